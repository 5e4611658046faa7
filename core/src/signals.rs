//! The pitfalls a node agent can tell from its own GPUs, published as GpuNode conditions (the
//! Prometheus rules in deploy/prometheus cover what needs history or other nodes). Pure.
//!
//! - **Ungranted use**: compute processes on a GPU or MIG instance that no tenant is granted (an
//!   instance without a tenant, a GPU no plan covers or whose spec names no tenant): someone
//!   reached a GPU around the rules (a namespace exempt from them, NVIDIA's toolkit honouring
//!   `NVIDIA_VISIBLE_DEVICES`, a process on the host).
//! - **Shared memory pressure**: an MPS or time-sliced GPU whose processes use 90% or more of its
//!   memory. Nothing on such a GPU keeps one tenant's memory from another's (time-slicing has no
//!   limit at all; MPS' pinned limit is per client, and clients can be more than the shares): the
//!   next allocation fails for whoever makes it, the "two 40 GB jobs on a 40 GB GPU" crash.
//!
//! Messages name GPUs and instances only, never process IDs or amounts, so a condition changes
//! (and the GpuNode is written) only when the set of GPUs concerned does.

use crate::accounting::{self, UNALLOCATED};
use crate::api::{GpuNodeSpec, GpuNodeStatus, GpuStatus, Mode};

/// A shared GPU's memory use, in percent of its memory, from which it is under pressure.
pub const SHARED_MEMORY_PRESSURE_PERCENT: u64 = 90;

/// What the agent found, as condition messages (empty: nothing found).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Signals {
    /// "GPU 3", "GPU 0 instance 2 (1g.10gb)": devices with processes and no tenant.
    pub ungranted: Vec<String>,
    /// "GPU 5": shared GPUs at or above [`SHARED_MEMORY_PRESSURE_PERCENT`].
    pub memory_pressure: Vec<String>,
}

/// The signals of the GPUs in `status` under `spec`.
pub fn signals(spec: &GpuNodeSpec, status: &GpuNodeStatus) -> Signals {
    let found: Vec<u32> = status.gpus.iter().map(|g| g.index).collect();
    let holdings = accounting::holdings(spec, &found);
    let mut out = Signals::default();
    for g in &status.gpus {
        let mode = spec.gpus.iter().find(|s| s.index == g.index).map(|s| s.mode);
        out.ungranted.extend(ungranted(g, &holdings));
        let shared = matches!(mode, Some(Mode::Mps | Mode::TimeSlicing));
        let used: u64 = g.processes.iter().filter_map(|p| p.used_memory_mib).sum();
        if shared && g.memory_mib > 0 && used * 100 >= g.memory_mib * SHARED_MEMORY_PRESSURE_PERCENT {
            out.memory_pressure.push(format!("GPU {}", g.index));
        }
    }
    out
}

fn ungranted(g: &GpuStatus, holdings: &[accounting::Holding]) -> Vec<String> {
    let mig = g.mig_mode.is_some_and(|m| m.current) && !g.instances.is_empty();
    if !mig {
        let held = accounting::gpu_tenant(holdings, g.index) != UNALLOCATED;
        return match held || g.processes.is_empty() {
            true => vec![],
            false => vec![format!("GPU {}", g.index)],
        };
    }
    let mut out = Vec::new();
    for i in &g.instances {
        let busy = g.processes.iter().any(|p| p.gpu_instance_id == Some(i.gpu_instance_id));
        let tenant = holdings
            .iter()
            .find(|h| h.gpu == g.index && h.instance.as_ref().is_some_and(|(s, _)| *s == i.placement.start))
            .map_or(UNALLOCATED, |h| h.tenant.as_str());
        if busy && tenant == UNALLOCATED {
            out.push(format!(
                "GPU {} instance {} ({})",
                g.index, i.gpu_instance_id, i.profile
            ));
        }
    }
    // A process on a GPU instance the agent does not list (made behind its back) is ungranted too.
    let listed = |id: u32| g.instances.iter().any(|i| i.gpu_instance_id == id);
    if g.processes
        .iter()
        .any(|p| p.gpu_instance_id.is_some_and(|id| !listed(id)))
    {
        out.push(format!("GPU {} (an instance the agent did not make)", g.index));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{GpuSpec, MigInstanceSpec, MigInstanceStatus, MigModeStatus, Placement, ProcessStatus};

    fn process(pid: u32, gi: Option<u32>, mib: u64) -> ProcessStatus {
        ProcessStatus {
            pid,
            gpu_instance_id: gi,
            compute_instance_id: gi.map(|_| 0),
            used_memory_mib: Some(mib),
        }
    }

    fn gpu_spec(index: u32, mode: Mode, tenants: &[&str]) -> GpuSpec {
        GpuSpec {
            index,
            mode,
            mig_instances: vec![],
            mps: None,
            time_slicing: None,
            tenants: tenants.iter().map(|t| t.to_string()).collect(),
            shares: vec![],
            scrub: Default::default(),
        }
    }

    fn gpu(index: u32, processes: Vec<ProcessStatus>) -> GpuStatus {
        GpuStatus {
            index,
            memory_mib: 1000,
            processes,
            ..Default::default()
        }
    }

    #[test]
    fn processes_where_no_tenant_is_granted_are_ungranted_use() {
        let mut mig = gpu_spec(0, Mode::Mig, &[]);
        mig.mig_instances = vec![
            MigInstanceSpec {
                profile: "3g.40gb".into(),
                placement: Placement { start: 4, size: 4 },
                tenant: Some("a".into()),
            },
            MigInstanceSpec {
                profile: "1g.10gb".into(),
                placement: Placement { start: 0, size: 1 },
                tenant: None,
            },
        ];
        let spec = GpuNodeSpec {
            gpus: vec![
                mig,
                gpu_spec(1, Mode::Exclusive, &["b"]),
                gpu_spec(2, Mode::Exclusive, &[]),
            ],
            ..Default::default()
        };
        let instance = |id, profile: &str, start| MigInstanceStatus {
            gpu_instance_id: id,
            profile: profile.into(),
            placement: Placement { start, size: 1 },
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
        let status = GpuNodeStatus {
            gpus: vec![
                g0,
                gpu(1, vec![process(4, None, 10)]),
                gpu(2, vec![process(5, None, 10)]),
                gpu(3, vec![process(6, None, 10)]),
                gpu(4, vec![]),
            ],
            ..Default::default()
        };
        let s = signals(&spec, &status);
        assert_eq!(
            s.ungranted,
            [
                "GPU 0 instance 13 (1g.10gb)",
                "GPU 0 (an instance the agent did not make)",
                "GPU 2",
                "GPU 3"
            ]
        );
        assert!(s.memory_pressure.is_empty());
    }

    #[test]
    fn a_shared_gpu_nearly_full_is_under_pressure_a_whole_one_is_not() {
        let spec = GpuNodeSpec {
            gpus: vec![
                gpu_spec(0, Mode::TimeSlicing, &["a", "b"]),
                gpu_spec(1, Mode::Mps, &["a"]),
                gpu_spec(2, Mode::Exclusive, &["a"]),
            ],
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
        assert_eq!(signals(&spec, &status).memory_pressure, ["GPU 0"]);
    }
}
