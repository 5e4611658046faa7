//! The node agent's GPU layer: discover the node's GPUs through NVML and make them match a
//! GpuNode spec, safely and with the fewest changes (DESIGN.md §2, §4).
//!
//! [`actions`] decides (pure), [`gpu::nvml`] reads and mutates the GPUs, [`scrub`] clears memory
//! through CUDA, [`mps`] supervises the MPS daemon, [`apply`] runs the loop and [`status`] builds
//! what the agent publishes. No Kubernetes here: the loop that watches GpuNodes passes the
//! published status where the command line passes `--status FILE`.

pub mod actions;
pub mod apply;
pub mod gpu;
pub mod mps;
pub mod output;
pub mod plugin_mps;
pub mod scrub;
pub mod status;

#[cfg(test)]
mod tests;
