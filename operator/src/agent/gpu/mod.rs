//! Access to the GPUs. The production backend is NVML; tests load the same backend against the
//! simulated `libnvidia-ml.so` in `e2e/nvml-sim`, so there is no second implementation to trust.

pub mod nvml;
