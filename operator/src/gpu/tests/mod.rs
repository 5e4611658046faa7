//! The agent's decisions as plain functions: observed state + spec + previous status → actions.

use super::actions::{Action, GpuActions, RunMemory, ScrubTarget, gpu_actions, node_actions};
use crate::api::GpuReason;
use crate::api::*;
use crate::mig::model_by_name;

mod status;

/// What NVML would report for an idle GPU of a model, profiles from the static tables.
fn gpu(index: u32, key: &str, mig: bool) -> GpuStatus {
    let m = model_by_name(key).unwrap();
    GpuStatus {
        index,
        uuid: format!("GPU-{index}"),
        name: m.name().into(),
        pci_device_id: m.pci_ids().next().unwrap(),
        memory_mib: m.memory_mib,
        compute_mode: Some("Default".into()),
        mig_mode: Some(MigModeStatus {
            current: mig,
            pending: mig,
        }),
        profiles: m
            .profiles()
            .map(|p| MigProfileStatus {
                id: p.info().profile_id,
                name: p.name.into(),
                compute_slices: p.info().compute_slices,
                memory_slices: p.info().memory_slices,
                memory_mib: p.memory_mib(),
                max_instances: p.info().max_instances,
                placements: p
                    .info()
                    .starts
                    .iter()
                    .map(|&s| Placement {
                        start: s,
                        size: p.info().memory_slices,
                    })
                    .collect(),
            })
            .collect(),
        ..Default::default()
    }
}

/// The ID a driver gives a GPU instance at `start:size`. Real drivers number GPU instances by
/// placement, not in creation order, and not the same way on every GPU (NVIDIA/DCGM#138: 9, 10, 3,
/// 2 on one A100, 13, 14, 5, 1 for the same layout on the next); these tests use the second kind,
/// whose IDs fall as placements rise, so no test passes by assuming IDs 1, 2, 3 in slice order.
fn driver_gi_id(start: u32, size: u32) -> u32 {
    let slice = (start + 4) % 8;
    match size {
        8 => 0,
        4 => 1 + slice / 4,
        2 => 3 + slice / 2,
        _ => 7 + slice,
    }
}

fn inst(profile: &str, start: u32, size: u32, tenant: Option<&str>) -> MigInstanceStatus {
    let gi = driver_gi_id(start, size);
    let id = model_by_name("H100-80GB")
        .unwrap()
        .profile(profile)
        .map(|p| p.info().profile_id)
        .unwrap_or(0);
    MigInstanceStatus {
        gpu_instance_id: gi,
        compute_instance_id: Some(0),
        profile_id: id,
        profile: profile.into(),
        placement: Placement { start, size },
        uuid: Some(format!("MIG-{gi}")),
        tenant: tenant.map(String::from),
        last_scrub: None,
        unhealthy: None,
    }
}

fn want(profile: &str, start: u32, size: u32, tenant: Option<&str>) -> MigInstanceSpec {
    MigInstanceSpec {
        profile: profile.into(),
        placement: Placement { start, size },
        tenant: tenant.map(String::from),
    }
}

fn mig_spec(index: u32, instances: Vec<MigInstanceSpec>) -> GpuSpec {
    GpuSpec::mig(index, instances).with_scrub(ScrubMemory::OnTenantChange)
}

fn whole(index: u32, mode: Mode, tenants: &[&str]) -> GpuSpec {
    GpuSpec::new(index, mode)
        .with_tenants(tenants)
        .with_scrub(ScrubMemory::OnTenantChange)
}

fn none() -> RunMemory {
    RunMemory::default()
}

/// `o` as the previous status recorded it once the agent had handed everything over (scrubbed).
fn recorded(o: &GpuStatus) -> GpuStatus {
    let rec = Some(ScrubRecord {
        result: ScrubResult::Scrubbed,
        ..Default::default()
    });
    let mut p = o.clone();
    p.last_scrub = rec.clone();
    for i in &mut p.instances {
        i.last_scrub = rec.clone();
    }
    p
}

/// `o` as the previous status recorded it once handed over whole, in `mode`, to `tenants`.
fn handed(o: &GpuStatus, mode: Mode, tenants: &[&str]) -> GpuStatus {
    GpuStatus {
        applied_mode: Some(mode),
        applied_tenants: tenants.iter().map(|t| t.to_string()).collect(),
        ..recorded(o)
    }
}

/// Processes with these pids on a GPU out of MIG mode.
fn running(pids: &[u32]) -> Vec<ProcessStatus> {
    pids.iter()
        .map(|&pid| ProcessStatus {
            pid,
            ..Default::default()
        })
        .collect()
}

/// GPU 0 shared between `tenants` in `mode` (MPS or TimeSlicing), four clients or replicas.
fn shared(mode: Mode, tenants: &[&str], scrub: ScrubMemory) -> GpuSpec {
    let gpu = match mode {
        Mode::Mps => GpuSpec::mps(0, 4),
        _ => GpuSpec::time_sliced(0, 4),
    };
    gpu.with_tenants(tenants).with_scrub(scrub)
}

/// A node of these GPUs as NVML reports them, or as a status recorded them.
fn node(gpus: Vec<GpuStatus>) -> GpuNodeStatus {
    GpuNodeStatus {
        gpus,
        ..Default::default()
    }
}

/// A GpuNode spec of these GPUs.
fn node_spec(gpus: Vec<GpuSpec>) -> GpuNodeSpec {
    GpuNodeSpec {
        gpus: gpus.into(),
        ..Default::default()
    }
}

fn blocked_by(p: GpuActions) -> Option<GpuReason> {
    p.blocked.map(|b| b.reason)
}

#[test]
fn a_matching_gpu_gets_no_action() {
    let mut o = gpu(0, "H100-80GB", true);
    o.instances = vec![inst("3g.40gb", 0, 4, Some("a")), inst("3g.40gb", 4, 4, Some("b"))];
    let g = mig_spec(
        0,
        vec![want("3g.40gb", 0, 4, Some("a")), want("3g.40gb", 4, 4, Some("b"))],
    );
    let prev = recorded(&o);
    let p = gpu_actions(&o, &g, Some(&prev), &none());
    assert_eq!((p.actions, p.blocked), (vec![], None));
    // The same layout without a record of who had it: every instance changes hands.
    let p = gpu_actions(&o, &g, None, &none());
    assert_eq!(p.actions.iter().filter(|a| a.is_scrub()).count(), 2);
    let mut unscrubbed = prev.clone();
    unscrubbed.instances[1].last_scrub = None;
    let p = gpu_actions(&o, &g, Some(&unscrubbed), &none());
    assert_eq!(
        p.actions,
        [Action::Scrub {
            gpu: 0,
            target: ScrubTarget::Instance(Placement { start: 4, size: 4 }),
            tenant: Some("b".into())
        }]
    );
    // An instance created again since the record (a new MIG device UUID) is not the one handed over.
    let mut recreated = o.clone();
    recreated.instances[0].uuid = Some("MIG-new".into());
    let p = gpu_actions(&recreated, &g, Some(&prev), &none());
    assert_eq!(p.actions.len(), 1, "{:?}", p.actions);
}

#[test]
fn layout_changes_destroy_only_what_must_go_ci_before_gi() {
    let mut o = gpu(0, "H100-80GB", true);
    o.instances = vec![inst("3g.40gb", 0, 4, Some("a")), inst("3g.40gb", 4, 4, Some("b"))];
    let prev = recorded(&o);
    let g = mig_spec(
        0,
        vec![
            want("2g.20gb", 0, 2, Some("a")),
            want("2g.20gb", 2, 2, Some("c")),
            want("3g.40gb", 4, 4, Some("b")),
        ],
    );
    let p = gpu_actions(&o, &g, Some(&prev), &none());
    let text: Vec<String> = p.actions.iter().map(|a| a.to_string()).collect();
    let destroy_ci = format!(
        "destroy compute instance 0 of GPU instance {}",
        o.instances[0].gpu_instance_id
    );
    assert_eq!(
        text,
        [
            destroy_ci.as_str(),
            "destroy 3g.40gb at 0:4",
            "create 2g.20gb at 0:2",
            "create 2g.20gb at 2:2",
            "scrub instance at 0:2",
            "scrub instance at 2:2",
        ]
    );
    assert!(
        matches!(p.actions[2], Action::CreateInstance { profile_id: 14, .. }),
        "profile ID from the driver's list"
    );
}

#[test]
fn processes_in_the_way_block_the_whole_gpu() {
    let mut o = gpu(0, "H100-80GB", true);
    o.instances = vec![inst("3g.40gb", 0, 4, None), inst("3g.40gb", 4, 4, None)];
    o.processes = vec![ProcessStatus {
        pid: 77,
        gpu_instance_id: Some(o.instances[0].gpu_instance_id),
        compute_instance_id: Some(0),
        used_memory_mib: None,
    }];
    let g = mig_spec(0, vec![want("7g.80gb", 0, 8, None)]);
    let p = gpu_actions(&o, &g, None, &none());
    assert!(p.actions.is_empty());
    let b = p.blocked.unwrap();
    assert_eq!(b.reason, GpuReason::Busy);
    assert!(b.message.contains("3g.40gb at 0:4 runs pids 77"), "{}", b.message);

    // A process in an instance that stays, with the same known owner, does not block.
    let g = mig_spec(0, vec![want("3g.40gb", 0, 4, None), want("2g.20gb", 4, 2, None)]);
    let p = gpu_actions(&o, &g, Some(&recorded(&o)), &none());
    assert_eq!(p.blocked, None);
    assert_eq!(
        p.actions.len(),
        2 + 1 + 1,
        "destroy the idle 3g at 4 (CI, GI), create the 2g, scrub it"
    );
}

#[test]
fn mig_mode_changes_wait_for_reset_and_for_idle_gpus() {
    let mut o = gpu(0, "A100-40GB", false);
    let g = mig_spec(0, vec![want("7g.40gb", 0, 8, None)]);
    assert_eq!(
        gpu_actions(&o, &g, None, &none()).actions,
        [Action::SetMigMode { gpu: 0, enable: true }]
    );
    // Pending and idle: calling again activates it (the call resets an idle GPU), unless NVML
    // answered RESET_REQUIRED last time (the previous status says so): then it waits for a reboot.
    o.mig_mode = Some(MigModeStatus {
        current: false,
        pending: true,
    });
    assert_eq!(
        gpu_actions(&o, &g, None, &none()).actions,
        [Action::SetMigMode { gpu: 0, enable: true }]
    );
    let mut prev = o.clone();
    prev.reason = Some(GpuReason::Busy);
    assert_eq!(gpu_actions(&o, &g, Some(&prev), &none()).actions.len(), 1);
    prev.reason = Some(GpuReason::ResetRequired);
    let p = gpu_actions(&o, &g, Some(&prev), &none());
    assert_eq!(p.blocked.unwrap().reason, GpuReason::ResetRequired);
    assert!(p.actions.is_empty());
    o.mig_mode = Some(MigModeStatus {
        current: false,
        pending: false,
    });
    o.processes = vec![ProcessStatus {
        pid: 5,
        ..Default::default()
    }];
    assert_eq!(
        gpu_actions(&o, &g, None, &none()).blocked.unwrap().reason,
        GpuReason::Busy
    );
}

#[test]
fn leaving_mig_destroys_everything_then_disables_it() {
    let mut o = gpu(0, "H100-80GB", true);
    o.instances = vec![inst("7g.80gb", 0, 8, None)];
    let p = gpu_actions(&o, &whole(0, Mode::Exclusive, &["a"]), None, &none());
    assert_eq!(
        p.actions,
        [
            Action::DestroyComputeInstance {
                gpu: 0,
                gpu_instance_id: o.instances[0].gpu_instance_id,
                compute_instance_id: 0
            },
            Action::DestroyGpuInstance {
                gpu: 0,
                gpu_instance_id: o.instances[0].gpu_instance_id,
                profile: "7g.80gb".into(),
                placement: Placement { start: 0, size: 8 }
            },
            Action::SetMigMode { gpu: 0, enable: false },
        ]
    );
}

#[test]
fn a_gpu_instance_without_compute_instance_is_finished_not_recreated() {
    let mut o = gpu(0, "H100-80GB", true);
    let mut half = inst("4g.40gb", 0, 4, None);
    half.compute_instance_id = None;
    o.instances = vec![half];
    let p = gpu_actions(&o, &mig_spec(0, vec![want("4g.40gb", 0, 4, None)]), None, &none());
    assert_eq!(
        p.nvml_actions().cloned().collect::<Vec<_>>(),
        [Action::CreateComputeInstance {
            gpu: 0,
            gpu_instance_id: o.instances[0].gpu_instance_id
        }]
    );
    assert!(p.notes[0].contains("no compute instance"));
}

#[test]
fn invalid_layouts_and_unknown_gpus_are_refused_by_name() {
    let o = gpu(0, "H100-80GB", true);
    let bad = [
        (vec![want("3g.20gb", 0, 4, None)], "profile \"3g.20gb\" is not offered"),
        (vec![want("3g.40gb", 2, 4, None)], "cannot be placed at 2:4"),
        (
            vec![want("4g.40gb", 0, 4, None), want("2g.20gb", 2, 2, None)],
            "overlaps",
        ),
        (
            vec![
                want("4g.40gb", 0, 4, None),
                want("3g.40gb", 4, 4, None),
                want("1g.10gb", 0, 1, None),
            ],
            "overlaps",
        ),
    ];
    for (layout, msg) in bad {
        let b = gpu_actions(&o, &mig_spec(0, layout), None, &none()).blocked.unwrap();
        assert_eq!(b.reason, GpuReason::InvalidSpec);
        assert!(b.message.contains(msg), "{}", b.message);
    }
    let status = node(vec![o]);
    let spec = node_spec(vec![whole(4, Mode::Exclusive, &[])]);
    assert_eq!(
        node_actions(&status, &spec, None, &none())[0]
            .blocked
            .as_ref()
            .unwrap()
            .reason,
        GpuReason::NotFound
    );
}

#[test]
fn scrub_decisions_follow_the_hands_not_the_runs() {
    let mut o = gpu(0, "H100-80GB", false);
    o.compute_mode = Some("ExclusiveProcess".into());
    let spec = |t: &str| shared(Mode::Mps, &[t], ScrubMemory::OnTenantChange);
    let mut prev = handed(&o, Mode::Mps, &["a"]);
    // Same hands: nothing. New hands: a scrub. Unknown past, or another GPU at this index, or
    // no record of a finished hand-over: a change of hands, even with nothing else to change.
    assert!(gpu_actions(&o, &spec("a"), Some(&prev), &none()).actions.is_empty());
    let scrub_a = [Action::Scrub {
        gpu: 0,
        target: ScrubTarget::Gpu,
        tenant: Some("a".into()),
    }];
    assert_eq!(gpu_actions(&o, &spec("a"), None, &none()).actions, scrub_a);
    let other = GpuStatus {
        uuid: "GPU-other".into(),
        ..prev.clone()
    };
    assert_eq!(gpu_actions(&o, &spec("a"), Some(&other), &none()).actions, scrub_a);
    let unrecorded = GpuStatus {
        last_scrub: None,
        ..prev.clone()
    };
    assert_eq!(gpu_actions(&o, &spec("a"), Some(&unrecorded), &none()).actions, scrub_a);
    assert_eq!(
        gpu_actions(&o, &spec("b"), Some(&prev), &none()).actions,
        [Action::Scrub {
            gpu: 0,
            target: ScrubTarget::Gpu,
            tenant: Some("b".into())
        }]
    );
    // A scrub done earlier in the run is not repeated; a failed one is retried.
    let done = RunMemory {
        scrubbed: vec![(0, ScrubTarget::Gpu)],
        touched: vec![],
    };
    assert!(gpu_actions(&o, &spec("b"), Some(&prev), &done).actions.is_empty());
    prev.applied_tenants = vec!["b".into()];
    prev.last_scrub = Some(ScrubRecord {
        result: crate::api::ScrubResult::Failed,
        ..Default::default()
    });
    assert_eq!(gpu_actions(&o, &spec("b"), Some(&prev), &none()).actions.len(), 1);
    // Never: no scrub, whatever the hands.
    let never = spec("c").with_scrub(ScrubMemory::Never);
    assert!(gpu_actions(&o, &never, Some(&prev), &none()).actions.is_empty());
    // Old tenant's processes still there: busy, not scrubbed under them.
    o.processes = running(&[9]);
    prev.last_scrub = None;
    assert_eq!(
        gpu_actions(&o, &spec("c"), Some(&prev), &none())
            .blocked
            .unwrap()
            .reason,
        GpuReason::Busy
    );
}

/// The shared modes, each with the compute mode it runs in.
const SHARED_MODES: [(Mode, &str); 2] = [(Mode::Mps, "ExclusiveProcess"), (Mode::TimeSlicing, "Default")];

/// GPU 0 in `mode` (its compute mode `cm`), a process of tenant `a` running, and the record of
/// handing it to `a`.
fn busy_shared_gpu(mode: Mode, cm: &str) -> (GpuStatus, GpuStatus) {
    let mut o = gpu(0, "H100-80GB", false);
    o.compute_mode = Some(cm.into());
    o.processes = running(&[42]);
    let prev = handed(&o, mode, &["a"]);
    (o, prev)
}

/// Tenants joining a shared GPU whose tenants stay (docs/design.md#scrub-on-change-of-hands, `core/src/handover.rs`): no
/// scrub and no wait for the running tenant's processes, in either shared mode and under every
/// scrub policy. A tenant leaving, an exclusive GPU, a mode change or a record the agent cannot
/// trust (another GPU, no finished hand-over, no record at all) still scrub, and wait while
/// processes run.
#[test]
fn a_tenant_joining_a_shared_gpu_is_no_change_of_hands() {
    for (mode, cm) in SHARED_MODES {
        let (o, prev) = busy_shared_gpu(mode, cm);
        for scrub in [ScrubMemory::OnTenantChange, ScrubMemory::Always] {
            let p = gpu_actions(&o, &shared(mode, &["a", "b"], scrub), Some(&prev), &none());
            assert!(p.actions.is_empty() && p.blocked.is_none(), "{mode}: b joins a: {p:?}");
            let p = gpu_actions(&o, &shared(mode, &["a", "b", "c"], scrub), Some(&prev), &none());
            assert!(
                p.actions.is_empty() && p.blocked.is_none(),
                "{mode}: b and c join a: {p:?}"
            );
        }
    }
}

/// a leaves while b stays, or b comes as a goes: a change of hands, and a's processes run.
#[test]
fn a_tenant_leaving_a_shared_gpu_is_a_change_of_hands() {
    for (mode, cm) in SHARED_MODES {
        let (o, prev) = busy_shared_gpu(mode, cm);
        let only_b = shared(mode, &["b"], ScrubMemory::OnTenantChange);
        let both = handed(&o, mode, &["a", "b"]);
        assert_eq!(
            blocked_by(gpu_actions(&o, &only_b, Some(&both), &none())),
            Some(GpuReason::Busy)
        );
        assert_eq!(
            blocked_by(gpu_actions(&o, &only_b, Some(&prev), &none())),
            Some(GpuReason::Busy)
        );
    }
}

/// Records of `prev`'s GPU that prove no hand-over to its tenants in `mode`: none, another GPU at
/// this index, a failed or missing scrub record, a GPU handed to nobody, another mode before.
fn untrusted(prev: &GpuStatus, mode: Mode) -> Vec<Option<GpuStatus>> {
    let other_mode = if mode == Mode::Mps {
        Mode::TimeSlicing
    } else {
        Mode::Mps
    };
    let failed = ScrubRecord {
        result: ScrubResult::Failed,
        ..Default::default()
    };
    vec![
        None,
        Some(GpuStatus {
            uuid: "GPU-other".into(),
            ..prev.clone()
        }),
        Some(GpuStatus {
            last_scrub: None,
            ..prev.clone()
        }),
        Some(GpuStatus {
            last_scrub: Some(failed),
            ..prev.clone()
        }),
        Some(GpuStatus {
            applied_tenants: vec![],
            ..prev.clone()
        }),
        Some(GpuStatus {
            applied_mode: Some(other_mode),
            ..prev.clone()
        }),
    ]
}

/// With nothing to trust, a join is a change of hands: it waits for the running processes, and,
/// idle, the joining set's scrub comes first.
#[test]
fn a_join_without_a_trusted_record_is_a_change_of_hands() {
    for (mode, cm) in SHARED_MODES {
        let (mut o, prev) = busy_shared_gpu(mode, cm);
        let spec = shared(mode, &["a", "b"], ScrubMemory::OnTenantChange);
        for p in &untrusted(&prev, mode) {
            let plan = gpu_actions(&o, &spec, p.as_ref(), &none());
            assert_eq!(blocked_by(plan), Some(GpuReason::Busy), "{mode}: {p:?}");
        }
        o.processes.clear();
        let plan = gpu_actions(&o, &spec, None, &none());
        assert!(plan.actions.iter().any(|a| a.is_scrub()), "{mode}: {plan:?}");
    }
}

/// An exclusive GPU is never joined: a second tenant there is a change of hands.
#[test]
fn an_exclusive_gpu_is_never_joined() {
    let mut o = gpu(0, "H100-80GB", false);
    o.processes = running(&[42]);
    let prev = handed(&o, Mode::Exclusive, &["a"]);
    let p = gpu_actions(&o, &whole(0, Mode::Exclusive, &["a", "b"]), Some(&prev), &none());
    assert_eq!(blocked_by(p), Some(GpuReason::Busy));
}

/// An instance created earlier in this run (round 1) and found with a process in round 2 (the
/// device plugin, or anyone, got it first): not scrubbed under that process, Busy.
#[test]
fn an_instance_created_in_this_run_is_scrubbed_only_when_idle() {
    let mut o = gpu(0, "H100-80GB", true);
    o.instances = vec![inst("3g.40gb", 0, 4, None)];
    let g = mig_spec(0, vec![want("3g.40gb", 0, 4, Some("a"))]);
    let done = RunMemory {
        scrubbed: vec![],
        touched: vec![(0, ScrubTarget::Instance(Placement { start: 0, size: 4 }))],
    };
    let p = gpu_actions(&o, &g, None, &done);
    assert_eq!(p.actions.len(), 1, "idle: scrubbed");
    o.processes = vec![ProcessStatus {
        pid: 66,
        gpu_instance_id: Some(o.instances[0].gpu_instance_id),
        compute_instance_id: Some(0),
        used_memory_mib: None,
    }];
    let p = gpu_actions(&o, &g, None, &done);
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    let b = p.blocked.unwrap();
    assert_eq!(b.reason, GpuReason::Busy);
    assert!(b.message.contains("pids 66"), "{}", b.message);
}
