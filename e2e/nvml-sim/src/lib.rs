//! A simulated `libnvidia-ml.so` for testing the gpu-tenancy agent without a GPU.
//!
//! Built as a `cdylib`, it exports the NVML functions the agent calls ([`nvml`]) and the CUDA
//! driver calls a memory scrub makes ([`cuda`]), over GPUs described by the YAML file named in
//! `GPU_TENANCY_SIM_CONFIG`. State lives in a JSON file next to it (or `GPU_TENANCY_SIM_STATE`), so
//! separate processes see the same GPUs. [`ctl`] (and the `sim-ctl` binary) attach processes,
//! reboot, inject faults and read the mutation log; [`stale`] plants bytes a scrub must find.

pub mod caps;
pub mod ctl;
pub mod cuda;
pub mod cuda_ctx;
pub mod cuda_kernels;
pub mod cuda_memory;
pub mod hook;
pub mod nvml;
pub mod stale;
pub mod state;
