//! The state of the simulated CUDA driver in this process (its context: the devices it sees,
//! the current one, allocations, loaded modules) and the driver's error codes, which the entry
//! points of [`crate::cuda`] and the kernels of [`crate::cuda_kernels`] share.

use crate::cuda_memory::Alloc;
use crate::state::{Paths, SimState, with_state};
use std::sync::Mutex;

pub(crate) const CUDA_SUCCESS: u32 = 0;
pub(crate) const CUDA_ERROR_INVALID_VALUE: u32 = 1;
pub(crate) const CUDA_ERROR_OUT_OF_MEMORY: u32 = 2;
pub(crate) const CUDA_ERROR_NOT_INITIALIZED: u32 = 3;
pub(crate) const CUDA_ERROR_NO_DEVICE: u32 = 100;
pub(crate) const CUDA_ERROR_INVALID_DEVICE: u32 = 101;
pub(crate) const CUDA_ERROR_NO_BINARY_FOR_GPU: u32 = 209;
pub(crate) const CUDA_ERROR_INVALID_PTX: u32 = 218;
pub(crate) const CUDA_ERROR_UNSUPPORTED_PTX_VERSION: u32 = 222;
pub(crate) const CUDA_ERROR_INVALID_HANDLE: u32 = 400;
pub(crate) const CUDA_ERROR_NOT_FOUND: u32 = 500;
pub(crate) const CUDA_ERROR_ILLEGAL_ADDRESS: u32 = 700;
pub(crate) const CUDA_ERROR_MISALIGNED_ADDRESS: u32 = 716;
/// A call the simulator does not model (a copy into a large allocation, an unknown kernel).
pub(crate) const CUDA_ERROR_NOT_SUPPORTED: u32 = 801;

/// Byte a read returns from memory that still holds another tenant's data.
pub const DIRTY_BYTE: u8 = 0xAB;

/// A CUDA device as this process sees it: a whole GPU or one MIG instance.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Target {
    pub gpu: u32,
    pub gi: Option<u32>,
}

#[derive(Default)]
pub(crate) struct Ctx {
    pub paths: Option<Paths>,
    pub targets: Vec<Target>,
    pub current: Option<usize>,
    pub allocs: Vec<Alloc>,
    pub next_ptr: u64,
    /// Where the memory cleared so far ends ([`Alloc::cleared_at`]).
    pub next_cleared: u64,
    pub zeroed: u64,
    pub scrubbed: bool,
    /// The index in the state's scrub log of this process's scrub, once logged.
    pub scrub_entry: Option<usize>,
    /// Bytes of cleared memory the verification kernel read since the last synchronisation.
    pub verified_pending: u64,
    pub modules: Vec<Module>,
    pub next_module: u64,
}

impl Ctx {
    /// The allocation holding `[p, p + n)`, and the offset of `p` in it.
    pub fn alloc_at(&mut self, p: u64, n: u64) -> Option<(&mut Alloc, u64)> {
        self.allocs
            .iter_mut()
            .find_map(|a| a.offset_of(p, n).map(|rel| (a, rel)))
    }
}

pub(crate) static CTX: Mutex<Option<Ctx>> = Mutex::new(None);

pub(crate) fn with_ctx(f: impl FnOnce(&mut Ctx) -> Result<(), u32>) -> u32 {
    let mut guard = CTX.lock().unwrap_or_else(|e| e.into_inner());
    match guard.as_mut() {
        None => CUDA_ERROR_NOT_INITIALIZED,
        Some(ctx) => f(ctx).err().unwrap_or(CUDA_SUCCESS),
    }
}

/// An injected fault for `name` (about GPU `gpu`, if known), if one is due (see `sim-ctl fail`).
pub(crate) fn fault(paths: &Paths, name: &str, gpu: Option<u32>) -> Option<u32> {
    with_state(paths, |st| {
        if !st.faults.iter().any(|f| f.call == name && f.times > 0) {
            return (None, false);
        }
        (st.check_fault(name, gpu), true)
    })
    .ok()
    .flatten()
}

pub(crate) fn current(ctx: &Ctx) -> Result<(Paths, Target), u32> {
    let t = ctx
        .targets
        .get(ctx.current.ok_or(201u32)?)
        .copied()
        .ok_or(CUDA_ERROR_INVALID_DEVICE)?;
    Ok((ctx.paths.clone().ok_or(CUDA_ERROR_NOT_INITIALIZED)?, t))
}

/// The byte a read of memory never written returns: the dirty pattern while the target holds
/// another tenant's data.
pub(crate) fn background(st: &SimState, t: Target) -> u8 {
    let dirty = st.gpu(t.gpu).is_some_and(|g| !g.dirty_tenants(t.gi).is_empty());
    if dirty { DIRTY_BYTE } else { 0 }
}

/// A PTX module loaded into the context: its handle and its entries' names.
pub(crate) struct Module {
    pub handle: u64,
    pub entries: Vec<String>,
}
