//! The CUDA driver calls a memory scrub makes (through cudarc), over the simulated GPUs.
//!
//! Device memory is not really allocated: allocations are address ranges whose contents
//! [`crate::cuda_memory`] models (a memset records the value, a read returns it, or the "dirty"
//! pattern while the GPU or instance still holds another tenant's data, or a stale byte). Zeroing
//! (nearly) all free memory of a target counts as a scrub: its memory slices are marked clean and
//! a [`crate::state::ScrubEntry`] is logged, whose `bytes_verified` the verification kernel's
//! launches ([`crate::cuda_kernels`]) add to.

#![allow(non_snake_case, clippy::missing_safety_doc)]

pub use crate::cuda_ctx::DIRTY_BYTE;
use crate::cuda_ctx::*;
use crate::cuda_memory::Alloc;
use crate::state::{MIB, Paths, ScrubEntry, SimState, read, with_state};
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

/// A scrub may leave this much of the free memory untouched (allocation granularity).
pub const SCRUB_SLACK: u64 = 64 * MIB;
/// Milliseconds a scrub takes once its memory is cleared, as a real GPU's tens of gigabytes do:
/// tests of what waits behind a scrub set it in the agent's environment.
pub const SCRUB_MS_ENV: &str = "GPU_TENANCY_SIM_SCRUB_MS";

/// The devices `CUDA_VISIBLE_DEVICES` selects: GPU UUIDs, MIG UUIDs or indices; all non-MIG
/// GPUs when unset.
fn visible(st: &SimState) -> Vec<Target> {
    let Ok(list) = std::env::var("CUDA_VISIBLE_DEVICES") else {
        return st
            .gpus
            .iter()
            .filter(|g| !g.mig_current)
            .map(|g| Target { gpu: g.index, gi: None })
            .collect();
    };
    let mut out = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let found = if let Ok(i) = item.parse::<u32>() {
            st.gpu(i)
                .filter(|g| !g.mig_current)
                .map(|g| Target { gpu: g.index, gi: None })
        } else if item.starts_with("MIG-") {
            st.gpus.iter().find_map(|g| {
                g.gis
                    .iter()
                    .find(|gi| gi.cis.iter().any(|c| c.uuid == item))
                    .map(|gi| Target {
                        gpu: g.index,
                        gi: Some(gi.id),
                    })
            })
        } else {
            st.gpus
                .iter()
                .find(|g| g.uuid == item && !g.mig_current)
                .map(|g| Target { gpu: g.index, gi: None })
        };
        // CUDA stops at the first entry it cannot resolve.
        match found {
            Some(t) => out.push(t),
            None => break,
        }
    }
    out
}

/// (total, used by processes) of a target, in bytes.
fn target_memory(st: &SimState, t: Target) -> Option<(u64, u64)> {
    let g = st.gpu(t.gpu)?;
    match t.gi {
        None => Some((
            g.memory_mib * MIB,
            g.processes.iter().map(|p| p.used_mib).sum::<u64>() * MIB,
        )),
        Some(id) => {
            let gi = g.gi(id)?;
            let used: u64 = g
                .processes
                .iter()
                .filter(|p| p.gi == Some(id))
                .map(|p| p.used_mib)
                .sum();
            Some((g.gi_memory_mib(gi) * MIB, used * MIB))
        }
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuInit(_flags: c_uint) -> u32 {
    let paths = match Paths::from_env() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("nvml-sim: {e}");
            return CUDA_ERROR_NO_DEVICE;
        }
    };
    if let Some(code) = fault(&paths, "cuInit", None) {
        return code;
    }
    let Ok(st) = read(&paths) else {
        return CUDA_ERROR_NO_DEVICE;
    };
    let targets = visible(&st);
    let mut guard = CTX.lock().unwrap_or_else(|e| e.into_inner());
    if guard.is_none() {
        *guard = Some(Ctx {
            paths: Some(paths),
            targets,
            next_ptr: 0x7f00_0000_0000,
            ..Default::default()
        });
    }
    CUDA_SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(v: *mut c_int) -> u32 {
    if v.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    unsafe { *v = 12040 };
    CUDA_SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> u32 {
    with_ctx(|ctx| {
        if count.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        unsafe { *count = ctx.targets.len() as c_int };
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(dev: *mut c_int, ordinal: c_int) -> u32 {
    with_ctx(|ctx| {
        if dev.is_null() || ordinal < 0 || ordinal as usize >= ctx.targets.len() {
            return Err(CUDA_ERROR_INVALID_DEVICE);
        }
        unsafe { *dev = ordinal };
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut *mut c_void, dev: c_int) -> u32 {
    with_ctx(|ctx| {
        if pctx.is_null() || dev < 0 || dev as usize >= ctx.targets.len() {
            return Err(CUDA_ERROR_INVALID_DEVICE);
        }
        unsafe { *pctx = (0x1000 + dev as usize) as *mut c_void };
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(_dev: c_int) -> u32 {
    with_ctx(|_| Ok(()))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCurrent(c: *mut c_void) -> u32 {
    with_ctx(|ctx| {
        let i = (c as usize).checked_sub(0x1000).ok_or(201u32)?;
        if i >= ctx.targets.len() {
            return Err(201);
        }
        ctx.current = Some(i);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize() -> u32 {
    with_ctx(crate::cuda_kernels::record_verified)
}

fn free_bytes(ctx: &Ctx) -> Result<(u64, u64), u32> {
    let (paths, t) = current(ctx)?;
    let st = read(&paths).map_err(|_| CUDA_ERROR_NOT_INITIALIZED)?;
    let (total, used) = target_memory(&st, t).ok_or(CUDA_ERROR_INVALID_DEVICE)?;
    let ours: u64 = ctx.allocs.iter().map(|a| a.size).sum();
    Ok((total.saturating_sub(used + ours), total))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> u32 {
    with_ctx(|ctx| {
        let (f, t) = free_bytes(ctx)?;
        if free.is_null() || total.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        unsafe {
            *free = f as usize;
            *total = t as usize;
        }
        Ok(())
    })
}

/// A process of a container (named by [`crate::caps::CONTAINER_ENV`]) with a memory cap on its
/// GPU: an allocation past the cap is out of memory, as the driver answers it, counting the
/// container's processes on the GPU and this process's own allocations, in MiB rounded up.
/// MIG devices carry no caps in the simulator.
fn within_cap(ctx: &Ctx, paths: &Paths, t: Target, bytes: u64) -> Result<(), u32> {
    let Ok(container) = std::env::var(crate::caps::CONTAINER_ENV) else {
        return Ok(());
    };
    if t.gi.is_some() {
        return Ok(());
    }
    let st = read(paths).map_err(|_| CUDA_ERROR_NOT_INITIALIZED)?;
    let g = st.gpu(t.gpu).ok_or(CUDA_ERROR_INVALID_DEVICE)?;
    let ours: u64 = ctx.allocs.iter().map(|a| a.size).sum();
    crate::caps::check(&st, g, Some(&container), ours.div_ceil(MIB), bytes.div_ceil(MIB))
        .map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut u64, bytes: usize) -> u32 {
    with_ctx(|ctx| {
        let (paths, t) = current(ctx)?;
        if let Some(code) = fault(&paths, "cuMemAlloc_v2", Some(t.gpu)) {
            return Err(code);
        }
        let (free, _) = free_bytes(ctx)?;
        if dptr.is_null() || bytes == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if bytes as u64 > free {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        within_cap(ctx, &paths, t, bytes as u64)?;
        let st = read(&paths).map_err(|_| CUDA_ERROR_NOT_INITIALIZED)?;
        let ptr = ctx.next_ptr;
        ctx.next_ptr += (bytes as u64).next_multiple_of(2 * MIB);
        ctx.allocs.push(Alloc::new(ptr, bytes as u64, background(&st, t)));
        unsafe { *dptr = ptr };
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFree_v2(dptr: u64) -> u32 {
    with_ctx(|ctx| {
        let before = ctx.allocs.len();
        ctx.allocs.retain(|a| a.ptr != dptr);
        if ctx.allocs.len() == before {
            Err(CUDA_ERROR_INVALID_VALUE)
        } else {
            Ok(())
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD8_v2(dptr: u64, value: u8, n: usize) -> u32 {
    with_ctx(|ctx| {
        let (paths, t) = current(ctx)?;
        if let Some(code) = fault(&paths, "cuMemsetD8_v2", Some(t.gpu)) {
            return Err(code);
        }
        let mut next = ctx.next_cleared;
        let (a, rel) = ctx.alloc_at(dptr, n as u64).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if !a.set(rel, n as u64, value, &mut next) {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        ctx.next_cleared = next;
        if value == 0 {
            ctx.zeroed += n as u64;
        }
        if ctx.scrubbed {
            return Ok(());
        }
        let zeroed = ctx.zeroed;
        let entry = with_state(&paths, |st| {
            let Some((total, used)) = target_memory(st, t) else {
                return (None, false);
            };
            if zeroed + SCRUB_SLACK < total.saturating_sub(used) {
                return (None, false);
            }
            let g = st.gpu_mut(t.gpu).expect("target GPU exists");
            let slices = g.slices_of(t.gi);
            for s in &mut g.dirty[slices] {
                *s = None;
            }
            st.scrubs.push(ScrubEntry {
                gpu: t.gpu,
                gpu_instance: t.gi,
                bytes: zeroed,
                bytes_verified: 0,
            });
            (Some(st.scrubs.len() - 1), true)
        })
        .map_err(|_| CUDA_ERROR_NOT_INITIALIZED)?;
        ctx.scrub_entry = entry;
        ctx.scrubbed = entry.is_some();
        if ctx.scrubbed
            && let Some(ms) = std::env::var(SCRUB_MS_ENV).ok().and_then(|v| v.parse::<u64>().ok())
        {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: u64, n: usize) -> u32 {
    with_ctx(|ctx| {
        let (paths, t) = current(ctx)?;
        if let Some(code) = fault(&paths, "cuMemcpyDtoH_v2", Some(t.gpu)) {
            return Err(code);
        }
        // A copy to the host waits for the kernels before it, as a synchronisation does.
        crate::cuda_kernels::record_verified(ctx)?;
        let st = read(&paths).map_err(|_| CUDA_ERROR_NOT_INITIALIZED)?;
        let (a, rel) = ctx.alloc_at(src, n as u64).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if dst.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let bytes = a.read(rel, n as u64, background(&st, t), &crate::stale::of(&st, t.gpu, t.gi));
        // SAFETY: the caller's buffer of `n` bytes (cuMemcpyDtoH's contract).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst as *mut u8, n) };
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(dst: u64, src: *const c_void, n: usize) -> u32 {
    with_ctx(|ctx| {
        let (paths, t) = current(ctx)?;
        if let Some(code) = fault(&paths, "cuMemcpyHtoD_v2", Some(t.gpu)) {
            return Err(code);
        }
        if src.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (a, rel) = ctx.alloc_at(dst, n as u64).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: the caller's buffer of `n` bytes (cuMemcpyHtoD's contract).
        let bytes = unsafe { std::slice::from_raw_parts(src as *const u8, n) };
        if !a.write(rel, bytes) {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorString(code: u32, s: *mut *const c_char) -> u32 {
    let msg: &'static CStr = match code {
        0 => c"no error",
        1 => c"invalid argument",
        2 => c"out of memory",
        3 => c"initialization error",
        100 => c"no CUDA-capable device is detected",
        101 => c"invalid device ordinal",
        209 => c"no kernel image is available for execution on the device",
        218 => c"a PTX JIT compilation failed",
        222 => c"the provided PTX was compiled with an unsupported toolchain.",
        400 => c"invalid resource handle",
        500 => c"named symbol not found",
        700 => c"an illegal memory access was encountered",
        716 => c"misaligned address",
        801 => c"operation not supported",
        _ => c"unknown error",
    };
    if s.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    unsafe { *s = msg.as_ptr() };
    CUDA_SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorName(code: u32, s: *mut *const c_char) -> u32 {
    let msg: &'static CStr = match code {
        0 => c"CUDA_SUCCESS",
        1 => c"CUDA_ERROR_INVALID_VALUE",
        2 => c"CUDA_ERROR_OUT_OF_MEMORY",
        3 => c"CUDA_ERROR_NOT_INITIALIZED",
        100 => c"CUDA_ERROR_NO_DEVICE",
        101 => c"CUDA_ERROR_INVALID_DEVICE",
        209 => c"CUDA_ERROR_NO_BINARY_FOR_GPU",
        218 => c"CUDA_ERROR_INVALID_PTX",
        222 => c"CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
        400 => c"CUDA_ERROR_INVALID_HANDLE",
        500 => c"CUDA_ERROR_NOT_FOUND",
        700 => c"CUDA_ERROR_ILLEGAL_ADDRESS",
        716 => c"CUDA_ERROR_MISALIGNED_ADDRESS",
        801 => c"CUDA_ERROR_NOT_SUPPORTED",
        _ => c"CUDA_ERROR_UNKNOWN",
    };
    if s.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    unsafe { *s = msg.as_ptr() };
    CUDA_SUCCESS
}
