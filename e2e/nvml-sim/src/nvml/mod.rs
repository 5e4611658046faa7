//! The NVML C functions the agent and NVIDIA's own Go client (go-nvml, go-nvlib) call, under their
//! real names and signatures, over [`crate::state`] and the MIG rules of `gpu_tenancy_core::mig`, with
//! the return codes nvml.h documents for each (e2e/nvml-check holds NVIDIA's client to them).

#![allow(non_snake_case, clippy::missing_safety_doc)]

pub mod events;
pub mod instances;
pub mod lookup;
pub mod mig_devices;
pub mod profiles;
pub mod utilization;

use crate::state::{Paths, SimGi, SimGpu, SimState, with_state};
use gpu_tenancy_core::mig;
use nvml_wrapper_sys::bindings::*;
use std::ffi::{CStr, c_char, c_int, c_uint};
use std::sync::OnceLock;

pub const SUCCESS: u32 = 0;
pub const ERR_UNINITIALIZED: u32 = 1;
pub const ERR_INVALID_ARGUMENT: u32 = 2;
pub const ERR_NOT_SUPPORTED: u32 = 3;
pub const ERR_NOT_FOUND: u32 = 6;
pub const ERR_INSUFFICIENT_SIZE: u32 = 7;
pub const ERR_DRIVER_NOT_LOADED: u32 = 9;
pub const ERR_RESET_REQUIRED: u32 = 16;
pub const ERR_IN_USE: u32 = 19;
pub const ERR_INSUFFICIENT_RESOURCES: u32 = 23;
pub const ERR_ARGUMENT_VERSION_MISMATCH: u32 = 25;
pub const ERR_INVALID_STATE: u32 = 29;
pub const ERR_UNKNOWN: u32 = 999;

/// The NVML error names the simulator understands in fault specs (`IN_USE`, `UNKNOWN`...).
pub fn error_code(name: &str) -> Option<u32> {
    let n = name.trim().trim_start_matches("NVML_ERROR_").to_ascii_uppercase();
    Some(match n.as_str() {
        "UNINITIALIZED" => 1,
        "INVALID_ARGUMENT" => 2,
        "NOT_SUPPORTED" => 3,
        "NO_PERMISSION" => 4,
        "NOT_FOUND" => 6,
        "INSUFFICIENT_SIZE" => 7,
        "DRIVER_NOT_LOADED" => 9,
        "TIMEOUT" => 10,
        "GPU_IS_LOST" => 15,
        "RESET_REQUIRED" => 16,
        "IN_USE" => 19,
        "MEMORY" => 20,
        "INSUFFICIENT_RESOURCES" => 23,
        "INVALID_STATE" => 29,
        "UNKNOWN" => 999,
        other => return other.parse().ok(),
    })
}

pub(crate) const NO_VALUE: u32 = 0xFFFF_FFFF;

fn paths() -> Result<&'static Paths, u32> {
    static PATHS: OnceLock<Result<Paths, String>> = OnceLock::new();
    PATHS.get_or_init(Paths::from_env).as_ref().map_err(|e| {
        eprintln!("nvml-sim: {e}");
        ERR_DRIVER_NOT_LOADED
    })
}

/// Runs one NVML call: checks injected faults (by name, and `mutation` for mutating calls),
/// then `f`, which returns whether it changed the state.
pub(crate) fn call(name: &str, mutating: bool, f: impl FnOnce(&mut SimState) -> Result<bool, u32>) -> nvmlReturn_t {
    call_on(name, None, mutating, f)
}

/// [`call`] for a call about one GPU (or its instances): faults installed for another GPU do not
/// apply to it.
pub(crate) fn call_on(
    name: &str,
    gpu: Option<u32>,
    mutating: bool,
    f: impl FnOnce(&mut SimState) -> Result<bool, u32>,
) -> nvmlReturn_t {
    let Ok(paths) = paths() else {
        return ERR_DRIVER_NOT_LOADED;
    };
    let r = with_state(paths, |st| {
        let faults_before = st.faults.iter().map(|f| (f.seen, f.times)).collect::<Vec<_>>();
        let fault = st.check_fault(name, gpu).or_else(|| {
            if mutating {
                st.check_fault("mutation", gpu)
            } else {
                None
            }
        });
        let faults_changed = faults_before != st.faults.iter().map(|f| (f.seen, f.times)).collect::<Vec<_>>();
        if let Some(code) = fault {
            return (code, true);
        }
        match f(st) {
            Ok(changed) => (SUCCESS, changed || faults_changed),
            Err(code) => (code, faults_changed),
        }
    });
    r.unwrap_or_else(|e| {
        eprintln!("nvml-sim: {e}");
        ERR_UNKNOWN
    })
}

/// Reads without changing the state.
pub(crate) fn read(name: &str, f: impl FnOnce(&SimState) -> Result<(), u32>) -> nvmlReturn_t {
    call(name, false, |st| f(st).map(|_| false))
}

/// [`read`] about one GPU.
pub(crate) fn read_on(name: &str, gpu: Option<u32>, f: impl FnOnce(&SimState) -> Result<(), u32>) -> nvmlReturn_t {
    call_on(name, gpu, false, |st| f(st).map(|_| false))
}

/// The GPU a device, MIG device, GPU instance or compute instance handle belongs to.
pub(crate) fn gpu_of<T>(h: *mut T) -> Option<u32> {
    Some(unpack(h).1)
}

// Handles are opaque pointers; the simulator packs what it needs into them.
pub(crate) const K_DEVICE: u64 = 1;
pub(crate) const K_MIG: u64 = 2;
pub(crate) const K_GI: u64 = 3;
pub(crate) const K_CI: u64 = 4;

pub(crate) fn pack(kind: u64, gpu: u32, gi: u32, ci: u32) -> *mut std::ffi::c_void {
    (kind | (gpu as u64) << 8 | (gi as u64) << 16 | (ci as u64) << 32) as *mut _
}

pub(crate) fn unpack<T>(h: *mut T) -> (u64, u32, u32, u32) {
    let v = h as u64;
    (
        v & 0xFF,
        ((v >> 8) & 0xFF) as u32,
        ((v >> 16) & 0xFFFF) as u32,
        ((v >> 32) & 0xFFFF) as u32,
    )
}

pub(crate) fn device(st: &SimState, h: nvmlDevice_t) -> Result<&SimGpu, u32> {
    let (kind, gpu, _, _) = unpack(h);
    if kind != K_DEVICE {
        return Err(ERR_INVALID_ARGUMENT);
    }
    st.gpu(gpu).ok_or(ERR_INVALID_ARGUMENT)
}

pub(crate) fn device_mut(st: &mut SimState, h: nvmlDevice_t) -> Result<&mut SimGpu, u32> {
    let (kind, gpu, _, _) = unpack(h);
    if kind != K_DEVICE {
        return Err(ERR_INVALID_ARGUMENT);
    }
    st.gpu_mut(gpu).ok_or(ERR_INVALID_ARGUMENT)
}

pub(crate) fn gi_of(st: &SimState, h: nvmlGpuInstance_t) -> Result<(&SimGpu, &SimGi), u32> {
    let (kind, gpu, gi, _) = unpack(h);
    if kind != K_GI {
        return Err(ERR_INVALID_ARGUMENT);
    }
    let g = st.gpu(gpu).ok_or(ERR_INVALID_ARGUMENT)?;
    Ok((g, g.gi(gi).ok_or(ERR_NOT_FOUND)?))
}

pub(crate) unsafe fn write_str(buf: *mut c_char, len: c_uint, s: &str) -> Result<(), u32> {
    if buf.is_null() {
        return Err(ERR_INVALID_ARGUMENT);
    }
    if (len as usize) < s.len() + 1 {
        return Err(ERR_INSUFFICIENT_SIZE);
    }
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr() as *const c_char, buf, s.len());
        *buf.add(s.len()) = 0;
    }
    Ok(())
}

pub(crate) unsafe fn out<T>(p: *mut T, v: T) -> Result<(), u32> {
    if p.is_null() {
        return Err(ERR_INVALID_ARGUMENT);
    }
    unsafe { p.write(v) };
    Ok(())
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    // Creates the state file from the config on first use.
    call("nvmlInit_v2", false, |_| Ok(false))
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    nvmlInit_v2()
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    let s: &'static CStr = match result {
        0 => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        4 => c"Insufficient Permissions",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        9 => c"Driver Not Loaded",
        10 => c"Timeout",
        15 => c"GPU is lost",
        16 => c"GPU requires reset",
        19 => c"In use by another client",
        23 => c"Insufficient Resources",
        29 => c"Invalid state",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> nvmlReturn_t {
    read("nvmlSystemGetDriverVersion", |st| unsafe {
        write_str(version, length, &st.driver_version)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> nvmlReturn_t {
    read("nvmlSystemGetNVMLVersion", |st| unsafe {
        write_str(version, length, &st.nvml_version)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(v: *mut c_int) -> nvmlReturn_t {
    read("nvmlSystemGetCudaDriverVersion_v2", |st| unsafe {
        out(v, st.cuda_version)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(v: *mut c_int) -> nvmlReturn_t {
    unsafe { nvmlSystemGetCudaDriverVersion_v2(v) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    read("nvmlDeviceGetCount_v2", |st| unsafe {
        out(count, st.gpus.len() as c_uint)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, dev: *mut nvmlDevice_t) -> nvmlReturn_t {
    read_on("nvmlDeviceGetHandleByIndex_v2", Some(index), |st| {
        st.gpu(index).ok_or(ERR_INVALID_ARGUMENT)?;
        unsafe { out(dev, pack(K_DEVICE, index, 0, 0) as nvmlDevice_t) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(dev: nvmlDevice_t, index: *mut c_uint) -> nvmlReturn_t {
    read_on("nvmlDeviceGetIndex", gpu_of(dev), |st| unsafe {
        out(index, device(st, dev)?.index)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(dev: nvmlDevice_t, buf: *mut c_char, len: c_uint) -> nvmlReturn_t {
    read_on("nvmlDeviceGetUUID", gpu_of(dev), |st| {
        let (kind, gpu, gi, ci) = unpack(dev);
        let uuid = match kind {
            K_DEVICE => device(st, dev)?.uuid.clone(),
            K_MIG => {
                let g = st.gpu(gpu).ok_or(ERR_INVALID_ARGUMENT)?;
                let gi = g.gi(gi).ok_or(ERR_NOT_FOUND)?;
                gi.cis.iter().find(|c| c.id == ci).ok_or(ERR_NOT_FOUND)?.uuid.clone()
            }
            _ => return Err(ERR_INVALID_ARGUMENT),
        };
        unsafe { write_str(buf, len, &uuid) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(dev: nvmlDevice_t, buf: *mut c_char, len: c_uint) -> nvmlReturn_t {
    read_on("nvmlDeviceGetName", gpu_of(dev), |st| unsafe {
        write_str(buf, len, &device(st, dev)?.name)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(dev: nvmlDevice_t, pci: *mut nvmlPciInfo_t) -> nvmlReturn_t {
    read_on("nvmlDeviceGetPciInfo_v3", gpu_of(dev), |st| {
        let g = device(st, dev)?;
        // SAFETY: all-zero is a valid nvmlPciInfo_t.
        let mut info: nvmlPciInfo_t = unsafe { std::mem::zeroed() };
        let (domain, bus, dev_no, _function) = g.pci_address();
        info.domain = domain;
        info.bus = bus;
        info.device = dev_no;
        info.pciDeviceId = ((g.device_id as u32) << 16) | mig::NVIDIA_VENDOR_ID as u32;
        info.pciSubSystemId = 0x16C1_10DE;
        // nvml.h: NVML_DEVICE_PCI_BUS_ID_FMT "%08X:%02X:%02X.0" and NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT
        // "%04X:%02X:%02X.0".
        let id = format!("{domain:08X}:{bus:02X}:{dev_no:02X}.0");
        let legacy = format!("{domain:04X}:{bus:02X}:{dev_no:02X}.0");
        for (i, b) in id.bytes().enumerate() {
            info.busId[i] = b as c_char;
        }
        for (i, b) in legacy.bytes().enumerate() {
            info.busIdLegacy[i] = b as c_char;
        }
        unsafe { out(pci, info) }
    })
}

fn memory_of(st: &SimState, dev: nvmlDevice_t) -> Result<(u64, u64), u32> {
    let (kind, gpu, gi, _) = unpack(dev);
    let g = st.gpu(gpu).ok_or(ERR_INVALID_ARGUMENT)?;
    let mib = crate::state::MIB;
    match kind {
        K_DEVICE => {
            let used: u64 = g.processes.iter().map(|p| p.used_mib).sum();
            Ok((g.memory_mib * mib, used * mib))
        }
        K_MIG => {
            let gi = g.gi(gi).ok_or(ERR_NOT_FOUND)?;
            let used: u64 = g
                .processes
                .iter()
                .filter(|p| p.gi == Some(gi.id))
                .map(|p| p.used_mib)
                .sum();
            Ok((g.gi_memory_mib(gi) * mib, used * mib))
        }
        _ => Err(ERR_INVALID_ARGUMENT),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(dev: nvmlDevice_t, m: *mut nvmlMemory_t) -> nvmlReturn_t {
    read_on("nvmlDeviceGetMemoryInfo", gpu_of(dev), |st| {
        let (total, used) = memory_of(st, dev)?;
        unsafe {
            out(
                m,
                nvmlMemory_t {
                    total,
                    free: total - used,
                    used,
                },
            )
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(dev: nvmlDevice_t, m: *mut nvmlMemory_v2_t) -> nvmlReturn_t {
    read_on("nvmlDeviceGetMemoryInfo_v2", gpu_of(dev), |st| {
        let (total, used) = memory_of(st, dev)?;
        if m.is_null() {
            return Err(ERR_INVALID_ARGUMENT);
        }
        let version = unsafe { (*m).version };
        unsafe {
            out(
                m,
                nvmlMemory_v2_t {
                    version,
                    total,
                    reserved: 0,
                    free: total - used,
                    used,
                },
            )
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNumaNodeId(dev: nvmlDevice_t, node: *mut c_uint) -> nvmlReturn_t {
    read_on("nvmlDeviceGetNumaNodeId", gpu_of(dev), |st| {
        match device(st, dev)?.numa_node {
            Some(n) => unsafe { out(node, n as c_uint) },
            None => Err(ERR_NOT_SUPPORTED),
        }
    })
}

/// The GPU's minor number: its index, as on a machine whose GPUs were probed in PCI order.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(dev: nvmlDevice_t, minor: *mut c_uint) -> nvmlReturn_t {
    read_on("nvmlDeviceGetMinorNumber", gpu_of(dev), |st| {
        let g = device(st, dev)?;
        unsafe { out(minor, g.index as c_uint) }
    })
}

/// NVIDIA's published compute capability of the GPU's model (developer.nvidia.com/cuda-gpus:
/// A100 8.0, H100 and H200 9.0, B200 10.0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    dev: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> nvmlReturn_t {
    read_on("nvmlDeviceGetCudaComputeCapability", gpu_of(dev), |st| {
        let g = device(st, dev)?;
        let (ma, mi) = gpu_tenancy_core::mig::model_by_name(&g.model)
            .map(|m| m.compute_capability)
            .ok_or(ERR_NOT_SUPPORTED)?;
        unsafe {
            out(major, ma as c_int)?;
            out(minor, mi as c_int)
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeMode(dev: nvmlDevice_t, mode: *mut nvmlComputeMode_t) -> nvmlReturn_t {
    read_on("nvmlDeviceGetComputeMode", gpu_of(dev), |st| unsafe {
        out(mode, device(st, dev)?.compute_mode)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceSetComputeMode(dev: nvmlDevice_t, mode: nvmlComputeMode_t) -> nvmlReturn_t {
    call_on("nvmlDeviceSetComputeMode", gpu_of(dev), true, |st| {
        if ![0, 2, 3].contains(&mode) {
            return Err(ERR_INVALID_ARGUMENT);
        }
        let g = device_mut(st, dev)?;
        g.compute_mode = mode;
        let index = g.index;
        st.record("nvmlDeviceSetComputeMode", index, format!("mode={mode}"));
        Ok(true)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    dev: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    read_on("nvmlDeviceGetMigMode", gpu_of(dev), |st| {
        let g = device(st, dev)?;
        unsafe {
            out(current, g.mig_current as c_uint)?;
            out(pending, g.mig_pending as c_uint)
        }
    })
}

/// As NVML documents it (docs/nvidia.md#mig-changes-through-nvml): the call returns SUCCESS for a valid request and puts the
/// outcome in `activation`. The new mode becomes pending; the call itself resets an idle GPU to
/// activate it (current = pending afterwards). A GPU that anything holds (processes, or holders
/// such as nvidia-persistenced) cannot be reset: `NVML_ERROR_IN_USE`, the caller is to idle it
/// and call again. A GPU passed through without reset: `NVML_ERROR_RESET_REQUIRED` (a VM reboot,
/// `sim-ctl reset`). Disabling MIG while GPU instances exist counts as in use.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetMigMode(
    dev: nvmlDevice_t,
    mode: c_uint,
    activation: *mut nvmlReturn_t,
) -> nvmlReturn_t {
    call_on("nvmlDeviceSetMigMode", gpu_of(dev), true, |st| {
        if activation.is_null() {
            return Err(ERR_INVALID_ARGUMENT);
        }
        let g = device_mut(st, dev)?;
        let enable = match mode {
            0 => false,
            1 => true,
            _ => return Err(ERR_INVALID_ARGUMENT),
        };
        g.mig_pending = enable;
        let status = if g.mig_current == enable {
            SUCCESS
        } else if g.pass_through {
            ERR_RESET_REQUIRED
        } else if g.in_use() || (!enable && !g.gis.is_empty()) {
            ERR_IN_USE
        } else {
            g.mig_current = enable;
            g.gis.clear();
            SUCCESS
        };
        let index = g.index;
        unsafe { *activation = status };
        st.record(
            "nvmlDeviceSetMigMode",
            index,
            format!("mode={mode} activation={status}"),
        );
        Ok(true)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    dev: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    read_on("nvmlDeviceGetComputeRunningProcesses_v3", gpu_of(dev), |st| {
        let g = device(st, dev)?;
        if count.is_null() {
            return Err(ERR_INVALID_ARGUMENT);
        }
        let n = g.processes.len() as c_uint;
        if infos.is_null() || unsafe { *count } < n {
            unsafe { *count = n };
            return if n == 0 { Ok(()) } else { Err(ERR_INSUFFICIENT_SIZE) };
        }
        for (i, p) in g.processes.iter().enumerate() {
            let v = nvmlProcessInfo_t {
                pid: p.pid,
                usedGpuMemory: p.used_mib * crate::state::MIB,
                gpuInstanceId: p.gi.unwrap_or(NO_VALUE),
                computeInstanceId: p.ci.or(p.gi.map(|_| 0)).unwrap_or(NO_VALUE),
            };
            unsafe { *infos.add(i) = v };
        }
        unsafe { *count = n };
        Ok(())
    })
}

/// The GPU's utilization over the last sample period: `gpu` is the sum of its processes' SM use
/// (capped at 100); the simulator keeps no memory-bandwidth activity, so `memory` is 0. As nvml.h
/// says, "on MIG-enabled GPUs, querying device utilization rates is not currently supported":
/// NOT_SUPPORTED for a GPU in MIG mode and for MIG device handles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(dev: nvmlDevice_t, u: *mut nvmlUtilization_t) -> nvmlReturn_t {
    read_on("nvmlDeviceGetUtilizationRates", gpu_of(dev), |st| {
        if unpack(dev).0 == K_MIG {
            return Err(ERR_NOT_SUPPORTED);
        }
        let g = device(st, dev)?;
        if g.mig_current {
            return Err(ERR_NOT_SUPPORTED);
        }
        let busy: u32 = g.processes.iter().map(|p| p.sm_util).sum();
        unsafe {
            out(
                u,
                nvmlUtilization_t {
                    gpu: busy.min(100),
                    memory: 0,
                },
            )
        }
    })
}
