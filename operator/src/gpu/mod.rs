//! The GPU layer: discover the node's GPUs through NVML and make them match a GpuNode spec,
//! safely and with the fewest changes (docs/design.md#components and #invariants).
//!
//! [`actions`] decides (pure), [`backend`] is what an apply needs of the GPUs ([`nvml`] is the
//! production backend), [`scrub`] clears memory through CUDA, [`health`] keeps what the driver reports of the devices'
//! health, [`mps`] supervises an MPS daemon
//! (for `agent apply` outside a cluster), [`apply`] runs the steps and [`status`] builds what the
//! agent publishes. No Kubernetes here: the node agent's loop (`crate::agent`) passes the
//! published status where the command line passes `--status FILE`.

pub mod actions;
pub mod apply;
pub mod backend;
pub mod health;
pub mod mps;
pub mod nvml;
pub mod scrub;
pub mod status;

pub use backend::{ActionError, DiscoverError, Gpus, Usage};

#[cfg(test)]
mod tests;
