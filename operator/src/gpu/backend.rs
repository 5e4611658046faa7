//! Access to the GPUs, behind [`Gpus`]: what one apply needs from a node's GPUs (read them, carry
//! out one NVML action, clear a device's memory).
//!
//! The production backend is NVML ([`super::nvml::NvmlGpus`]); tests load that same backend against the
//! simulated `libnvidia-ml.so` in `e2e/nvml-sim`, so there is no second implementation to trust
//! for the agent's own tests. The trait exists so that a fleet of many simulated nodes can run the
//! agent's exact apply and Kubernetes loop in one process (`e2e/fleet`), each node on an in-memory
//! backend, where a thousand loaded copies of the NVML library could not.

use super::actions::Action;
use super::health::HealthSignal;
use super::scrub::{ScrubError, ScrubReport};
use crate::api::GpuNodeStatus;
use crate::api::GpuReason;
use crate::attribution::ProcessSample;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;

/// A node's GPUs as one apply sees them. Implementations are called from a blocking thread.
pub trait Gpus: Send + Sync {
    /// Everything the agent publishes about the GPUs (a GPU that cannot be read is reported with
    /// reason `Unreadable`, never skipped).
    fn discover(&self) -> Result<GpuNodeStatus, DiscoverError>;
    /// Carries out one NVML action (never a scrub: those go to [`Gpus::scrub`]).
    fn execute(&self, action: &Action) -> Result<(), ActionError>;
    /// Zeroes and verifies all free memory of `device` (a GPU or MIG device UUID).
    fn scrub(&self, device: &str) -> Result<ScrubReport, ScrubError>;
    /// How busy the GPUs of `status` (as just discovered) are now, for the agent's metrics, where
    /// the backend can tell ([`Usage`]). Never published in the GpuNode: it changes every second.
    /// Backends without the notion report nothing.
    fn usage(&self, _status: &GpuNodeStatus) -> Usage {
        Usage::default()
    }
    /// Watches the GPUs' error events until `stop` is set, telling `report` what it sees
    /// ([`HealthSignal`]); returns soon after `stop`. Backends without events return at once.
    fn watch_health(&self, _stop: &AtomicBool, _report: &mut dyn FnMut(HealthSignal)) {}
}

/// How busy a node's devices are, where NVML reports it; what it does not report is absent.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Usage {
    /// Whole GPUs not in MIG mode: utilization, 0 to 1 (`nvmlDeviceGetUtilizationRates`' `gpu`,
    /// the part of the last sample period a kernel ran).
    pub gpus: BTreeMap<u32, f64>,
    /// MIG instances by (GPU index, GPU instance ID): the part of the time since the previous
    /// reading any work was active on the instance, 0 to 1 (GPM's `GRAPHICS_UTIL`; Hopper and
    /// later, from the second reading on).
    pub instances: BTreeMap<(u32, u32), f64>,
    /// GPUs not in MIG mode: their processes' samples newer than the previous reading (empty:
    /// none was busy since), where NVML reports them (`nvmlDeviceGetProcessUtilization`).
    pub processes: BTreeMap<u32, Vec<ProcessSample>>,
}

/// Why the GPUs could not be read at all (a GPU that cannot be read is reported `Unreadable`
/// in the status instead): the backend's own error (NVML's, [`super::nvml::NvmlError`]). Kept
/// opaque here so the trait does not depend on one backend.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct DiscoverError(Box<dyn std::error::Error + Send + Sync>);

impl DiscoverError {
    pub fn new(source: impl std::error::Error + Send + Sync + 'static) -> DiscoverError {
        DiscoverError(Box::new(source))
    }
}

/// Why an NVML action did not take effect: the reason the GPU's status gives, and the details.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ActionError {
    /// `Failed` (the call failed), `Busy` or `ResetRequired` (a MIG mode change is pending).
    pub reason: GpuReason,
    pub message: String,
}
