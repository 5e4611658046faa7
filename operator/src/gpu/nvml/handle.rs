//! The NVML backend's handle: the library loaded and initialised, the CUDA library scrubs load,
//! and what one usage reading leaves for the next.

use super::usage::UsageMemory;
use crate::api::GpuNodeStatus;
use crate::gpu::scrub::CudaLib;
use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::NvmlLib;
use std::ffi::OsStr;

/// An initialised NVML library, and where scrubs get their CUDA library.
pub struct NvmlGpus {
    pub(super) nvml: Nvml,
    pub(super) cuda: CudaLib,
    /// GPM samples and per-process sample timestamps kept between readings ([`usage`]).
    usage: std::sync::Mutex<UsageMemory>,
}

impl Drop for NvmlGpus {
    fn drop(&mut self) {
        // The GPM samples kept were allocated by this library: freed through it, before it goes.
        let NvmlGpus { nvml, usage, .. } = self;
        usage.get_mut().unwrap_or_else(|e| e.into_inner()).free_all(nvml);
    }
}

impl NvmlGpus {
    /// Loads NVML from `lib` (the system's `libnvidia-ml.so.1` when `None`) and initialises it.
    pub fn open(lib: Option<&OsStr>) -> Result<NvmlGpus, String> {
        // The driver ships `libnvidia-ml.so.1`; the unversioned name often exists only with
        // development packages, so try the versioned one first.
        let names: Vec<&OsStr> = match lib {
            Some(l) => vec![l],
            None => vec![OsStr::new("libnvidia-ml.so.1"), OsStr::new("libnvidia-ml.so")],
        };
        let mut load_error = String::new();
        for name in &names {
            match Nvml::builder().lib_path(name).init() {
                Ok(nvml) => {
                    return Ok(NvmlGpus {
                        nvml,
                        cuda: CudaLib::default(),
                        usage: Default::default(),
                    });
                }
                Err(NvmlError::LibloadingError(e)) if load_error.is_empty() => load_error = e.to_string(),
                Err(NvmlError::LibloadingError(_)) => {}
                Err(e) => {
                    let name = name.to_string_lossy();
                    return Err(format!("NVML library {name} failed to initialise (nvmlInit_v2): {e}"));
                }
            }
        }
        let tried: Vec<String> = names.iter().map(|n| n.to_string_lossy().into_owned()).collect();
        Err(format!(
            "cannot load the NVML library {}: {load_error}; install the NVIDIA driver or point --nvml-lib (GPU_TENANCY_NVML_LIB) at libnvidia-ml.so.1",
            tried.join(" or ")
        ))
    }

    /// Scrubs load CUDA from `cuda` (the system's `libcuda.so.1` by default).
    pub fn with_cuda(mut self, cuda: CudaLib) -> NvmlGpus {
        self.cuda = cuda;
        self
    }

    pub(super) fn lib(&self) -> &NvmlLib {
        self.nvml.lib()
    }

    /// How busy the GPUs of `status` are now (GPUs it could not read are skipped).
    pub(super) fn read_usage(&self, status: &GpuNodeStatus) -> crate::gpu::Usage {
        let mut memory = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        memory.read(&self.nvml, status)
    }
}
