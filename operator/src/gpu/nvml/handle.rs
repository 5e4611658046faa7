//! The NVML backend's handle: the library loaded and initialised, the CUDA library scrubs load,
//! and what one usage reading leaves for the next.

use super::usage::UsageMemory;
use crate::api::GpuNodeStatus;
use crate::gpu::scrub::CudaLib;
use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError as WrapperError;
use nvml_wrapper_sys::bindings::NvmlLib;
use std::ffi::OsStr;

/// Why the NVML library could not be loaded or initialised.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("NVML library {name} failed to initialise (nvmlInit_v2): {source}")]
    Init { name: String, source: WrapperError },
    /// `tried`: the library names tried, in order; `error`: the loader's message for the first.
    #[error(
        "cannot load the NVML library {}: {error}; install the NVIDIA driver or point --nvml-lib (GPU_TENANCY_NVML_LIB) at libnvidia-ml.so.1",
        .tried.join(" or ")
    )]
    Load { tried: Vec<String>, error: String },
}

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
    pub fn open(lib: Option<&OsStr>) -> Result<NvmlGpus, OpenError> {
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
                Err(WrapperError::LibloadingError(e)) if load_error.is_empty() => load_error = e.to_string(),
                Err(WrapperError::LibloadingError(_)) => {}
                Err(e) => {
                    return Err(OpenError::Init {
                        name: name.to_string_lossy().into_owned(),
                        source: e,
                    });
                }
            }
        }
        Err(OpenError::Load {
            tried: names.iter().map(|n| n.to_string_lossy().into_owned()).collect(),
            error: load_error,
        })
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
