//! gpu-tenancy: share GPUs between teams on Kubernetes.
//!
//! Pure decisions live in the core crate (`gpu-tenancy-core`, re-exported here: [`mig`],
//! [`policy`], [`planner`], [`desired`] and their helpers): no network, no NVML.
//! [`gpu`] is the GPU layer (NVML, scrubs; no Kubernetes); [`controller`] and [`agent`] are the
//! two loops around them, over what both need in [`runtime`]; [`cli`] is the command line.

pub use gpu_tenancy_core::{
    accounting, api, attribution, desired, device_plugin, devices, dra, handover, inventory, kueue, labels, mig,
    planner, policy, problem, selectors, signals, tenancy,
};

pub mod agent;
pub mod cli;
pub mod controller;
pub mod gpu;
pub mod migparted;
pub mod report;
pub mod runtime;
pub mod schema;
