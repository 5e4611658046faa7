//! How a node caps the memory of its MPS and time-sliced shares, decided from what its agent
//! probed (pure: the agent reads the versions, this decides). docs/concepts/isolation.md#memory-limits.
//!
//! The driver caps a container's memory on a GPU through the container toolkit's
//! `apply-cuda-memory-limits` hook, which needs a driver of R615 or later, the toolkit 1.20.1 or
//! later, and cgroup v2. Where any is missing an MPS share falls back to its MPS daemon's pinned
//! memory limit (which binds, unlike the client's own environment), and a time-sliced share has
//! no cap: its tier's `memoryCaps` says whether it is handed out then.

use crate::api::{
    GpuMemoryCap, GpuSpec, MemoryCapMethod, MemoryCapPolicy, MemoryCapReason, Mode, MpsSettings, quantity_to_mib,
};

/// The oldest driver branch whose NVML caps a container's memory.
pub const MIN_DRIVER_MAJOR: u32 = 615;
/// The oldest container toolkit that ships the `apply-cuda-memory-limits` hook.
pub const MIN_TOOLKIT: (u32, u32, u32) = (1, 20, 1);

/// What the agent found on its node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Probe {
    /// The driver's version as NVML reports it (`nvmlSystemGetDriverVersion`, e.g. `615.20.01`).
    pub driver: Option<String>,
    /// `nvidia-ctk --version`'s output; `None` where the binary is not there.
    pub toolkit: Option<String>,
    /// Whether the node runs cgroup v2.
    pub cgroup_v2: bool,
}

/// Why the driver cannot cap, with the version found where the reason is about one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unavailable {
    pub reason: MemoryCapReason,
    pub found: Option<String>,
}

/// Whether the driver can cap the node's shares: `Ok` only when every part is known to be
/// recent enough (an unreadable version counts as too old).
pub fn driver_cap(p: &Probe) -> Result<(), Unavailable> {
    let no = |reason, found: Option<&str>| {
        Err(Unavailable {
            reason,
            found: found.map(|f| f.chars().take(64).collect()),
        })
    };
    let Some(driver) = p.driver.as_deref() else {
        return no(MemoryCapReason::DriverUnknown, None);
    };
    match driver.trim().split('.').next().and_then(|m| m.parse::<u32>().ok()) {
        None => return no(MemoryCapReason::DriverUnknown, Some(driver)),
        Some(major) if major < MIN_DRIVER_MAJOR => return no(MemoryCapReason::DriverTooOld, Some(driver)),
        Some(_) => {}
    }
    let Some(out) = p.toolkit.as_deref() else {
        return no(MemoryCapReason::ToolkitMissing, None);
    };
    match toolkit_version(out) {
        None => return no(MemoryCapReason::ToolkitUnknown, Some(out.lines().next().unwrap_or(""))),
        Some(v) if v < MIN_TOOLKIT => {
            return no(
                MemoryCapReason::ToolkitTooOld,
                Some(&format!("{}.{}.{}", v.0, v.1, v.2)),
            );
        }
        Some(_) => {}
    }
    if !p.cgroup_v2 {
        return no(MemoryCapReason::NoCgroupV2, None);
    }
    Ok(())
}

/// The version in `nvidia-ctk --version`'s output: its first line is `NVIDIA Container Toolkit
/// CLI version 1.20.1` (a pre-release `1.20.1-rc.1` counts as 1.20.1's own number).
pub fn toolkit_version(out: &str) -> Option<(u32, u32, u32)> {
    let line = out.lines().find(|l| l.contains("version"))?;
    let word = line.split_whitespace().last()?.trim_start_matches('v');
    let core = word.split(['-', '+']).next()?;
    let mut parts = core.split('.').map(|p| p.parse::<u32>().ok());
    let v = (parts.next()??, parts.next()??, parts.next().unwrap_or(Some(0))?);
    parts.next().is_none().then_some(v)
}

/// How a share of a GPU in `mode` is capped where the driver's cap is `driver`.
pub fn method(mode: Mode, driver: &Result<(), Unavailable>) -> MemoryCapMethod {
    match (driver, mode) {
        (Ok(()), Mode::Mps | Mode::TimeSlicing) => MemoryCapMethod::Driver,
        (Err(_), Mode::Mps) => MemoryCapMethod::MpsDaemon,
        _ => MemoryCapMethod::None,
    }
}

/// What the status says of each MPS or time-sliced GPU of `gpus`.
pub fn statuses<'a>(
    gpus: impl IntoIterator<Item = &'a GpuSpec>,
    driver: &Result<(), Unavailable>,
) -> Vec<GpuMemoryCap> {
    gpus.into_iter()
        .filter(|g| matches!(g.mode, Mode::Mps | Mode::TimeSlicing))
        .map(|g| {
            let method = method(g.mode, driver);
            let why = driver.as_ref().err();
            GpuMemoryCap {
                index: g.index,
                method,
                reason: why.map(|u| u.reason),
                found: why.and_then(|u| u.found.clone()),
            }
        })
        .collect()
}

/// Whether a share capped by `method` may be handed out under `policy`: only a time-sliced share
/// with no cap under `Required` may not.
pub fn may_hand_out(mode: Mode, method: MemoryCapMethod, policy: MemoryCapPolicy) -> bool {
    !(mode == Mode::TimeSlicing && method == MemoryCapMethod::None && policy == MemoryCapPolicy::Required)
}

/// The memory of one share of `spec`'s GPU with `gpu_memory_mib`: an MPS share's pinned memory
/// (the plan's `pinnedMemoryLimit`, else memory / maxClients, what the planner counts against
/// the headroom), a time-sliced share memory / replicas. 0 for other modes.
pub fn share_mib(spec: &GpuSpec, gpu_memory_mib: u64) -> u64 {
    match spec.mode {
        Mode::Mps => {
            let mps = MpsSettings::in_effect(spec.mps.as_ref());
            mps.pinned_memory_limit
                .as_deref()
                .and_then(quantity_to_mib)
                .unwrap_or(gpu_memory_mib / u64::from(mps.max_clients.max(1)))
        }
        Mode::TimeSlicing => gpu_memory_mib / u64::from(spec.time_slicing.as_ref().map_or(1, |t| t.replicas).max(1)),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(driver: Option<&str>, toolkit: Option<&str>, cgroup_v2: bool) -> Probe {
        Probe {
            driver: driver.map(String::from),
            toolkit: toolkit.map(String::from),
            cgroup_v2,
        }
    }

    /// Driver, toolkit output, cgroup v2, and the reason (with the version found) expected.
    type Case<'a> = (
        Option<&'a str>,
        Option<&'a str>,
        bool,
        Option<(MemoryCapReason, Option<&'a str>)>,
    );

    const CTK_1201: &str = "NVIDIA Container Toolkit CLI version 1.20.1\ncommit: 0123abc";

    /// A table of driver and toolkit versions, each with the answer worked out by hand from the
    /// requirements (R615, toolkit 1.20.1, cgroup v2).
    #[test]
    fn the_driver_caps_only_on_a_stack_known_to_be_recent_enough() {
        use MemoryCapReason::*;
        let cases: &[Case] = &[
            (Some("615.20.01"), Some(CTK_1201), true, None),
            (
                Some("620.1"),
                Some("NVIDIA Container Toolkit CLI version 1.21.0"),
                true,
                None,
            ),
            (
                Some("615.20.01"),
                Some("NVIDIA Container Toolkit CLI version 2.0"),
                true,
                None,
            ),
            (
                Some("614.99.99"),
                Some(CTK_1201),
                true,
                Some((DriverTooOld, Some("614.99.99"))),
            ),
            (
                Some("550.54.15"),
                Some(CTK_1201),
                true,
                Some((DriverTooOld, Some("550.54.15"))),
            ),
            (
                Some("garbage"),
                Some(CTK_1201),
                true,
                Some((DriverUnknown, Some("garbage"))),
            ),
            (None, Some(CTK_1201), true, Some((DriverUnknown, None))),
            (Some("615.20.01"), None, true, Some((ToolkitMissing, None))),
            (
                Some("615.20.01"),
                Some("NVIDIA Container Toolkit CLI version 1.20.0"),
                true,
                Some((ToolkitTooOld, Some("1.20.0"))),
            ),
            (
                Some("615.20.01"),
                Some("NVIDIA Container Toolkit CLI version 1.19.9"),
                true,
                Some((ToolkitTooOld, Some("1.19.9"))),
            ),
            (
                Some("615.20.01"),
                Some("NVIDIA Container Toolkit CLI version 1.20.1-rc.1"),
                true,
                None,
            ),
            (
                Some("615.20.01"),
                Some("command not found"),
                true,
                Some((ToolkitUnknown, Some("command not found"))),
            ),
            (Some("615.20.01"), Some(CTK_1201), false, Some((NoCgroupV2, None))),
        ];
        for (driver, toolkit, v2, want) in cases {
            let got = driver_cap(&probe(*driver, *toolkit, *v2))
                .err()
                .map(|u| (u.reason, u.found));
            let want = want.map(|(r, f)| (r, f.map(String::from)));
            assert_eq!(got, want, "driver {driver:?}, toolkit {toolkit:?}, cgroup v2 {v2}");
        }
    }

    /// MPS falls back to its daemon, time-slicing to nothing; Required keeps an uncapped
    /// time-sliced share back and nothing else.
    #[test]
    fn fallbacks_and_the_tier_rule() {
        let off = Err(Unavailable {
            reason: MemoryCapReason::ToolkitMissing,
            found: None,
        });
        assert_eq!(method(Mode::Mps, &Ok(())), MemoryCapMethod::Driver);
        assert_eq!(method(Mode::TimeSlicing, &Ok(())), MemoryCapMethod::Driver);
        assert_eq!(method(Mode::Mps, &off), MemoryCapMethod::MpsDaemon);
        assert_eq!(method(Mode::TimeSlicing, &off), MemoryCapMethod::None);
        use MemoryCapPolicy::*;
        assert!(!may_hand_out(Mode::TimeSlicing, MemoryCapMethod::None, Required));
        assert!(may_hand_out(Mode::TimeSlicing, MemoryCapMethod::None, BestEffort));
        assert!(may_hand_out(Mode::TimeSlicing, MemoryCapMethod::Driver, Required));
        assert!(may_hand_out(Mode::Mps, MemoryCapMethod::MpsDaemon, Required));
        let gpus = [
            GpuSpec::mps(0, 4),
            GpuSpec::exclusive(1, "a"),
            GpuSpec::time_sliced(2, 4),
        ];
        let st = statuses(&gpus, &off);
        assert_eq!(
            st.iter().map(|g| (g.index, g.method, g.reason)).collect::<Vec<_>>(),
            [
                (0, MemoryCapMethod::MpsDaemon, Some(MemoryCapReason::ToolkitMissing)),
                (2, MemoryCapMethod::None, Some(MemoryCapReason::ToolkitMissing)),
            ]
        );
    }

    /// A share's memory, by hand: 81559 MiB / 4 = 20389 (rounded down); a pinned limit of 10Gi
    /// is 10240 MiB; 81559 / 7 = 11651.
    #[test]
    fn share_memory() {
        assert_eq!(share_mib(&GpuSpec::mps(0, 4), 81559), 20389);
        let pinned = GpuSpec::mps(0, 4).with_mps(MpsSettings {
            max_clients: 4,
            active_thread_percentage: None,
            pinned_memory_limit: Some("10Gi".into()),
        });
        assert_eq!(share_mib(&pinned, 81559), 10240);
        assert_eq!(share_mib(&GpuSpec::time_sliced(0, 7), 81559), 11651);
        assert_eq!(share_mib(&GpuSpec::exclusive(0, "a"), 81559), 0);
    }
}
