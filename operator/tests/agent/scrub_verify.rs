//! The scrub verifies every byte it cleared (docs/design.md#scrub-on-change-of-hands): a stale
//! byte that the memset did not clear is found wherever it lies, the scrub fails with its place
//! and value, and the device is not handed over. Stale bytes are planted in the simulator
//! (`sim-ctl plant`), at offsets of the memory the scrub clears, in the order it clears it.

use super::support::Sim;
use super::{H100, gpus, mig_gpu};
use gpu_tenancy::api::ScrubResult;
use nvidia_ml_sim::{ctl, stale};
use proptest::prelude::*;
use std::process::Output;

const MIB: u64 = 1024 * 1024;
/// The worker's allocations: 256 MiB each while memory lasts (the simulator gives it all).
const CHUNK: u64 = 256 * MIB;
/// What the scrub used to read back from each end of an allocation.
const OLD_SAMPLE: u64 = 64 * 1024;

fn scrub_check(sim: &Sim, device: &str, bytes: u64) -> Output {
    sim.command()
        .args([
            "agent",
            "scrub-check",
            "--device",
            device,
            "--bytes",
            &bytes.to_string(),
        ])
        .output()
        .unwrap()
}

/// A scrub-check that must fail on the byte planted at `offset` of the memory cleared.
fn assert_found(out: &Output, offset: u64, value: u8, words: u64) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "not refused: {err}");
    let want = format!(
        "byte {} of allocation {} reads {value:#04x} after zeroing ({words} non-zero 8-byte words in all)",
        offset % CHUNK,
        offset / CHUNK
    );
    assert!(err.contains(&want), "want {want:?} in {err}");
}

fn gpu_uuid(sim: &Sim) -> String {
    sim.discover().gpus[0].uuid.clone()
}

#[test]
fn a_stale_byte_in_the_middle_of_a_chunk_which_sampling_the_ends_missed_is_found() {
    let sim = Sim::new("stale-middle", &[H100]);
    let uuid = gpu_uuid(&sim);
    sim.use_by(0, None, "alpha");
    let in_chunk = CHUNK / 2 + 3;
    assert!(
        (OLD_SAMPLE..CHUNK - OLD_SAMPLE).contains(&in_chunk),
        "outside both 64 KiB ends the old scrub read"
    );
    let offset = CHUNK + in_chunk;
    stale::plant(&sim.paths, 0, None, offset, 0x5C).unwrap();
    assert_found(&scrub_check(&sim, &uuid, 2 * CHUNK), offset, 0x5C, 1);

    // Clean memory passes, and every byte cleared was verified.
    stale::unplant(&sim.paths, None).unwrap();
    let out = scrub_check(&sim, &uuid, 2 * CHUNK);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn stale_bytes_at_the_start_and_the_end_are_found_and_every_word_is_counted() {
    let sim = Sim::new("stale-ends", &[H100]);
    let uuid = gpu_uuid(&sim);
    // An amount that is no multiple of 16: the kernel's tail, past the last whole 16 bytes.
    let bytes = 2 * CHUNK + 13;
    for offset in [0, CHUNK - 1, bytes - 1] {
        stale::plant(&sim.paths, 0, None, offset, 0xAB).unwrap();
        assert_found(&scrub_check(&sim, &uuid, bytes), offset, 0xAB, 1);
        stale::unplant(&sim.paths, Some(0)).unwrap();
    }
    // Three words (two bytes share one), reported at the lowest.
    for offset in [CHUNK + 80, CHUNK + 81, CHUNK + 4096, 2 * CHUNK + 9] {
        stale::plant(&sim.paths, 0, None, offset, 0x11).unwrap();
    }
    assert_found(&scrub_check(&sim, &uuid, bytes), CHUNK + 80, 0x11, 3);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// Wherever a stale byte lies in the memory cleared, the scrub names it.
    #[test]
    fn a_stale_byte_anywhere_is_found(offset in 0u64..(4 * CHUNK + 5), value in 1u8..=255) {
        let sim = Sim::new(&format!("stale-any-{offset}"), &[H100]);
        let uuid = gpu_uuid(&sim);
        stale::plant(&sim.paths, 0, None, offset, value).unwrap();
        assert_found(&scrub_check(&sim, &uuid, 4 * CHUNK + 5), offset, value, 1);
    }
}

/// The agent's own scrubs: a stale byte fails the GPU's scrub, which stays with its old tenant
/// until a scrub verifies clean; the simulator's log shows every byte cleared verified.
#[test]
fn a_stale_byte_keeps_a_gpu_from_its_next_tenant() {
    let sim = Sim::new("stale-apply", &[H100]);
    let spec = |t: &str| format!("  gpus:\n  - {{index: 0, mode: Exclusive, tenants: [{t}]}}\n");
    assert_eq!(sim.apply(&spec("alpha")).code(), Some(0));
    sim.use_by(0, None, "alpha");
    let n = sim.scrubs().len();
    stale::plant(&sim.paths, 0, None, 40 * CHUNK + 12345, 0xEE).unwrap();
    let run = sim.apply(&spec("beta"));
    assert_eq!(run.code(), Some(1));
    let g = &run.status().gpus[0];
    assert_eq!(
        (g.applied, g.reason.map(|r| r.as_str())),
        (Some(false), Some("ScrubFailed"))
    );
    assert!(
        g.message
            .as_deref()
            .unwrap()
            .contains("byte 12345 of allocation 40 reads 0xee"),
        "{:?}",
        g.message
    );
    assert_eq!(g.applied_tenants, ["alpha"], "not handed over");
    assert_eq!(g.last_scrub.as_ref().unwrap().result, ScrubResult::Failed);

    stale::unplant(&sim.paths, None).unwrap();
    let run = sim.apply(&spec("beta"));
    assert_eq!(run.code(), Some(0), "{}", run.stdout());
    assert_eq!(run.status().gpus[0].applied_tenants, ["beta"]);
    let last = sim.scrubs().last().cloned().unwrap();
    assert_eq!(sim.scrubs().len(), n + 2, "the failed scrub cleared too");
    assert!(last.bytes > 79 * 1024 * MIB, "{last:?}");
    assert_eq!(last.bytes_verified, last.bytes, "every byte cleared was verified");
}

/// A MIG instance's scrub checks the instance's memory: a byte planted there fails it, one
/// planted in another instance does not.
#[test]
fn a_stale_byte_in_a_mig_instance_fails_that_instance_only() {
    let sim = Sim::new("stale-mig", &[H100]);
    let spec = |t: &str, u: &str| gpus(&[mig_gpu(0, &[("3g.40gb", 0, 4, Some(t)), ("3g.40gb", 4, 4, Some(u))])]);
    assert_eq!(sim.apply(&spec("alpha", "beta")).code(), Some(0));
    sim.use_by(0, Some(0), "alpha");
    sim.use_by(0, Some(4), "beta");
    stale::plant(&sim.paths, 0, Some(4), 3 * CHUNK + 77, 0x42).unwrap();
    let run = sim.apply(&spec("gamma", "alpha"));
    assert_eq!(run.code(), Some(1), "{}", run.stdout());
    let g = &run.status().gpus[0];
    assert!(
        g.message
            .as_deref()
            .unwrap()
            .contains("byte 77 of allocation 3 reads 0x42"),
        "{:?}",
        g.message
    );
    let tenant = |start| {
        g.instances
            .iter()
            .find(|i| i.placement.start == start)
            .and_then(|i| i.tenant.clone())
    };
    assert_eq!(tenant(4).as_deref(), Some("beta"), "kept from its next tenant");
    assert!(sim.leaks(run.status()).is_empty(), "{:?}", sim.leaks(run.status()));
}

/// The kernel's launch failing, or returning success without running, fails the scrub.
#[test]
fn a_kernel_that_fails_or_does_not_run_fails_the_scrub() {
    let sim = Sim::new("kernel-faults", &[H100]);
    let uuid = gpu_uuid(&sim);
    for (call, error, want) in [
        ("cuLaunchKernel", "999", "cuLaunchKernel"),
        ("cuLaunchKernel", "0", "failed its self-test"),
        ("cuModuleLoadData", "218", "cuModuleLoadData"),
    ] {
        ctl::fail(&sim.paths, call, 1, error, 1).unwrap();
        let out = scrub_check(&sim, &uuid, 64 * MIB);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{call} {error}: {err}");
        assert!(err.contains(want), "{call} {error}: {err}");
        ctl::clear_faults(&sim.paths).unwrap();
    }
    let out = scrub_check(&sim, &uuid, 64 * MIB);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
