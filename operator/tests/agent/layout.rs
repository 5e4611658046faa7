//! MIG layouts that are not what the agent left: a reboot (instances gone), changes behind the
//! agent's back, a GPU instance without its compute instance, or with several; GPU instance IDs
//! as the driver gives them.

use crate::support::{Sim, calls, layout};
use crate::{H100, H200, gpus, mig_gpu};

#[test]
fn a_reboot_recreates_the_declared_layout() {
    let sim = Sim::new("reboot", &[H200]);
    let spec = gpus(&[mig_gpu(
        0,
        &[
            ("4g.71gb", 0, 4, Some("alpha")),
            ("2g.35gb", 4, 2, Some("beta")),
            ("1g.35gb", 6, 2, None),
        ],
    )]);
    assert_eq!(sim.apply(&spec).code(), Some(0));
    let scrubs = sim.scrubs().len();
    nvidia_ml_sim::ctl::reboot(&sim.paths).unwrap();
    assert!(sim.discover().gpus[0].instances.is_empty());
    let before = sim.mutations();
    let run = sim.apply(&spec);
    assert_eq!(run.code(), Some(0), "{}", run.stdout());
    assert_eq!(
        sim.log_since(before).len(),
        6,
        "three instances, GI + CI each; MIG mode survived"
    );
    assert_eq!(layout(run.status(), 0), ["4g.71gb@0:4", "2g.35gb@4:2", "1g.35gb@6:2"]);
    assert_eq!(
        sim.scrubs().len(),
        scrubs + 3,
        "instances created again are new MIG devices (new UUIDs) whose memory nobody vouches for: scrubbed"
    );
    assert!(sim.leaks(run.status()).is_empty(), "{:?}", sim.leaks(run.status()));
    let drifted = run.status().conditions.iter().find(|c| c.type_ == "Drifted").unwrap();
    assert!(
        drifted.message.ends_with("found MIG on, no instances"),
        "{}",
        drifted.message
    );
}

#[test]
fn drift_is_repaired_and_reported() {
    let sim = Sim::new("drift", &[H100]);
    let spec = gpus(&[mig_gpu(
        0,
        &[("3g.40gb", 0, 4, Some("alpha")), ("2g.20gb", 4, 2, Some("beta"))],
    )]);
    assert_eq!(sim.apply(&spec).code(), Some(0));
    // Behind the agent's back: the 2g instance is destroyed and a 1g appears at 7.
    nvidia_ml_sim::state::update(&sim.paths, |st| {
        let g = &mut st.gpus[0];
        g.gis.retain(|gi| gi.start != 4);
        g.gis.push(nvidia_ml_sim::state::SimGi {
            // The ID a driver gives it (by placement, not creation order).
            id: g.gpu_instance_id(6, 1),
            profile_id: 19,
            start: 6,
            size: 1,
            cis: vec![],
        });
    })
    .unwrap();
    let before = sim.mutations();
    let run = sim.apply(&spec);
    assert_eq!(run.code(), Some(0), "{}", run.stdout());
    let log = sim.log_since(before);
    assert_eq!(
        calls(&log),
        [
            (0, "nvmlGpuInstanceDestroy"),
            (0, "nvmlDeviceCreateGpuInstanceWithPlacement"),
            (0, "nvmlGpuInstanceCreateComputeInstance")
        ]
    );
    let msg = run.status().gpus[0].message.clone().unwrap_or_default();
    assert!(msg.contains("1g.10gb at 6:1 is not in the spec"), "{msg}");
    assert_eq!(layout(run.status(), 0), ["3g.40gb@0:4", "2g.20gb@4:2"]);
    let drifted = run.status().conditions.iter().find(|c| c.type_ == "Drifted").unwrap();
    assert_eq!((drifted.status.as_str(), drifted.reason.as_str()), ("True", "Repaired"));
    assert_eq!(
        drifted.message,
        "changed outside the agent (reboot or manual change): GPU 0: applied 3g.40gb@0:4 2g.20gb@4:2, found 3g.40gb@0:4 1g.10gb@6:1"
    );
    // Once repaired, the next apply finds nothing.
    let again = sim.apply(&spec);
    let drifted = again.status().conditions.iter().find(|c| c.type_ == "Drifted").unwrap();
    assert_eq!((drifted.status.as_str(), drifted.reason.as_str()), ("False", "NoDrift"));
}

#[test]
fn a_gpu_instance_left_without_compute_instance_is_finished() {
    let sim = Sim::new("halfdone", &[H100]);
    let spec = gpus(&[mig_gpu(0, &[("7g.80gb", 0, 8, Some("alpha"))])]);
    nvidia_ml_sim::ctl::fail(&sim.paths, "nvmlGpuInstanceCreateComputeInstance", 1, "UNKNOWN", 1).unwrap();
    let run = sim.apply(&spec);
    assert_eq!(run.code(), Some(1));
    assert_eq!(run.status().gpus[0].reason.map(|r| r.as_str()), Some("Failed"));
    let before = sim.mutations();
    let run = sim.apply(&spec);
    assert_eq!(run.code(), Some(0), "{}", run.stdout());
    assert_eq!(
        calls(&sim.log_since(before)),
        [(0, "nvmlGpuInstanceCreateComputeInstance")]
    );
    let msg = run.status().gpus[0].message.clone().unwrap_or_default();
    assert!(msg.contains("has no compute instance"), "{msg}");
    assert_eq!(sim.scrubs().len(), 1);
}

/// A GPU instance with several compute instances (made by hand, or by another tool): listed and
/// destroyed when the spec drops it; when the spec keeps it, its compute instances are replaced by
/// one spanning it (what the device plugin should advertise) once nothing runs in it.
#[test]
fn gpu_instances_with_several_compute_instances_are_handled() {
    let split = |sim: &Sim| {
        nvidia_ml_sim::state::update(&sim.paths, |st| {
            let id = st.gpus[0].gpu_instance_id(4, 4);
            let a = st.next_mig_uuid(0, id);
            let b = st.next_mig_uuid(0, id);
            st.gpus[0].gis.push(nvidia_ml_sim::state::SimGi {
                id,
                profile_id: 9,
                start: 4,
                size: 4,
                cis: vec![
                    nvidia_ml_sim::state::SimCi {
                        id: 0,
                        profile_id: 0,
                        uuid: a,
                    },
                    nvidia_ml_sim::state::SimCi {
                        id: 1,
                        profile_id: 0,
                        uuid: b,
                    },
                ],
            });
        })
        .unwrap();
    };
    let mig_on = r#"{model: "NVIDIA H100 80GB HBM3", count: 1, mig: true}"#;

    // Dropped by the spec: every compute instance goes, then the GPU instance, in one apply.
    let sim = Sim::new("multici-drop", &[mig_on]);
    split(&sim);
    let run = sim.apply(&gpus(&[mig_gpu(0, &[("7g.80gb", 0, 8, Some("alpha"))])]));
    assert_eq!(run.code(), Some(0), "{}", run.stdout());
    assert_eq!(layout(run.status(), 0), ["7g.80gb@0:8"]);

    // Kept by the spec: busy while a process runs in it, then one spanning compute instance.
    let sim = Sim::new("multici-keep", &[mig_on]);
    split(&sim);
    let spec = gpus(&[mig_gpu(0, &[("3g.40gb", 4, 4, Some("beta"))])]);
    nvidia_ml_sim::ctl::attach(
        &sim.paths,
        &nvidia_ml_sim::ctl::Attach {
            gpu: 0,
            placement_start: Some(4),
            pid: 4711,
            tenant: Some("alpha".into()),
            used_mib: 100,
            ..Default::default()
        },
    )
    .unwrap();
    let run = sim.apply(&spec);
    assert_eq!(run.code(), Some(1), "{}", run.stdout());
    let g = &run.status().gpus[0];
    assert_eq!(
        (g.applied, g.reason.map(|r| r.as_str())),
        (Some(false), Some("Busy")),
        "{:?}",
        g.message
    );
    assert!(g.message.as_deref().unwrap().contains("4711"), "{:?}", g.message);
    assert_eq!(
        sim.state().gpus[0].gis[0].cis.len(),
        2,
        "nothing destroyed under a process"
    );

    nvidia_ml_sim::ctl::detach(&sim.paths, 4711).unwrap();
    let run = sim.apply(&spec);
    assert_eq!(run.code(), Some(0), "{}", run.stdout());
    let gi = sim.state().gpus[0].gis[0].clone();
    assert_eq!(gi.cis.len(), 1, "{gi:?}");
    assert_eq!(gi.cis[0].profile_id, 2, "one compute instance of all 3 slices");
    let inst = &run.status().gpus[0].instances[0];
    assert_eq!(inst.uuid.as_deref(), Some(gi.cis[0].uuid.as_str()));
    assert_eq!(inst.tenant.as_deref(), Some("beta"));
    assert!(sim.leaks(run.status()).is_empty(), "{:?}", sim.leaks(run.status()));
    let m = sim.mutations();
    assert_eq!(sim.apply(&spec).code(), Some(0));
    assert_eq!(sim.mutations(), m, "repaired once, then left alone");
}

/// GPU instance IDs are the driver's, by placement and not in creation order, and not the same on
/// two GPUs of a node: the layout of NVIDIA/DCGM#138 gets IDs 3, 9, 10, 2 on one A100 80GB and 5,
/// 13, 14, 1 on the next (in placement order). The agent reports them as they are, matches MIG
/// devices and processes by them, and a second apply changes nothing on either GPU.
#[test]
fn gpu_instance_ids_are_the_drivers_whatever_their_order() {
    let sim = Sim::new("gi-ids", &[r#"{pciDeviceId: "0x20B210DE", count: 2}"#]);
    let dcgm = [
        ("2g.20gb", 0, 2, Some("alpha")),
        ("1g.10gb", 2, 1, Some("beta")),
        ("1g.10gb", 3, 1, None),
        ("3g.40gb", 4, 4, Some("gamma")),
    ];
    let spec = gpus(&[mig_gpu(0, &dcgm), mig_gpu(1, &dcgm)]);
    let run = sim.apply(&spec);
    assert_eq!(run.code(), Some(0), "{}", run.stdout());
    let st = sim.state();
    for (gpu, want) in [(0usize, [3, 9, 10, 2]), (1, [5, 13, 14, 1])] {
        let got: Vec<u32> = run.status().gpus[gpu]
            .instances
            .iter()
            .map(|i| i.gpu_instance_id)
            .collect();
        assert_eq!(got, want, "GPU {gpu}");
        for i in &run.status().gpus[gpu].instances {
            let gi = st.gpus[gpu].gi(i.gpu_instance_id).unwrap();
            assert_eq!(
                (gi.start, i.uuid.as_deref()),
                (i.placement.start, Some(gi.cis[0].uuid.as_str())),
                "GPU {gpu}: the MIG device of GPU instance {}",
                i.gpu_instance_id
            );
        }
    }
    let before = sim.mutations();
    assert_eq!(sim.apply(&spec).code(), Some(0));
    assert_eq!(sim.mutations(), before, "{:?}", calls(&sim.log_since(before)));

    // A workload in GPU 1's 3g at 4:4 (GPU instance 1 there) keeps that instance from going.
    nvidia_ml_sim::ctl::attach(
        &sim.paths,
        &nvidia_ml_sim::ctl::Attach {
            gpu: 1,
            placement_start: Some(4),
            pid: 5150,
            tenant: Some("gamma".into()),
            used_mib: 100,
            ..Default::default()
        },
    )
    .unwrap();
    let p = sim.discover().gpus[1].processes.clone();
    assert_eq!(
        p.iter().map(|p| (p.pid, p.gpu_instance_id)).collect::<Vec<_>>(),
        [(5150, Some(1))]
    );
    let run = sim.apply(&gpus(&[mig_gpu(0, &dcgm), mig_gpu(1, &[("7g.80gb", 0, 8, None)])]));
    assert_eq!(run.code(), Some(1), "{}", run.stdout());
    let g = &run.status().gpus[1];
    assert_eq!(g.reason.map(|r| r.as_str()), Some("Busy"), "{:?}", g.message);
    assert!(
        g.message.as_deref().unwrap().contains("3g.40gb at 4:4 runs pids 5150"),
        "{:?}",
        g.message
    );
}
