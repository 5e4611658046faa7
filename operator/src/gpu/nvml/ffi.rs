//! What every part of the NVML backend uses to call the library: its return codes made errors,
//! the raw function table's missing functions named, and a compute instance as NVML lists it.

use nvml_wrapper::error::{NvmlError as WrapperError, nvml_try};
use nvml_wrapper_sys::bindings::*;

/// Why the NVML backend could not read or change the GPUs: a call that failed, named as NVML
/// names it with its GPU and instance, or a function the loaded library lacks.
#[derive(Debug, thiserror::Error)]
pub enum NvmlError {
    /// `call`: the function and its arguments (`nvmlDeviceGetUUID(GPU 0)`).
    #[error("{call}: {source}")]
    Call { call: String, source: WrapperError },
    /// The loader's message naming the missing function.
    #[error("the NVML library lacks a function the agent needs: {0}")]
    MissingFunction(String),
    #[error("GPU {gpu}: the driver offers no compute instance profile for GPU instance {gpu_instance_id}")]
    NoComputeProfile { gpu: u32, gpu_instance_id: u32 },
    /// A GPU whose events cannot tell its health.
    #[error("it supports no XID or ECC events")]
    NoHealthEvents,
}

impl From<NvmlError> for crate::gpu::DiscoverError {
    fn from(e: NvmlError) -> Self {
        crate::gpu::DiscoverError::new(e)
    }
}

/// A failed NVML call: the action failed.
impl From<NvmlError> for crate::gpu::ActionError {
    fn from(e: NvmlError) -> Self {
        crate::gpu::ActionError {
            reason: crate::api::GpuReason::Failed,
            message: e.to_string(),
        }
    }
}

/// A compute instance as NVML lists it.
pub(super) struct Ci {
    pub(super) handle: nvmlComputeInstance_t,
    pub(super) id: u32,
    /// Compute slices of its profile.
    pub(super) slices: u32,
}

pub(super) fn err(what: &str, e: WrapperError) -> NvmlError {
    NvmlError::Call {
        call: what.to_string(),
        source: e,
    }
}

/// A function of the raw table, or which one the library lacks.
pub(super) fn sym<T, E: std::fmt::Display>(r: Result<&T, E>) -> Result<&T, NvmlError> {
    r.map_err(|e| NvmlError::MissingFunction(e.to_string()))
}

/// A query whose answer may legitimately not exist: `Ok(None)` when the GPU or the driver does not
/// support it; any other error is an error (the GPU cannot be read, so nothing is assumed).
pub(super) fn optional<T>(r: Result<T, WrapperError>) -> Result<Option<T>, WrapperError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(WrapperError::NotSupported | WrapperError::FailedToLoadSymbol(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether a raw return code means "no such profile here" (skip it) rather than a failed read.
pub(super) fn not_offered(code: nvmlReturn_t) -> bool {
    code == nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED || code == nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
}

/// Turns a raw NVML return code into a `Result`.
pub(super) fn check(what: impl FnOnce() -> String, code: nvmlReturn_t) -> Result<(), NvmlError> {
    nvml_try(code).map_err(|e| err(&what(), e))
}
