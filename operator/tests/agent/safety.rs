//! Fail closed (docs/design.md#scrub-on-change-of-hands): where the agent does not know something (a previous owner, a GPU
//! it cannot read, a setting it could not send) it scrubs, does nothing, or reports not ready with
//! the reason. Memory hand-overs are judged by the simulator's dirty-memory markers, not by what
//! the agent says about them.

use crate::support::Sim;
use crate::{H100, gpus, mig_gpu};
use gpu_tenancy::api::{GpuNodeStatus, ScrubResult};
use nvidia_ml_sim::ctl;

fn exclusive(index: u32, tenant: &str, scrub: &str) -> String {
    format!("  - {{index: {index}, mode: Exclusive, tenants: [{tenant}], scrub: {scrub}}}\n")
}

/// Scrub entries the simulator logged for a GPU (`None`) or the instance with this GI id.
fn scrubs_of(sim: &Sim, gpu: u32, gi: Option<u32>) -> usize {
    sim.scrubs()
        .iter()
        .filter(|s| s.gpu == gpu && s.gpu_instance == gi)
        .count()
}

/// Tenant `alpha` left data on GPU 0 (whole) and in GPU 1's only instance; the agent is then
/// asked to hand both to `beta` without knowing who had them before.
fn dirty_node(name: &str) -> (Sim, String) {
    let sim = Sim::new(name, &[r#"{model: "NVIDIA H100 80GB HBM3", count: 2}"#]);
    let spec = gpus(&[
        exclusive(0, "beta", "OnTenantChange"),
        mig_gpu(1, &[("7g.80gb", 0, 8, Some("beta"))]),
    ]);
    // Lay the node out (MIG on GPU 1, its instance created) the way a previous agent left it.
    let run = sim.apply_args(&spec, &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stdout());
    ctl::set_dirty(&sim.paths, 0, None, "alpha").unwrap();
    ctl::set_dirty(&sim.paths, 1, Some(0), "alpha").unwrap();
    (sim, spec)
}

fn assert_scrubbed_for_beta(sim: &Sim, st: &GpuNodeStatus, before: (usize, usize)) {
    assert!(sim.leaks(st).is_empty(), "{:?}", sim.leaks(st));
    let gi = sim.state().gpus[1].gis[0].id;
    assert_eq!(
        (scrubs_of(sim, 0, None), scrubs_of(sim, 1, Some(gi))),
        (before.0 + 1, before.1 + 1),
        "both scrubbed once more"
    );
    let rec = st.gpus[0].last_scrub.clone().expect("GPU 0 records its scrub");
    assert_eq!(
        (rec.result, rec.tenant.as_deref()),
        (ScrubResult::Scrubbed, Some("beta"))
    );
    assert_eq!(
        (st.gpus[0].applied, st.gpus[0].applied_tenants.clone()),
        (Some(true), vec!["beta".into()])
    );
    let inst = &st.gpus[1].instances[0];
    let rec = inst.last_scrub.clone().expect("the instance records its scrub");
    assert_eq!(
        (rec.result, rec.tenant.as_deref()),
        (ScrubResult::Scrubbed, Some("beta"))
    );
    assert_eq!(inst.tenant.as_deref(), Some("beta"));
}

fn counts(sim: &Sim) -> (usize, usize) {
    let gi = sim.state().gpus[1].gis[0].id;
    (scrubs_of(sim, 0, None), scrubs_of(sim, 1, Some(gi)))
}

#[test]
fn without_a_status_the_previous_owner_is_unknown_and_everything_is_scrubbed() {
    let (sim, spec) = dirty_node("unknown-nostatus");
    let before = counts(&sim);
    let run = sim.apply_args(&spec, &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stdout());
    assert_scrubbed_for_beta(&sim, run.status(), before);
}

#[test]
fn a_missing_unreadable_or_foreign_status_is_an_unknown_owner() {
    let (sim, spec) = dirty_node("unknown-files");
    let status = sim.file("status.yaml");
    let arg = status.to_str().unwrap().to_string();

    // Missing file.
    let before = counts(&sim);
    let run = sim.apply_args(&spec, &["--status", &arg]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_scrubbed_for_beta(&sim, run.status(), before);

    // Unreadable file: said on stderr, and treated as knowing nothing.
    ctl::set_dirty(&sim.paths, 0, None, "alpha").unwrap();
    ctl::set_dirty(&sim.paths, 1, Some(0), "alpha").unwrap();
    std::fs::write(&status, "gpus: [this is not a status\n").unwrap();
    let before = counts(&sim);
    let run = sim.apply_args(&spec, &["--status", &arg]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert!(run.stderr().contains("previous owner"), "{}", run.stderr());
    assert_scrubbed_for_beta(&sim, run.status(), before);

    // A status without these GPUs (a GpuNode deleted and created again).
    ctl::set_dirty(&sim.paths, 0, None, "alpha").unwrap();
    ctl::set_dirty(&sim.paths, 1, Some(0), "alpha").unwrap();
    std::fs::write(&status, "gpuCount: 2\n").unwrap();
    let before = counts(&sim);
    let run = sim.apply_args(&spec, &["--status", &arg]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_scrubbed_for_beta(&sim, run.status(), before);

    // A status as `agent discover` prints it: GPUs and instances, but nothing applied.
    ctl::set_dirty(&sim.paths, 0, None, "alpha").unwrap();
    ctl::set_dirty(&sim.paths, 1, Some(0), "alpha").unwrap();
    let discovered = serde_json::to_string(&sim.discover()).unwrap();
    std::fs::write(&status, discovered).unwrap();
    let before = counts(&sim);
    let run = sim.apply_args(&spec, &["--status", &arg]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_scrubbed_for_beta(&sim, run.status(), before);
}

#[test]
fn an_unknown_owner_is_never_the_same_tenant_but_never_means_never() {
    let (sim, _) = dirty_node("unknown-policies");
    // Always: scrubbed (there is nothing to compare with).
    let always = gpus(&[exclusive(0, "beta", "Always")]);
    let before = scrubs_of(&sim, 0, None);
    let run = sim.apply_args(&always, &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stdout());
    assert_eq!(scrubs_of(&sim, 0, None), before + 1);

    // Never: the tenant's policy skips the scrub, and the status says it was skipped for beta.
    ctl::set_dirty(&sim.paths, 0, None, "alpha").unwrap();
    let never = gpus(&[exclusive(0, "beta", "Never")]);
    let run = sim.apply_args(&never, &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stdout());
    assert_eq!(scrubs_of(&sim, 0, None), before + 1);
    let rec = run.status().gpus[0].last_scrub.clone().unwrap();
    assert_eq!(
        (rec.result, rec.tenant.as_deref()),
        (ScrubResult::Skipped, Some("beta"))
    );
}

#[test]
fn an_unknown_owner_with_processes_running_is_busy_not_handed_over() {
    let sim = Sim::new("unknown-busy", &[H100]);
    ctl::attach(
        &sim.paths,
        &ctl::Attach {
            gpu: 0,
            pid: 777,
            tenant: Some("alpha".into()),
            used_mib: 100,
            ..Default::default()
        },
    )
    .unwrap();
    let run = sim.apply_args(&gpus(&[exclusive(0, "beta", "OnTenantChange")]), &[]);
    assert_eq!(run.code(), Some(1), "{}", run.stdout());
    let g = &run.status().gpus[0];
    assert_eq!((g.applied, g.reason.map(|r| r.as_str())), (Some(false), Some("Busy")));
    assert!(
        g.applied_tenants.is_empty(),
        "not handed to beta: {:?}",
        g.applied_tenants
    );
    assert_eq!(sim.scrubs().len(), 0, "never scrubbed under a running process");
}

/// A hand-over the agent has not scrubbed for yet (here: a dry run) is reported as such: the GPU
/// not applied with reason `ScrubPending`, its old tenants kept, the node not Ready.
#[test]
fn a_hand_over_waiting_for_its_scrub_is_scrub_pending_and_not_ready() {
    let sim = Sim::new("scrubpending", &[H100]);
    assert_eq!(
        sim.apply(&gpus(&[exclusive(0, "alpha", "OnTenantChange")])).code(),
        Some(0)
    );
    sim.use_by(0, None, "alpha");
    let run = sim.apply_with(
        &gpus(&[exclusive(0, "beta", "OnTenantChange")]),
        &["--no-mps", "--dry-run"],
    );
    assert_eq!(run.code(), Some(1), "{}", run.stdout());
    let g = &run.status().gpus[0];
    assert_eq!(
        (g.applied, g.reason.map(|r| r.as_str())),
        (Some(false), Some("ScrubPending"))
    );
    assert_eq!(g.applied_tenants, ["alpha"]);
    let ready = run.status().conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(ready.status, "False");
    assert!(ready.message.contains("GPU 0 (ScrubPending)"), "{}", ready.message);
}

/// A failed scrub of one MIG instance: the GPU reports `ScrubFailed` with the error, the instance
/// keeps its old tenant, and the next apply scrubs and hands it over.
#[test]
fn a_failed_instance_scrub_keeps_the_old_tenant_until_a_scrub_succeeds() {
    let sim = Sim::new("scrubfail-mig", &[H100]);
    let spec = |t: &str| {
        gpus(&[mig_gpu(
            0,
            &[("3g.40gb", 0, 4, Some(t)), ("3g.40gb", 4, 4, Some("beta"))],
        )])
    };
    assert_eq!(sim.apply(&spec("alpha")).code(), Some(0));
    sim.use_by(0, Some(0), "alpha");
    ctl::fail(&sim.paths, "cuMemsetD8_v2", 1, "999", 1).unwrap();
    let run = sim.apply(&spec("gamma"));
    assert_eq!(run.code(), Some(1), "{}", run.stdout());
    let g = &run.status().gpus[0];
    assert_eq!(
        (g.applied, g.reason.map(|r| r.as_str())),
        (Some(false), Some("ScrubFailed"))
    );
    assert!(
        g.message.as_deref().unwrap().contains("scrub instance at 0:4 failed"),
        "{:?}",
        g.message
    );
    let i0 = g.instances.iter().find(|i| i.placement.start == 0).unwrap();
    assert_eq!(i0.tenant.as_deref(), Some("alpha"));
    assert_eq!(i0.last_scrub.as_ref().unwrap().result, ScrubResult::Failed);
    assert!(sim.leaks(run.status()).is_empty(), "{:?}", sim.leaks(run.status()));

    let run = sim.apply(&spec("gamma"));
    assert_eq!(run.code(), Some(0), "{}", run.stdout());
    let i0 = run.status().gpus[0]
        .instances
        .iter()
        .find(|i| i.placement.start == 0)
        .cloned()
        .unwrap();
    assert_eq!(i0.tenant.as_deref(), Some("gamma"));
    assert_eq!(i0.last_scrub.unwrap().result, ScrubResult::Scrubbed);
    assert!(sim.leaks(run.status()).is_empty(), "{:?}", sim.leaks(run.status()));
}

/// Any NVML error on a query about one GPU: that GPU is reported `Unreadable` with the error, its
/// last known record is kept, nothing is done to it; the other GPU carries on; once readable again
/// it converges without handing memory over.
#[test]
fn a_gpu_nvml_cannot_read_is_unreadable_left_alone_and_the_others_carry_on() {
    let a = |i| mig_gpu(i, &[("3g.40gb", 0, 4, Some("alpha")), ("3g.40gb", 4, 4, Some("beta"))]);
    let b = |i| mig_gpu(i, &[("7g.80gb", 0, 8, Some("gamma"))]);
    let whole = |i, mode: &str| format!("  - {{index: {i}, mode: {mode}, tenants: [gamma]}}\n");
    let mig_queries = [
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetComputeMode",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetGpuInstances",
        "nvmlGpuInstanceGetComputeInstances",
        "nvmlDeviceGetMigDeviceHandleByIndex",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetHandleByIndex_v2",
    ];
    let cases = mig_queries.iter().map(|c| (*c, "MIG")).chain([
        ("nvmlDeviceGetMigMode", "Exclusive"),
        ("nvmlDeviceGetComputeMode", "MPS"),
    ]);
    for (n, (call, target)) in cases.enumerate() {
        let sim = Sim::new(
            &format!("unreadable-{n}-{target}"),
            &[r#"{model: "NVIDIA H100 80GB HBM3", count: 2}"#],
        );
        let setup = sim.apply(&gpus(&[a(0), a(1)]));
        assert_eq!(
            setup.code(),
            Some(0),
            "{call} {target}: the setup apply: {}",
            setup.stdout()
        );
        sim.use_by(0, Some(0), "alpha");
        let want = |i| if target == "MIG" { b(i) } else { whole(i, target) };
        let spec = gpus(&[want(0), want(1)]);
        ctl::fail_on(&sim.paths, call, Some(0), 1, "GPU_IS_LOST", 100_000).unwrap();
        let before = sim.mutations();
        let scrubs = sim.scrubs().len();
        let run = sim.apply(&spec);
        assert_eq!(run.code(), Some(1), "{call} {target}: {}", run.stdout());
        let g0 = &run.status().gpus[0];
        assert_eq!(
            (g0.applied, g0.reason.map(|r| r.as_str())),
            (Some(false), Some("Unreadable")),
            "{call} {target}: {:?}",
            g0.message
        );
        let msg = g0.message.as_deref().unwrap_or_default();
        assert!(
            msg.contains(call) && msg.contains("fell off the bus"),
            "{call} {target}: {msg}"
        );
        let touched: Vec<_> = sim.log_since(before).into_iter().filter(|e| e.gpu == 0).collect();
        assert!(touched.is_empty(), "{call} {target}: GPU 0 was changed: {touched:?}");
        assert!(
            sim.scrubs()[scrubs..].iter().all(|s| s.gpu != 0),
            "{call} {target}: GPU 0 was scrubbed"
        );
        let tenants: Vec<Option<&str>> = g0.instances.iter().map(|i| i.tenant.as_deref()).collect();
        assert_eq!(
            tenants,
            [Some("alpha"), Some("beta")],
            "{call} {target}: last known record kept"
        );
        let g1 = &run.status().gpus[1];
        assert_eq!(g1.applied, Some(true), "{call} {target}: {:?}", g1.message);
        let ready = run.status().conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert!(ready.message.contains("GPU 0 (Unreadable)"), "{}", ready.message);
        let drifted = run.status().conditions.iter().find(|c| c.type_ == "Drifted").unwrap();
        assert_eq!(drifted.status, "False", "unreadable is not drift: {}", drifted.message);

        ctl::clear_faults(&sim.paths).unwrap();
        let run = sim.apply(&spec);
        assert_eq!(run.code(), Some(0), "{call} {target}: {}", run.stdout());
        assert!(sim.leaks(run.status()).is_empty(), "{:?}", sim.leaks(run.status()));
    }
}

fn time_sliced(tenants: &[&str]) -> String {
    gpus(&[format!(
        "  - {{index: 0, mode: TimeSlicing, timeSlicing: {{replicas: 4}}, tenants: [{}], scrub: OnTenantChange}}\n",
        tenants.join(", ")
    )])
}

/// A tenant joining a shared GPU while its tenant's process runs (`core/src/handover.rs`): applied
/// at once, no scrub, no wait. The running tenant leaving is a change of hands: Busy until its
/// process ends. And without the agent's own record of the GPU, the same join is an unknown owner.
#[test]
fn a_tenant_joins_a_shared_gpu_without_a_scrub_but_a_leaving_one_waits() {
    let sim = Sim::new("join-shared", &[H100]);
    assert_eq!(sim.apply(&time_sliced(&["alpha"])).code(), Some(0));
    let scrubbed = sim.scrubs().len();
    ctl::attach(
        &sim.paths,
        &ctl::Attach {
            gpu: 0,
            pid: 777,
            tenant: Some("alpha".into()),
            used_mib: 100,
            ..Default::default()
        },
    )
    .unwrap();
    // Without a record (no --status): who had the GPU is unknown, so beta's join waits.
    let run = sim.apply_args(&time_sliced(&["alpha", "beta"]), &["--no-mps"]);
    assert_eq!(run.code(), Some(1), "{}", run.stdout());
    assert_eq!(run.status().gpus[0].reason.map(|r| r.as_str()), Some("Busy"));
    // With it: beta joins alpha at once.
    let run = sim.apply(&time_sliced(&["alpha", "beta"]));
    assert_eq!(run.code(), Some(0), "{}", run.stdout());
    let g = &run.status().gpus[0];
    assert_eq!((g.applied, g.reason), (Some(true), None));
    assert_eq!(g.applied_tenants, ["alpha", "beta"]);
    assert_eq!(sim.scrubs().len(), scrubbed, "no scrub for a join");
    // alpha leaves while its process runs: a change of hands, which waits.
    let run = sim.apply(&time_sliced(&["beta"]));
    assert_eq!(run.code(), Some(1), "{}", run.stdout());
    let g = &run.status().gpus[0];
    assert_eq!((g.applied, g.reason.map(|r| r.as_str())), (Some(false), Some("Busy")));
    assert_eq!(g.applied_tenants, ["alpha", "beta"]);
    ctl::detach(&sim.paths, 777).unwrap();
    let run = sim.apply(&time_sliced(&["beta"]));
    assert_eq!(run.code(), Some(0), "{}", run.stdout());
    assert_eq!(sim.scrubs().len(), scrubbed + 1, "alpha's leaving is scrubbed");
    assert_eq!(run.status().gpus[0].applied_tenants, ["beta"]);
}
