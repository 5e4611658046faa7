//! gpu-tenancy's pure core: decisions, no I/O. The CRDs ([`api`]), the GPU models and MIG rules
//! ([`mig`]), the checks of tenants, tiers and plans ([`policy`]), the planner ([`planner`]) and
//! everything the controller writes ([`desired`]), over their helpers. No Kubernetes client, no
//! NVML, no network: the operator (controller, agent, command line), the simulated NVML library
//! and the fleet build on it, and `gpu-tenancy plan` prints exactly what the controller applies.

pub mod accounting;
pub mod api;
pub mod attribution;
pub mod desired;
pub mod device_plugin;
pub mod devices;
pub mod dra;
pub mod handover;
pub mod inventory;
pub mod kueue;
pub mod labels;
pub mod memory_caps;
pub mod mig;
pub mod planner;
pub mod policy;
pub mod problem;
pub mod selectors;
pub mod signals;
pub mod tenancy;
