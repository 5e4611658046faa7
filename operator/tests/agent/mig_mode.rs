//! MIG mode changes as NVML makes them (docs/nvidia.md#mig-changes-through-nvml): `nvmlDeviceSetMigMode` succeeds and reports
//! the outcome in its activation status. The call itself activates an idle GPU; `IN_USE` means
//! something holds the GPU (idle it, retry); `RESET_REQUIRED` means no reset is exposed (a VM
//! reboot is needed) and is not retried.

use crate::support::{Sim, calls, layout};
use crate::{gpus, mig_gpu};
use nvidia_ml_sim::ctl;

fn spec() -> String {
    gpus(&[mig_gpu(
        0,
        &[("3g.20gb", 0, 4, Some("alpha")), ("3g.20gb", 4, 4, Some("beta"))],
    )])
}

#[test]
fn an_idle_gpu_is_switched_by_the_call_itself_and_laid_out_in_the_same_apply() {
    let sim = Sim::new("migmode-idle", &[r#"{pciDeviceId: "0x20B010DE", count: 1}"#]);
    let run = sim.apply(&spec());
    assert_eq!(run.code(), Some(0), "{}", run.stdout());
    let log = sim.log_since(0);
    assert_eq!(log[0].call, "nvmlDeviceSetMigMode");
    assert_eq!(log.len(), 1 + 2 * 2, "{:?}", calls(&log));
    let g = &sim.discover().gpus[0];
    assert_eq!(g.mig_mode.map(|m| (m.current, m.pending)), Some((true, true)));
    assert_eq!(layout(run.status(), 0), ["3g.20gb@0:4", "3g.20gb@4:4"]);
}

#[test]
fn a_gpu_without_reset_is_reset_required_and_not_retried() {
    let sim = Sim::new(
        "migmode-passthrough",
        &[r#"{pciDeviceId: "0x20B010DE", count: 1, passThrough: true}"#],
    );
    let run = sim.apply(&spec());
    assert_eq!(run.code(), Some(1), "{}", run.stdout());
    let g = &run.status().gpus[0];
    assert_eq!(
        (g.applied, g.reason.map(|r| r.as_str())),
        (Some(false), Some("ResetRequired"))
    );
    assert!(g.message.as_deref().unwrap().contains("reboot"), "{:?}", g.message);
    assert_eq!(calls(&sim.log_since(0)), [(0, "nvmlDeviceSetMigMode")]);
    let run = sim.apply(&spec());
    assert_eq!(run.status().gpus[0].reason.map(|r| r.as_str()), Some("ResetRequired"));
    assert_eq!(sim.mutations(), 1, "a change waiting for a reset is not retried");

    ctl::reset(&sim.paths, 0).unwrap();
    let run = sim.apply(&spec());
    assert_eq!(run.code(), Some(0), "{}", run.stdout());
    assert_eq!(sim.mutations(), 1 + 4);
}

/// nvidia-persistenced (or nvidia_drm, a display server) holds the GPU: no compute process shows,
/// but the reset fails with IN_USE. The GPU is Busy and the change is retried on the next apply,
/// which succeeds once the holder lets go.
#[test]
fn a_held_gpu_is_busy_and_the_mode_change_is_retried_once_idle() {
    let sim = Sim::new("migmode-held", &[r#"{model: "NVIDIA H100 80GB HBM3", count: 2}"#]);
    ctl::hold(&sim.paths, 0, "nvidia-persistenced").unwrap();
    let both = gpus(&[
        mig_gpu(0, &[("7g.80gb", 0, 8, Some("alpha"))]),
        mig_gpu(1, &[("7g.80gb", 0, 8, Some("beta"))]),
    ]);
    let run = sim.apply(&both);
    assert_eq!(run.code(), Some(1), "{}", run.stdout());
    let g = &run.status().gpus[0];
    assert_eq!(
        (g.applied, g.reason.map(|r| r.as_str())),
        (Some(false), Some("Busy")),
        "{:?}",
        g.message
    );
    assert!(g.message.as_deref().unwrap().contains("IN_USE"), "{:?}", g.message);
    assert_eq!(run.status().gpus[1].applied, Some(true), "the other GPU carries on");
    let found = sim.discover();
    assert_eq!(
        found.gpus[0].mig_mode.map(|m| (m.current, m.pending)),
        Some((false, true))
    );

    // Still held: tried again (once per apply), still Busy, nothing else done to it.
    let before = sim.mutations();
    let run = sim.apply(&both);
    assert_eq!(run.status().gpus[0].reason.map(|r| r.as_str()), Some("Busy"));
    assert_eq!(calls(&sim.log_since(before)), [(0, "nvmlDeviceSetMigMode")]);

    ctl::release(&sim.paths, 0, None).unwrap();
    let run = sim.apply(&both);
    assert_eq!(run.code(), Some(0), "{}", run.stdout());
    assert_eq!(layout(run.status(), 0), ["7g.80gb@0:8"]);
    assert!(sim.leaks(run.status()).is_empty(), "{:?}", sim.leaks(run.status()));
}
