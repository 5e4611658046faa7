//! What the agent publishes: hands recorded only once handed over, the reasons a GPU is not
//! ready, drift, and the MPS daemon's defaults.

use super::*;
use crate::api::GpuReason;
use crate::gpu::actions::{ScrubTarget, node_actions};
use crate::gpu::mps;
use crate::gpu::status::{RunRecord, build};

fn t0() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::from_second(1_800_000_000).unwrap())
}

#[test]
fn status_records_hands_only_once_applied() {
    let observed = node(vec![gpu(0, "H100-80GB", false)]);
    let spec = node_spec(vec![whole(0, Mode::Exclusive, &["b"])]);
    let mut prev = observed.clone();
    prev.gpus[0].applied_mode = Some(Mode::Exclusive);
    prev.gpus[0].applied_tenants = vec!["a".into()];
    let now = t0();
    let s = published(&observed, &spec, &prev, &RunRecord::default());
    assert_eq!(s.gpus[0].applied, Some(false));
    assert_eq!(s.gpus[0].reason, Some(GpuReason::ScrubPending));
    assert_eq!(s.gpus[0].applied_tenants, ["a"], "not handed over before the scrub");
    assert_eq!(condition_status(&s.conditions, "Ready"), Some(false));

    let done = RunMemory {
        scrubbed: vec![(0, ScrubTarget::Gpu)],
        touched: vec![],
    };
    let plans = node_actions(&observed, &spec, Some(&prev), &done);
    let s = build(&observed, &spec, Some(&prev), &plans, &RunRecord::default(), None, &now);
    assert_eq!(
        (s.gpus[0].applied, s.gpus[0].applied_tenants.clone()),
        (Some(true), vec!["b".to_string()])
    );
    assert_eq!(condition_status(&s.conditions, "Ready"), Some(true));
    assert_eq!(
        (s.layout.as_deref(), s.gpu_layout.as_deref()),
        (Some("Exclusive"), Some("0:Exclusive"))
    );
}

/// What an apply that did `run` publishes, its actions planned from nothing done yet.
fn published(observed: &GpuNodeStatus, spec: &GpuNodeSpec, prev: &GpuNodeStatus, run: &RunRecord) -> GpuNodeStatus {
    let plans = node_actions(observed, spec, Some(prev), &none());
    build(observed, spec, Some(prev), &plans, run, None, &t0())
}

/// GPU 0 cut in two 3g.40gb, handed to a and b, and a spec that gives the first one to c: what
/// NVML reports, the spec, the previous status.
fn first_instance_to_c() -> (GpuNodeStatus, GpuNodeSpec, GpuNodeStatus) {
    let mut o = gpu(0, "H100-80GB", true);
    o.instances = vec![inst("3g.40gb", 0, 4, None), inst("3g.40gb", 4, 4, None)];
    let mut prev = recorded(&o);
    prev.instances[0].tenant = Some("a".into());
    prev.instances[1].tenant = Some("b".into());
    let spec = node_spec(vec![mig_spec(
        0,
        vec![want("3g.40gb", 0, 4, Some("c")), want("3g.40gb", 4, 4, Some("b"))],
    )]);
    (node(vec![o]), spec, node(vec![prev]))
}

/// Until its scrub, an instance keeps its old tenant, its GPU is not applied (`ScrubPending`) and
/// the node is not Ready; instances that keep their hands are recorded for the new spec at once.
#[test]
fn an_instance_waiting_for_its_scrub_is_not_handed_over() {
    let (observed, spec, prev) = first_instance_to_c();
    let s = published(&observed, &spec, &prev, &RunRecord::default());
    let g = &s.gpus[0];
    assert_eq!(
        (g.applied, g.reason.map(|r| r.as_str())),
        (Some(false), Some("ScrubPending"))
    );
    assert!(
        g.message.as_deref().unwrap().contains("scrub instance at 0:4"),
        "{:?}",
        g.message
    );
    let tenants: Vec<Option<&str>> = g.instances.iter().map(|i| i.tenant.as_deref()).collect();
    assert_eq!(tenants, [Some("a"), Some("b")], "c does not get 0:4 before its scrub");
    assert_eq!(condition_status(&s.conditions, "Ready"), Some(false));
    let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert!(ready.message.contains("GPU 0 (ScrubPending)"), "{}", ready.message);
}

/// A failed scrub: the error is the reason (`ScrubFailed`), the instance still not handed over.
#[test]
fn an_instance_whose_scrub_failed_is_not_handed_over() {
    let (observed, spec, prev) = first_instance_to_c();
    let failed = ScrubRecord {
        result: ScrubResult::Failed,
        tenant: Some("c".into()),
        ..Default::default()
    };
    let run = RunRecord {
        errors: [(
            0,
            (
                GpuReason::ScrubFailed,
                "scrub instance at 0:4 failed: cuMemsetD8".to_string(),
            ),
        )]
        .into(),
        scrubs: vec![(
            0,
            ScrubTarget::Instance(Placement { start: 0, size: 4 }),
            failed.clone(),
        )],
        ..Default::default()
    };
    let s = published(&observed, &spec, &prev, &run);
    let g = &s.gpus[0];
    assert_eq!(
        (g.applied, g.reason.map(|r| r.as_str())),
        (Some(false), Some("ScrubFailed"))
    );
    assert!(g.message.as_deref().unwrap().contains("cuMemsetD8"), "{:?}", g.message);
    assert_eq!(g.instances[0].tenant.as_deref(), Some("a"));
    assert_eq!(g.instances[0].last_scrub, Some(failed));
    assert_eq!(condition_status(&s.conditions, "Ready"), Some(false));
}

/// A GPU NVML cannot read: no action whatever the spec, its last known record published with the
/// error, not ready, and not counted as drift.
#[test]
fn an_unreadable_gpu_gets_no_action_and_keeps_its_last_record() {
    let lost = GpuStatus {
        index: 0,
        reason: Some(GpuReason::Unreadable),
        message: Some("NVML cannot read GPU 0: nvmlDeviceGetMigMode(GPU 0): GPU is lost".into()),
        ..Default::default()
    };
    let observed = node(vec![lost]);
    let mut known = recorded(&gpu(0, "H100-80GB", true));
    known.instances = vec![inst("7g.80gb", 0, 8, Some("a"))];
    known.applied = Some(true);
    let prev = node(vec![known]);
    for g in [
        mig_spec(0, vec![want("7g.80gb", 0, 8, Some("b"))]),
        whole(0, Mode::Exclusive, &["b"]),
        whole(0, Mode::Mps, &["b"]),
    ] {
        let spec = node_spec(vec![g]);
        for p in [None, Some(&prev)] {
            let plans = node_actions(&observed, &spec, p, &none());
            assert!(plans[0].actions.is_empty(), "{:?}", plans[0].actions);
            assert_eq!(plans[0].blocked.as_ref().unwrap().reason, GpuReason::Unreadable);
        }
        let s = published(&observed, &spec, &prev, &RunRecord::default());
        let g = &s.gpus[0];
        assert_eq!(
            (g.applied, g.reason.map(|r| r.as_str())),
            (Some(false), Some("Unreadable"))
        );
        assert!(g.message.as_deref().unwrap().contains("GPU is lost"));
        assert_eq!(
            (g.uuid.as_str(), g.instances[0].tenant.as_deref()),
            ("GPU-0", Some("a"))
        );
        assert_eq!(condition_status(&s.conditions, "Ready"), Some(false));
        assert!(crate::gpu::status::drift(&observed, &spec, Some(&prev)).is_empty());
    }
}

#[test]
fn mps_defaults_come_from_the_spec_per_daemon_device() {
    let mut a = gpu(0, "H100-80GB", false);
    let mut b = gpu(1, "H100-80GB", false);
    let c = gpu(2, "H100-80GB", false);
    a.compute_mode = Some("ExclusiveProcess".into());
    b.compute_mode = Some("ExclusiveProcess".into());
    let observed = GpuNodeStatus {
        gpus: vec![a, b, c],
        ..Default::default()
    };
    let set = |pct, mem: &str| MpsSettings {
        max_clients: 4,
        active_thread_percentage: Some(pct),
        pinned_memory_limit: Some(mem.into()),
    };
    let spec = GpuNodeSpec {
        gpus: vec![
            whole(1, Mode::Mps, &[]).with_mps(set(50, "1Gi")),
            whole(2, Mode::Mps, &[]).with_mps(set(25, "512Mi")),
            whole(0, Mode::Mps, &[]).with_mps(set(30, "2Gi")),
        ]
        .into(),
        ..Default::default()
    };
    let d = mps::desired(&spec, &observed);
    assert_eq!(d.gpus, ["GPU-1", "GPU-0"], "GPU 2 is not in EXCLUSIVE_PROCESS yet");
    assert_eq!(
        d.settings,
        [
            "set_default_active_thread_percentage 30",
            "set_default_device_pinned_mem_limit 0 1024M",
            "set_default_device_pinned_mem_limit 1 2048M"
        ]
    );
    assert_eq!(d.notes.len(), 1);
}

/// Without a pinned limit in the plan every client is still pinned, to one share: the H100's
/// 81559 MiB / 4 clients = 20389 MiB, by hand; with one, the plan's value (1Gi = 1024 MiB).
#[test]
fn the_daemon_pins_every_client_to_one_share_of_memory() {
    let mut a = gpu(0, "H100-80GB", false);
    a.compute_mode = Some("ExclusiveProcess".into());
    let mut b = a.clone();
    b.index = 1;
    b.uuid = "GPU-1".into();
    let observed = GpuNodeStatus {
        gpus: vec![a, b],
        ..Default::default()
    };
    let pinned = MpsSettings {
        max_clients: 4,
        active_thread_percentage: None,
        pinned_memory_limit: Some("1Gi".into()),
    };
    let spec = GpuNodeSpec {
        gpus: vec![
            crate::api::GpuSpec::mps(0, 4),
            whole(1, Mode::Mps, &[]).with_mps(pinned),
        ]
        .into(),
        ..Default::default()
    };
    assert_eq!(
        mps::desired(&spec, &observed).settings,
        [
            "set_default_device_pinned_mem_limit 0 20389M",
            "set_default_device_pinned_mem_limit 1 1024M"
        ]
    );
}

#[test]
fn drift_is_a_changed_gpu_under_an_unchanged_spec() {
    let spec = GpuNodeSpec {
        gpus: vec![mig_spec(0, vec![want("7g.80gb", 0, 8, Some("a"))])].into(),
        ..Default::default()
    };
    let mut applied = gpu(0, "H100-80GB", true);
    applied.instances = vec![inst("7g.80gb", 0, 8, Some("a"))];
    applied.applied = Some(true);
    let prev = GpuNodeStatus {
        gpus: vec![applied.clone()],
        ..Default::default()
    };
    let now = GpuNodeStatus {
        gpus: vec![gpu(0, "H100-80GB", true)],
        ..Default::default()
    };
    let found = crate::gpu::status::drift(&now, &spec, Some(&prev));
    assert_eq!(found[&0], "GPU 0: applied 7g.80gb@0:8, found MIG on, no instances");
    // Matching hardware, no previous status, or a changed spec: none of these is drift.
    let same = GpuNodeStatus {
        gpus: vec![applied],
        ..Default::default()
    };
    assert!(crate::gpu::status::drift(&same, &spec, Some(&prev)).is_empty());
    assert!(crate::gpu::status::drift(&now, &spec, None).is_empty());
    let changed = GpuNodeSpec {
        gpus: vec![mig_spec(0, vec![want("3g.40gb", 0, 4, Some("a"))])].into(),
        ..Default::default()
    };
    assert!(crate::gpu::status::drift(&now, &changed, Some(&prev)).is_empty());
}

/// The `kubectl get gpunodes` column of an 8-GPU node is the short form the docs show (written out
/// not this code's output), whatever order each GPU's instances were placed in; the per-GPU line
/// keeps every instance as placed.
#[test]
fn the_layout_column_groups_gpus_alike() {
    let instance = |profile: &str| crate::api::MigInstanceStatus {
        profile: profile.into(),
        ..Default::default()
    };
    let mig = |i: u32, profiles: &[&str]| GpuStatus {
        index: i,
        mig_mode: Some(crate::api::MigModeStatus {
            current: true,
            pending: false,
        }),
        instances: profiles.iter().map(|p| instance(p)).collect(),
        ..Default::default()
    };
    let exclusive = |i: u32| GpuStatus {
        index: i,
        applied_mode: Some(Mode::Exclusive),
        ..Default::default()
    };
    let small = ["1g.10gb"; 7];
    let status = GpuNodeStatus {
        gpus: vec![
            mig(0, &["3g.40gb", "2g.20gb", "2g.20gb"]),
            mig(1, &["2g.20gb", "3g.40gb", "2g.20gb"]),
            mig(2, &["2g.20gb", "2g.20gb", "3g.40gb"]),
            mig(3, &["3g.40gb", "2g.20gb", "2g.20gb"]),
            mig(4, &small),
            mig(5, &small),
            exclusive(6),
            exclusive(7),
        ],
        ..Default::default()
    };
    assert_eq!(
        crate::gpu::status::layout_summary(&status),
        "4×[3g.40gb+2×2g.20gb] 2×[7×1g.10gb] 2×Exclusive"
    );
    let line = crate::gpu::status::gpu_layout_line(&status);
    assert!(
        line.starts_with("0:3g.40gb+2g.20gb+2g.20gb 1:2g.20gb+3g.40gb+2g.20gb "),
        "{line}"
    );
    assert!(line.ends_with(" 6:Exclusive 7:Exclusive"), "{line}");

    // One of a kind has no count; an empty MIG GPU and a GPU with nothing applied say so.
    let odd = GpuNodeStatus {
        gpus: vec![
            mig(0, &["7g.80gb"]),
            mig(1, &[]),
            GpuStatus {
                index: 2,
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    assert_eq!(crate::gpu::status::layout_summary(&odd), "[7g.80gb] MIG(empty) -");
}
