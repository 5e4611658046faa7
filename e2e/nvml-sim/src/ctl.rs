//! What tests and `sim-ctl` do to the simulated node from outside: the things a real node does
//! on its own (workloads start and stop, the machine reboots) and fault injection.

use crate::nvml::error_code;
use crate::state::{Fault, LogEntry, Paths, SimProcess, SimState, now_us, read, update};

/// Where a process runs: a whole GPU, or the GPU instance at a memory-slice start.
#[derive(Clone, Debug, Default)]
pub struct Attach {
    pub gpu: u32,
    pub placement_start: Option<u32>,
    pub pid: u32,
    pub tenant: Option<String>,
    pub used_mib: u64,
    /// Percent of the device's SMs it keeps busy.
    pub sm_util: u32,
}

/// Starts a simulated process; its tenant's data is now in that memory.
pub fn attach(paths: &Paths, a: &Attach) -> Result<(), String> {
    update(paths, |st| {
        let g = st.gpu_mut(a.gpu).ok_or_else(|| format!("no GPU {}", a.gpu))?;
        let gi = match a.placement_start {
            None if g.mig_current => {
                return Err(format!("GPU {} is in MIG mode: name an instance with --start", a.gpu));
            }
            None => None,
            Some(s) => Some(
                g.gis
                    .iter()
                    .find(|gi| gi.start == s)
                    .ok_or_else(|| format!("GPU {} has no GPU instance starting at slice {s}", a.gpu))?,
            ),
        };
        let (gi_id, ci) = (gi.map(|x| x.id), gi.and_then(|x| x.cis.first().map(|c| c.id)));
        // GPM counts busy time at the processes that ran until now.
        g.checkpoint_gpm(now_us());
        if let Some(t) = &a.tenant {
            let r = g.slices_of(gi_id);
            for s in &mut g.dirty[r] {
                *s = Some(t.clone());
            }
        }
        g.processes.push(SimProcess {
            pid: a.pid,
            gi: gi_id,
            ci,
            used_mib: a.used_mib,
            tenant: a.tenant.clone(),
            sm_util: a.sm_util.min(100),
            container: None,
        });
        Ok(())
    })?
}

/// Ends a simulated process (its data stays in memory).
pub fn detach(paths: &Paths, pid: u32) -> Result<(), String> {
    update(paths, |st| {
        let mut found = false;
        let now = now_us();
        for g in &mut st.gpus {
            if g.processes.iter().any(|p| p.pid == pid) {
                g.checkpoint_gpm(now);
            }
            let before = g.processes.len();
            g.processes.retain(|p| p.pid != pid);
            found |= g.processes.len() != before;
        }
        if found {
            Ok(())
        } else {
            Err(format!("no simulated process {pid}"))
        }
    })?
}

/// Something that is not a compute process opens the GPU (nvidia-persistenced, nvidia_drm, a
/// display server): the process list stays empty, but the GPU cannot be reset.
pub fn hold(paths: &Paths, gpu: u32, by: &str) -> Result<(), String> {
    update(paths, |st| {
        let g = st.gpu_mut(gpu).ok_or_else(|| format!("no GPU {gpu}"))?;
        g.holders.push(by.to_string());
        Ok(())
    })?
}

/// The holder `by` lets go of the GPU (every holder with `by = None`).
pub fn release(paths: &Paths, gpu: u32, by: Option<&str>) -> Result<(), String> {
    update(paths, |st| {
        let g = st.gpu_mut(gpu).ok_or_else(|| format!("no GPU {gpu}"))?;
        g.holders.retain(|h| by.is_some_and(|b| b != h));
        Ok(())
    })?
}

pub fn reboot(paths: &Paths) -> Result<(), String> {
    update(paths, SimState::reboot)
}

pub fn reset(paths: &Paths, gpu: u32) -> Result<(), String> {
    update(paths, |st| st.reset(gpu))?
}

/// Makes the `at`-th next call of `call` (or of any mutation, with `call = "mutation"`) fail
/// with the NVML or CUDA error `error` (a name like `IN_USE` or a number), `times` times.
pub fn fail(paths: &Paths, call: &str, at: u64, error: &str, times: u32) -> Result<(), String> {
    fail_on(paths, call, None, at, error, times)
}

/// [`fail`] for the calls about one GPU (or its instances) only, with `gpu`.
pub fn fail_on(paths: &Paths, call: &str, gpu: Option<u32>, at: u64, error: &str, times: u32) -> Result<(), String> {
    let code = error_code(error)
        .ok_or_else(|| format!("unknown error {error:?}: use an NVML name like IN_USE or a number"))?;
    update(paths, |st| {
        st.faults.push(Fault {
            call: call.to_string(),
            gpu,
            at: at.max(1),
            error: code,
            times: times.max(1),
            seen: 0,
            rate: None,
        })
    })
}

/// Makes each call of `call` (`any`: every NVML and CUDA call; `mutation`: mutating calls),
/// about `gpu` if given, fail with probability `rate` until the faults are cleared; `seed`
/// (non-zero) restarts the generator, so a run can be repeated.
pub fn fail_at_random(
    paths: &Paths,
    call: &str,
    gpu: Option<u32>,
    rate: f64,
    error: &str,
    seed: Option<u64>,
) -> Result<(), String> {
    if !(0.0..=1.0).contains(&rate) {
        return Err(format!("--rate {rate} is not a probability: give a number from 0 to 1"));
    }
    let code = error_code(error)
        .ok_or_else(|| format!("unknown error {error:?}: use an NVML name like IN_USE or a number"))?;
    update(paths, |st| {
        if let Some(seed) = seed.filter(|s| *s != 0) {
            st.rng = seed;
        }
        st.faults.push(Fault {
            call: call.to_string(),
            gpu,
            at: 1,
            error: code,
            times: u32::MAX,
            seen: 0,
            rate: Some(rate),
        })
    })
}

/// Aborts whichever process makes the `n`-th mutation from now, right after it lands.
pub fn abort_at(paths: &Paths, n: u64) -> Result<(), String> {
    update(paths, |st| st.abort_at_mutation = Some(st.mutations + n.max(1)))
}

pub fn clear_faults(paths: &Paths) -> Result<(), String> {
    update(paths, |st| {
        st.faults.clear();
        st.abort_at_mutation = None;
    })
}

/// Marks the whole GPU, or the instance at `start`, as holding `tenant`'s data.
pub fn set_dirty(paths: &Paths, gpu: u32, start: Option<u32>, tenant: &str) -> Result<(), String> {
    update(paths, |st| {
        let g = st.gpu_mut(gpu).ok_or_else(|| format!("no GPU {gpu}"))?;
        let gi = start
            .map(|s| {
                g.gis
                    .iter()
                    .find(|gi| gi.start == s)
                    .map(|gi| gi.id)
                    .ok_or(format!("no instance at {s}"))
            })
            .transpose()?;
        let r = g.slices_of(gi);
        for s in &mut g.dirty[r] {
            *s = Some(tenant.to_string());
        }
        Ok(())
    })?
}

pub fn mutations(paths: &Paths) -> Result<u64, String> {
    Ok(read(paths)?.mutations)
}

pub fn log_since(paths: &Paths, since: u64) -> Result<Vec<LogEntry>, String> {
    Ok(read(paths)?.log_since(since))
}

/// What went wrong on a GPU, as the driver reports it to NVML's event sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DriverEvent {
    /// An XID error (e.g. 79: the GPU has fallen off the bus; 13: an application's fault).
    Xid(u64),
    /// An uncorrectable (double-bit) ECC error.
    EccUncorrectable,
}

/// The driver reports `event` on GPU `gpu`, in the MIG instance at memory slice `start` if given
/// (its GPU instance and first compute instance), else on the whole GPU.
pub fn event(paths: &Paths, gpu: u32, start: Option<u32>, event: DriverEvent) -> Result<(), String> {
    use nvml_wrapper_sys::bindings::{nvmlEventTypeDoubleBitEccError, nvmlEventTypeXidCriticalError};
    update(paths, |st| {
        let g = st.gpu_mut(gpu).ok_or_else(|| format!("no GPU {gpu}"))?;
        let (gi, ci) = match start {
            None => (None, None),
            Some(s) => {
                let gi = g
                    .gis
                    .iter()
                    .find(|gi| gi.start == s)
                    .ok_or_else(|| format!("GPU {gpu} has no GPU instance starting at slice {s}"))?;
                (Some(gi.id), gi.cis.first().map(|c| c.id))
            }
        };
        let (event_type, data) = match event {
            DriverEvent::Xid(xid) => (u64::from(nvmlEventTypeXidCriticalError), xid),
            DriverEvent::EccUncorrectable => (u64::from(nvmlEventTypeDoubleBitEccError), 0),
        };
        let seq = st.events.last().map_or(1, |e| e.seq + 1);
        st.events.push(crate::state::SimEvent {
            seq,
            gpu,
            event_type,
            data,
            gpu_instance: gi,
            compute_instance: ci,
        });
        let excess = st.events.len().saturating_sub(crate::state::EVENTS_KEPT);
        st.events.drain(..excess);
        Ok(())
    })?
}
