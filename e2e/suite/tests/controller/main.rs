//! The controller on the real API server. These scenarios own their cluster: `e2e/run.sh` gives
//! this binary a fresh control plane of its own and runs the scenarios one at a time
//! (the controller plans the whole fleet, so tests sharing a cluster would see each other's objects).
//!
//! Agents are simulated by the tests: they create the Node objects (there is no kubelet) and
//! write GpuNode status the way the agent does (the GPUs it found, then "applied" for each new
//! generation); `agents.rs` (and scenarios e and f) run real agents on simulated GPUs instead, and
//! `real_kubelet.rs` one on a node of Kubernetes' own kubelet with a device plugin, whose pods
//! really start.
//! The controller's passes are driven directly (`Controller::pass`) so each scenario states
//! exactly which writes a pass makes.

mod agent_reads;
mod agents;
mod attacks;
mod kueue;
mod kueue_manager;
mod metrics;
mod metrics_work;
mod observe;
mod plan_live;
mod privilege;
mod real_kubelet;
mod scenarios;
mod support;
