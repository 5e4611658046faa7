//! Per-container GPU memory caps, as the driver enforces them once the container toolkit's
//! `apply-cuda-memory-limits` hook has set them (see the crate's README).
//!
//! The hook (`sim-nvidia-ctk`, [`crate::hook`]) reads `NVIDIA_GPU_MEMORY_REQUEST` and
//! `NVIDIA_GPU_MEMORY_LIMIT` from the container's OCI spec and records a [`MemoryCap`] for (GPU
//! UUID, container ID). From then on every allocation of a process of that container on that GPU
//! counts against the cap: past it the allocation fails as out of memory, whatever the GPU has
//! free. Another container's allocations on the same GPU are bounded only by the GPU's memory.
//!
//! A process belongs to a container by the `container` of its [`crate::state::SimProcess`] (the
//! driver knows it by the process's cgroup); [`alloc`] is what `sim-ctl alloc` and the tests call,
//! and the CUDA side (`cuMemAlloc_v2`) applies the same [`check`] for a process run with
//! [`CONTAINER_ENV`].

pub use crate::state::MemoryCap;
use crate::state::{Paths, SimGpu, SimProcess, SimState, now_us, update};

/// Environment variable naming the container a CUDA client of the simulator runs in: its
/// `cuMemAlloc_v2` calls count against that container's cap.
pub const CONTAINER_ENV: &str = "GPU_TENANCY_SIM_CONTAINER";

/// Why an allocation or a cap was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapError {
    #[error(
        "out of memory: container {container} on {gpu_uuid} uses {used_mib} MiB of its {limit_mib} MiB cap and asked for {asked_mib} MiB more"
    )]
    OverCap {
        container: String,
        gpu_uuid: String,
        used_mib: u64,
        limit_mib: u64,
        asked_mib: u64,
    },
    #[error("out of memory: {gpu_uuid} has {free_mib} MiB free and {asked_mib} MiB were asked for")]
    GpuFull {
        gpu_uuid: String,
        free_mib: u64,
        asked_mib: u64,
    },
    #[error("no simulated GPU has UUID {0:?} (MIG devices are not capped by the simulator): name a GPU of the node")]
    NoGpu(String),
    #[error("{0}")]
    State(String),
}

impl CapError {
    /// Whether the driver would answer out of memory (the allocation, not the request, is wrong).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, CapError::OverCap { .. } | CapError::GpuFull { .. })
    }
}

impl SimState {
    /// The cap of `container` on the GPU with `gpu_uuid`, if the hook set one.
    pub fn cap_of(&self, gpu_uuid: &str, container: &str) -> Option<&MemoryCap> {
        self.caps
            .iter()
            .find(|c| c.gpu_uuid == gpu_uuid && c.container == container)
    }

    /// Sets (or replaces: the hook runs again for a re-created container) a cap.
    pub fn set_cap(&mut self, cap: MemoryCap) -> Result<(), CapError> {
        if !self.gpus.iter().any(|g| g.uuid == cap.gpu_uuid) {
            return Err(CapError::NoGpu(cap.gpu_uuid));
        }
        self.caps
            .retain(|c| !(c.gpu_uuid == cap.gpu_uuid && c.container == cap.container));
        self.caps.push(cap);
        Ok(())
    }
}

/// MiB the processes of `container` hold on `g` now.
pub fn container_used_mib(g: &SimGpu, container: &str) -> u64 {
    g.processes
        .iter()
        .filter(|p| p.container.as_deref() == Some(container))
        .map(|p| p.used_mib)
        .sum()
}

/// Whether `container` (if any) may allocate `asked_mib` more on `g`, on top of `pending_mib` its
/// calling process holds outside the state (the CUDA side's own allocations): the container's cap
/// first, then the GPU's free memory, both as the driver checks them.
pub fn check(
    st: &SimState,
    g: &SimGpu,
    container: Option<&str>,
    pending_mib: u64,
    asked_mib: u64,
) -> Result<(), CapError> {
    if let Some(c) = container
        && let Some(cap) = st.cap_of(&g.uuid, c)
    {
        let used_mib = container_used_mib(g, c) + pending_mib;
        if used_mib + asked_mib > cap.limit_mib {
            return Err(CapError::OverCap {
                container: c.to_string(),
                gpu_uuid: g.uuid.clone(),
                used_mib,
                limit_mib: cap.limit_mib,
                asked_mib,
            });
        }
    }
    let used: u64 = g.processes.iter().map(|p| p.used_mib).sum::<u64>() + pending_mib;
    let free_mib = g.memory_mib.saturating_sub(used);
    if asked_mib > free_mib {
        return Err(CapError::GpuFull {
            gpu_uuid: g.uuid.clone(),
            free_mib,
            asked_mib,
        });
    }
    Ok(())
}

/// One allocation of a container's process.
#[derive(Clone, Debug)]
pub struct Alloc {
    pub gpu_uuid: String,
    pub container: String,
    pub pid: u32,
    pub mib: u64,
    pub tenant: Option<String>,
}

/// Process `a.pid` of container `a.container` allocates `a.mib` more on the GPU `a.gpu_uuid`
/// (whole GPUs only): registered on its first allocation, its `used_mib` grown on the next ones.
/// Refused as out of memory past the container's cap or the GPU's free memory; a refused
/// allocation changes nothing. Returns the process's memory after it.
pub fn alloc(paths: &Paths, a: &Alloc) -> Result<u64, CapError> {
    update(paths, |st| {
        let i = st
            .gpus
            .iter()
            .position(|g| g.uuid == a.gpu_uuid && !g.mig_current)
            .ok_or_else(|| CapError::NoGpu(a.gpu_uuid.clone()))?;
        check(st, &st.gpus[i], Some(&a.container), 0, a.mib)?;
        let g = &mut st.gpus[i];
        if let Some(p) = g.processes.iter_mut().find(|p| p.pid == a.pid) {
            if p.container.as_deref() != Some(a.container.as_str()) {
                return Err(CapError::State(format!(
                    "process {} on {} is not in container {}: give each container's processes their own pids",
                    a.pid, a.gpu_uuid, a.container
                )));
            }
            p.used_mib += a.mib;
            return Ok(p.used_mib);
        }
        g.checkpoint_gpm(now_us());
        if let Some(t) = &a.tenant {
            for s in &mut g.dirty {
                *s = Some(t.clone());
            }
        }
        g.processes.push(SimProcess {
            pid: a.pid,
            used_mib: a.mib,
            tenant: a.tenant.clone(),
            container: Some(a.container.clone()),
            ..SimProcess::default()
        });
        Ok(a.mib)
    })
    .map_err(CapError::State)?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(memory_mib: u64, procs: &[(&str, u64)]) -> SimGpu {
        SimGpu {
            uuid: "GPU-a".into(),
            memory_mib,
            processes: procs
                .iter()
                .enumerate()
                .map(|(i, (c, mib))| SimProcess {
                    pid: i as u32 + 1,
                    used_mib: *mib,
                    container: Some(c.to_string()),
                    ..SimProcess::default()
                })
                .collect(),
            ..SimGpu::default()
        }
    }

    fn state(g: &SimGpu, caps: &[(&str, u64)]) -> SimState {
        SimState {
            gpus: vec![g.clone()],
            caps: caps
                .iter()
                .map(|(c, limit)| MemoryCap {
                    gpu_uuid: "GPU-a".into(),
                    container: c.to_string(),
                    request_mib: None,
                    limit_mib: *limit,
                })
                .collect(),
            ..SimState::default()
        }
    }

    #[test]
    fn a_cap_bounds_its_container_only() {
        let g = gpu(1000, &[("a", 300), ("b", 100)]);
        let st = state(&g, &[("a", 400)]);
        assert_eq!(check(&st, &g, Some("a"), 0, 100), Ok(()), "exactly up to the cap");
        assert!(matches!(
            check(&st, &g, Some("a"), 0, 101),
            Err(CapError::OverCap {
                used_mib: 300,
                limit_mib: 400,
                asked_mib: 101,
                ..
            })
        ));
        assert!(
            matches!(
                check(&st, &g, Some("a"), 50, 51),
                Err(CapError::OverCap { used_mib: 350, .. })
            ),
            "the caller's own allocations count"
        );
        assert_eq!(
            check(&st, &g, Some("b"), 0, 600),
            Ok(()),
            "b has no cap: the GPU's 600 free"
        );
        assert!(matches!(
            check(&st, &g, Some("b"), 0, 601),
            Err(CapError::GpuFull {
                free_mib: 600,
                asked_mib: 601,
                ..
            })
        ));
        assert_eq!(check(&st, &g, None, 0, 600), Ok(()));
    }

    #[test]
    fn a_cap_on_an_unknown_gpu_is_refused_and_a_second_replaces_the_first() {
        let g = gpu(1000, &[]);
        let mut st = state(&g, &[]);
        let cap = |uuid: &str, limit| MemoryCap {
            gpu_uuid: uuid.into(),
            container: "a".into(),
            request_mib: Some(1),
            limit_mib: limit,
        };
        assert_eq!(st.set_cap(cap("GPU-x", 5)), Err(CapError::NoGpu("GPU-x".into())));
        st.set_cap(cap("GPU-a", 5)).unwrap();
        st.set_cap(cap("GPU-a", 7)).unwrap();
        assert_eq!(st.caps, vec![cap("GPU-a", 7)]);
    }
}
