//! gpu-tenancy: share GPUs between teams on Kubernetes.
//!
//! Pure decisions live in [`mig`], [`policy`] and [`planner`]: no network, no NVML. The command
//! line in [`cli`] and the loops that come later are thin shells around them.

pub mod agent;
pub mod agent_loop;
pub mod api;
pub mod cli;
pub mod controller;
pub mod desired;
pub mod device_plugin;
pub mod devices;
pub mod inventory;
pub mod labels;
pub mod mig;
pub mod migparted;
pub mod planner;
pub mod policy;
pub mod problem;
pub mod schema;
pub mod selectors;
