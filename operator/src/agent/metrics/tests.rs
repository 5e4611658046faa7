use super::*;
use crate::api::{
    GpuSpec, MigInstanceSpec, MigInstanceStatus, MigModeStatus, MigProfileStatus, Mode, MpsSettings, Placement,
    ProcessStatus,
};
use crate::gpu::status::MigChange;

/// Whole GPUs' utilization only.
fn gpus_busy(gpus: BTreeMap<u32, f64>) -> Busy {
    Busy {
        gpus,
        ..Default::default()
    }
}

/// The scraped lines of one metric, sorted.
fn samples(text: &str, name: &str) -> Vec<String> {
    let mut v: Vec<String> = text
        .lines()
        .filter(|l| l.starts_with(name) && (l[name.len()..].starts_with('{') || l[name.len()..].starts_with(' ')))
        .map(str::to_string)
        .collect();
    v.sort();
    v
}

/// GPU 0 in MIG mode with a 3g.40gb of acme (one process) and a free 1g.10gb; GPU 1 an MPS GPU of
/// beta (3 of 4 shares) and delta (1), two processes; GPU 2 found but in no spec.
fn node() -> (GpuNodeSpec, GpuNodeStatus) {
    let spec = GpuNodeSpec {
        gpus: vec![
            GpuSpec::mig(
                0,
                vec![
                    MigInstanceSpec::new("3g.40gb", 4, 4).for_tenant("acme"),
                    MigInstanceSpec::new("1g.10gb", 0, 1),
                ],
            ),
            GpuSpec::new(1, Mode::Mps)
                .with_mps(MpsSettings::default())
                .with_tenants(&["beta", "delta"])
                .with_shares(&[("beta", 3), ("delta", 1)]),
        ]
        .into(),
        ..Default::default()
    };
    let instance = |id, profile_id, profile: &str, start, size| MigInstanceStatus {
        gpu_instance_id: id,
        compute_instance_id: Some(0),
        profile_id,
        profile: profile.into(),
        placement: Placement { start, size },
        uuid: Some(format!("MIG-{id}")),
        ..Default::default()
    };
    let profile = |id, name: &str, memory_mib| MigProfileStatus {
        id,
        name: name.into(),
        memory_mib,
        ..Default::default()
    };
    let process = |pid, gi, mib| ProcessStatus {
        pid,
        gpu_instance_id: gi,
        compute_instance_id: gi.map(|_| 0),
        used_memory_mib: Some(mib),
    };
    let status = GpuNodeStatus {
        gpus: vec![
            GpuStatus {
                index: 0,
                uuid: "GPU-0".into(),
                memory_mib: 81559,
                mig_mode: Some(MigModeStatus {
                    current: true,
                    pending: true,
                }),
                profiles: vec![profile(9, "3g.40gb", 40448), profile(19, "1g.10gb", 9856)],
                instances: vec![instance(2, 9, "3g.40gb", 4, 4), instance(13, 19, "1g.10gb", 0, 1)],
                processes: vec![process(10, Some(2), 2048)],
                ..Default::default()
            },
            GpuStatus {
                index: 1,
                uuid: "GPU-1".into(),
                memory_mib: 81559,
                processes: vec![process(20, None, 1024), process(21, None, 512)],
                ..Default::default()
            },
            GpuStatus {
                index: 2,
                uuid: "GPU-2".into(),
                memory_mib: 81559,
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    (spec, status)
}

#[test]
fn device_rows_carry_dcgm_labels_one_per_mig_instance() {
    let m = AgentMetrics::new("n1");
    let (spec, status) = node();
    m.observe(&spec, &status, gpus_busy(BTreeMap::from([(1, 0.5), (2, 0.0)])), &[]);
    let text = m.encode();
    assert_eq!(
        samples(&text, "gpu_tenancy_device_memory_used_bytes"),
        [
            r#"gpu_tenancy_device_memory_used_bytes{Hostname="n1",gpu="0",UUID="GPU-0",GPU_I_ID="13",GPU_I_PROFILE="1g.10gb",mode="MIG",tenant="unallocated"} 0.0"#,
            r#"gpu_tenancy_device_memory_used_bytes{Hostname="n1",gpu="0",UUID="GPU-0",GPU_I_ID="2",GPU_I_PROFILE="3g.40gb",mode="MIG",tenant="acme"} 2147483648.0"#,
            r#"gpu_tenancy_device_memory_used_bytes{Hostname="n1",gpu="1",UUID="GPU-1",GPU_I_ID="",GPU_I_PROFILE="",mode="MPS",tenant="shared"} 1610612736.0"#,
            r#"gpu_tenancy_device_memory_used_bytes{Hostname="n1",gpu="2",UUID="GPU-2",GPU_I_ID="",GPU_I_PROFILE="",mode="Unplanned",tenant="unallocated"} 0.0"#,
        ]
    );
    assert!(text.contains(r#"gpu_tenancy_device_memory_total_bytes{Hostname="n1",gpu="0",UUID="GPU-0",GPU_I_ID="2",GPU_I_PROFILE="3g.40gb",mode="MIG",tenant="acme"} 42412802048.0"#), "{text}");
    assert!(text.contains(r#"gpu_tenancy_device_processes{Hostname="n1",gpu="1",UUID="GPU-1",GPU_I_ID="",GPU_I_PROFILE="",mode="MPS",tenant="shared"} 2"#), "{text}");
    // Utilization only where NVML gave it: the MPS GPU and the idle GPU, not the MIG GPU.
    assert_eq!(
        samples(&text, "gpu_tenancy_device_utilization_ratio").len(),
        2,
        "{text}"
    );
    assert!(text.contains(r#"gpu_tenancy_node_gpus{Hostname="n1"} 3"#));
    let shares = samples(&text, "gpu_tenancy_device_share_ratio");
    assert!(shares.contains(&r#"gpu_tenancy_device_share_ratio{Hostname="n1",gpu="1",UUID="GPU-1",GPU_I_ID="",GPU_I_PROFILE="",mode="MPS",tenant="beta"} 0.75"#.to_string()), "{shares:?}");
    assert!(
        text.contains(r#"gpu_tenancy_scrubs_total{Hostname="n1",gpu="2",result="failed"} 0"#),
        "failures exported at 0: {text}"
    );
    assert!(text.trim_end().ends_with("# EOF"));
}

/// GPM's figure for the 3g.40gb goes in its utilization row and, weighted by 3/7, into acme's
/// busy GPUs; the MPS GPU's busy time divides as its processes' samples said; the namespaces'
/// holdings count from the moment they are told.
#[test]
fn instances_have_utilization_where_gpm_gives_it_and_samples_split_shared_gpus() {
    let m = AgentMetrics::new("n1");
    let (spec, status) = node();
    let busy = Busy {
        gpus: BTreeMap::from([(1, 0.8)]),
        instances: BTreeMap::from([((0, 4), 0.7)]),
        split: BTreeMap::from([(
            1,
            BTreeMap::from([("beta".to_string(), 0.5), ("unattributed".to_string(), 0.5)]),
        )]),
    };
    m.observe(&spec, &status, busy, &[]);
    m.namespaces(BTreeMap::from([(
        ("acme".to_string(), "acme-train".to_string()),
        3.0 / 7.0,
    )]));
    std::thread::sleep(std::time::Duration::from_millis(100));
    let text = m.encode();
    assert!(
        text.contains(r#"gpu_tenancy_device_utilization_ratio{Hostname="n1",gpu="0",UUID="GPU-0",GPU_I_ID="2",GPU_I_PROFILE="3g.40gb",mode="MIG",tenant="acme"} 0.7"#),
        "{text}"
    );
    assert!(
        !text.contains(r#"gpu_tenancy_device_utilization_ratio{Hostname="n1",gpu="0",UUID="GPU-0",GPU_I_ID="13""#),
        "no GPM figure for it: {text}"
    );
    let busy_gpus = samples(&text, "gpu_tenancy_busy_gpus");
    assert_eq!(
        busy_gpus,
        [
            r#"gpu_tenancy_busy_gpus{Hostname="n1",tenant="acme",mode="MIG"} 0.3"#,
            r#"gpu_tenancy_busy_gpus{Hostname="n1",tenant="beta",mode="MPS"} 0.4"#,
            r#"gpu_tenancy_busy_gpus{Hostname="n1",tenant="unattributed",mode="MPS"} 0.4"#,
        ],
        "{text}"
    );
    let l = m.ledger();
    let acme_ns = l.namespaces[&("acme".to_string(), "acme-train".to_string())];
    let acme = l.allocated[&("acme".to_string(), "MIG")];
    assert!(acme_ns > 0.0 && acme_ns <= acme + 1e-12, "{l:?}");
    let used = |t: &str, mode: &'static str| l.used.get(&(t.to_string(), mode)).copied().unwrap_or(0.0);
    assert!(
        (used("beta", "MPS") - used("unattributed", "MPS")).abs() < 1e-12,
        "{l:?}"
    );
    assert!(
        (used("acme", "MIG") / acme - 0.7).abs() < 1e-9,
        "efficiency = GPM's figure: {l:?}"
    );
    assert_eq!(used("shared", "MPS"), 0.0);
}

#[test]
fn a_gpu_that_goes_leaves_no_series() {
    let m = AgentMetrics::new("n1");
    let (spec, mut status) = node();
    m.observe(&spec, &status, Busy::default(), &[]);
    status.gpus.truncate(1);
    m.observe(&spec, &status, Busy::default(), &[]);
    let text = m.encode();
    let stale: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("gpu_tenancy_device") && l.contains(r#"gpu="1""#))
        .collect();
    assert!(stale.is_empty(), "{stale:?}");
    assert!(text.contains(r#"gpu_tenancy_node_gpus{Hostname="n1"} 1"#));
}

#[test]
fn allocated_seconds_add_up_to_the_gpus_times_the_time() {
    let m = AgentMetrics::new("n1");
    let (spec, status) = node();
    let t0 = Instant::now();
    m.observe(&spec, &status, gpus_busy(BTreeMap::from([(1, 1.0)])), &[]);
    std::thread::sleep(std::time::Duration::from_millis(200));
    let l = m.ledger();
    let elapsed = t0.elapsed().as_secs_f64();
    let total: f64 = l.allocated.values().sum();
    assert!(
        total > 3.0 * 0.2 && total <= 3.0 * elapsed + 1e-9,
        "{total} over {elapsed}s: {l:?}"
    );
    let acme = l.allocated[&("acme".to_string(), "MIG")];
    assert!((acme / total - 3.0 / 7.0 / 3.0).abs() < 1e-9, "{l:?}");
    // The MPS GPU was busy the whole time, and several tenants share it.
    let shared = l.used[&("shared".to_string(), "MPS")];
    assert!((shared - total / 3.0).abs() < 1e-9, "{l:?}");
}

#[test]
fn scrubs_and_mig_changes_are_counted() {
    let m = AgentMetrics::new("n1");
    let (spec, status) = node();
    let events = [
        GpuEvent::Scrub {
            gpu: 0,
            ok: true,
            seconds: 0.3,
        },
        GpuEvent::Scrub {
            gpu: 0,
            ok: false,
            seconds: 0.1,
        },
        GpuEvent::Mig {
            gpu: 0,
            change: MigChange::CreateInstance,
        },
    ];
    m.observe(&spec, &status, Busy::default(), &events);
    m.observe(&spec, &status, Busy::default(), &events[..1]);
    let text = m.encode();
    assert!(
        text.contains(r#"gpu_tenancy_scrubs_total{Hostname="n1",gpu="0",result="ok"} 2"#),
        "{text}"
    );
    assert!(
        text.contains(r#"gpu_tenancy_scrubs_total{Hostname="n1",gpu="0",result="failed"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"gpu_tenancy_scrub_duration_seconds_count{Hostname="n1"} 3"#),
        "{text}"
    );
    assert!(
        text.contains(r#"gpu_tenancy_mig_changes_total{Hostname="n1",gpu="0",change="create_instance"} 1"#),
        "{text}"
    );
}

#[test]
fn holders_name_the_containers_of_each_device_the_kubelet_reports() {
    use crate::agent::pod_resources::{HeldDevice, Holder, Holdings};
    let m = AgentMetrics::new("n1");
    let (spec, status) = node();
    m.observe(&spec, &status, Busy::default(), &[]);
    let holder = |ns: &str, pod: &str| Holder {
        namespace: ns.into(),
        pod: pod.into(),
        container: "main".into(),
    };
    let device = |resource: &str, holders| HeldDevice {
        resource: resource.into(),
        holders,
    };
    let h = Holdings {
        devices: BTreeMap::from([
            (
                "MIG-2".to_string(),
                device("nvidia.com/mig-3g.40gb", vec![holder("acme", "train")]),
            ),
            (
                "GPU-1::2".to_string(),
                device("nvidia.com/gpu.shared", vec![holder("beta", "serve")]),
            ),
            ("GPU-9".to_string(), device("nvidia.com/gpu", vec![holder("x", "gone")])),
        ]),
        ..Default::default()
    };
    m.holders(&status, Some(&h));
    let rows = samples(&m.encode(), "gpu_tenancy_device_holder_info");
    assert_eq!(
        rows,
        [
            r#"gpu_tenancy_device_holder_info{Hostname="n1",gpu="0",UUID="GPU-0",GPU_I_ID="2",GPU_I_PROFILE="3g.40gb",namespace="acme",pod="train",container="main"} 1"#,
            r#"gpu_tenancy_device_holder_info{Hostname="n1",gpu="1",UUID="GPU-1",GPU_I_ID="",GPU_I_PROFILE="",namespace="beta",pod="serve",container="main"} 1"#,
        ]
    );
    m.holders(&status, None);
    assert!(samples(&m.encode(), "gpu_tenancy_device_holder_info").is_empty());
}

/// An unhealthy GPU makes all its rows 1 with the reason; an unhealthy MIG instance only its row.
#[test]
fn unhealthy_devices_are_exported_with_their_reason() {
    let m = AgentMetrics::new("n1");
    let (spec, mut status) = node();
    let xid = crate::api::Unhealthy {
        reason: crate::api::HealthReason::Xid,
        message: "the driver reported XID 94".into(),
    };
    status.gpus[0].instances[0].unhealthy = Some(xid.clone());
    status.gpus[2].unhealthy = Some(crate::api::Unhealthy {
        reason: crate::api::HealthReason::Unreadable,
        ..xid
    });
    m.observe(&spec, &status, gpus_busy(BTreeMap::new()), &[]);
    let text = m.encode();
    let rows = samples(&text, "gpu_tenancy_device_unhealthy");
    let sick: Vec<&String> = rows.iter().filter(|r| r.ends_with(" 1")).collect();
    assert_eq!(sick.len(), 2, "{rows:#?}");
    let id = status.gpus[0].instances[0].gpu_instance_id;
    assert!(
        sick.iter()
            .any(|r| r.contains(&format!(r#"gpu="0",UUID="GPU-0",GPU_I_ID="{id}""#)) && r.contains(r#"reason="Xid""#)),
        "{rows:#?}"
    );
    assert!(
        sick.iter()
            .any(|r| r.contains(r#"gpu="2""#) && r.contains(r#"reason="Unreadable""#)),
        "{rows:#?}"
    );
    assert_eq!(rows.len(), 4, "one row per device, healthy ones at 0: {rows:#?}");
}
