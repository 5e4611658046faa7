//! The simulated node: GPUs, MIG instances, processes and memory contents, kept in a JSON file so
//! that separate processes (agent runs, `sim-ctl`, tests) see the same hardware.
//!
//! Every access takes an exclusive `flock` on `<state>.lock`, loads the file, and writes it back
//! only when something changed. The file is created from the config on first use.

use gpu_tenancy_core::mig::{self, GpuModel, Shape};
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// Environment variable naming the YAML file that describes the simulated GPUs.
pub const CONFIG_ENV: &str = "GPU_TENANCY_SIM_CONFIG";
/// Environment variable naming the state file (default: the config path + `.state.json`).
pub const STATE_ENV: &str = "GPU_TENANCY_SIM_STATE";

pub const MIB: u64 = 1024 * 1024;

/// The `call` of a fault that matches every NVML and CUDA call (for random-rate faults).
pub const ANY_CALL: &str = "any";

/// The next number in [0, 1) of the state's generator (xorshift64*), seeding it on first use.
fn next_unit(state: &mut u64) -> f64 {
    if *state == 0 {
        *state = 0x9E37_79B9_7F4A_7C15;
    }
    let mut x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
}

/// The config file: the same GPU entries as the offline inventory file.
#[derive(Deserialize, Debug, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SimConfig {
    #[serde(default)]
    pub driver_version: Option<String>,
    /// CUDA driver API version as NVML encodes it (`12040` is 12.4).
    #[serde(default)]
    pub cuda_version: Option<i32>,
    pub gpus: Vec<GpuEntry>,
}

#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuEntry {
    #[serde(default)]
    pub pci_device_id: Option<String>,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default = "one")]
    pub count: u32,
    #[serde(default)]
    pub numa_node: Option<i32>,
    /// Start with MIG mode enabled.
    #[serde(default)]
    pub mig: bool,
    /// Passed through to a VM that cannot reset it: a MIG mode change waits for a (VM) reboot.
    #[serde(default)]
    pub pass_through: bool,
}

fn one() -> u32 {
    1
}

#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct SimState {
    pub driver_version: String,
    pub nvml_version: String,
    pub cuda_version: i32,
    pub gpus: Vec<SimGpu>,
    /// Source of unique MIG UUIDs: a re-created instance gets a new one, as on real GPUs.
    pub uuid_counter: u64,
    /// NVML mutations so far (successful ones; what `log` lists).
    pub mutations: u64,
    pub log: Vec<LogEntry>,
    pub faults: Vec<Fault>,
    /// Abort the calling process right after this mutation number has been applied.
    pub abort_at_mutation: Option<u64>,
    /// Scrubs completed through the simulated CUDA side.
    pub scrubs: Vec<ScrubEntry>,
    /// Bytes a memset does not clear (`sim-ctl plant`).
    #[serde(default)]
    pub stale: Vec<StaleByte>,
    /// What the driver reported since the node started, for NVML's event sets
    /// (`nvmlEventSetWait_v2`): XID errors and ECC errors, oldest first ([`SimEvent`]).
    #[serde(default)]
    pub events: Vec<SimEvent>,
    /// State of the generator random-rate faults draw from (xorshift64*; 0: not seeded yet).
    #[serde(default)]
    pub rng: u64,
    /// Per-container memory caps the toolkit's hook set ([`crate::caps`]).
    #[serde(default)]
    pub caps: Vec<MemoryCap>,
    /// Set by [`SimState::record`] when the abort point is reached; never saved.
    #[serde(skip)]
    pub abort_now: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct SimGpu {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub device_id: u16,
    pub model: String,
    pub memory_mib: u64,
    pub numa_node: Option<i32>,
    pub mig_current: bool,
    pub mig_pending: bool,
    /// NVML compute mode: 0 Default, 2 Prohibited, 3 ExclusiveProcess.
    pub compute_mode: u32,
    /// No GPU reset is exposed (pass-through to a VM): MIG mode changes need a reboot.
    #[serde(default)]
    pub pass_through: bool,
    /// Clients that hold the device open without being compute processes (nvidia-persistenced,
    /// the nvidia_drm module, a display server): invisible to the process list, but they keep
    /// the GPU from being reset.
    #[serde(default)]
    pub holders: Vec<String>,
    pub gis: Vec<SimGi>,
    pub processes: Vec<SimProcess>,
    /// Per memory slice: the tenant whose data it still holds (the whole GPU is all 8 slices).
    pub dirty: Vec<Option<String>>,
    /// GPM's counters (Hopper and later): SM-busy time integrated from the processes' `sm_util`.
    #[serde(default)]
    pub gpm: GpmCounters,
}

/// SM-busy time so far, in percent × microseconds, of the whole GPU and of each GPU instance, as
/// of `at_us` (wall clock). Between two changes of the processes the busy rate is constant, so a
/// counter now is its value at `at_us` plus the rate × the time since: a reading writes nothing,
/// and every change of the processes first brings the counters up to that moment
/// ([`SimGpu::checkpoint_gpm`]). GPM samples are two readings of these; the metrics their
/// difference over the time between them.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct GpmCounters {
    pub at_us: u64,
    pub gpu: f64,
    /// By GPU instance ID.
    #[serde(default)]
    pub gis: std::collections::BTreeMap<u32, f64>,
}

/// The wall clock in microseconds since the Unix epoch: NVML's sample timestamps are CPU time in
/// microseconds.
pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct SimGi {
    pub id: u32,
    pub profile_id: u32,
    pub start: u32,
    pub size: u32,
    pub cis: Vec<SimCi>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct SimCi {
    pub id: u32,
    pub profile_id: u32,
    pub uuid: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct SimProcess {
    pub pid: u32,
    pub gi: Option<u32>,
    pub ci: Option<u32>,
    pub used_mib: u64,
    pub tenant: Option<String>,
    /// Percent of its device's streaming multiprocessors the process keeps busy (what NVML's
    /// utilization calls sum up, capped at 100 per device).
    #[serde(default)]
    pub sm_util: u32,
    /// The container the process runs in (the driver knows it by the process's cgroup): its
    /// allocations count against that container's memory cap on this GPU, if it has one
    /// ([`crate::caps`]).
    #[serde(default)]
    pub container: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct LogEntry {
    pub seq: u64,
    pub call: String,
    pub gpu: u32,
    pub detail: String,
}

/// Makes a call fail: the `at`-th call of `call` (a function name, or `mutation` for any mutating
/// call) after the fault is installed returns `error` instead, and so do the next `times - 1`.
/// With `gpu`, only calls about that GPU (or its instances) count.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Fault {
    pub call: String,
    #[serde(default)]
    pub gpu: Option<u32>,
    pub at: u64,
    pub error: u32,
    pub times: u32,
    /// Matching calls seen so far.
    #[serde(default)]
    pub seen: u64,
    /// Instead of the `at`-th call: each matching call fails with this probability (0 to 1),
    /// drawn from the state's own generator, so a seeded run repeats.
    #[serde(default)]
    pub rate: Option<f64>,
}

/// One event of the driver, as an event set delivers it: `seq` numbers them from 1, so each
/// event set delivers only what came after it was created, as NVML's do.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct SimEvent {
    pub seq: u64,
    pub gpu: u32,
    /// An `nvmlEventType*` bit: `nvmlEventTypeXidCriticalError`, `nvmlEventTypeDoubleBitEccError`...
    pub event_type: u64,
    /// The XID of an XID event; 0 otherwise.
    pub data: u64,
    /// The GPU and compute instance the error was in, on a GPU in MIG mode (`None`: the whole GPU,
    /// which NVML reports as 0xFFFFFFFF).
    pub gpu_instance: Option<u32>,
    pub compute_instance: Option<u32>,
}

/// Events kept in the state: an event set that falls this far behind loses the oldest, as the
/// driver's queue would.
pub const EVENTS_KEPT: usize = 256;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ScrubEntry {
    pub gpu: u32,
    /// `None` for the whole GPU.
    pub gpu_instance: Option<u32>,
    pub bytes: u64,
    /// Bytes of it the verification kernel read back (its launches over the memory cleared).
    #[serde(default)]
    pub bytes_verified: u64,
}

/// A PCI address: domain, bus, device, function.
pub type PciAddress = (u32, u32, u32, u32);

impl SimGpu {
    /// Where the simulator puts a GPU on the PCI bus: domain 0, bus 0x18 + index, device 0,
    /// function 0 (what `nvmlDeviceGetPciInfo_v3` reports as `00000000:18:00.0` for GPU 0).
    pub fn pci_address(&self) -> PciAddress {
        (0, 0x18 + self.index, 0, 0)
    }

    pub fn model(&self) -> &'static GpuModel {
        mig::model_by_name(&self.model).expect("state names a known model")
    }

    pub fn mig_capable(&self) -> bool {
        true
    }

    /// Whether anything keeps the GPU from being reset: compute processes, or other holders.
    pub fn in_use(&self) -> bool {
        !self.processes.is_empty() || !self.holders.is_empty()
    }

    pub fn gi(&self, id: u32) -> Option<&SimGi> {
        self.gis.iter().find(|g| g.id == id)
    }

    /// GPM (GPU Performance Monitoring) is on Hopper and later: compute capability 9.0 and up
    /// (nvml.h: "For Hopper or newer fully supported devices").
    pub fn has_gpm(&self) -> bool {
        self.model().compute_capability.0 >= 9
    }

    /// Percent of the SMs busy now: of GPU instance `gi`, the sum of its processes' `sm_util`
    /// (capped at 100); of the whole GPU without MIG, all its processes'; of a GPU in MIG mode,
    /// its instances' rates weighted by their compute slices of 7.
    pub fn busy_percent(&self, gi: Option<u32>) -> f64 {
        let sum = |f: &dyn Fn(&SimProcess) -> bool| -> f64 {
            let s: u32 = self.processes.iter().filter(|p| f(p)).map(|p| p.sm_util).sum();
            f64::from(s.min(100))
        };
        match gi {
            Some(id) => sum(&|p| p.gi == Some(id)),
            None if self.mig_current => self
                .gis
                .iter()
                .map(|g| {
                    let slices = Shape::from_profile_id(g.profile_id).map_or(0, |s| s.info().compute_slices);
                    sum(&|p| p.gi == Some(g.id)) * f64::from(slices) / f64::from(mig::COMPUTE_SLICES)
                })
                .sum(),
            None => sum(&|_| true),
        }
    }

    /// The GPM counter of the whole GPU (`None`) or a GPU instance at `now` (microseconds).
    pub fn gpm_counter(&self, gi: Option<u32>, now: u64) -> f64 {
        let since = now.saturating_sub(self.gpm.at_us) as f64;
        let stored = match gi {
            None => self.gpm.gpu,
            Some(id) => self.gpm.gis.get(&id).copied().unwrap_or(0.0),
        };
        stored + self.busy_percent(gi) * since
    }

    /// Brings the GPM counters up to `now`, at the processes as they are: call before the
    /// processes change. Counters of instances that are gone are dropped.
    pub fn checkpoint_gpm(&mut self, now: u64) {
        if self.gpm.at_us == 0 {
            self.gpm.at_us = now;
        }
        let gpu = self.gpm_counter(None, now);
        let gis = self
            .gis
            .iter()
            .map(|g| (g.id, self.gpm_counter(Some(g.id), now)))
            .collect();
        self.gpm = GpmCounters { at_us: now, gpu, gis };
    }

    /// Memory of a GPU instance: what the driver reports for its profile on this model (the
    /// published `nvidia-smi mig -lgip` figure where there is one), else its share of the slices.
    pub fn gi_memory_mib(&self, gi: &SimGi) -> u64 {
        match Shape::from_profile_id(gi.profile_id) {
            Some(shape) => self.model().shape_memory_mib(shape).min(self.memory_mib),
            None => self.memory_mib * gi.size as u64 / mig::MEMORY_SLICES as u64,
        }
    }

    pub fn slices_of(&self, gi: Option<u32>) -> std::ops::Range<usize> {
        match gi.and_then(|id| self.gi(id)) {
            Some(g) => g.start as usize..(g.start + g.size) as usize,
            None => 0..mig::MEMORY_SLICES as usize,
        }
    }

    /// Tenants whose data is still in the memory of the GPU (`gi: None`) or an instance.
    pub fn dirty_tenants(&self, gi: Option<u32>) -> Vec<String> {
        let mut out: Vec<String> = self.dirty[self.slices_of(gi)].iter().flatten().cloned().collect();
        out.sort();
        out.dedup();
        out
    }

    pub fn shape_of(profile_id: u32) -> Option<Shape> {
        Shape::from_profile_id(profile_id)
    }

    /// Whether the driver maps this GPU's placements onto its memory halves the other way round.
    ///
    /// Real GPUs differ here by chip (which half holds the GPC the chip lacks): the same
    /// placements got IDs 9, 10, 3, 2 on one A100 and 13, 14, 5, 1 on the next one of the same
    /// node (`nvidia-smi mig -lgi` in NVIDIA/DCGM#138). The simulator makes every odd GPU index
    /// such a GPU, deterministically, so tests meet both kinds.
    pub fn swaps_halves(&self) -> bool {
        self.index % 2 == 1
    }

    /// The ID the driver gives a GPU instance at `start:size`: it follows from the placement, not
    /// from creation order.
    ///
    /// On A100 the IDs are the hardware's memory-partition numbers: 0 the whole GPU, 1-2 the
    /// halves, 3-6 the quarters, 7-14 the eighths, so 1g instances get IDs from 7 up
    /// (NVIDIA/DCGM#138; `nvidia-smi mig -cgi 19,...` making IDs 9, 7, 8, 11, 12, 13, 14 in
    /// rapidsai/dask-cuda#583, ID 10 left out on that chip). Placements count from the GPU's first
    /// half, or from its second one on a GPU that [`SimGpu::swaps_halves`]. No such output of an
    /// H100, H200 or B200 was found: they get the same numbering, since their placements are the
    /// A100's (docs/nvidia.md#mig-geometry).
    pub fn gpu_instance_id(&self, start: u32, size: u32) -> u32 {
        let half = mig::MEMORY_SLICES / 2;
        let slice = if self.swaps_halves() {
            (start + half) % mig::MEMORY_SLICES
        } else {
            start
        };
        match size {
            8 => 0,
            4 => 1 + slice / 4,
            2 => 3 + slice / 2,
            _ => 7 + slice,
        }
    }
}

impl SimState {
    pub fn from_config(cfg: &SimConfig) -> Result<SimState, String> {
        let mut st = SimState {
            driver_version: cfg.driver_version.clone().unwrap_or_else(|| "550.54.15".into()),
            nvml_version: "12.550.54.15".into(),
            cuda_version: cfg.cuda_version.unwrap_or(12040),
            ..Default::default()
        };
        for entry in &cfg.gpus {
            let (model, device_id, name) = match (&entry.pci_device_id, &entry.model) {
                (Some(pci), _) => {
                    let model = mig::model_by_pci_id(pci)
                        .ok_or_else(|| format!("gpus: pciDeviceId {pci:?} is not a modelled MIG GPU"))?;
                    let id = mig::parse_pci_id(pci).unwrap_or(model.variants[0].device_id);
                    (model, id, mig::variant_name(id).unwrap_or(model.name()).to_string())
                }
                (None, Some(name)) => {
                    let model = mig::model_by_name(name)
                        .ok_or_else(|| format!("gpus: model {name:?} is not a modelled MIG GPU"))?;
                    let v = model
                        .variants
                        .iter()
                        .find(|v| v.name == name)
                        .unwrap_or(&model.variants[0]);
                    (model, v.device_id, v.name.to_string())
                }
                (None, None) => return Err("gpus: each entry needs pciDeviceId or model".into()),
            };
            for _ in 0..entry.count {
                let index = st.gpus.len() as u32;
                st.gpus.push(SimGpu {
                    index,
                    uuid: format!(
                        "GPU-{:08x}-51a1-4e0b-9c{:02x}-{:012x}",
                        0x5157_0000 + index,
                        index,
                        device_id as u64
                    ),
                    name: name.clone(),
                    device_id,
                    model: model.key.to_string(),
                    memory_mib: model.memory_mib,
                    numa_node: entry.numa_node,
                    mig_current: entry.mig,
                    mig_pending: entry.mig,
                    compute_mode: 0,
                    pass_through: entry.pass_through,
                    holders: Vec::new(),
                    gis: Vec::new(),
                    processes: Vec::new(),
                    dirty: vec![None; mig::MEMORY_SLICES as usize],
                    gpm: GpmCounters::default(),
                });
            }
        }
        Ok(st)
    }

    pub fn gpu(&self, index: u32) -> Option<&SimGpu> {
        self.gpus.get(index as usize)
    }

    pub fn gpu_mut(&mut self, index: u32) -> Option<&mut SimGpu> {
        self.gpus.get_mut(index as usize)
    }

    pub fn next_mig_uuid(&mut self, gpu: u32, gi: u32) -> String {
        self.uuid_counter += 1;
        format!(
            "MIG-{:08x}-{:04x}-4d1e-8f00-{:012x}",
            0x6d16_0000 + gpu,
            gi,
            self.uuid_counter
        )
    }

    /// Counts a call (about `gpu`, if about one) against the faults installed for it; returns the
    /// injected error, if due.
    pub fn check_fault(&mut self, call: &str, gpu: Option<u32>) -> Option<u32> {
        let mut hit = None;
        let mut rng = self.rng;
        for f in self
            .faults
            .iter_mut()
            .filter(|f| (f.call == call || f.call == ANY_CALL) && f.times > 0 && (f.gpu.is_none() || f.gpu == gpu))
        {
            f.seen += 1;
            let due = match f.rate {
                Some(rate) => next_unit(&mut rng) < rate,
                None => f.seen >= f.at,
            };
            if hit.is_none() && due {
                f.times -= 1;
                hit = Some(f.error);
            }
        }
        self.rng = rng;
        hit
    }

    /// Records a successful mutation. At the abort point the process is killed right after the
    /// state is saved, like an agent killed between two steps.
    pub fn record(&mut self, call: &str, gpu: u32, detail: String) {
        self.mutations += 1;
        self.log.push(LogEntry {
            seq: self.mutations,
            call: call.to_string(),
            gpu,
            detail,
        });
        if self.abort_at_mutation == Some(self.mutations) {
            self.abort_at_mutation = None;
            self.abort_now = true;
        }
    }

    /// A node reboot: instances and processes are gone, pending MIG modes take effect, compute
    /// modes go back to Default. Memory contents are not cleared (nothing guarantees that).
    pub fn reboot(&mut self) {
        let now = now_us();
        for g in &mut self.gpus {
            g.checkpoint_gpm(now);
            g.gis.clear();
            g.processes.clear();
            g.mig_current = g.mig_pending;
            g.compute_mode = 0;
        }
        // The containers are gone with their processes; the hook sets a new container's cap.
        self.caps.clear();
    }

    /// A GPU reset (or, for a pass-through GPU, the VM's reboot): applies a pending MIG mode.
    /// Refused while anything holds the GPU.
    pub fn reset(&mut self, index: u32) -> Result<(), String> {
        let g = self.gpu_mut(index).ok_or_else(|| format!("no GPU {index}"))?;
        if g.in_use() {
            return Err(format!(
                "GPU {index} is in use (processes or holders); a reset is refused"
            ));
        }
        g.gis.clear();
        g.mig_current = g.mig_pending;
        Ok(())
    }

    /// Mutation log entries after `since` (a `mutations` value read earlier).
    pub fn log_since(&self, since: u64) -> Vec<LogEntry> {
        self.log.iter().filter(|e| e.seq > since).cloned().collect()
    }
}

/// Where the config and state live, from the environment.
#[derive(Clone, Debug)]
pub struct Paths {
    pub config: PathBuf,
    pub state: PathBuf,
}

impl Paths {
    pub fn from_env() -> Result<Paths, String> {
        let config = std::env::var_os(CONFIG_ENV)
            .map(PathBuf::from)
            .ok_or_else(|| format!("{CONFIG_ENV} is not set: it must name the simulated GPUs' YAML file"))?;
        Ok(Paths::for_config(&config))
    }

    pub fn for_config(config: &Path) -> Paths {
        let state = std::env::var_os(STATE_ENV).map(PathBuf::from).unwrap_or_else(|| {
            let mut s = config.as_os_str().to_owned();
            s.push(".state.json");
            PathBuf::from(s)
        });
        Paths {
            config: config.to_path_buf(),
            state,
        }
    }
}

struct Lock(File);

impl Lock {
    fn take(state: &Path) -> Result<Lock, String> {
        let mut p = state.as_os_str().to_owned();
        p.push(".lock");
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(PathBuf::from(&p))
            .map_err(|e| format!("cannot open lock file {}: {e}", PathBuf::from(&p).display()))?;
        // SAFETY: flock on a descriptor we own; released when the file closes.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(format!("cannot lock {}", PathBuf::from(&p).display()));
        }
        Ok(Lock(f))
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        // SAFETY: unlocking our own descriptor.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

pub fn load_config(path: &Path) -> Result<SimConfig, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_saphyr::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn load_unlocked(paths: &Paths) -> Result<SimState, String> {
    match std::fs::read_to_string(&paths.state) {
        Ok(text) => serde_json::from_str(&text).map_err(|e| format!("{}: {e}", paths.state.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => SimState::from_config(&load_config(&paths.config)?),
        Err(e) => Err(format!("cannot read {}: {e}", paths.state.display())),
    }
}

fn save_unlocked(paths: &Paths, st: &SimState) -> Result<(), String> {
    let tmp = paths.state.with_extension("tmp");
    let mut f = File::create(&tmp).map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
    f.write_all(serde_json::to_string_pretty(st).expect("state serialises").as_bytes())
        .and_then(|_| f.sync_all())
        .map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, &paths.state).map_err(|e| format!("cannot replace {}: {e}", paths.state.display()))
}

/// Runs `f` on the state under the lock; saves when `f` reports a change (`.1 == true`).
pub fn with_state<R>(paths: &Paths, f: impl FnOnce(&mut SimState) -> (R, bool)) -> Result<R, String> {
    let _lock = Lock::take(&paths.state)?;
    let mut st = load_unlocked(paths)?;
    let (r, changed) = f(&mut st);
    if changed || st.abort_now {
        save_unlocked(paths, &st)?;
    }
    if st.abort_now {
        eprintln!("nvml-sim: aborting at mutation {} as injected", st.mutations);
        // A simulated crash should not litter the working directory with core files.
        let none = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: lowering our own core size limit.
        unsafe { libc::setrlimit(libc::RLIMIT_CORE, &none) };
        std::process::abort();
    }
    Ok(r)
}

/// Reads the state (for tests and `sim-ctl`).
pub fn read(paths: &Paths) -> Result<SimState, String> {
    with_state(paths, |st| (st.clone(), false))
}

/// Changes the state (for tests and `sim-ctl`).
pub fn update<R>(paths: &Paths, f: impl FnOnce(&mut SimState) -> R) -> Result<R, String> {
    with_state(paths, |st| (f(st), true))
}

#[cfg(test)]
mod random_fault_tests {
    use super::*;

    fn state_with(rate: f64, seed: u64) -> SimState {
        SimState {
            rng: seed,
            faults: vec![Fault {
                call: ANY_CALL.into(),
                gpu: Some(1),
                at: 1,
                error: 999,
                times: u32::MAX,
                seen: 0,
                rate: Some(rate),
            }],
            ..SimState::default()
        }
    }

    #[test]
    fn random_faults_hit_at_their_rate_on_their_gpu_and_repeat_with_a_seed() {
        let count = |st: &mut SimState, gpu| {
            (0..10_000)
                .filter(|_| st.check_fault("nvmlDeviceGetUUID", gpu).is_some())
                .count()
        };
        assert_eq!(count(&mut state_with(0.0, 7), Some(1)), 0);
        assert_eq!(count(&mut state_with(1.0, 7), Some(1)), 10_000);
        let hits = count(&mut state_with(0.3, 7), Some(1));
        assert!((2_700..3_300).contains(&hits), "{hits} of 10000 at rate 0.3");
        assert_eq!(
            count(&mut state_with(1.0, 7), Some(0)),
            0,
            "another GPU's calls are spared"
        );
        assert_eq!(
            hits,
            count(&mut state_with(0.3, 7), Some(1)),
            "the same seed, the same faults"
        );
    }
}

/// A cap the driver holds for one container on one GPU, in MiB.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MemoryCap {
    pub gpu_uuid: String,
    pub container: String,
    /// `NVIDIA_GPU_MEMORY_REQUEST`, when the container set it (recorded, not enforced).
    pub request_mib: Option<u64>,
    /// What allocations are held to.
    pub limit_mib: u64,
}

/// A byte that keeps its value through every write (`sim-ctl plant`, [`crate::stale`]).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct StaleByte {
    pub gpu: u32,
    /// The GPU instance ID; `None` for the whole GPU.
    pub gpu_instance: Option<u32>,
    /// Offset in the memory a scrub of that device clears, in the order it clears it.
    pub offset: u64,
    pub value: u8,
}
