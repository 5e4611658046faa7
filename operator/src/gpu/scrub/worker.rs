//! The scrub worker: runs in the child process, on CUDA device 0 of its `CUDA_VISIBLE_DEVICES`.
//! It takes the free memory in chunks, zeroes each, has the kernel check all of it, and frees it.

use super::verify::{Found, Verifier, locate, on};
use super::{Amount, MIB, ScrubReport, WorkerError};
use cudarc::driver::{result, sys};
use std::time::Instant;

/// Allocation size to start with; halved on out-of-memory down to [`MIN_CHUNK`].
const CHUNK: u64 = 256 * MIB;
const MIN_CHUNK: u64 = 2 * MIB;

/// Clears and verifies `amount` of the device's free memory.
pub fn worker(amount: Amount) -> Result<ScrubReport, WorkerError> {
    let device = std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_else(|_| "0".into());
    // SAFETY: only probes whether the library can be opened.
    if !unsafe { sys::is_culib_present() } {
        return Err(WorkerError::NoDriverLibrary);
    }
    result::init().map_err(on(&device, "cuInit"))?;
    let n = result::device::get_count().map_err(on(&device, "cuDeviceGetCount"))?;
    if n < 1 {
        return Err(WorkerError::NoDevice { device: device.clone() });
    }
    let dev = result::device::get(0).map_err(on(&device, "cuDeviceGet"))?;
    // SAFETY: the primary context of a device we just got; released before returning.
    let ctx = unsafe { result::primary_ctx::retain(dev) }.map_err(on(&device, "cuDevicePrimaryCtxRetain"))?;
    let outcome = unsafe { result::ctx::set_current(ctx) }
        .map_err(on(&device, "cuCtxSetCurrent"))
        .and_then(|()| in_context(dev, &device, amount));
    let _ = unsafe { result::primary_ctx::release(dev) };
    outcome
}

/// The scrub with the device's context current; everything it allocates is freed on return.
fn in_context(dev: sys::CUdevice, device: &str, amount: Amount) -> Result<ScrubReport, WorkerError> {
    let verifier = Verifier::new(dev, device)?;
    let (free, total) = result::mem_get_info().map_err(on(device, "cuMemGetInfo"))?;
    let target = match amount {
        Amount::AllFree => free as u64,
        Amount::Bytes(b) => b.min(free as u64),
    };
    let mut report = ScrubReport {
        device: device.to_string(),
        total_bytes: total as u64,
        free_bytes: free as u64,
        ..ScrubReport::default()
    };
    let mut allocs: Vec<(u64, u64)> = Vec::new();
    let outcome = clear_and_verify(&verifier, &mut report, target, &mut allocs);
    drop(verifier);
    for (ptr, _) in allocs {
        // SAFETY: allocations of this context, each freed once.
        let _ = unsafe { result::free_sync(ptr) };
    }
    outcome.map(|()| report)
}

/// Allocates up to `target` bytes in chunks (halved on out-of-memory), zeroes each, then has the
/// kernel check every allocation; the bytes and the time of each phase go into `report`.
fn clear_and_verify(
    verifier: &Verifier,
    report: &mut ScrubReport,
    target: u64,
    allocs: &mut Vec<(u64, u64)>,
) -> Result<(), WorkerError> {
    let device = report.device.as_str();
    let started = Instant::now();
    let mut cleared = 0u64;
    let mut chunk = CHUNK;
    while cleared < target && chunk >= MIN_CHUNK {
        let size = chunk.min(target - cleared);
        // SAFETY: plain device allocations, freed by the caller.
        match unsafe { result::malloc_sync(size as usize) } {
            Ok(ptr) => {
                allocs.push((ptr, size));
                unsafe { result::memset_d8_sync(ptr, 0, size as usize) }.map_err(on(device, "cuMemsetD8"))?;
                cleared += size;
            }
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => chunk /= 2,
            Err(e) => return Err(on(device, "cuMemAlloc")(e)),
        }
    }
    // Memsets may still be running: the clearing time ends when they have.
    result::ctx::synchronize().map_err(on(device, "cuCtxSynchronize (clear)"))?;
    report.clear_micros = started.elapsed().as_micros() as u64;
    let started = Instant::now();
    let mut base = 0u64;
    for &(ptr, size) in allocs.iter() {
        verifier.check(ptr, size, base)?;
        base += size;
    }
    let found = verifier.finish(cleared)?;
    report.verify_micros = started.elapsed().as_micros() as u64;
    match found {
        None => {
            report.bytes_cleared = cleared;
            report.bytes_verified = base;
            Ok(())
        }
        Some(f) => Err(not_zero(device, allocs, f)),
    }
}

/// The error for a non-zero word the kernel found: the first non-zero byte at or after its
/// offset (the kernel reports words; the byte and its value are read back).
fn not_zero(device: &str, allocs: &[(u64, u64)], f: Found) -> WorkerError {
    let Some((allocation, word)) = locate(allocs, f.lowest) else {
        return WorkerError::Inconsistent {
            device: device.to_string(),
            words: f.words,
            lowest: f.lowest,
        };
    };
    let (ptr, size) = allocs[allocation];
    let mut buf = vec![0u8; (size - word).min(16) as usize];
    // SAFETY: at most 16 bytes inside one allocation.
    if let Err(e) = unsafe { result::memcpy_dtoh_sync(&mut buf, ptr + word) } {
        return on(device, "cuMemcpyDtoH")(e);
    }
    match buf.iter().position(|b| *b != 0) {
        Some(i) => WorkerError::NotZero {
            device: device.to_string(),
            allocation,
            offset: word + i as u64,
            value: buf[i],
            words: f.words,
        },
        None => WorkerError::Unconfirmed {
            device: device.to_string(),
            allocation,
            offset: word,
            words: f.words,
        },
    }
}
