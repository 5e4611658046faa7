//! Utilization beyond `nvmlDeviceGetUtilizationRates`: per-process samples
//! (`nvmlDeviceGetProcessUtilization`) and GPM, GPU Performance Monitoring, per GPU and per GPU
//! instance (`nvmlGpmQueryDeviceSupport`, `nvmlGpmSampleAlloc`/`Free`, `nvmlGpmSampleGet`,
//! `nvmlGpmMigSampleGet`, `nvmlGpmMetricsGet`), with the semantics and return codes nvml.h gives
//! them.
//!
//! The simulator keeps one figure per process, `sm_util` (the percent of its device's SMs it keeps
//! busy). Per-process samples report it as `smUtil`; GPM's counters integrate it over time
//! ([`crate::state::GpmCounters`]), so a metric between two samples is the average busy percent
//! between them, exactly what a steady workload ran. GPM's `GRAPHICS_UTIL` and `SM_UTIL` are the
//! same figure here (one number per process cannot tell time with a kernel active from SMs busy);
//! every other metric is `NVML_ERROR_NOT_SUPPORTED` in its slot.

use super::*;
use crate::state::now_us;

/// How often the driver takes a per-process sample. nvml.h gives the device's sample period as
/// "between 1 second and 1/6 second depending on the product"; the simulator takes the shortest.
pub const PROCESS_SAMPLE_PERIOD_US: u64 = 166_667;

/// `nvmlDeviceGetProcessUtilization`, as nvml.h documents it: one sample per running process with
/// non-zero utilization in the last sample period, stamped with that period's CPU time in
/// microseconds; `NVML_ERROR_NOT_FOUND` when no sample is newer than `lastSeenTimeStamp`. Sizing:
/// `utilization` NULL (or a buffer too small) sets `*count` to the samples there are and returns
/// `NVML_ERROR_INSUFFICIENT_SIZE`, as go-nvml's caller expects. "On MIG-enabled GPUs, querying
/// process utilization is not currently supported": `NVML_ERROR_NOT_SUPPORTED` for a GPU in MIG
/// mode and for MIG device handles. Processes asking for more than the GPU has (time-slicing
/// oversubscribed) are scaled down together, so the samples add up to the device's utilization.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    dev: nvmlDevice_t,
    utilization: *mut nvmlProcessUtilizationSample_t,
    count: *mut c_uint,
    last_seen: u64,
) -> nvmlReturn_t {
    read_on("nvmlDeviceGetProcessUtilization", gpu_of(dev), |st| {
        if unpack(dev).0 == K_MIG {
            return Err(ERR_NOT_SUPPORTED);
        }
        let g = device(st, dev)?;
        if count.is_null() {
            return Err(ERR_INVALID_ARGUMENT);
        }
        if g.mig_current {
            return Err(ERR_NOT_SUPPORTED);
        }
        let now = now_us();
        let stamp = now - now % PROCESS_SAMPLE_PERIOD_US;
        let busy: Vec<_> = g.processes.iter().filter(|p| p.sm_util > 0).collect();
        if stamp <= last_seen || busy.is_empty() {
            return Err(ERR_NOT_FOUND);
        }
        let n = busy.len() as c_uint;
        if utilization.is_null() || unsafe { *count } < n {
            unsafe { *count = n };
            return Err(ERR_INSUFFICIENT_SIZE);
        }
        let total: u32 = busy.iter().map(|p| p.sm_util).sum();
        for (i, p) in busy.iter().enumerate() {
            let sm = if total > 100 {
                p.sm_util * 100 / total
            } else {
                p.sm_util
            };
            let v = nvmlProcessUtilizationSample_t {
                pid: p.pid,
                timeStamp: stamp,
                smUtil: sm,
                memUtil: 0,
                encUtil: 0,
                decUtil: 0,
            };
            unsafe { *utilization.add(i) = v };
        }
        unsafe { *count = n };
        Ok(())
    })
}

/// `nvmlGpmQueryDeviceSupport`: `isSupportedDevice` 1 on Hopper and later (H100, H200, B200),
/// 0 on Ampere (A100), for device and MIG device handles alike. The struct's `version` must be
/// `NVML_GPM_SUPPORT_VERSION`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmQueryDeviceSupport(dev: nvmlDevice_t, support: *mut nvmlGpmSupport_t) -> nvmlReturn_t {
    read_on("nvmlGpmQueryDeviceSupport", gpu_of(dev), |st| {
        let g = parent(st, dev)?;
        if support.is_null() {
            return Err(ERR_INVALID_ARGUMENT);
        }
        if unsafe { (*support).version } != NVML_GPM_SUPPORT_VERSION {
            return Err(ERR_ARGUMENT_VERSION_MISMATCH);
        }
        unsafe { (*support).isSupportedDevice = g.has_gpm() as c_uint };
        Ok(())
    })
}

/// The GPU of a device or MIG device handle.
fn parent(st: &SimState, dev: nvmlDevice_t) -> Result<&SimGpu, u32> {
    let (kind, gpu, gi, _) = unpack(dev);
    let g = st.gpu(gpu).ok_or(ERR_INVALID_ARGUMENT)?;
    match kind {
        K_DEVICE => Ok(g),
        K_MIG => g.gi(gi).map(|_| g).ok_or(ERR_NOT_FOUND),
        _ => Err(ERR_INVALID_ARGUMENT),
    }
}

/// A GPM sample buffer, in the caller's memory as the real library's are: a reading of one
/// device's or GPU instance's counter.
struct Sample {
    /// Marks a buffer this library allocated (a stray pointer is refused, not read).
    magic: u64,
    reading: Option<Reading>,
}

#[derive(Clone, Copy, PartialEq)]
struct Reading {
    gpu: u32,
    gi: Option<u32>,
    at_us: u64,
    busy: f64,
}

const SAMPLE_MAGIC: u64 = 0x4750_4D53_494D_0001;

unsafe fn sample<'a>(s: nvmlGpmSample_t) -> Result<&'a mut Sample, u32> {
    let p = s as *mut Sample;
    if p.is_null() || unsafe { (*p).magic } != SAMPLE_MAGIC {
        return Err(ERR_INVALID_ARGUMENT);
    }
    Ok(unsafe { &mut *p })
}

/// `nvmlGpmSampleAlloc`: `NVML_ERROR_INVALID_ARGUMENT` for a NULL pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmSampleAlloc(out: *mut nvmlGpmSample_t) -> nvmlReturn_t {
    if out.is_null() {
        return ERR_INVALID_ARGUMENT;
    }
    let s = Box::new(Sample {
        magic: SAMPLE_MAGIC,
        reading: None,
    });
    unsafe { *out = Box::into_raw(s) as nvmlGpmSample_t };
    SUCCESS
}

/// `nvmlGpmSampleFree`: `NVML_ERROR_INVALID_ARGUMENT` for a pointer it did not allocate.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmSampleFree(s: nvmlGpmSample_t) -> nvmlReturn_t {
    match unsafe { sample(s) } {
        Ok(b) => {
            b.magic = 0;
            drop(unsafe { Box::from_raw(s as *mut Sample) });
            SUCCESS
        }
        Err(e) => e,
    }
}

fn fill(st: &SimState, gpu: u32, gi: Option<u32>, s: nvmlGpmSample_t) -> Result<(), u32> {
    let g = st.gpu(gpu).ok_or(ERR_INVALID_ARGUMENT)?;
    if !g.has_gpm() {
        return Err(ERR_NOT_SUPPORTED);
    }
    let buf = unsafe { sample(s) }?;
    let at_us = now_us();
    buf.reading = Some(Reading {
        gpu,
        gi,
        at_us,
        busy: g.gpm_counter(gi, at_us),
    });
    Ok(())
}

/// `nvmlGpmSampleGet`: a device handle samples the whole GPU, a MIG device handle its GPU
/// instance ("This API supports the device handle and MIG device handle").
/// `NVML_ERROR_NOT_SUPPORTED` before Hopper.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmSampleGet(dev: nvmlDevice_t, s: nvmlGpmSample_t) -> nvmlReturn_t {
    read_on("nvmlGpmSampleGet", gpu_of(dev), |st| {
        let (kind, gpu, gi, _) = unpack(dev);
        match kind {
            K_DEVICE => fill(st, gpu, None, s),
            K_MIG => {
                parent(st, dev)?;
                fill(st, gpu, Some(gi), s)
            }
            _ => Err(ERR_INVALID_ARGUMENT),
        }
    })
}

/// `nvmlGpmMigSampleGet`: GPU instance `gi` of a GPU (a device handle). No such instance (the
/// GPU not in MIG mode included): `NVML_ERROR_INVALID_ARGUMENT`; `NVML_ERROR_NOT_SUPPORTED`
/// before Hopper.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmMigSampleGet(dev: nvmlDevice_t, gi: c_uint, s: nvmlGpmSample_t) -> nvmlReturn_t {
    read_on("nvmlGpmMigSampleGet", gpu_of(dev), |st| {
        let g = device(st, dev)?;
        if !g.has_gpm() {
            return Err(ERR_NOT_SUPPORTED);
        }
        if !g.mig_current || g.gi(gi).is_none() {
            return Err(ERR_INVALID_ARGUMENT);
        }
        fill(st, g.index, Some(gi), s)
    })
}

/// GPM metrics the simulator computes: `NVML_GPM_METRIC_GRAPHICS_UTIL` and `NVML_GPM_METRIC_SM_UTIL`.
const COMPUTED: [u32; 2] = [
    nvmlGpmMetricId_t_NVML_GPM_METRIC_GRAPHICS_UTIL,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL,
];

/// `nvmlGpmMetricsGet`: each requested metric between `sample1` and `sample2`, its value in
/// percent (0.0 - 100.0) and its own return code. The call itself fails with
/// `NVML_ERROR_ARGUMENT_VERSION_MISMATCH` for another `version`, `NVML_ERROR_INVALID_ARGUMENT`
/// for more metrics than `NVML_GPM_METRIC_MAX`, samples never filled, or samples of two different
/// devices; a metric the simulator does not compute is `NVML_ERROR_NOT_SUPPORTED` in its slot, as
/// one is when samples are not in time order (`NVML_ERROR_INVALID_ARGUMENT` there). Pure
/// arithmetic on the two readings, as in the real library: no device is read.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmMetricsGet(m: *mut nvmlGpmMetricsGet_t) -> nvmlReturn_t {
    if m.is_null() {
        return ERR_INVALID_ARGUMENT;
    }
    let m = unsafe { &mut *m };
    if m.version != NVML_GPM_METRICS_GET_VERSION {
        return ERR_ARGUMENT_VERSION_MISMATCH;
    }
    if m.numMetrics as usize > m.metrics.len() {
        return ERR_INVALID_ARGUMENT;
    }
    let reading = |s| unsafe { sample(s) }.ok().and_then(|s| s.reading);
    let (a, b) = match (reading(m.sample1), reading(m.sample2)) {
        (Some(a), Some(b)) if a.gpu == b.gpu && a.gi == b.gi => (a, b),
        _ => return ERR_INVALID_ARGUMENT,
    };
    for metric in &mut m.metrics[..m.numMetrics as usize] {
        metric.metricInfo = nvmlGpmMetric_t__bindgen_ty_1 {
            shortName: std::ptr::null_mut(),
            longName: std::ptr::null_mut(),
            unit: std::ptr::null_mut(),
        };
        if !COMPUTED.contains(&metric.metricId) {
            metric.nvmlReturn = ERR_NOT_SUPPORTED;
            metric.value = 0.0;
            continue;
        }
        if b.at_us <= a.at_us {
            metric.nvmlReturn = ERR_INVALID_ARGUMENT;
            metric.value = 0.0;
            continue;
        }
        let elapsed = (b.at_us - a.at_us) as f64;
        metric.value = ((b.busy - a.busy) / elapsed).clamp(0.0, 100.0);
        metric.nvmlReturn = SUCCESS;
    }
    SUCCESS
}
