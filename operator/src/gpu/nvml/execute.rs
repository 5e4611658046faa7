//! Carrying out NVML actions (the mutations), and reading their outcome: return codes, and the
//! activation status of a MIG mode change.

use super::ffi::{Ci, NvmlError, check, err, sym};
use super::handle::NvmlGpus;
use crate::api::{GpuReason, Placement};
use crate::gpu::actions::{Action, COMPUTE_EXCLUSIVE_PROCESS};
use crate::gpu::backend::ActionError;
use nvml_wrapper::enum_wrappers::device::ComputeMode;
use nvml_wrapper_sys::bindings::*;
use std::ptr;

/// Reads the outcome of `nvmlDeviceSetMigMode` from its activation status (docs/nvidia.md#mig-changes-through-nvml): the call
/// succeeds, and resets an idle GPU to activate the mode; `IN_USE` means something held the GPU
/// (idle it and call again: `Busy`, retried on a later apply); `RESET_REQUIRED` means no reset is
/// exposed here (a pass-through VM: a reboot is needed; not retried).
fn mig_activation(gpu: u32, enable: bool, status: nvmlReturn_t) -> Result<(), ActionError> {
    let what = if enable { "enable" } else { "disable" };
    match status {
        s if s == nvmlReturn_enum_NVML_SUCCESS => Ok(()),
        s if s == nvmlReturn_enum_NVML_ERROR_IN_USE => Err(ActionError {
            reason: GpuReason::Busy,
            message: format!(
                "MIG mode {what} is pending: GPU {gpu} could not be reset to activate it (activation status NVML_ERROR_IN_USE: a process, nvidia-persistenced or the nvidia_drm module holds it); the next apply retries once it is idle"
            ),
        }),
        s if s == nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED => Err(ActionError {
            reason: GpuReason::ResetRequired,
            message: format!(
                "MIG mode {what} is pending until GPU {gpu} is reset, which this machine does not expose (activation status NVML_ERROR_RESET_REQUIRED, e.g. a GPU passed through to a VM): reboot the VM or node; not retried until then"
            ),
        }),
        s => check(|| format!("nvmlDeviceSetMigMode(GPU {gpu}): activation failed"), s).map_err(ActionError::from),
    }
}

impl NvmlGpus {
    fn destroy_compute_instance(&self, gpu: u32, gpu_instance_id: u32, ci: &Ci) -> Result<(), NvmlError> {
        let destroy = sym(self.lib().nvmlComputeInstanceDestroy.as_ref())?;
        let what = || {
            format!(
                "nvmlComputeInstanceDestroy(GPU {gpu}, GI {gpu_instance_id}, CI {})",
                ci.id
            )
        };
        check(what, unsafe { destroy(ci.handle) })
    }

    fn device(&self, gpu: u32) -> Result<nvml_wrapper::Device<'_>, NvmlError> {
        self.nvml
            .device_by_index(gpu)
            .map_err(|e| err(&format!("nvmlDeviceGetHandleByIndex_v2(GPU {gpu})"), e))
    }

    fn gpu_instance(&self, gpu: u32, id: u32) -> Result<nvmlGpuInstance_t, NvmlError> {
        let dev = self.device(gpu)?;
        let f = sym(self.lib().nvmlDeviceGetGpuInstanceById.as_ref())?;
        let mut gi: nvmlGpuInstance_t = ptr::null_mut();
        check(|| format!("nvmlDeviceGetGpuInstanceById(GPU {gpu}, {id})"), unsafe {
            f(dev.handle(), id, &mut gi)
        })?;
        Ok(gi)
    }

    /// Leaves the GPU instance with exactly one compute instance spanning it (the CI profile with
    /// the most slices the driver offers for it): any others (several, or a partial one) are
    /// destroyed first; NVML refuses that with IN_USE while processes run in them.
    fn ensure_full_ci(&self, gpu: u32, gpu_instance_id: u32, gi: nvmlGpuInstance_t) -> Result<(), NvmlError> {
        let lib = self.lib();
        let prof = sym(lib.nvmlGpuInstanceGetComputeInstanceProfileInfo.as_ref())?;
        let create = sym(lib.nvmlGpuInstanceCreateComputeInstance.as_ref())?;
        let mut best: Option<nvmlComputeInstanceProfileInfo_t> = None;
        for e in 0..NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
            let mut p: nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
            if unsafe { prof(gi, e, NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, &mut p) }
                == nvmlReturn_enum_NVML_SUCCESS
                && best.is_none_or(|b| p.sliceCount > b.sliceCount)
            {
                best = Some(p);
            }
        }
        let p = best.ok_or(NvmlError::NoComputeProfile { gpu, gpu_instance_id })?;
        let cis = self.compute_instances(gi)?;
        if let [c] = cis.as_slice()
            && c.slices == p.sliceCount
        {
            return Ok(());
        }
        for ci in &cis {
            self.destroy_compute_instance(gpu, gpu_instance_id, ci)?;
        }
        let mut ci: nvmlComputeInstance_t = ptr::null_mut();
        check(
            || format!("nvmlGpuInstanceCreateComputeInstance(GPU {gpu}, CI profile {})", p.id),
            unsafe { create(gi, p.id, &mut ci) },
        )
    }

    /// Carries out one NVML action. Scrubs are not NVML's business.
    pub fn execute(&self, action: &Action) -> Result<(), ActionError> {
        match action {
            Action::SetMigMode { gpu, enable } => {
                // nvml-wrapper returns the activation status; the return code only says the
                // request was valid.
                let activation = self
                    .device(*gpu)?
                    .set_mig_mode(*enable)
                    .map_err(|e| err(&format!("nvmlDeviceSetMigMode(GPU {gpu})"), e))?;
                mig_activation(*gpu, *enable, activation)
            }
            Action::DestroyComputeInstance {
                gpu,
                gpu_instance_id,
                compute_instance_id,
            } => {
                let gi = self.gpu_instance(*gpu, *gpu_instance_id)?;
                if let Some(ci) = self
                    .compute_instances(gi)?
                    .iter()
                    .find(|c| c.id == *compute_instance_id)
                {
                    self.destroy_compute_instance(*gpu, *gpu_instance_id, ci)?;
                }
                Ok(())
            }
            Action::DestroyGpuInstance {
                gpu,
                gpu_instance_id,
                profile,
                placement,
            } => {
                let what = || format!("nvmlGpuInstanceDestroy(GPU {gpu}, {profile} at {placement})");
                Ok(self.destroy_gpu_instance(*gpu, *gpu_instance_id, what)?)
            }
            Action::CreateInstance {
                gpu,
                profile_id,
                profile,
                placement,
            } => {
                let what = || format!("nvmlDeviceCreateGpuInstanceWithPlacement(GPU {gpu}, {profile} at {placement})");
                Ok(self.create_instance(*gpu, *profile_id, *placement, what)?)
            }
            Action::CreateComputeInstance { gpu, gpu_instance_id } => {
                let gi = self.gpu_instance(*gpu, *gpu_instance_id)?;
                Ok(self.ensure_full_ci(*gpu, *gpu_instance_id, gi)?)
            }
            Action::SetComputeMode { gpu, mode } => {
                let m = if *mode == COMPUTE_EXCLUSIVE_PROCESS {
                    ComputeMode::ExclusiveProcess
                } else {
                    ComputeMode::Default
                };
                let mut dev = self.device(*gpu)?;
                dev.set_compute_mode(m)
                    .map_err(|e| err(&format!("nvmlDeviceSetComputeMode(GPU {gpu}, {mode})"), e))?;
                Ok(())
            }
            Action::Scrub { gpu, .. } => Err(ActionError {
                reason: GpuReason::Failed,
                message: format!("GPU {gpu}: a scrub is not an NVML action (scrubs run through CUDA)"),
            }),
        }
    }

    /// Destroys a GPU instance (`what` names the call for its error) and, first, its compute
    /// instances: NVML refuses to destroy a GPU instance that still has some, and any the plan did
    /// not know of (several per instance, made by hand) go too.
    fn destroy_gpu_instance(
        &self,
        gpu: u32,
        gpu_instance_id: u32,
        what: impl FnOnce() -> String,
    ) -> Result<(), NvmlError> {
        let gi = self.gpu_instance(gpu, gpu_instance_id)?;
        for ci in self.compute_instances(gi)? {
            self.destroy_compute_instance(gpu, gpu_instance_id, &ci)?;
        }
        let destroy = sym(self.lib().nvmlGpuInstanceDestroy.as_ref())?;
        check(what, unsafe { destroy(gi) })
    }

    /// Creates a GPU instance of `profile_id` at `placement` (`what` names the call for its error)
    /// and the one compute instance spanning it.
    fn create_instance(
        &self,
        gpu: u32,
        profile_id: u32,
        placement: Placement,
        what: impl FnOnce() -> String,
    ) -> Result<(), NvmlError> {
        let lib = self.lib();
        let dev = self.device(gpu)?;
        let create = sym(lib.nvmlDeviceCreateGpuInstanceWithPlacement.as_ref())?;
        let p = nvmlGpuInstancePlacement_t {
            start: placement.start,
            size: placement.size,
        };
        let mut gi: nvmlGpuInstance_t = ptr::null_mut();
        check(what, unsafe { create(dev.handle(), profile_id, &p, &mut gi) })?;
        let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
        let gi_info = sym(lib.nvmlGpuInstanceGetInfo.as_ref())?;
        check(|| format!("nvmlGpuInstanceGetInfo(GPU {gpu})"), unsafe {
            gi_info(gi, &mut info)
        })?;
        self.ensure_full_ci(gpu, info.id, gi)
    }
}
