//! Per-process samples and GPM, as nvml.h documents them (`src/nvml/utilization.rs`), against
//! what the simulator was told to run: the figures are the `sm_util` the processes were attached
//! with, never read back from the simulator's own tables.

use super::*;
use nvidia_ml_sim::nvml::utilization as u;

const INSUFFICIENT_SIZE: u32 = 7;
const ARGUMENT_VERSION_MISMATCH: u32 = 25;

fn attach(gpu: u32, start: Option<u32>, pid: u32, sm_util: u32) {
    let a = nvidia_ml_sim::ctl::Attach {
        gpu,
        placement_start: start,
        pid,
        sm_util,
        used_mib: 100,
        ..Default::default()
    };
    nvidia_ml_sim::ctl::attach(paths(), &a).unwrap();
}

/// The samples newer than `last_seen`, through the size query first, as callers do.
fn process_samples(d: nvmlDevice_t, last_seen: u64) -> Result<Vec<nvmlProcessUtilizationSample_t>, u32> {
    let mut n = 0;
    match unsafe { u::nvmlDeviceGetProcessUtilization(d, std::ptr::null_mut(), &mut n, last_seen) } {
        INSUFFICIENT_SIZE => {}
        code => return Err(code),
    }
    let mut buf: Vec<nvmlProcessUtilizationSample_t> = vec![unsafe { std::mem::zeroed() }; n as usize];
    match unsafe { u::nvmlDeviceGetProcessUtilization(d, buf.as_mut_ptr(), &mut n, last_seen) } {
        SUCCESS => {
            buf.truncate(n as usize);
            Ok(buf)
        }
        code => Err(code),
    }
}

#[test]
fn process_samples_name_the_busy_processes_and_none_is_not_found() {
    let _g = fresh();
    // nvml.h: "If no valid sample entries are found since the lastSeenTimeStamp,
    // NVML_ERROR_NOT_FOUND is returned."
    assert_eq!(process_samples(dev(MIG_OFF), 0).map(|s| s.len()), Err(NOT_FOUND));
    attach(MIG_OFF, None, 100, 30);
    attach(MIG_OFF, None, 101, 90);
    attach(MIG_OFF, None, 102, 0);
    // A buffer too small: the count there is, and INSUFFICIENT_SIZE.
    let mut one: [nvmlProcessUtilizationSample_t; 1] = unsafe { std::mem::zeroed() };
    let mut n = 1;
    assert_eq!(
        unsafe { u::nvmlDeviceGetProcessUtilization(dev(MIG_OFF), one.as_mut_ptr(), &mut n, 0) },
        INSUFFICIENT_SIZE
    );
    assert_eq!(n, 2, "the idle process has no sample");
    let before = nvidia_ml_sim::state::now_us();
    let s = process_samples(dev(MIG_OFF), 0).unwrap();
    // Asked for 30% and 90% of one GPU: scaled together to what it has, 25% and 75%.
    let got: Vec<(u32, u32)> = s.iter().map(|x| (x.pid, x.smUtil)).collect();
    assert_eq!(got, [(100, 25), (101, 75)]);
    let stamp = s[0].timeStamp;
    assert!(
        stamp <= before && before - stamp < u::PROCESS_SAMPLE_PERIOD_US,
        "the last period's CPU time in µs: {stamp} at {before}"
    );
    assert!(s.iter().all(|x| x.timeStamp == stamp && x.memUtil == 0));
    // Nothing newer than a timestamp past the last sample.
    assert_eq!(
        process_samples(dev(MIG_OFF), stamp + 10_000_000).map(|s| s.len()),
        Err(NOT_FOUND)
    );
    // A later period's sample is newer than the one read.
    std::thread::sleep(std::time::Duration::from_micros(u::PROCESS_SAMPLE_PERIOD_US + 10_000));
    let later = process_samples(dev(MIG_OFF), stamp).unwrap();
    assert!(later.iter().all(|x| x.timeStamp > stamp), "newer samples only");
    assert_eq!(
        unsafe { u::nvmlDeviceGetProcessUtilization(dev(MIG_OFF), std::ptr::null_mut(), std::ptr::null_mut(), 0) },
        INVALID_ARGUMENT
    );
    // nvml.h: "On MIG-enabled GPUs, querying process utilization is not currently supported."
    assert_eq!(process_samples(dev(H100), 0).map(|s| s.len()), Err(NOT_SUPPORTED));
}

fn gpm_supported(d: nvmlDevice_t) -> Result<u32, u32> {
    let mut s = nvmlGpmSupport_t {
        version: NVML_GPM_SUPPORT_VERSION,
        isSupportedDevice: 7,
    };
    match unsafe { u::nvmlGpmQueryDeviceSupport(d, &mut s) } {
        SUCCESS => Ok(s.isSupportedDevice),
        code => Err(code),
    }
}

fn alloc() -> nvmlGpmSample_t {
    let mut s: nvmlGpmSample_t = std::ptr::null_mut();
    assert_eq!(unsafe { u::nvmlGpmSampleAlloc(&mut s) }, SUCCESS);
    s
}

/// Requested metrics between two samples: (the call's code, each metric's code and value).
fn metrics(a: nvmlGpmSample_t, b: nvmlGpmSample_t, ids: &[u32]) -> (u32, Vec<(u32, f64)>) {
    let mut m: nvmlGpmMetricsGet_t = unsafe { std::mem::zeroed() };
    m.version = NVML_GPM_METRICS_GET_VERSION;
    m.numMetrics = ids.len() as u32;
    m.sample1 = a;
    m.sample2 = b;
    for (i, id) in ids.iter().enumerate() {
        m.metrics[i].metricId = *id;
    }
    let rc = unsafe { u::nvmlGpmMetricsGet(&mut m) };
    let out = m.metrics[..ids.len()].iter().map(|x| (x.nvmlReturn, x.value)).collect();
    (rc, out)
}

const GRAPHICS_UTIL: u32 = nvmlGpmMetricId_t_NVML_GPM_METRIC_GRAPHICS_UTIL;
const SM_UTIL: u32 = nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL;
const SM_OCCUPANCY: u32 = nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_OCCUPANCY;

#[test]
fn gpm_is_hopper_and_later_and_measures_an_instance_between_two_samples() {
    let _g = fresh();
    assert_eq!(gpm_supported(dev(A100_40)), Ok(0), "Ampere");
    for gpu in [H100, H100_NVL, H200, B200] {
        assert_eq!(gpm_supported(dev(gpu)), Ok(1), "GPU {gpu}");
    }
    let mut old = nvmlGpmSupport_t {
        version: 99,
        isSupportedDevice: 0,
    };
    assert_eq!(
        unsafe { u::nvmlGpmQueryDeviceSupport(dev(H100), &mut old) },
        ARGUMENT_VERSION_MISMATCH
    );

    // A 1g instance on an A100: no GPM.
    let a100_gi = create(A100_40, 19, Some(0)).unwrap();
    let s = alloc();
    assert_eq!(
        unsafe { u::nvmlGpmMigSampleGet(dev(A100_40), a100_gi, s) },
        NOT_SUPPORTED
    );

    // A 1g instance of the H100 running a process at 40% of its SMs.
    let gi = create(H100, 19, Some(0)).unwrap();
    create_ci(gi_handle(H100, gi), 0).unwrap();
    attach(H100, Some(0), 200, 40);
    let (a, b, whole_a, whole_b) = (alloc(), alloc(), alloc(), alloc());
    assert_eq!(unsafe { u::nvmlGpmMigSampleGet(dev(H100), gi, a) }, SUCCESS);
    assert_eq!(unsafe { u::nvmlGpmSampleGet(dev(H100), whole_a) }, SUCCESS);
    std::thread::sleep(std::time::Duration::from_millis(150));
    assert_eq!(unsafe { u::nvmlGpmMigSampleGet(dev(H100), gi, b) }, SUCCESS);
    assert_eq!(unsafe { u::nvmlGpmSampleGet(dev(H100), whole_b) }, SUCCESS);
    let (rc, got) = metrics(a, b, &[GRAPHICS_UTIL, SM_UTIL, SM_OCCUPANCY]);
    assert_eq!(rc, SUCCESS);
    assert_eq!((got[0].0, got[1].0, got[2].0), (SUCCESS, SUCCESS, NOT_SUPPORTED));
    assert!(
        (got[0].1 - 40.0).abs() < 1e-6 && (got[1].1 - 40.0).abs() < 1e-6,
        "{got:?}"
    );
    // The whole GPU: the instance's 40% on 1 of its 7 compute slices.
    let (_, whole) = metrics(whole_a, whole_b, &[GRAPHICS_UTIL]);
    assert!((whole[0].1 - 40.0 / 7.0).abs() < 1e-6, "{whole:?}");

    // A second process joins half-way: the interval's average lies between 40% and 70%.
    let c = alloc();
    std::thread::sleep(std::time::Duration::from_millis(100));
    attach(H100, Some(0), 201, 30);
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(unsafe { u::nvmlGpmMigSampleGet(dev(H100), gi, c) }, SUCCESS);
    let (_, got) = metrics(b, c, &[GRAPHICS_UTIL]);
    assert!(got[0].1 > 45.0 && got[0].1 < 65.0, "{got:?}");

    // Refusals: another device's sample, a sample never filled, an old struct version, an
    // instance that is not there, a pointer the library did not allocate.
    assert_eq!(metrics(a, whole_b, &[GRAPHICS_UTIL]).0, INVALID_ARGUMENT);
    let empty = alloc();
    assert_eq!(metrics(a, empty, &[GRAPHICS_UTIL]).0, INVALID_ARGUMENT);
    let mut m: nvmlGpmMetricsGet_t = unsafe { std::mem::zeroed() };
    m.version = 2;
    assert_eq!(unsafe { u::nvmlGpmMetricsGet(&mut m) }, ARGUMENT_VERSION_MISMATCH);
    assert_eq!(
        unsafe { u::nvmlGpmMigSampleGet(dev(H100), 14, empty) },
        INVALID_ARGUMENT
    );
    let mut stray = 0u64;
    assert_eq!(
        unsafe { u::nvmlGpmSampleFree(&mut stray as *mut u64 as nvmlGpmSample_t) },
        INVALID_ARGUMENT
    );
    for x in [s, a, b, c, whole_a, whole_b, empty] {
        assert_eq!(unsafe { u::nvmlGpmSampleFree(x) }, SUCCESS);
    }
}
