//! gpu-tenancy: share GPUs between teams on Kubernetes.
//!
//! Pure decisions live in [`mig`], [`policy`], [`planner`] and [`desired`]: no network, no NVML.
//! [`gpu`] is the GPU layer (NVML, scrubs; no Kubernetes); [`controller`] and [`agent`] are the
//! two loops around them, over what both need in [`runtime`]; [`cli`] is the command line.

pub mod agent;
pub mod api;
pub mod cli;
pub mod controller;
pub mod desired;
pub mod device_plugin;
pub mod devices;
pub mod dra;
pub mod gpu;
pub mod inventory;
pub mod labels;
pub mod mig;
pub mod migparted;
pub mod planner;
pub mod policy;
pub mod problem;
pub mod runtime;
pub mod schema;
pub mod selectors;
