//! NVIDIA's device plugin's MPS daemon, as the agent sees it: the settings it gives the node's GPUs,
//! the paths and environment a pod gets, and whether it has started.
//!
//! In a cluster the plugin's daemon is the one MPS daemon of a node (docs/concepts/isolation.md#mps); the agent runs
//! none. What is here follows the plugin's own code (k8s-device-plugin,
//! `cmd/mps-control-daemon/mps/{daemon,root}.go` and `internal/plugin/mps.go`; docs/nvidia.md#the-device-plugin-and-mig-parted):
//! - the daemon serves one resource name (ours: `nvidia.com/gpu.shared`, the plugin's
//!   `renameByDefault`) under `<mpsRoot>/<resource>/` with `pipe/` and `log/`, shared memory in
//!   `<mpsRoot>/shm`, and creates `<mpsRoot>/<resource>/.started` once its defaults are set;
//! - its defaults are equal shares: `set_default_device_pinned_mem_limit <index> <bytes/replicas/MiB>M`
//!   per GPU and `set_default_active_thread_percentage <100/replicas>`;
//! - a pod's Allocate response mounts the host pipe and shm directories at `/mps/<resource>/pipe` and
//!   `/mps/shm` and sets `CUDA_MPS_PIPE_DIRECTORY` to the former.
//!
//! The agent reports the daemon's state as the GpuNode condition `MpsDaemonReady` on nodes whose spec
//! has MPS GPUs. It does not gate `Ready` (that says the GPUs match the spec): while the daemon is
//! down the plugin advertises no MPS devices, so nothing is handed out unsafely, but the condition
//! tells the operator why MPS pods stay Pending.

use crate::api::{GpuNodeSpec, GpuNodeStatus, Mode, set_condition};
use crate::device_plugin::RESOURCE_SHARED;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::path::{Path, PathBuf};

/// The device plugin's default `--mps-root`.
pub const DEFAULT_MPS_ROOT: &str = "/run/nvidia/mps";
/// The GpuNode condition that reports the plugin's MPS daemon.
pub const MPS_DAEMON_READY: &str = "MpsDaemonReady";

/// The plugin's MPS directories for our shared resource name, under one root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MpsRoot(pub PathBuf);

impl MpsRoot {
    fn resource_dir(&self) -> PathBuf {
        self.0.join(RESOURCE_SHARED)
    }
    pub fn pipe_dir(&self) -> PathBuf {
        self.resource_dir().join("pipe")
    }
    pub fn log_dir(&self) -> PathBuf {
        self.resource_dir().join("log")
    }
    /// The plugin mounts it into its pods' containers (the tests' model of its Allocate).
    #[cfg(test)]
    pub fn shm_dir(&self) -> PathBuf {
        self.0.join("shm")
    }
    /// Created by the daemon once its defaults are set; removed when it stops.
    pub fn started_file(&self) -> PathBuf {
        self.resource_dir().join(".started")
    }
}

/// What the agent found of the daemon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DaemonState {
    Started,
    /// The root is visible but the daemon has not (yet) marked itself started.
    NotStarted,
    /// The agent cannot see the root (not mounted into its container, or unreadable).
    RootMissing(String),
}

/// Looks for the daemon's `.started` file (the only I/O here).
pub fn observe(root: &MpsRoot) -> DaemonState {
    match std::fs::metadata(&root.0) {
        Err(e) => return DaemonState::RootMissing(e.to_string()),
        Ok(m) if !m.is_dir() => return DaemonState::RootMissing("not a directory".to_string()),
        Ok(_) => {}
    }
    if root.started_file().is_file() {
        DaemonState::Started
    } else {
        DaemonState::NotStarted
    }
}

/// Whether the spec shares any GPU through MPS.
pub fn wants_mps(spec: &GpuNodeSpec) -> bool {
    spec.gpus.iter().any(|g| g.mode == Mode::Mps)
}

/// Sets `MpsDaemonReady` on nodes whose spec has MPS GPUs, and removes it from the others.
pub fn report(status: &mut GpuNodeStatus, spec: &GpuNodeSpec, root: &MpsRoot, state: &DaemonState, now: &Time) {
    if !wants_mps(spec) {
        status.conditions.retain(|c| c.type_ != MPS_DAEMON_READY);
        return;
    }
    let (ok, reason, message) = match state {
        DaemonState::Started => (
            true,
            "Started",
            format!(
                "the device plugin's MPS daemon for {RESOURCE_SHARED} has started ({})",
                root.started_file().display()
            ),
        ),
        DaemonState::NotStarted => (
            false,
            "NotStarted",
            format!(
                "no {}: the device plugin's MPS daemon has not started; MPS pods stay Pending until it does (is its mps-control-daemon scheduled on this node, label nvidia.com/mps.capable=true?)",
                root.started_file().display()
            ),
        ),
        DaemonState::RootMissing(e) => (
            false,
            "RootNotMounted",
            format!(
                "the agent cannot read the device plugin's MPS root {} ({e}): mount it into the agent (hostPath) or pass its path with --mps-root",
                root.0.display()
            ),
        ),
    };
    set_condition(
        &mut status.conditions,
        MPS_DAEMON_READY,
        ok,
        reason,
        message,
        status.observed_generation,
        now,
    );
}

#[cfg(test)]
mod tests;

/// The root a path names (for flags).
impl From<&Path> for MpsRoot {
    fn from(p: &Path) -> MpsRoot {
        MpsRoot(p.to_path_buf())
    }
}
