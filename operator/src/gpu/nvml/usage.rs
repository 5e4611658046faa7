//! How busy the GPUs are, for the agent's metrics: a whole GPU's utilization
//! (`nvmlDeviceGetUtilizationRates`), its processes' samples (`nvmlDeviceGetProcessUtilization`)
//! and, on Hopper and later, each MIG instance's from GPM (`nvmlGpmMigSampleGet`,
//! `nvmlGpmMetricsGet`). NVML reports neither of the first two for a GPU in MIG mode, and GPM does
//! not exist before Hopper: what NVML does not report is left out, never guessed.
//!
//! GPM metrics are the difference of two samples, so the backend keeps each instance's last
//! sample from one reading to the next (keyed by the MIG device UUID, so a re-created instance
//! never takes its predecessor's sample) and the timestamp of each GPU's last process sample.
//! Raw handles through the function table: nvml-wrapper's `GpmSample` borrows the `Nvml` it came
//! from, which a struct owning both cannot hold.

use super::ffi::{NvmlError, check, sym};
use crate::api::{GpuNodeStatus, GpuStatus};
use crate::attribution::ProcessSample;
use crate::gpu::Usage;
use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError as WrapperError;
use nvml_wrapper_sys::bindings::*;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// nvml.h: "The interval between two nvmlGpmSampleGet() calls should be greater than 100ms due
/// to the internal sample refresh rate."
const GPM_MIN_INTERVAL: Duration = Duration::from_millis(100);

/// A GPM sample buffer allocated by the loaded NVML, freed through it.
struct RawSample(nvmlGpmSample_t);

// SAFETY: a sample is plain memory of the library's; it is used under the backend's mutex only.
unsafe impl Send for RawSample {}

/// An instance's last GPM sample and the figure computed with it.
struct Last {
    sample: RawSample,
    taken: Instant,
    ratio: Option<f64>,
}

/// What one reading leaves for the next.
#[derive(Default)]
pub(super) struct UsageMemory {
    /// By (GPU index, MIG device UUID).
    gpm: BTreeMap<(u32, String), Last>,
    /// Whether GPM is supported, by GPU index (asked once: it is the chip's).
    gpm_supported: BTreeMap<u32, bool>,
    /// The newest per-process sample's timestamp seen, by GPU index.
    process_seen: BTreeMap<u32, u64>,
}

impl UsageMemory {
    /// How busy the GPUs of `status` are now, read through `nvml` (GPUs it could not read are
    /// skipped); the samples and timestamps this reading takes are kept for the next.
    pub(super) fn read(&mut self, nvml: &Nvml, status: &GpuNodeStatus) -> Usage {
        let memory = self;
        let mut out = Usage::default();
        let mut kept = Vec::new();
        for g in status.gpus.iter().filter(|g| !g.uuid.is_empty()) {
            let Ok(dev) = nvml.device_by_index(g.index) else {
                continue;
            };
            if g.mig_mode.is_some_and(|m| m.current) {
                let supported = *memory
                    .gpm_supported
                    .entry(g.index)
                    .or_insert_with(|| dev.gpm_support().unwrap_or(false));
                if supported {
                    // SAFETY: the handle belongs to `dev`, which lives as long as `nvml`.
                    let handle = unsafe { dev.handle() };
                    for (gi, ratio) in memory.instance_usage(nvml, g, handle, &mut kept) {
                        out.instances.insert((g.index, gi), ratio);
                    }
                }
                continue;
            }
            match dev.utilization_rates() {
                Ok(u) => {
                    out.gpus.insert(g.index, f64::from(u.gpu.min(100)) / 100.0);
                }
                Err(WrapperError::NotSupported) => {}
                Err(e) => tracing::debug!(gpu = g.index, error = %e, "nvmlDeviceGetUtilizationRates failed"),
            }
            let seen = memory.process_seen.get(&g.index).copied().unwrap_or(0);
            match dev.process_utilization_stats(seen) {
                Ok(samples) => {
                    if let Some(newest) = samples.iter().map(|s| s.timestamp).max() {
                        memory.process_seen.insert(g.index, newest.max(seen));
                    }
                    let samples = samples
                        .into_iter()
                        .map(|s| ProcessSample {
                            pid: s.pid,
                            sm: f64::from(s.sm_util.min(100)) / 100.0,
                        })
                        .collect();
                    out.processes.insert(g.index, samples);
                }
                // No sample newer than the last one read: no process was busy since.
                Err(WrapperError::NotFound) => {
                    out.processes.insert(g.index, Vec::new());
                }
                Err(WrapperError::NotSupported | WrapperError::FailedToLoadSymbol(_)) => {}
                Err(e) => tracing::debug!(gpu = g.index, error = %e, "nvmlDeviceGetProcessUtilization failed"),
            }
        }
        // Instances gone since (destroyed, or their GPU out of MIG mode) free their samples.
        let gone: Vec<(u32, String)> = memory.gpm.keys().filter(|k| !kept.contains(*k)).cloned().collect();
        for k in gone {
            if let Some(last) = memory.gpm.remove(&k) {
                free(nvml, last.sample);
            }
        }
        out
    }

    /// Each instance of `g` with a MIG device UUID: its GPM graphics utilization since its last
    /// sample, 0 to 1 (none on the first sample, or when GPM fails for it). Keys read go to `kept`.
    fn instance_usage(
        &mut self,
        nvml: &Nvml,
        g: &GpuStatus,
        dev: nvmlDevice_t,
        kept: &mut Vec<(u32, String)>,
    ) -> Vec<(u32, f64)> {
        let mut out = Vec::new();
        for i in &g.instances {
            let Some(uuid) = &i.uuid else { continue };
            let key = (g.index, uuid.clone());
            kept.push(key.clone());
            if let Some(last) = self.gpm.get(&key)
                && last.taken.elapsed() < GPM_MIN_INTERVAL
            {
                // Too soon for a new sample: the last figure still stands.
                out.extend(last.ratio.map(|r| (i.gpu_instance_id, r)));
                continue;
            }
            let sample = match mig_sample(nvml, dev, i.gpu_instance_id) {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(gpu = g.index, gi = i.gpu_instance_id, error = %e, "no GPM sample");
                    continue;
                }
            };
            let ratio = match self.gpm.get(&key) {
                Some(last) => graphics_util(nvml, &last.sample, &sample)
                    .map_err(|e| tracing::debug!(gpu = g.index, gi = i.gpu_instance_id, error = %e, "nvmlGpmMetricsGet failed"))
                    .ok(),
                None => None,
            };
            out.extend(ratio.map(|r| (i.gpu_instance_id, r)));
            let next = Last {
                sample,
                taken: Instant::now(),
                ratio,
            };
            if let Some(previous) = self.gpm.insert(key, next) {
                free(nvml, previous.sample);
            }
        }
        out
    }

    /// Frees the samples kept (when the backend goes), through the library that allocated them.
    pub(super) fn free_all(&mut self, nvml: &Nvml) {
        for (_, last) in std::mem::take(&mut self.gpm) {
            free(nvml, last.sample);
        }
    }
}

/// A new sample of GPU instance `gi` of `dev`.
fn mig_sample(nvml: &Nvml, dev: nvmlDevice_t, gi: u32) -> Result<RawSample, NvmlError> {
    let lib = nvml.lib();
    let alloc = sym(lib.nvmlGpmSampleAlloc.as_ref())?;
    let get = sym(lib.nvmlGpmMigSampleGet.as_ref())?;
    let mut s: nvmlGpmSample_t = std::ptr::null_mut();
    check(|| "nvmlGpmSampleAlloc".into(), unsafe { alloc(&mut s) })?;
    let sample = RawSample(s);
    match check(|| format!("nvmlGpmMigSampleGet(GPU instance {gi})"), unsafe {
        get(dev, gi, sample.0)
    }) {
        Ok(()) => Ok(sample),
        Err(e) => {
            free(nvml, sample);
            Err(e)
        }
    }
}

/// NVML_GPM_METRIC_GRAPHICS_UTIL between two samples ("percentage of time any compute/graphics
/// app was active", the instance's counterpart of nvmlDeviceGetUtilizationRates' `gpu`), 0 to 1.
fn graphics_util(nvml: &Nvml, first: &RawSample, second: &RawSample) -> Result<f64, NvmlError> {
    let get = sym(nvml.lib().nvmlGpmMetricsGet.as_ref())?;
    // SAFETY: all-zero is a valid request (null samples and names, ID 0); filled in below.
    let mut m: nvmlGpmMetricsGet_t = unsafe { std::mem::zeroed() };
    m.version = NVML_GPM_METRICS_GET_VERSION;
    m.numMetrics = 1;
    m.sample1 = first.0;
    m.sample2 = second.0;
    m.metrics[0].metricId = nvmlGpmMetricId_t_NVML_GPM_METRIC_GRAPHICS_UTIL;
    check(|| "nvmlGpmMetricsGet".into(), unsafe { get(&mut m) })?;
    check(|| "nvmlGpmMetricsGet(GRAPHICS_UTIL)".into(), m.metrics[0].nvmlReturn)?;
    Ok((m.metrics[0].value / 100.0).clamp(0.0, 1.0))
}

fn free(nvml: &Nvml, s: RawSample) {
    if let Ok(f) = nvml.lib().nvmlGpmSampleFree.as_ref() {
        // SAFETY: allocated by this library's nvmlGpmSampleAlloc, freed once (moved in).
        unsafe { f(s.0) };
    }
}
