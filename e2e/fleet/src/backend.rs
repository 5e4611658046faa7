//! The in-memory GPUs of one simulated node: the [`Gpus`] backend a fleet node's agent runs on.
//!
//! It keeps what NVML would report (MIG mode current and pending, GPU instances at their
//! placements with one compute instance each, compute mode, processes) and refuses what NVML
//! refuses: a MIG mode change or an instance removal under a running process (`IN_USE`), an
//! instance at a placement its profile does not offer or overlapping another, MIG mode off while
//! instances exist. The GPUs themselves (names, PCI IDs, memory, profile IDs and placements) are
//! copied from one discovery of the simulated `libnvidia-ml.so` ([`crate::templates`]), not from the
//! operator's own tables. Trouble is injected at the fleet's rates: failed NVML mutations here, busy
//! processes through [`MemGpus::start_process`].

use crate::rng::Rng;
use gpu_tenancy::api::{
    DriverInfo, GpuNodeStatus, GpuReason, GpuStatus, MigInstanceStatus, MigModeStatus, Placement, ProcessStatus,
};
use gpu_tenancy::gpu::actions::{Action, COMPUTE_DEFAULT, COMPUTE_EXCLUSIVE_PROCESS};
use gpu_tenancy::gpu::scrub::{ScrubError, ScrubReport};
use gpu_tenancy::gpu::{ActionError, DiscoverError, Gpus};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

const MIB: u64 = 1024 * 1024;

/// One GPU model as the driver reports it: what a node of that model is made of.
#[derive(Clone, Debug)]
pub struct ModelTemplate {
    pub driver: DriverInfo,
    /// Index, UUID and NUMA node are set per node; instances and processes are empty.
    pub gpu: GpuStatus,
}

/// Trouble shared by every node of a fleet, changeable while it runs (paused for the idle period).
#[derive(Debug, Default)]
pub struct Trouble {
    /// Chance, in parts per million, that an NVML mutation fails (`NVML_ERROR_UNKNOWN`).
    pub fail_ppm: AtomicU32,
}

/// What the backends of a fleet did, summed over its nodes.
#[derive(Debug, Default)]
pub struct Tally {
    /// NVML mutations that took effect.
    pub mutations: AtomicU64,
    /// Mutations refused because of an injected failure.
    pub injected_failures: AtomicU64,
    pub scrubs: AtomicU64,
    /// Busy processes started.
    pub processes: AtomicU64,
    /// Reads of a node's GPUs (`discover`): every agent pass, polls included, starts with one.
    pub gpu_reads: AtomicU64,
}

#[derive(Clone, Debug)]
struct Instance {
    id: u32,
    profile_id: u32,
    profile: String,
    placement: Placement,
    /// The one compute instance spanning it, once made.
    compute_instance: Option<u32>,
    uuid: String,
}

#[derive(Clone, Debug)]
struct Process {
    pid: u32,
    gpu_instance: Option<u32>,
    used_mib: u64,
    ends: Instant,
}

#[derive(Clone, Debug)]
struct Gpu {
    base: GpuStatus,
    mig_current: bool,
    mig_pending: bool,
    compute_mode: &'static str,
    instances: Vec<Instance>,
    processes: Vec<Process>,
}

#[derive(Debug)]
struct State {
    gpus: Vec<Gpu>,
    rng: Rng,
    /// Source of MIG device UUIDs and pids: a re-created instance gets a new UUID, as on real GPUs.
    serial: u64,
}

/// A node's GPUs in memory.
pub struct MemGpus {
    node: String,
    driver: DriverInfo,
    state: Mutex<State>,
    trouble: Arc<Trouble>,
    tally: Arc<Tally>,
}

fn nvml_error(reason: GpuReason, message: String) -> ActionError {
    ActionError { reason, message }
}

impl MemGpus {
    /// `count` GPUs of `model` for node `node`, half on each of two NUMA nodes.
    pub fn new(
        node: &str,
        model: &ModelTemplate,
        count: u32,
        seed: u64,
        trouble: Arc<Trouble>,
        tally: Arc<Tally>,
    ) -> MemGpus {
        let gpus = (0..count)
            .map(|index| {
                let mut base = model.gpu.clone();
                base.index = index;
                base.uuid = format!("GPU-{node}-{index}");
                base.numa_node = Some(if index < count / 2 { 0 } else { 1 });
                base.instances.clear();
                base.processes.clear();
                Gpu {
                    base,
                    mig_current: false,
                    mig_pending: false,
                    compute_mode: COMPUTE_DEFAULT,
                    instances: Vec::new(),
                    processes: Vec::new(),
                }
            })
            .collect();
        MemGpus {
            node: node.to_string(),
            driver: model.driver.clone(),
            state: Mutex::new(State {
                gpus,
                rng: Rng::new(seed),
                serial: 0,
            }),
            trouble,
            tally,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-made change: every change below is
        // one assignment after its checks; so a poisoned lock's state is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a compute process on GPU `gpu` (in one of its MIG instances, if it has any) that
    /// ends after `lasts`. Returns its pid, or `None` when there is no such GPU.
    pub fn start_process(&self, gpu: u32, lasts: Duration) -> Option<u32> {
        let mut st = self.lock();
        st.serial += 1;
        let pid = 100_000 + st.serial as u32;
        let pick = st.rng.below(8) as usize;
        let g = st.gpus.get_mut(gpu as usize)?;
        let gpu_instance = if g.mig_current && !g.instances.is_empty() {
            Some(g.instances[pick % g.instances.len()].id)
        } else {
            None
        };
        g.processes.push(Process {
            pid,
            gpu_instance,
            used_mib: 1024,
            ends: Instant::now() + lasts,
        });
        self.tally.processes.fetch_add(1, Ordering::Relaxed);
        Some(pid)
    }

    /// Whether a process runs on the GPU (or, with `gpu_instance`, in that instance).
    fn busy(g: &Gpu, gpu_instance: Option<u32>) -> Vec<u32> {
        g.processes
            .iter()
            .filter(|p| gpu_instance.is_none() || p.gpu_instance == gpu_instance)
            .map(|p| p.pid)
            .collect()
    }

    /// An injected failure of the NVML call `call`, at the fleet's rate.
    fn injected(&self, st: &mut State, call: &str) -> Result<(), ActionError> {
        let ppm = self.trouble.fail_ppm.load(Ordering::Relaxed);
        if ppm > 0 && st.rng.below(1_000_000) < u64::from(ppm) {
            self.tally.injected_failures.fetch_add(1, Ordering::Relaxed);
            return Err(nvml_error(
                GpuReason::Failed,
                format!("{call}: Unknown Error (NVML_ERROR_UNKNOWN, injected by the fleet simulator)"),
            ));
        }
        Ok(())
    }
}

impl Gpus for MemGpus {
    fn discover(&self) -> Result<GpuNodeStatus, DiscoverError> {
        self.tally.gpu_reads.fetch_add(1, Ordering::Relaxed);
        let mut st = self.lock();
        let now = Instant::now();
        let mut gpus = Vec::with_capacity(st.gpus.len());
        for g in &mut st.gpus {
            g.processes.retain(|p| p.ends > now);
            let mut s = g.base.clone();
            s.compute_mode = Some(g.compute_mode.to_string());
            s.mig_mode = Some(MigModeStatus {
                current: g.mig_current,
                pending: g.mig_pending,
            });
            if g.mig_current {
                s.instances = g
                    .instances
                    .iter()
                    .map(|i| MigInstanceStatus {
                        gpu_instance_id: i.id,
                        compute_instance_id: i.compute_instance,
                        profile_id: i.profile_id,
                        profile: i.profile.clone(),
                        placement: i.placement,
                        uuid: Some(i.uuid.clone()),
                        ..Default::default()
                    })
                    .collect();
            }
            s.processes = g
                .processes
                .iter()
                .map(|p| ProcessStatus {
                    pid: p.pid,
                    gpu_instance_id: p.gpu_instance,
                    compute_instance_id: p.gpu_instance.map(|_| 0),
                    used_memory_mib: Some(p.used_mib),
                })
                .collect();
            gpus.push(s);
        }
        Ok(GpuNodeStatus {
            driver: Some(self.driver.clone()),
            gpu_count: Some(gpus.len() as u32),
            gpus,
            ..Default::default()
        })
    }

    fn execute(&self, action: &Action) -> Result<(), ActionError> {
        let mut guard = self.lock();
        let st = &mut *guard;
        let index = action.gpu();
        if st.gpus.get(index as usize).is_none() {
            return Err(nvml_error(
                GpuReason::Failed,
                format!(
                    "node {}: GPU {index}: no such GPU (NVML_ERROR_INVALID_ARGUMENT)",
                    self.node
                ),
            ));
        }
        let call = match action {
            Action::SetMigMode { .. } => "nvmlDeviceSetMigMode",
            Action::DestroyComputeInstance { .. } => "nvmlComputeInstanceDestroy",
            Action::DestroyGpuInstance { .. } => "nvmlGpuInstanceDestroy",
            Action::CreateInstance { .. } => "nvmlDeviceCreateGpuInstanceWithPlacement",
            Action::CreateComputeInstance { .. } => "nvmlGpuInstanceCreateComputeInstance",
            Action::SetComputeMode { .. } => "nvmlDeviceSetComputeMode",
            Action::Scrub { .. } => {
                return Err(nvml_error(
                    GpuReason::Failed,
                    format!("GPU {index}: a scrub is not an NVML action"),
                ));
            }
        };
        self.injected(st, &format!("{call}(GPU {index})"))?;
        st.serial += 1;
        let serial = st.serial;
        let g = &mut st.gpus[index as usize];
        match action {
            Action::SetMigMode { enable, .. } => {
                if g.mig_current == *enable && g.mig_pending == *enable {
                    return Ok(());
                }
                if !*enable && !g.instances.is_empty() {
                    return Err(nvml_error(
                        GpuReason::Failed,
                        format!("{call}(GPU {index}): In use by another client (GPU instances exist)"),
                    ));
                }
                g.mig_pending = *enable;
                let pids = Self::busy(g, None);
                if !pids.is_empty() {
                    // NVML: the call succeeds, the activation status is IN_USE and the mode stays pending.
                    return Err(nvml_error(
                        GpuReason::Busy,
                        format!(
                            "MIG mode change is pending: GPU {index} could not be reset to activate it (activation status NVML_ERROR_IN_USE: processes {pids:?})"
                        ),
                    ));
                }
                g.mig_current = *enable;
            }
            Action::DestroyComputeInstance {
                gpu_instance_id,
                compute_instance_id,
                ..
            } => {
                if !Self::busy(g, Some(*gpu_instance_id)).is_empty() {
                    return Err(nvml_error(
                        GpuReason::Failed,
                        format!("{call}(GPU {index}): In use by another client"),
                    ));
                }
                if let Some(i) = g.instances.iter_mut().find(|i| i.id == *gpu_instance_id)
                    && i.compute_instance == Some(*compute_instance_id)
                {
                    i.compute_instance = None;
                }
            }
            Action::DestroyGpuInstance { gpu_instance_id, .. } => {
                if !Self::busy(g, Some(*gpu_instance_id)).is_empty() {
                    return Err(nvml_error(
                        GpuReason::Failed,
                        format!("{call}(GPU {index}): In use by another client"),
                    ));
                }
                let before = g.instances.len();
                g.instances.retain(|i| i.id != *gpu_instance_id);
                if g.instances.len() == before {
                    return Err(nvml_error(
                        GpuReason::Failed,
                        format!("{call}(GPU {index}, GI {gpu_instance_id}): Not Found"),
                    ));
                }
            }
            Action::CreateInstance {
                profile_id,
                profile,
                placement,
                ..
            } => {
                if !g.mig_current {
                    return Err(nvml_error(
                        GpuReason::Failed,
                        format!("{call}(GPU {index}): Not Supported (MIG mode is off)"),
                    ));
                }
                let offered = g
                    .base
                    .profiles
                    .iter()
                    .find(|p| p.id == *profile_id)
                    .is_some_and(|p| p.placements.contains(placement));
                let overlaps = g.instances.iter().any(|i| {
                    i.placement.start < placement.start + placement.size
                        && placement.start < i.placement.start + i.placement.size
                });
                if !offered || overlaps {
                    return Err(nvml_error(
                        GpuReason::Failed,
                        format!("{call}(GPU {index}, {profile} at {placement}): Insufficient Resources"),
                    ));
                }
                let id = (1..).find(|id| g.instances.iter().all(|i| i.id != *id)).unwrap_or(1);
                g.instances.push(Instance {
                    id,
                    profile_id: *profile_id,
                    profile: profile.clone(),
                    placement: *placement,
                    compute_instance: Some(0),
                    uuid: format!("MIG-{}-{index}-{serial}", self.node),
                });
            }
            Action::CreateComputeInstance { gpu_instance_id, .. } => {
                match g.instances.iter_mut().find(|i| i.id == *gpu_instance_id) {
                    Some(i) => i.compute_instance = Some(0),
                    None => {
                        return Err(nvml_error(
                            GpuReason::Failed,
                            format!("{call}(GPU {index}, GI {gpu_instance_id}): Not Found"),
                        ));
                    }
                }
            }
            Action::SetComputeMode { mode, .. } => {
                g.compute_mode = if *mode == COMPUTE_EXCLUSIVE_PROCESS {
                    COMPUTE_EXCLUSIVE_PROCESS
                } else {
                    COMPUTE_DEFAULT
                };
            }
            Action::Scrub { .. } => {}
        }
        self.tally.mutations.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn scrub(&self, device: &str) -> Result<ScrubReport, ScrubError> {
        let st = self.lock();
        for g in &st.gpus {
            let (mib, pids) = if g.base.uuid == device {
                (g.base.memory_mib, Self::busy(g, None))
            } else if let Some(i) = g.instances.iter().find(|i| i.uuid == device) {
                let mib = g
                    .base
                    .profiles
                    .iter()
                    .find(|p| p.id == i.profile_id)
                    .map_or(0, |p| p.memory_mib);
                (mib, Self::busy(g, Some(i.id)))
            } else {
                continue;
            };
            if !pids.is_empty() {
                return Err(ScrubError::Refused {
                    device: device.to_string(),
                    why: format!("processes {pids:?} hold its memory"),
                });
            }
            self.tally.scrubs.fetch_add(1, Ordering::Relaxed);
            let bytes = mib * MIB;
            return Ok(ScrubReport {
                device: device.to_string(),
                total_bytes: bytes,
                free_bytes: bytes,
                bytes_cleared: bytes,
                bytes_verified: bytes,
                ..Default::default()
            });
        }
        Err(ScrubError::Refused {
            device: device.to_string(),
            why: format!("no such GPU or MIG device on node {}", self.node),
        })
    }
}
