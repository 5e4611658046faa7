//! What every part of the NVML backend uses to call the library: its return codes made errors,
//! the raw function table's missing functions named, and a compute instance as NVML lists it.

use nvml_wrapper::error::{NvmlError, nvml_try};
use nvml_wrapper_sys::bindings::*;

/// A compute instance as NVML lists it.
pub(super) struct Ci {
    pub(super) handle: nvmlComputeInstance_t,
    pub(super) id: u32,
    /// Compute slices of its profile.
    pub(super) slices: u32,
}

pub(super) fn err(what: &str, e: NvmlError) -> String {
    format!("{what}: {e}")
}

/// A function of the raw table, or which one the library lacks.
pub(super) fn sym<T, E: std::fmt::Display>(r: Result<&T, E>) -> Result<&T, String> {
    r.map_err(|e| format!("the NVML library lacks a function the agent needs: {e}"))
}

/// A query whose answer may legitimately not exist: `Ok(None)` when the GPU or the driver does not
/// support it; any other error is an error (the GPU cannot be read, so nothing is assumed).
pub(super) fn optional<T>(r: Result<T, NvmlError>) -> Result<Option<T>, NvmlError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether a raw return code means "no such profile here" (skip it) rather than a failed read.
pub(super) fn not_offered(code: nvmlReturn_t) -> bool {
    code == nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED || code == nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
}

/// Turns a raw NVML return code into a `Result`.
pub(super) fn check(what: impl FnOnce() -> String, code: nvmlReturn_t) -> Result<(), String> {
    nvml_try(code).map_err(|e| err(&what(), e))
}
