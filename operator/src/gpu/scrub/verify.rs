//! The scrub's read-back: a kernel ([`PTX`], `verify_zero.ptx`) reads every word of the memory
//! the worker cleared, on the GPU at memory bandwidth, and reports how many are not zero and the
//! lowest offset of one. Only its 32-byte result and, on a find, the 16 bytes around the first
//! non-zero word come back to the host.
//!
//! Before the scrub counts on the kernel, the kernel must find what a probe holds: a launch that
//! silently did nothing, or a kernel that misses words, would otherwise read as clean memory.

use super::WorkerError;
use cudarc::driver::{result, sys};
use std::ffi::{CString, c_void};

/// The kernel, NUL-terminated as `cuModuleLoadData` reads a PTX image.
const PTX: &str = concat!(include_str!("verify_zero.ptx"), "\0");
const ENTRY: &str = "gpu_tenancy_verify_zero";
const BLOCK: u32 = 256;
/// No lowest offset yet: what the kernel's minimum starts from.
const NONE: u64 = u64::MAX;
/// Result slots, two u64s each (count, lowest offset): the probe's, then the scrub's.
const PROBE_SLOT: usize = 0;
const SCRUB_SLOT: usize = 1;
const INITIAL: [u64; 4] = [0, NONE, 0, NONE];

/// The probe, checked by one block (a stride of 256 units): 1224 whole 16-byte units, of which
/// the kernel's two-unit steps read the first 1024 and its one-unit steps the other 200, and a
/// 5-byte tail. Its non-zero bytes lie in each word of each load of both kinds of step and in the
/// tail (two in one word), so the kernel must report 7 words, the first at byte 80.
const PROBE_LEN: usize = 1224 * 16 + 5;
const PROBE_BYTES: [usize; 8] = [83, 84, 8473, 4210, 12783, 19572, 17609, 19586];
const PROBE_EXPECTED: (u64, u64) = (7, 80);
const _: () = assert!(!PROBE_LEN.is_multiple_of(16), "the probe has a tail");

fn probe() -> Vec<u8> {
    let mut p = vec![0u8; PROBE_LEN];
    for (i, at) in PROBE_BYTES.iter().enumerate() {
        p[*at] = 0x11 * (i as u8 + 1);
    }
    p
}

/// Maps a driver error of `call` to the worker's error about `device`.
pub(super) fn on<'a>(device: &'a str, call: &'static str) -> impl FnOnce(result::DriverError) -> WorkerError + 'a {
    move |error| WorkerError::Cuda {
        call,
        device: device.to_string(),
        error,
    }
}

/// What the kernel found in the memory cleared: `None` when every word reads zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Found {
    pub words: u64,
    /// Offset in the memory cleared, its allocations counted one after the other.
    pub lowest: u64,
}

/// The loaded kernel and its buffers; unloaded and freed when dropped (before the context is
/// released).
pub(super) struct Verifier<'a> {
    device: &'a str,
    module: sys::CUmodule,
    function: sys::CUfunction,
    /// Blocks a launch uses at most: enough threads to fill every SM.
    grid: u32,
    results: sys::CUdeviceptr,
    probe: sys::CUdeviceptr,
}

impl<'a> Verifier<'a> {
    /// Loads the kernel, allocates its buffers and launches it on the probe: done before the
    /// scrub takes the free memory, which the module and the buffers need some of.
    pub fn new(dev: sys::CUdevice, device: &'a str) -> Result<Verifier<'a>, WorkerError> {
        // SAFETY: a NUL-terminated PTX image.
        let module = unsafe { result::module::load_data(PTX.as_ptr() as *const c_void) }
            .map_err(on(device, "cuModuleLoadData"))?;
        let mut v = Verifier {
            device,
            module,
            function: std::ptr::null_mut(),
            grid: 1,
            results: 0,
            probe: 0,
        };
        let entry = CString::new(ENTRY).expect("no NUL in the entry name");
        // SAFETY: a module loaded above and not unloaded.
        v.function =
            unsafe { result::module::get_function(module, entry) }.map_err(on(device, "cuModuleGetFunction"))?;
        v.grid = grid(dev).map_err(on(device, "cuDeviceGetAttribute"))?;
        // SAFETY: small device buffers, freed when `v` drops.
        v.results = unsafe { result::malloc_sync(INITIAL.len() * 8) }.map_err(on(device, "cuMemAlloc"))?;
        v.probe = unsafe { result::malloc_sync(PROBE_LEN) }.map_err(on(device, "cuMemAlloc"))?;
        unsafe { result::memcpy_htod_sync(v.results, &INITIAL) }.map_err(on(device, "cuMemcpyHtoD"))?;
        unsafe { result::memcpy_htod_sync(v.probe, &probe()) }.map_err(on(device, "cuMemcpyHtoD"))?;
        v.launch(v.probe, PROBE_LEN as u64, 0, PROBE_SLOT, 1)?;
        Ok(v)
    }

    /// Queues the kernel over `bytes` at `ptr` (16-byte aligned, as every allocation is), whose
    /// offsets count from `base` in the memory cleared.
    pub fn check(&self, ptr: sys::CUdeviceptr, bytes: u64, base: u64) -> Result<(), WorkerError> {
        let blocks = bytes.div_ceil(16).div_ceil(u64::from(BLOCK));
        self.launch(
            ptr,
            bytes,
            base,
            SCRUB_SLOT,
            blocks.clamp(1, u64::from(self.grid)) as u32,
        )
    }

    fn launch(&self, ptr: sys::CUdeviceptr, bytes: u64, base: u64, slot: usize, grid: u32) -> Result<(), WorkerError> {
        let mut args = [ptr, bytes, base, self.results + (slot * 16) as u64];
        let mut params: Vec<*mut c_void> = args.iter_mut().map(|a| a as *mut u64 as *mut c_void).collect();
        // SAFETY: the function of a loaded module; four u64 parameters as the kernel declares,
        // read by the driver during the call; every address is an allocation of this context.
        unsafe {
            result::launch_kernel(
                self.function,
                (grid, 1, 1),
                (BLOCK, 1, 1),
                0,
                std::ptr::null_mut(),
                &mut params,
            )
        }
        .map_err(on(self.device, "cuLaunchKernel"))
    }

    /// Waits for every launch and reads the result: an error unless the probe came out as it
    /// must and the scrub's result is consistent; `cleared` bytes were checked.
    pub fn finish(&self, cleared: u64) -> Result<Option<Found>, WorkerError> {
        result::ctx::synchronize().map_err(on(self.device, "cuCtxSynchronize (verification kernel)"))?;
        let mut r = [0u64; 4];
        // SAFETY: the 32-byte result buffer.
        unsafe { result::memcpy_dtoh_sync(&mut r, self.results) }.map_err(on(self.device, "cuMemcpyDtoH"))?;
        let (probe, scrub) = ((r[0], r[1]), (r[2], r[3]));
        if probe != PROBE_EXPECTED {
            return Err(WorkerError::KernelSelfTest {
                device: self.device.to_string(),
                words: probe.0,
                lowest: probe.1,
            });
        }
        match scrub {
            (0, NONE) => Ok(None),
            (words, lowest) if words > 0 && lowest < cleared => Ok(Some(Found { words, lowest })),
            (words, lowest) => Err(WorkerError::Inconsistent {
                device: self.device.to_string(),
                words,
                lowest,
            }),
        }
    }
}

impl Drop for Verifier<'_> {
    fn drop(&mut self) {
        // SAFETY: this verifier's own buffers and module, each released once.
        unsafe {
            for p in [self.results, self.probe] {
                if p != 0 {
                    let _ = result::free_sync(p);
                }
            }
            let _ = result::module::unload(self.module);
        }
    }
}

/// Blocks to fill the device: its SMs times the blocks of [`BLOCK`] threads each one runs.
fn grid(dev: sys::CUdevice) -> Result<u32, result::DriverError> {
    use sys::CUdevice_attribute::*;
    // SAFETY: attributes of the device the context is on.
    let sms = unsafe { result::device::get_attribute(dev, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) }?;
    let threads = unsafe { result::device::get_attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR) }?;
    let per_sm = (threads.max(0) as u32 / BLOCK).max(1);
    Ok((sms.max(1) as u32).saturating_mul(per_sm))
}

/// The allocation holding offset `at` of the memory cleared, and the offset in it.
pub(super) fn locate(allocs: &[(u64, u64)], at: u64) -> Option<(usize, u64)> {
    let mut base = 0;
    for (i, &(_, size)) in allocs.iter().enumerate() {
        if at < base + size {
            return Some((i, at - base));
        }
        base += size;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offset_is_found_in_the_allocation_that_holds_it() {
        let allocs = [(0x1000, 256), (0x9000, 128), (0x20000, 64)];
        assert_eq!(locate(&allocs, 0), Some((0, 0)));
        assert_eq!(locate(&allocs, 255), Some((0, 255)));
        assert_eq!(locate(&allocs, 256), Some((1, 0)));
        assert_eq!(locate(&allocs, 256 + 128 + 63), Some((2, 63)));
        assert_eq!(locate(&allocs, 256 + 128 + 64), None);
    }

    /// Which step of the kernel's loop reads each unit when one block checks `units` units:
    /// (first unit of a two-unit step, or the second, or a one-unit step), as verify_zero.ptx
    /// walks them.
    fn steps(units: u64) -> std::collections::HashMap<u64, &'static str> {
        let stride = u64::from(BLOCK);
        let mut out = std::collections::HashMap::new();
        for t in 0..stride {
            let mut i = t;
            while i + stride < units {
                out.insert(i, "two, first");
                out.insert(i + stride, "two, second");
                i += 2 * stride;
            }
            while i < units {
                out.insert(i, "one");
                i += stride;
            }
        }
        out
    }

    #[test]
    fn the_probe_has_a_word_in_every_load_of_every_step_and_the_tail() {
        let units = (PROBE_LEN / 16) as u64;
        let steps = steps(units);
        assert_eq!(steps.len() as u64, units, "every unit read once");
        let mut seen = std::collections::BTreeSet::new();
        for at in PROBE_BYTES {
            let unit = at as u64 / 16;
            let half = if at % 16 < 8 { "low" } else { "high" };
            seen.insert(steps.get(&unit).map_or(("tail", ""), |s| (*s, half)));
        }
        let want = [
            ("one", "high"),
            ("one", "low"),
            ("tail", ""),
            ("two, first", "high"),
            ("two, first", "low"),
            ("two, second", "high"),
            ("two, second", "low"),
        ];
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), want);
    }

    #[test]
    fn the_probe_holds_what_the_kernel_must_report() {
        // The kernel's rule, applied by hand: 8-byte words of the whole 16-byte units, and the
        // tail as one word at its start.
        let p = probe();
        let whole = PROBE_LEN / 16 * 16;
        let mut words: Vec<u64> = (0..whole / 8)
            .filter(|w| p[w * 8..w * 8 + 8].iter().any(|b| *b != 0))
            .map(|w| w as u64 * 8)
            .collect();
        if p[whole..].iter().any(|b| *b != 0) {
            words.push(whole as u64);
        }
        assert_eq!((words.len() as u64, words[0]), PROBE_EXPECTED);
    }

    #[test]
    fn the_kernel_targets_a_gpu_every_supported_one_can_compile_for() {
        assert!(PTX.ends_with('\0'));
        assert!(
            PTX.contains(".target sm_70\n"),
            "sm_70: JIT-compiled for sm_80, sm_90 and sm_100"
        );
        assert!(PTX.contains(&format!(".entry {ENTRY}(")));
    }
}
