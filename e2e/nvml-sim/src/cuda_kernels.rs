//! Modules and kernel launches: the CUDA calls that load the scrub's verification kernel (PTX)
//! and run it, and the device attributes its launch geometry reads.
//!
//! The simulator runs no PTX. It reads a module's `.version`, `.target` and `.entry` lines (so a
//! kernel for a newer GPU or a newer PTX ISA than the device and driver take is refused, as the
//! driver's JIT refuses it), and recognises the one kernel it models by its entry name,
//! [`VERIFY_ZERO_ENTRY`], whose result it computes from its memory model
//! ([`crate::cuda_memory::Alloc::verify`]) and writes into the kernel's result buffer.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use crate::cuda_ctx::{
    CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_PTX,
    CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_MISALIGNED_ADDRESS, CUDA_ERROR_NO_BINARY_FOR_GPU, CUDA_ERROR_NOT_FOUND,
    CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_UNSUPPORTED_PTX_VERSION, Ctx, Module, Target,
    background, current, fault, with_ctx,
};
use crate::state::{SimState, read, with_state};
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

/// The verification kernel's entry: `(ptr, bytes, base, result)`, all 64-bit; adds the non-zero
/// 8-byte words of `[ptr, ptr + bytes)` to `result[0]` and lowers `result[1]` to `base` plus the
/// offset of the first one.
pub const VERIFY_ZERO_ENTRY: &str = "gpu_tenancy_verify_zero";
/// The newest PTX ISA the simulated driver (CUDA 12.4) compiles.
const PTX_ISA_MAX: (u32, u32) = (8, 4);
const MODULE_BASE: u64 = 0x5100_0000;
/// Entries of a module: its function handles are the module's handle times this plus the index.
const ENTRIES_MAX: u64 = 0x100;
const ATTR_MULTIPROCESSOR_COUNT: c_int = 16;
const ATTR_MAX_THREADS_PER_MULTIPROCESSOR: c_int = 39;

/// The entries of a PTX module for a device of compute capability `cc`, or the driver's error.
pub fn ptx_entries(ptx: &str, cc: (u32, u32)) -> Result<Vec<String>, u32> {
    let mut version = None;
    let mut target = None;
    let mut entries = Vec::new();
    for line in ptx.lines() {
        let code = line.split("//").next().unwrap_or_default();
        let mut words = code.split_whitespace();
        while let Some(w) = words.next() {
            match w {
                ".version" => version = words.next().map(str::to_string),
                ".target" => target = words.next().map(|t| t.trim_end_matches(',').to_string()),
                ".entry" => {
                    let name = words.next().unwrap_or_default();
                    let name = name.split('(').next().unwrap_or_default();
                    if !name.is_empty() {
                        entries.push(name.to_string());
                    }
                }
                _ => {}
            }
        }
    }
    let version = version.ok_or(CUDA_ERROR_INVALID_PTX)?;
    let (major, minor) = version.split_once('.').ok_or(CUDA_ERROR_INVALID_PTX)?;
    let isa = (
        major.parse::<u32>().map_err(|_| CUDA_ERROR_INVALID_PTX)?,
        minor.parse::<u32>().map_err(|_| CUDA_ERROR_INVALID_PTX)?,
    );
    if isa > PTX_ISA_MAX {
        return Err(CUDA_ERROR_UNSUPPORTED_PTX_VERSION);
    }
    let sm = target
        .as_deref()
        .and_then(|t| t.strip_prefix("sm_"))
        .and_then(|n| {
            n.trim_end_matches(|c: char| c.is_ascii_alphabetic())
                .parse::<u32>()
                .ok()
        })
        .ok_or(CUDA_ERROR_INVALID_PTX)?;
    if sm > cc.0 * 10 + cc.1 {
        return Err(CUDA_ERROR_NO_BINARY_FOR_GPU);
    }
    if entries.is_empty() {
        return Err(CUDA_ERROR_INVALID_PTX);
    }
    Ok(entries)
}

fn compute_capability(st: &SimState, t: Target) -> Result<(u32, u32), u32> {
    let g = st.gpu(t.gpu).ok_or(CUDA_ERROR_INVALID_DEVICE)?;
    Ok(g.model().compute_capability)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut *mut c_void, image: *const c_void) -> u32 {
    with_ctx(|ctx| {
        let (paths, t) = current(ctx)?;
        if let Some(code) = fault(&paths, "cuModuleLoadData", Some(t.gpu)) {
            return Err(code);
        }
        if module.is_null() || image.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: a PTX image is a NUL-terminated string (cuModuleLoadData's contract).
        let text = unsafe { CStr::from_ptr(image as *const c_char) };
        let text = text.to_str().map_err(|_| CUDA_ERROR_INVALID_PTX)?;
        let st = read(&paths).map_err(|_| CUDA_ERROR_NOT_INITIALIZED)?;
        let entries = ptx_entries(text, compute_capability(&st, t)?)?;
        ctx.next_module += 1;
        let handle = MODULE_BASE + ctx.next_module;
        ctx.modules.push(Module { handle, entries });
        unsafe { *module = handle as *mut c_void };
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetFunction(f: *mut *mut c_void, module: *mut c_void, name: *const c_char) -> u32 {
    with_ctx(|ctx| {
        if f.is_null() || name.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let m = ctx
            .modules
            .iter()
            .find(|m| m.handle == module as u64)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        // SAFETY: a NUL-terminated name (cuModuleGetFunction's contract).
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
        let i = m.entries.iter().position(|e| *e == name).ok_or(CUDA_ERROR_NOT_FOUND)?;
        unsafe { *f = (m.handle * ENTRIES_MAX + i as u64) as *mut c_void };
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuModuleUnload(module: *mut c_void) -> u32 {
    with_ctx(|ctx| {
        let before = ctx.modules.len();
        ctx.modules.retain(|m| m.handle != module as u64);
        if ctx.modules.len() == before {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        Ok(())
    })
}

/// The entry name of a function handle from a module still loaded.
fn entry_of(ctx: &Ctx, f: *mut c_void) -> Result<String, u32> {
    let (handle, i) = (f as u64 / ENTRIES_MAX, f as u64 % ENTRIES_MAX);
    let m = ctx
        .modules
        .iter()
        .find(|m| m.handle == handle)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    m.entries.get(i as usize).cloned().ok_or(CUDA_ERROR_INVALID_HANDLE)
}

/// Launch geometry: non-empty, at most 1024 threads a block (every GPU since compute capability
/// 2.0), no dynamic shared memory (the kernel declares none).
fn check_geometry(grid: [c_uint; 3], block: [c_uint; 3], shared: c_uint) -> Result<(), u32> {
    let threads: u64 = block.iter().map(|b| u64::from(*b)).product();
    if grid.contains(&0) || block.contains(&0) || threads > 1024 || shared != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernel(
    f: *mut c_void,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    _stream: *mut c_void,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> u32 {
    with_ctx(|ctx| {
        let (paths, t) = current(ctx)?;
        // An injected fault with error 0 returns success without running the kernel: a launch
        // that silently does nothing, which the scrub's test of the kernel must catch.
        if let Some(code) = fault(&paths, "cuLaunchKernel", Some(t.gpu)) {
            return Err(code);
        }
        let entry = entry_of(ctx, f)?;
        if entry != VERIFY_ZERO_ENTRY || !extra.is_null() {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        check_geometry([gx, gy, gz], [bx, by, bz], shared)?;
        if params.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: kernelParams holds one pointer per kernel parameter, four u64s for this entry.
        let [ptr, bytes, base, result] = std::array::from_fn(|i| unsafe { *(*params.add(i) as *const u64) });
        verify_zero(ctx, &paths, t, [ptr, bytes, base, result])
    })
}

/// The verification kernel over `[ptr, ptr + bytes)`, as it runs to completion.
fn verify_zero(ctx: &mut Ctx, paths: &crate::state::Paths, t: Target, args: [u64; 4]) -> Result<(), u32> {
    let [ptr, bytes, base, result] = args;
    // 16-byte loads need 16-byte alignment; the result's 64-bit atomics 8.
    if ptr % 16 != 0 || result % 8 != 0 {
        return Err(CUDA_ERROR_MISALIGNED_ADDRESS);
    }
    let st = read(paths).map_err(|_| CUDA_ERROR_NOT_INITIALIZED)?;
    let stale = crate::stale::of(&st, t.gpu, t.gi);
    let (a, rel) = ctx.alloc_at(ptr, bytes).ok_or(CUDA_ERROR_ILLEGAL_ADDRESS)?;
    let found = a.verify(rel, bytes, background(&st, t), &stale);
    let cleared = a.cleared_at.is_some();
    if let Some(first) = found.first {
        let (r, rel) = ctx.alloc_at(result, 16).ok_or(CUDA_ERROR_ILLEGAL_ADDRESS)?;
        let now = r.read(rel, 16, 0, &[]);
        let count = u64::from_le_bytes(now[..8].try_into().expect("8 bytes")) + found.words;
        let lowest = u64::from_le_bytes(now[8..].try_into().expect("8 bytes")).min(base + first);
        let mut out = count.to_le_bytes().to_vec();
        out.extend(lowest.to_le_bytes());
        if !r.write(rel, &out) {
            return Err(CUDA_ERROR_ILLEGAL_ADDRESS);
        }
    }
    if cleared {
        ctx.verified_pending += bytes;
    }
    Ok(())
}

/// Adds the bytes verified by the launches since the last synchronisation to this process's
/// scrub log entry: kernels finish, as far as the host knows, when it synchronises (a context
/// synchronisation, or a copy to the host), and one state write per scrub, not per launch.
pub(crate) fn record_verified(ctx: &mut Ctx) -> Result<(), u32> {
    let (Some(i), n) = (ctx.scrub_entry, std::mem::take(&mut ctx.verified_pending)) else {
        return Ok(());
    };
    if n == 0 {
        return Ok(());
    }
    let (paths, _) = current(ctx)?;
    with_state(&paths, |st| match st.scrubs.get_mut(i) {
        Some(e) => {
            e.bytes_verified += n;
            ((), true)
        }
        None => ((), false),
    })
    .map_err(|_| CUDA_ERROR_NOT_INITIALIZED)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetAttribute(value: *mut c_int, attribute: c_int, dev: c_int) -> u32 {
    with_ctx(|ctx| {
        let (paths, _) = current(ctx)?;
        let t = *usize::try_from(dev)
            .ok()
            .and_then(|d| ctx_target(ctx, d))
            .ok_or(CUDA_ERROR_INVALID_DEVICE)?;
        if value.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let st = read(&paths).map_err(|_| CUDA_ERROR_NOT_INITIALIZED)?;
        let g = st.gpu(t.gpu).ok_or(CUDA_ERROR_INVALID_DEVICE)?;
        let v = match attribute {
            ATTR_MULTIPROCESSOR_COUNT => {
                let shape = match t.gi.and_then(|id| g.gi(id)) {
                    Some(gi) => crate::state::SimGpu::shape_of(gi.profile_id).ok_or(CUDA_ERROR_INVALID_DEVICE)?,
                    None => gpu_tenancy_core::mig::Shape::SevenSlice,
                };
                crate::nvml::profiles::engines(g.model().key, shape).sm
            }
            // Compute capability 7.0 to 10.0 run 2048 threads per SM (8.6 and 8.9 run 1536).
            ATTR_MAX_THREADS_PER_MULTIPROCESSOR => 2048,
            _ => return Err(CUDA_ERROR_NOT_SUPPORTED),
        };
        unsafe { *value = v as c_int };
        Ok(())
    })
}

fn ctx_target(ctx: &Ctx, dev: usize) -> Option<&Target> {
    ctx.targets.get(dev)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KERNEL: &str = include_str!("../../../operator/src/gpu/scrub/verify_zero.ptx");

    #[test]
    fn the_scrubs_kernel_loads_on_every_modelled_gpu_and_newer_ptx_is_refused() {
        for cc in [(8, 0), (9, 0), (10, 0)] {
            assert_eq!(
                ptx_entries(KERNEL, cc),
                Ok(vec![VERIFY_ZERO_ENTRY.to_string()]),
                "{cc:?}"
            );
        }
        let newer = KERNEL.replace(".target sm_70", ".target sm_90");
        assert_eq!(ptx_entries(&newer, (8, 0)), Err(CUDA_ERROR_NO_BINARY_FOR_GPU));
        let isa = KERNEL.replace(".version 6.0", ".version 9.0");
        assert_eq!(ptx_entries(&isa, (9, 0)), Err(CUDA_ERROR_UNSUPPORTED_PTX_VERSION));
        assert_eq!(ptx_entries("// nothing", (9, 0)), Err(CUDA_ERROR_INVALID_PTX));
    }
}
