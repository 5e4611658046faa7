//! The agent's GPU layer end to end: the `gpu-tenancy` binary against the simulated NVML/CUDA
//! library (e2e/nvml-sim), on A100-40GB, H100 and H200. NVML mutations are counted from the
//! simulator's log; memory hand-overs are checked against its dirty-memory markers.

mod layout;
mod mig_mode;
mod mps;
mod safety;
mod scrub_verify;
mod support;

use gpu_tenancy::mig::model_by_name;
use support::{Sim, calls, layout};

const A100: &str = r#"{pciDeviceId: "0x20B010DE", count: 1}"#;
const H100: &str = r#"{model: "NVIDIA H100 80GB HBM3", count: 1}"#;
const H200: &str = r#"{pciDeviceId: "0x233510DE", count: 1}"#;

fn mig_gpu(index: u32, instances: &[(&str, u32, u32, Option<&str>)]) -> String {
    let mut s = format!("  - index: {index}\n    mode: MIG\n    migInstances:\n");
    for (p, start, size, tenant) in instances {
        let t = tenant.map(|t| format!(", tenant: {t}")).unwrap_or_default();
        s += &format!("    - {{profile: {p}, placement: {{start: {start}, size: {size}}}{t}}}\n");
    }
    s
}

fn gpus(parts: &[String]) -> String {
    format!("  gpus:\n{}", parts.concat())
}

#[test]
fn discover_reports_what_the_driver_reports() {
    let sim = Sim::new("discover", &[A100, H100, H200]);
    let s = sim.discover();
    assert_eq!(s.gpu_count, Some(3));
    assert_eq!(s.driver.as_ref().unwrap().cuda_version, "12.4");
    for (g, key) in s.gpus.iter().zip(["A100-40GB", "H100-80GB", "H200"]) {
        let model = model_by_name(key).unwrap();
        assert_eq!(g.memory_mib, model.memory_mib);
        assert!(g.uuid.starts_with("GPU-"));
        assert_eq!(g.mig_mode.map(|m| (m.current, m.pending)), Some((false, false)));
        assert_eq!(g.profiles.len(), 7, "{key}");
        for p in model.profiles() {
            let got = g
                .profiles
                .iter()
                .find(|x| x.name == p.name)
                .unwrap_or_else(|| panic!("{key} lacks {}", p.name));
            assert_eq!(got.id, p.info().profile_id, "{key} {}", p.name);
            let starts: Vec<u32> = got.placements.iter().map(|x| x.start).collect();
            assert_eq!(starts, p.info().starts, "{key} {}", p.name);
            assert!(got.placements.iter().all(|x| x.size == p.info().memory_slices));
        }
    }
}

#[test]
fn a_missing_nvml_library_is_one_line_and_exit_2() {
    let sim = Sim::new("nolib", &[H100]);
    let out = sim
        .command()
        .args(["agent", "discover", "--nvml-lib", "/nonexistent/libnvidia-ml.so.1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("/nonexistent/libnvidia-ml.so.1") && err.contains("cannot load"),
        "{err}"
    );
}

#[test]
fn bad_spec_files_and_unknown_gpus_are_named() {
    let sim = Sim::new("badspec", &[H100]);
    let run = sim.apply("  gpus:\n  - index: 0\n    mode: Bogus\n");
    assert_eq!(run.code(), Some(2));
    assert_eq!(run.stderr().lines().count(), 1, "{}", run.stderr());
    assert!(
        run.stderr().contains("gpunode.yaml") && run.stderr().contains("Bogus"),
        "{}",
        run.stderr()
    );

    let run = sim.apply("  gpus:\n  - {index: 3, mode: Exclusive}\n");
    assert_eq!(run.code(), Some(1));
    let g = run.status().gpus.iter().find(|g| g.index == 3).unwrap();
    assert_eq!(g.reason.map(|r| r.as_str()), Some("NotFound"));
    assert!(g.message.as_deref().unwrap().contains("no GPU 3"));
    assert_eq!(sim.mutations(), 0);

    let run = sim.apply(&gpus(&[mig_gpu(0, &[("3g.40gb", 2, 4, None)])]));
    assert_eq!(run.code(), Some(1));
    assert_eq!(run.status().gpus[0].reason.map(|r| r.as_str()), Some("InvalidSpec"));
    assert!(
        run.status().gpus[0]
            .message
            .as_deref()
            .unwrap()
            .contains("cannot be placed at 2:4")
    );
    assert_eq!(sim.mutations(), 0);
}

/// Per model: the first apply makes exactly mode + 2 per instance mutations, a second none.
#[test]
fn first_apply_is_the_minimal_diff_and_a_second_is_a_no_op() {
    for (cfg, p3, p2, p1) in [
        (H100, "3g.40gb", "2g.20gb", "1g.10gb"),
        (H200, "3g.71gb", "2g.35gb", "1g.18gb"),
    ] {
        let sim = Sim::new(&format!("first-{p3}"), &[cfg]);
        let spec = gpus(&[mig_gpu(
            0,
            &[(p3, 0, 4, Some("alpha")), (p2, 4, 2, Some("beta")), (p1, 6, 1, None)],
        )]);
        let run = sim.apply(&spec);
        assert_eq!(run.code(), Some(0), "{}", run.stderr());
        let log = sim.log_since(0);
        assert_eq!(log.len(), 1 + 3 * 2, "{:?}", calls(&log));
        assert_eq!(
            layout(run.status(), 0),
            [format!("{p3}@0:4"), format!("{p2}@4:2"), format!("{p1}@6:1")]
        );
        assert_eq!(sim.scrubs().len(), 3, "new instances are scrubbed before use");
        let before = sim.mutations();
        let again = sim.apply(&spec);
        assert_eq!(again.code(), Some(0));
        assert_eq!(
            sim.mutations(),
            before,
            "second apply mutated: {:?}",
            calls(&sim.log_since(before))
        );
        assert_eq!(sim.scrubs().len(), 3, "same hands: no scrub");
    }
}

#[test]
fn only_the_changed_gpu_is_touched_and_kept_instances_stay() {
    let sim = Sim::new("minimal", &[r#"{model: "NVIDIA H100 80GB HBM3", count: 3}"#]);
    let a = [("3g.40gb", 0, 4, Some("alpha")), ("3g.40gb", 4, 4, Some("beta"))];
    let spec = gpus(&[mig_gpu(0, &a), mig_gpu(1, &a), mig_gpu(2, &a)]);
    assert_eq!(sim.apply(&spec).code(), Some(0));
    let ids_before: Vec<u32> = sim.discover().gpus[1]
        .instances
        .iter()
        .map(|i| i.gpu_instance_id)
        .collect();
    let before = sim.mutations();
    let b = [
        ("2g.20gb", 0, 2, Some("alpha")),
        ("2g.20gb", 2, 2, Some("gamma")),
        ("3g.40gb", 4, 4, Some("beta")),
    ];
    let run = sim.apply(&gpus(&[mig_gpu(0, &a), mig_gpu(1, &b), mig_gpu(2, &a)]));
    assert_eq!(run.code(), Some(0), "{}", run.stdout());
    let log = sim.log_since(before);
    assert_eq!(
        calls(&log),
        [
            (1, "nvmlComputeInstanceDestroy"),
            (1, "nvmlGpuInstanceDestroy"),
            (1, "nvmlDeviceCreateGpuInstanceWithPlacement"),
            (1, "nvmlGpuInstanceCreateComputeInstance"),
            (1, "nvmlDeviceCreateGpuInstanceWithPlacement"),
            (1, "nvmlGpuInstanceCreateComputeInstance"),
        ]
    );
    let after = sim.discover();
    let kept = after.gpus[1].instances.iter().find(|i| i.placement.start == 4).unwrap();
    assert!(
        ids_before.contains(&kept.gpu_instance_id),
        "the 3g at 4:4 must be the same instance"
    );
    assert!(sim.leaks(run.status()).is_empty(), "{:?}", sim.leaks(run.status()));
}

#[test]
fn a_busy_gpu_is_left_alone_reported_and_finished_later() {
    let sim = Sim::new("busy", &[r#"{model: "NVIDIA H100 80GB HBM3", count: 2}"#]);
    let a = [("3g.40gb", 0, 4, Some("alpha")), ("3g.40gb", 4, 4, Some("beta"))];
    assert_eq!(sim.apply(&gpus(&[mig_gpu(0, &a), mig_gpu(1, &a)])).code(), Some(0));
    nvidia_ml_sim::ctl::attach(
        &sim.paths,
        &nvidia_ml_sim::ctl::Attach {
            gpu: 0,
            placement_start: Some(0),
            pid: 4242,
            tenant: Some("alpha".into()),
            used_mib: 100,
            ..Default::default()
        },
    )
    .unwrap();
    let b = [("7g.80gb", 0, 8, Some("gamma"))];
    let before = sim.mutations();
    let run = sim.apply(&gpus(&[mig_gpu(0, &b), mig_gpu(1, &b)]));
    assert_eq!(run.code(), Some(1));
    let g0 = &run.status().gpus[0];
    assert_eq!((g0.applied, g0.reason.map(|r| r.as_str())), (Some(false), Some("Busy")));
    assert!(g0.message.as_deref().unwrap().contains("4242"), "{:?}", g0.message);
    assert_eq!(run.status().gpus[1].applied, Some(true));
    assert!(
        sim.log_since(before).iter().all(|e| e.gpu == 1),
        "GPU 0 was touched: {:?}",
        calls(&sim.log_since(before))
    );
    assert_eq!(layout(run.status(), 0), ["3g.40gb@0:4", "3g.40gb@4:4"]);

    nvidia_ml_sim::ctl::detach(&sim.paths, 4242).unwrap();
    let run = sim.apply(&gpus(&[mig_gpu(0, &b), mig_gpu(1, &b)]));
    assert_eq!(run.code(), Some(0), "{}", run.stdout());
    assert_eq!(layout(run.status(), 0), ["7g.80gb@0:8"]);
    assert!(sim.leaks(run.status()).is_empty(), "{:?}", sim.leaks(run.status()));
}

/// Kills the agent right after each mutation of a reconfiguration in turn; the next apply must
/// converge to the spec, hand no memory over unscrubbed, and a third apply must do nothing.
#[test]
fn a_crash_at_any_mutation_converges_on_the_next_apply() {
    let a = gpus(&[
        mig_gpu(0, &[("3g.40gb", 0, 4, Some("alpha")), ("3g.40gb", 4, 4, Some("beta"))]),
        "  - {index: 1, mode: Exclusive, tenants: [alpha]}\n".to_string(),
    ]);
    let b = gpus(&[
        mig_gpu(
            0,
            &[
                ("2g.20gb", 0, 2, Some("gamma")),
                ("2g.20gb", 2, 2, Some("alpha")),
                ("3g.40gb", 4, 4, Some("beta")),
            ],
        ),
        mig_gpu(1, &[("4g.40gb", 0, 4, Some("beta")), ("3g.40gb", 4, 4, Some("gamma"))]),
    ]);
    let prepare = |name: &str| {
        let sim = Sim::new(name, &[r#"{model: "NVIDIA H100 80GB HBM3", count: 2}"#]);
        let run = sim.apply(&a);
        assert_eq!(run.code(), Some(0), "{name}: {}{}", run.stdout(), run.stderr());
        sim.use_by(0, Some(0), "alpha");
        sim.use_by(0, Some(4), "beta");
        sim.use_by(1, None, "alpha");
        sim
    };
    let reference = prepare("crash-ref");
    let before = reference.mutations();
    assert_eq!(reference.apply(&b).code(), Some(0));
    let total = reference.mutations() - before;
    assert_eq!(
        total,
        2 + 4 + 1 + 4,
        "destroy 3g, create two 2g; MIG on and two instances on GPU 1"
    );
    let want = reference.discover();
    drop(reference);

    for n in 1..=total {
        let sim = prepare(&format!("crash-{n}"));
        nvidia_ml_sim::ctl::abort_at(&sim.paths, n).unwrap();
        let crashed = sim.apply(&b);
        assert_ne!(crashed.code(), Some(0), "run {n} should have been killed");
        let run = sim.apply(&b);
        assert_eq!(run.code(), Some(0), "after a crash at mutation {n}: {}", run.stdout());
        for g in 0..2 {
            assert_eq!(layout(run.status(), g), layout(&want, g), "crash at {n}, GPU {g}");
        }
        assert!(
            sim.leaks(run.status()).is_empty(),
            "crash at {n}: {:?}",
            sim.leaks(run.status())
        );
        let m = sim.mutations();
        assert_eq!(sim.apply(&b).code(), Some(0));
        assert_eq!(sim.mutations(), m, "crash at {n}: third apply mutated");
    }
}

#[test]
fn scrubs_happen_exactly_on_a_change_of_hands() {
    let sim = Sim::new("hands", &[r#"{model: "NVIDIA H100 80GB HBM3", count: 2}"#]);
    let spec = |t0: &str, t1: &str, policy: &str| {
        gpus(&[
            mig_gpu(0, &[("3g.40gb", 0, 4, Some(t0)), ("3g.40gb", 4, 4, Some("beta"))]),
            format!("  - {{index: 1, mode: Exclusive, tenants: [{t1}], scrub: {policy}}}\n"),
        ])
    };
    let run = sim.apply(&spec("alpha", "alpha", "OnTenantChange"));
    assert_eq!(run.code(), Some(0));
    let n = sim.scrubs().len();
    assert_eq!(
        n, 3,
        "two new instances, and GPU 1 whose previous owner nobody recorded"
    );
    sim.use_by(0, Some(0), "alpha");
    sim.use_by(1, None, "alpha");

    let run = sim.apply(&spec("alpha", "alpha", "OnTenantChange"));
    assert_eq!(sim.scrubs().len(), n, "same tenants: no scrub");
    assert!(sim.leaks(run.status()).is_empty());

    let run = sim.apply(&spec("gamma", "gamma", "OnTenantChange"));
    assert_eq!(run.code(), Some(0), "{}", run.stdout());
    let new: Vec<_> = sim.scrubs()[n..].to_vec();
    assert_eq!(new.len(), 2, "{new:?}");
    assert!(sim.leaks(run.status()).is_empty(), "{:?}", sim.leaks(run.status()));
    let inst = run.status().gpus[0]
        .instances
        .iter()
        .find(|i| i.placement.start == 0)
        .unwrap();
    assert_eq!(inst.tenant.as_deref(), Some("gamma"));
    assert_eq!(
        inst.last_scrub.as_ref().unwrap().result,
        gpu_tenancy::api::ScrubResult::Scrubbed
    );
    assert_eq!(
        run.status().gpus[1].last_scrub.as_ref().unwrap().tenant.as_deref(),
        Some("gamma")
    );

    let m = sim.scrubs().len();
    sim.apply(&spec("gamma", "gamma", "OnTenantChange"));
    assert_eq!(sim.scrubs().len(), m, "second apply of the same tenants: no scrub");

    // Policy Never: the hand-over happens unscrubbed, and the status says so.
    sim.use_by(1, None, "gamma");
    let run = sim.apply(&spec("gamma", "delta", "Never"));
    assert_eq!(run.code(), Some(0));
    assert_eq!(sim.scrubs().len(), m);
    let rec = run.status().gpus[1].last_scrub.clone().unwrap();
    assert_eq!(
        (rec.result, rec.tenant.as_deref()),
        (gpu_tenancy::api::ScrubResult::Skipped, Some("delta"))
    );
    assert_eq!(
        sim.leaks(run.status()),
        ["GPU 1 holds gamma's data, now serves [\"delta\"]"]
    );
}

#[test]
fn a_failed_scrub_keeps_the_gpu_not_ready_until_it_succeeds() {
    let sim = Sim::new("scrubfail", &[H100]);
    let spec = |t: &str| format!("  gpus:\n  - {{index: 0, mode: Exclusive, tenants: [{t}]}}\n");
    assert_eq!(sim.apply(&spec("alpha")).code(), Some(0));
    sim.use_by(0, None, "alpha");
    nvidia_ml_sim::ctl::fail(&sim.paths, "cuMemsetD8_v2", 1, "999", 1).unwrap();
    let run = sim.apply(&spec("beta"));
    assert_eq!(run.code(), Some(1));
    let g = &run.status().gpus[0];
    assert_eq!(
        (g.applied, g.reason.map(|r| r.as_str())),
        (Some(false), Some("ScrubFailed"))
    );
    assert_eq!(g.applied_tenants, ["alpha"], "not handed over yet");
    let run = sim.apply(&spec("beta"));
    assert_eq!(run.code(), Some(0), "{}", run.stdout());
    assert!(sim.leaks(run.status()).is_empty());
}

#[test]
fn scrub_check_reads_back_zeros() {
    let sim = Sim::new("scrubcheck", &[H100]);
    let uuid = sim.discover().gpus[0].uuid.clone();
    sim.use_by(0, None, "alpha");
    let out = sim
        .command()
        .args([
            "agent",
            "scrub-check",
            "--device",
            &uuid,
            "--bytes",
            "64Mi",
            "-o",
            "json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["bytesCleared"], 64 * 1024 * 1024);
    assert_eq!(r["bytesVerified"], 64 * 1024 * 1024, "every byte cleared is verified");
    assert_eq!(sim.mutations(), 0);

    let out = sim
        .command()
        .args(["agent", "scrub-check", "--cuda-lib", "/nonexistent/libcuda.so.1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// A process that appears between the agent's look and its destroy: NVML answers IN_USE. That GPU
/// fails with the driver's reason, the others carry on, and the next apply finishes.
#[test]
fn in_use_from_the_driver_fails_one_gpu_and_the_next_apply_finishes() {
    let sim = Sim::new("inuse", &[r#"{model: "NVIDIA H100 80GB HBM3", count: 2}"#]);
    let a = [("3g.40gb", 0, 4, Some("alpha")), ("3g.40gb", 4, 4, Some("beta"))];
    assert_eq!(sim.apply(&gpus(&[mig_gpu(0, &a), mig_gpu(1, &a)])).code(), Some(0));
    nvidia_ml_sim::ctl::fail(&sim.paths, "nvmlComputeInstanceDestroy", 1, "IN_USE", 1).unwrap();
    let b = [("7g.80gb", 0, 8, Some("gamma"))];
    let run = sim.apply(&gpus(&[mig_gpu(0, &b), mig_gpu(1, &b)]));
    assert_eq!(run.code(), Some(1));
    let failed: Vec<_> = run.status().gpus.iter().filter(|g| g.applied == Some(false)).collect();
    assert_eq!(failed.len(), 1, "{}", run.stdout());
    assert_eq!(failed[0].reason.map(|r| r.as_str()), Some("Failed"));
    assert!(
        failed[0]
            .message
            .as_deref()
            .unwrap()
            .contains("nvmlComputeInstanceDestroy"),
        "{:?}",
        failed[0].message
    );
    let run = sim.apply(&gpus(&[mig_gpu(0, &b), mig_gpu(1, &b)]));
    assert_eq!(run.code(), Some(0), "{}", run.stdout());
    assert_eq!(
        (layout(run.status(), 0), layout(run.status(), 1)),
        (vec!["7g.80gb@0:8".to_string()], vec!["7g.80gb@0:8".to_string()])
    );
    assert!(sim.leaks(run.status()).is_empty(), "{:?}", sim.leaks(run.status()));
}
