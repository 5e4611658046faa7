//! The NVML backend: reads the GPUs into a `GpuNodeStatus` and carries out NVML actions.
//!
//! `nvml-wrapper` covers the simple queries; MIG placements and GPU/compute instance management
//! go through its raw function table (`Nvml::lib()`), because the wrapper does not offer them
//! (and its `possible_placements` returns an empty list). Profile IDs and placements always come
//! from the driver: other GPUs number them differently than the static tables. Discovery is here,
//! the mutations in [`execute`], how busy the GPUs are in [`usage`]; below them all, the loaded
//! library ([`handle`]) and its return codes made errors ([`ffi`]).

mod execute;
mod ffi;
mod handle;
mod health;
mod usage;

pub use ffi::NvmlError;
pub use handle::{NvmlGpus, OpenError};

pub use super::ActionError;

use crate::api::GpuReason;
use crate::api::{
    DriverInfo, GpuNodeStatus, GpuStatus, MigInstanceStatus, MigModeStatus, MigProfileStatus, Placement, ProcessStatus,
};
use crate::gpu::actions::{Action, COMPUTE_DEFAULT, COMPUTE_EXCLUSIVE_PROCESS};
use crate::gpu::backend::DiscoverError;
use crate::gpu::scrub::{self, Amount, ScrubError, ScrubReport};
use ffi::{Ci, check, err, not_offered, optional, sym};
use nvml_wrapper::enum_wrappers::device::ComputeMode;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError as WrapperError;
use nvml_wrapper_sys::bindings::*;
use std::ffi::CStr;
use std::ptr;

const MIB: u64 = 1024 * 1024;

/// `nvmlGpuInstanceProfileInfo_v2`: struct size with the version in the top byte (nvml.h's
/// `NVML_STRUCT_VERSION(GpuInstanceProfileInfo, 2)`).
const PROFILE_INFO_V2: u32 = std::mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>() as u32 | (2 << 24);

impl NvmlGpus {
    /// Everything the agent publishes about the node's GPUs. A GPU that any per-device query fails
    /// for is reported with reason `Unreadable` and the error, nothing else: it is never mistaken
    /// for an idle GPU without MIG (fails closed), and the other GPUs are read as usual.
    pub fn discover(&self) -> Result<GpuNodeStatus, NvmlError> {
        let driver = DriverInfo {
            driver_version: self
                .nvml
                .sys_driver_version()
                .map_err(|e| err("nvmlSystemGetDriverVersion", e))?,
            nvml_version: self
                .nvml
                .sys_nvml_version()
                .map_err(|e| err("nvmlSystemGetNVMLVersion", e))?,
            cuda_version: self
                .nvml
                .sys_cuda_driver_version()
                .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10))
                .map_err(|e| err("nvmlSystemGetCudaDriverVersion_v2", e))?,
        };
        let count = self.nvml.device_count().map_err(|e| err("nvmlDeviceGetCount_v2", e))?;
        let mut gpus = Vec::new();
        for index in 0..count {
            gpus.push(self.discover_gpu(index).unwrap_or_else(|e| GpuStatus {
                index,
                reason: Some(GpuReason::Unreadable),
                message: Some(format!("NVML cannot read GPU {index}: {e}")),
                ..Default::default()
            }));
        }
        Ok(GpuNodeStatus {
            driver: Some(driver),
            gpu_count: Some(count),
            gpus,
            ..Default::default()
        })
    }

    fn discover_gpu(&self, index: u32) -> Result<GpuStatus, NvmlError> {
        let at = |call: &str| format!("{call}(GPU {index})");
        let dev = self
            .nvml
            .device_by_index(index)
            .map_err(|e| err(&at("nvmlDeviceGetHandleByIndex_v2"), e))?;
        let pci = dev.pci_info().map_err(|e| err(&at("nvmlDeviceGetPciInfo_v3"), e))?;
        let mig_mode = match dev.mig_mode() {
            Ok(m) => Some(MigModeStatus {
                current: m.current == 1,
                pending: m.pending == 1,
            }),
            Err(WrapperError::NotSupported) => None,
            Err(e) => return Err(err(&at("nvmlDeviceGetMigMode"), e)),
        };
        // SAFETY: the handle belongs to `dev`, which lives as long as `self.nvml`.
        let handle = unsafe { dev.handle() };
        let profiles = if mig_mode.is_some() {
            self.profiles(index, handle)?
        } else {
            Vec::new()
        };
        let instances = if mig_mode.is_some_and(|m| m.current) {
            self.instances(index, handle, &profiles)?
        } else {
            Vec::new()
        };
        let processes = dev
            .running_compute_processes()
            .map_err(|e| err(&at("nvmlDeviceGetComputeRunningProcesses_v3"), e))?
            .into_iter()
            .map(|p| ProcessStatus {
                pid: p.pid,
                gpu_instance_id: p.gpu_instance_id,
                compute_instance_id: p.compute_instance_id,
                used_memory_mib: match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b / MIB),
                    UsedGpuMemory::Unavailable => None,
                },
            })
            .collect();
        Ok(GpuStatus {
            index,
            uuid: dev.uuid().map_err(|e| err(&at("nvmlDeviceGetUUID"), e))?,
            name: dev.name().map_err(|e| err(&at("nvmlDeviceGetName"), e))?,
            pci_device_id: format!("0x{:08X}", pci.pci_device_id),
            memory_mib: dev
                .memory_info()
                .map_err(|e| err(&at("nvmlDeviceGetMemoryInfo_v2"), e))?
                .total
                / MIB,
            numa_node: optional(dev.numa_node_id())
                .map_err(|e| err(&at("nvmlDeviceGetNumaNodeId"), e))?
                .map(|n| n as i32),
            // Only the planner's MPS limit reads it, and an unknown capability is its safe side
            // (16 clients): a library without the call is no reason to fail discovery.
            minor_number: dev.minor_number().ok(),
            compute_capability: dev
                .cuda_compute_capability()
                .ok()
                .map(|c| format!("{}.{}", c.major, c.minor)),
            compute_mode: optional(dev.compute_mode())
                .map_err(|e| err(&at("nvmlDeviceGetComputeMode"), e))?
                .map(|m| compute_mode_name(m).to_string()),
            mig_mode,
            profiles,
            instances,
            processes,
            ..Default::default()
        })
    }

    /// GPU instance profiles by NVML enum, with IDs, names and placements as the driver reports.
    fn profiles(&self, index: u32, dev: nvmlDevice_t) -> Result<Vec<MigProfileStatus>, NvmlError> {
        let lib = self.lib();
        let info_v = lib.nvmlDeviceGetGpuInstanceProfileInfoV.as_ref().ok();
        let info_v1 = sym(lib.nvmlDeviceGetGpuInstanceProfileInfo.as_ref())?;
        let placements = sym(lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2.as_ref())?;
        let mut out: Vec<MigProfileStatus> = Vec::new();
        for e in 0..NVML_GPU_INSTANCE_PROFILE_COUNT {
            // SAFETY: plain C structs filled by NVML; zeroed is a valid initial value.
            let mut info: nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
            info.version = PROFILE_INFO_V2;
            let code = match info_v {
                Some(f) => unsafe { f(dev, e, &mut info) },
                None => nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND,
            };
            let name = if code == nvmlReturn_enum_NVML_SUCCESS {
                let raw = unsafe { CStr::from_ptr(info.name.as_ptr()) }
                    .to_string_lossy()
                    .into_owned();
                raw.trim_start_matches("MIG ").to_string()
            } else {
                // Older drivers: no names; fall back to the v1 call and the static model tables.
                let mut v1: nvmlGpuInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
                match unsafe { info_v1(dev, e, &mut v1) } {
                    c if c == nvmlReturn_enum_NVML_SUCCESS => {}
                    c if not_offered(c) => continue,
                    c => check(|| format!("nvmlDeviceGetGpuInstanceProfileInfo(GPU {index}, {e})"), c)?,
                }
                info.id = v1.id;
                info.sliceCount = v1.sliceCount;
                info.instanceCount = v1.instanceCount;
                info.memorySizeMB = v1.memorySizeMB;
                String::new()
            };
            if out.iter().any(|p| p.id == info.id) {
                continue;
            }
            let mut count: u32 = 0;
            let what = || {
                format!(
                    "nvmlDeviceGetGpuInstancePossiblePlacements_v2(GPU {index}, profile {})",
                    info.id
                )
            };
            match unsafe { placements(dev, info.id, ptr::null_mut(), &mut count) } {
                c if c == nvmlReturn_enum_NVML_SUCCESS || c == nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE => {}
                c if c == nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED => continue,
                c => check(what, c)?,
            }
            let mut buf = vec![nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
            if count > 0 {
                check(what, unsafe { placements(dev, info.id, buf.as_mut_ptr(), &mut count) })?;
                buf.truncate(count as usize);
            }
            let placements: Vec<Placement> = buf
                .iter()
                .map(|p| Placement {
                    start: p.start,
                    size: p.size,
                })
                .collect();
            let name = if name.is_empty() {
                fallback_name(self, index, info.id)
            } else {
                name
            };
            out.push(MigProfileStatus {
                id: info.id,
                name,
                compute_slices: info.sliceCount,
                memory_slices: placements.first().map(|p| p.size).unwrap_or(0),
                memory_mib: info.memorySizeMB,
                max_instances: info.instanceCount,
                placements,
            });
        }
        Ok(out)
    }

    /// Existing GPU instances with their first compute instance and MIG device UUID.
    fn instances(
        &self,
        index: u32,
        dev: nvmlDevice_t,
        profiles: &[MigProfileStatus],
    ) -> Result<Vec<MigInstanceStatus>, NvmlError> {
        let lib = self.lib();
        let get_gis = sym(lib.nvmlDeviceGetGpuInstances.as_ref())?;
        let gi_info = sym(lib.nvmlGpuInstanceGetInfo.as_ref())?;
        let mut out = Vec::new();
        for p in profiles {
            let mut buf: Vec<nvmlGpuInstance_t> = vec![ptr::null_mut(); p.max_instances.max(1) as usize];
            let mut count = 0u32;
            let what = || format!("nvmlDeviceGetGpuInstances(GPU {index}, profile {})", p.id);
            check(what, unsafe { get_gis(dev, p.id, buf.as_mut_ptr(), &mut count) })?;
            for &gi in buf.iter().take(count as usize) {
                let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
                check(|| format!("nvmlGpuInstanceGetInfo(GPU {index})"), unsafe {
                    gi_info(gi, &mut info)
                })?;
                // The one compute instance spanning the GPU instance, what the agent creates and the
                // device plugin should advertise; none, several or a partial one read as "no
                // compute instance" and are replaced by the plan.
                let cis = self.compute_instances(gi)?;
                let full = match cis.as_slice() {
                    [c] if c.slices == p.compute_slices => Some(c.id),
                    _ => None,
                };
                out.push(MigInstanceStatus {
                    gpu_instance_id: info.id,
                    compute_instance_id: full,
                    profile_id: info.profileId,
                    profile: p.name.clone(),
                    placement: Placement {
                        start: info.placement.start,
                        size: info.placement.size,
                    },
                    ..Default::default()
                });
            }
        }
        self.mig_device_uuids(index, dev, &mut out)?;
        out.sort_by_key(|i| i.placement);
        Ok(out)
    }

    /// Fills in the MIG device UUID of each instance with its compute instance, matched by (GPU
    /// instance, compute instance) among the GPU's MIG devices.
    fn mig_device_uuids(&self, index: u32, dev: nvmlDevice_t, out: &mut [MigInstanceStatus]) -> Result<(), NvmlError> {
        let lib = self.lib();
        let max = {
            let f = sym(lib.nvmlDeviceGetMaxMigDeviceCount.as_ref())?;
            let mut n = 0u32;
            check(|| format!("nvmlDeviceGetMaxMigDeviceCount(GPU {index})"), unsafe {
                f(dev, &mut n)
            })?;
            n
        };
        let by_index = sym(lib.nvmlDeviceGetMigDeviceHandleByIndex.as_ref())?;
        let gi_id = sym(lib.nvmlDeviceGetGpuInstanceId.as_ref())?;
        let ci_id = sym(lib.nvmlDeviceGetComputeInstanceId.as_ref())?;
        let uuid_of = sym(lib.nvmlDeviceGetUUID.as_ref())?;
        for j in 0..max {
            let mut mig: nvmlDevice_t = ptr::null_mut();
            match unsafe { by_index(dev, j, &mut mig) } {
                c if c == nvmlReturn_enum_NVML_SUCCESS => {}
                // No MIG device at this index: the indices are 0..max, most of them unused.
                c if c == nvmlReturn_enum_NVML_ERROR_NOT_FOUND => continue,
                c => check(|| format!("nvmlDeviceGetMigDeviceHandleByIndex(GPU {index}, {j})"), c)?,
            }
            let (mut g, mut c) = (0u32, 0u32);
            let mut buf = [0 as std::ffi::c_char; NVML_DEVICE_UUID_V2_BUFFER_SIZE as usize];
            let what = || format!("MIG device {j} of GPU {index}");
            check(|| format!("nvmlDeviceGetGpuInstanceId({})", what()), unsafe {
                gi_id(mig, &mut g)
            })?;
            check(|| format!("nvmlDeviceGetComputeInstanceId({})", what()), unsafe {
                ci_id(mig, &mut c)
            })?;
            check(|| format!("nvmlDeviceGetUUID({})", what()), unsafe {
                uuid_of(mig, buf.as_mut_ptr(), buf.len() as u32)
            })?;
            if let Some(inst) = out
                .iter_mut()
                .find(|i| i.gpu_instance_id == g && i.compute_instance_id == Some(c))
            {
                inst.uuid = Some(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned());
            }
        }
        Ok(())
    }

    /// Every compute instance of a GPU instance, whatever its profile, in ID order.
    fn compute_instances(&self, gi: nvmlGpuInstance_t) -> Result<Vec<Ci>, NvmlError> {
        let lib = self.lib();
        let prof = sym(lib.nvmlGpuInstanceGetComputeInstanceProfileInfo.as_ref())?;
        let list = sym(lib.nvmlGpuInstanceGetComputeInstances.as_ref())?;
        let info = sym(lib.nvmlComputeInstanceGetInfo_v2.as_ref())?;
        let mut out = Vec::new();
        for e in 0..NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
            let mut p: nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
            match unsafe { prof(gi, e, NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, &mut p) } {
                c if c == nvmlReturn_enum_NVML_SUCCESS => {}
                c if not_offered(c) => continue,
                c => check(|| format!("nvmlGpuInstanceGetComputeInstanceProfileInfo({e})"), c)?,
            }
            let mut buf: Vec<nvmlComputeInstance_t> = vec![ptr::null_mut(); p.instanceCount.max(1) as usize];
            let mut count = 0u32;
            check(|| "nvmlGpuInstanceGetComputeInstances".into(), unsafe {
                list(gi, p.id, buf.as_mut_ptr(), &mut count)
            })?;
            for &ci in buf.iter().take(count as usize) {
                let mut i: nvmlComputeInstanceInfo_t = unsafe { std::mem::zeroed() };
                check(|| "nvmlComputeInstanceGetInfo_v2".into(), unsafe { info(ci, &mut i) })?;
                out.push(Ci {
                    handle: ci,
                    id: i.id,
                    slices: p.sliceCount,
                });
            }
        }
        out.sort_by_key(|c| c.id);
        Ok(out)
    }
}

fn fallback_name(gpus: &NvmlGpus, index: u32, profile_id: u32) -> String {
    let model = gpus
        .nvml
        .device_by_index(index)
        .and_then(|d| d.pci_info())
        .ok()
        .and_then(|p| crate::mig::model_by_pci_id(&format!("0x{:08X}", p.pci_device_id)));
    match (model, crate::mig::Shape::from_profile_id(profile_id)) {
        (Some(m), Some(s)) => m.profile_for(s).name.to_string(),
        _ => format!("profile-{profile_id}"),
    }
}

pub fn compute_mode_name(m: ComputeMode) -> &'static str {
    match m {
        ComputeMode::Default => COMPUTE_DEFAULT,
        ComputeMode::ExclusiveThread => "ExclusiveThread",
        ComputeMode::Prohibited => "Prohibited",
        ComputeMode::ExclusiveProcess => COMPUTE_EXCLUSIVE_PROCESS,
    }
}

/// The production backend: NVML for discovery and actions, CUDA (in a child process) for scrubs.
impl super::Gpus for NvmlGpus {
    fn discover(&self) -> Result<GpuNodeStatus, DiscoverError> {
        Ok(NvmlGpus::discover(self)?)
    }

    fn execute(&self, action: &Action) -> Result<(), ActionError> {
        NvmlGpus::execute(self, action)
    }

    fn scrub(&self, device: &str) -> Result<ScrubReport, ScrubError> {
        scrub::run(device, Amount::AllFree, &self.cuda)
    }

    /// Device utilization, per-process samples and GPM per MIG instance ([`usage`]).
    fn usage(&self, status: &GpuNodeStatus) -> crate::gpu::Usage {
        self.read_usage(status)
    }

    /// XID and ECC events through NVML's event sets ([`health`]).
    fn watch_health(
        &self,
        stop: &std::sync::atomic::AtomicBool,
        report: &mut dyn FnMut(crate::gpu::health::HealthSignal),
    ) {
        self.watch_events(stop, report)
    }
}
