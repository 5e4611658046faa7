//! The pitfalls a node agent can tell from its own GPUs, published as GpuNode conditions and
//! metrics (the Prometheus rules in deploy/prometheus cover what needs history or other nodes).
//! Pure.
//!
//! - **Ungranted use**: compute processes on a GPU or MIG instance that no grant explains:
//!   someone reached a GPU around the rules (a namespace exempt from them, NVIDIA's toolkit
//!   honouring `NVIDIA_VISIBLE_DEVICES`, a process on the host). What explains a process depends on
//!   how the node's pods get devices. In DRA mode each device is bound to its tenant, so a process
//!   on a device no tenant is granted is ungranted. With NVIDIA's device plugin the binding of a
//!   device to a tenant is bookkeeping (the plugin hands any free device of a resource name to
//!   any pod that asks, docs/concepts/isolation.md), so the plan cannot tell: the kubelet's
//!   pod-resources answer can, and a device is explained when some container holds it (a replica
//!   of it, on a shared GPU). Without that answer it is not known, and said so.
//! - **Shared memory pressure**: an MPS or time-sliced GPU whose processes use 90% or more of its
//!   memory. Nothing on such a GPU keeps one tenant's memory from another's (time-slicing has no
//!   limit at all; MPS' pinned limit is per client, and clients can be more than the shares): the
//!   next allocation fails for whoever makes it, the "two 40 GB jobs on a 40 GB GPU" crash.
//!
//! Messages name GPUs and instances only, never process IDs or amounts, so a condition changes
//! (and the GpuNode is written) only when the set of devices concerned does.

use crate::accounting::{self, UNALLOCATED};
use crate::api::{DeviceAccess, GpuNodeSpec, GpuNodeStatus, GpuStatus, Mode};
use std::collections::BTreeSet;

/// A shared GPU's memory use, in percent of its memory, from which it is under pressure.
pub const SHARED_MEMORY_PRESSURE_PERCENT: u64 = 90;

/// Compute processes on one device that no grant explains.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ungranted {
    pub gpu: u32,
    /// The MIG instance; `None` for a whole GPU.
    pub gpu_instance_id: Option<u32>,
    /// "GPU 3", "GPU 0 instance 2 (1g.10gb)".
    pub device: String,
    pub processes: u32,
}

/// What the agent found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Signals {
    /// Devices with ungranted processes; `None` when it cannot be told (device-plugin mode
    /// without the kubelet's pod-resources answer).
    pub ungranted: Option<Vec<Ungranted>>,
    /// "GPU 5": shared GPUs at or above [`SHARED_MEMORY_PRESSURE_PERCENT`].
    pub memory_pressure: Vec<String>,
}

/// The signals of the GPUs in `status` under `spec`. `held`: the GPU and MIG device UUIDs some
/// container holds by the kubelet's pod-resources answer (replicas folded into their device),
/// `None` where it was not read.
pub fn signals(spec: &GpuNodeSpec, status: &GpuNodeStatus, held: Option<&BTreeSet<String>>) -> Signals {
    let found: Vec<u32> = status.gpus.iter().map(|g| g.index).collect();
    let holdings = accounting::holdings(spec, &found);
    let explained = match (spec.device_access, held) {
        // Bound per device: its tenant explains it.
        (DeviceAccess::Dra, _) => Some(Explains::Tenant),
        (DeviceAccess::DevicePlugin, Some(h)) => Some(Explains::Held(h)),
        (DeviceAccess::DevicePlugin, None) => None,
    };
    let mut out = Signals {
        ungranted: explained.as_ref().map(|_| Vec::new()),
        ..Default::default()
    };
    for g in &status.gpus {
        if let (Some(list), Some(explained)) = (out.ungranted.as_mut(), explained.as_ref()) {
            list.extend(ungranted(g, &holdings, explained));
        }
        let mode = spec.gpus.iter().find(|s| s.index == g.index).map(|s| s.mode);
        let shared = matches!(mode, Some(Mode::Mps | Mode::TimeSlicing));
        let used: u64 = g.processes.iter().filter_map(|p| p.used_memory_mib).sum();
        if shared && g.memory_mib > 0 && used * 100 >= g.memory_mib * SHARED_MEMORY_PRESSURE_PERCENT {
            out.memory_pressure.push(format!("GPU {}", g.index));
        }
    }
    out
}

/// What explains a process on a device.
enum Explains<'a> {
    /// The device's tenant (DRA: devices are bound to tenants).
    Tenant,
    /// A container holding the device (the device plugin: the kubelet says who holds what).
    Held(&'a BTreeSet<String>),
}

impl Explains<'_> {
    fn explains(&self, uuid: &str, tenant: &str) -> bool {
        match self {
            Explains::Tenant => tenant != UNALLOCATED,
            Explains::Held(h) => h.contains(uuid),
        }
    }
}

fn ungranted(g: &GpuStatus, holdings: &[accounting::Holding], explained: &Explains) -> Vec<Ungranted> {
    let mig = g.mig_mode.is_some_and(|m| m.current) && !g.instances.is_empty();
    if !mig {
        let processes = g.processes.len() as u32;
        let tenant = accounting::gpu_tenant(holdings, g.index);
        return match processes == 0 || explained.explains(&g.uuid, tenant) {
            true => vec![],
            false => vec![Ungranted {
                gpu: g.index,
                gpu_instance_id: None,
                device: format!("GPU {}", g.index),
                processes,
            }],
        };
    }
    let mut out = Vec::new();
    for i in &g.instances {
        let processes = g
            .processes
            .iter()
            .filter(|p| p.gpu_instance_id == Some(i.gpu_instance_id))
            .count() as u32;
        let tenant = holdings
            .iter()
            .find(|h| h.gpu == g.index && h.instance.as_ref().is_some_and(|(s, _)| *s == i.placement.start))
            .map_or(UNALLOCATED, |h| h.tenant.as_str());
        if processes > 0 && !explained.explains(i.uuid.as_deref().unwrap_or(""), tenant) {
            out.push(Ungranted {
                gpu: g.index,
                gpu_instance_id: Some(i.gpu_instance_id),
                device: format!("GPU {} instance {} ({})", g.index, i.gpu_instance_id, i.profile),
                processes,
            });
        }
    }
    // A process on a GPU instance the agent does not list (made behind its back): nothing grants it.
    let listed = |id: u32| g.instances.iter().any(|i| i.gpu_instance_id == id);
    let stray = g
        .processes
        .iter()
        .filter(|p| p.gpu_instance_id.is_some_and(|id| !listed(id)))
        .count() as u32;
    if stray > 0 {
        out.push(Ungranted {
            gpu: g.index,
            gpu_instance_id: None,
            device: format!("GPU {} (an instance the agent did not make)", g.index),
            processes: stray,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{GpuSpec, MigInstanceSpec, MigInstanceStatus, MigModeStatus, Placement, ProcessStatus};
    use std::collections::BTreeSet;

    fn process(pid: u32, gi: Option<u32>, mib: u64) -> ProcessStatus {
        ProcessStatus {
            pid,
            gpu_instance_id: gi,
            compute_instance_id: gi.map(|_| 0),
            used_memory_mib: Some(mib),
        }
    }

    fn gpu_spec(index: u32, mode: Mode, tenants: &[&str]) -> GpuSpec {
        GpuSpec::new(index, mode).with_tenants(tenants)
    }

    fn gpu(index: u32, processes: Vec<ProcessStatus>) -> GpuStatus {
        GpuStatus {
            index,
            memory_mib: 1000,
            processes,
            ..Default::default()
        }
    }

    /// A DRA node of three GPUs: a MIG GPU with a 3g instance granted to `a` and a 1g instance to
    /// nobody, an exclusive GPU granted to `b`, one granted to nobody.
    fn mixed_spec() -> GpuNodeSpec {
        let mig = GpuSpec::mig(
            0,
            vec![
                MigInstanceSpec::new("3g.40gb", 4, 4).for_tenant("a"),
                MigInstanceSpec::new("1g.10gb", 0, 1),
            ],
        );
        GpuNodeSpec {
            gpus: vec![
                mig,
                gpu_spec(1, Mode::Exclusive, &["b"]),
                gpu_spec(2, Mode::Exclusive, &[]),
            ]
            .into(),
            device_access: DeviceAccess::Dra,
            ..Default::default()
        }
    }

    /// What runs on [`mixed_spec`]'s node: a process in each MIG instance and one in an instance
    /// the agent did not make, one on each other GPU, and two GPUs no spec covers (one busy).
    fn mixed_status() -> GpuNodeStatus {
        let instance = |id, profile: &str, start| MigInstanceStatus {
            gpu_instance_id: id,
            profile: profile.into(),
            placement: Placement { start, size: 1 },
            uuid: Some(format!("MIG-{id}")),
            ..Default::default()
        };
        let mut g0 = gpu(
            0,
            vec![
                process(1, Some(2), 10),
                process(2, Some(13), 10),
                process(3, Some(9), 10),
            ],
        );
        g0.mig_mode = Some(MigModeStatus {
            current: true,
            pending: true,
        });
        g0.instances = vec![instance(2, "3g.40gb", 4), instance(13, "1g.10gb", 0)];
        GpuNodeStatus {
            gpus: vec![
                g0,
                gpu(1, vec![process(4, None, 10)]),
                gpu(2, vec![process(5, None, 10)]),
                gpu(3, vec![process(6, None, 10)]),
                gpu(4, vec![]),
            ],
            ..Default::default()
        }
    }

    #[test]
    fn processes_where_no_tenant_is_granted_are_ungranted_use() {
        let mut spec = mixed_spec();
        let mut status = mixed_status();
        let devices = |s: &Signals| {
            s.ungranted
                .as_ref()
                .map(|u| u.iter().map(|x| x.device.clone()).collect::<Vec<_>>())
        };
        // DRA: bound per device, so a device no tenant is granted explains no process.
        let s = signals(&spec, &status, None);
        assert_eq!(
            devices(&s).unwrap(),
            [
                "GPU 0 instance 13 (1g.10gb)",
                "GPU 0 (an instance the agent did not make)",
                "GPU 2",
                "GPU 3"
            ]
        );
        assert!(s.memory_pressure.is_empty());
        // The device plugin: the plan's binding is bookkeeping; what a container holds explains.
        spec.device_access = DeviceAccess::DevicePlugin;
        assert_eq!(
            signals(&spec, &status, None).ungranted,
            None,
            "not known without pod-resources"
        );
        for g in &mut status.gpus[1..] {
            g.uuid = format!("GPU-{}", g.index);
        }
        let held: BTreeSet<String> = ["MIG-13", "GPU-2"].into_iter().map(String::from).collect();
        let s = signals(&spec, &status, Some(&held));
        assert_eq!(
            devices(&s).unwrap(),
            [
                "GPU 0 instance 2 (3g.40gb)",
                "GPU 0 (an instance the agent did not make)",
                "GPU 1",
                "GPU 3"
            ],
            "a's and b's processes run in no container that holds their device; GPU 2's does"
        );
    }

    #[test]
    fn a_shared_gpu_nearly_full_is_under_pressure_a_whole_one_is_not() {
        let spec = GpuNodeSpec {
            gpus: vec![
                gpu_spec(0, Mode::TimeSlicing, &["a", "b"]),
                gpu_spec(1, Mode::Mps, &["a"]),
                gpu_spec(2, Mode::Exclusive, &["a"]),
            ]
            .into(),
            ..Default::default()
        };
        let status = GpuNodeStatus {
            gpus: vec![
                gpu(0, vec![process(1, None, 450), process(2, None, 450)]),
                gpu(1, vec![process(3, None, 899)]),
                gpu(2, vec![process(4, None, 990)]),
            ],
            ..Default::default()
        };
        assert_eq!(signals(&spec, &status, None).memory_pressure, ["GPU 0"]);
    }
}
