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

use crate::api::{GpuNodeSpec, GpuNodeStatus, GpuStatus, Mode, set_condition};
use crate::device_plugin::RESOURCE_SHARED;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::path::{Path, PathBuf};

/// The device plugin's default `--mps-root`.
pub const DEFAULT_MPS_ROOT: &str = "/run/nvidia/mps";
/// Where the plugin mounts the MPS root's directories in a container.
const CONTAINER_ROOT: &str = "/mps";
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
    pub fn shm_dir(&self) -> PathBuf {
        self.0.join("shm")
    }
    /// Created by the daemon once its defaults are set; removed when it stops.
    pub fn started_file(&self) -> PathBuf {
        self.resource_dir().join(".started")
    }
}

/// What a pod that asks for `nvidia.com/gpu.shared` on an MPS node gets from the plugin's Allocate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodMps {
    /// Environment variables set in the container.
    pub env: Vec<(String, String)>,
    /// `(container path, host path)` mounts.
    pub mounts: Vec<(PathBuf, PathBuf)>,
}

/// The Allocate response's MPS part for a node whose plugin uses `host_root` as `--mps-root`.
pub fn pod_mps(host_root: &MpsRoot) -> PodMps {
    let container = MpsRoot(PathBuf::from(CONTAINER_ROOT));
    PodMps {
        env: vec![(
            "CUDA_MPS_PIPE_DIRECTORY".to_string(),
            container.pipe_dir().display().to_string(),
        )],
        mounts: vec![
            (container.pipe_dir(), host_root.pipe_dir()),
            (container.shm_dir(), host_root.shm_dir()),
        ],
    }
}

/// The commands the plugin's daemon sends its control pipe at start for a node whose GPUs are
/// shared `replicas` ways: a pinned memory limit per GPU (bytes / replicas, in whole MiB), then
/// the thread percentage. Every non-MIG GPU of the node is shared (the plugin applies one sharing
/// setting per node).
pub fn daemon_commands(gpus: &[GpuStatus], replicas: u32) -> Vec<String> {
    let replicas = u64::from(replicas.max(1));
    let mut out: Vec<String> = gpus
        .iter()
        .filter(|g| g.instances.is_empty() && g.memory_mib > 0)
        .map(|g| {
            // The plugin divides bytes, then converts to MiB: floor(floor(B/r)/2^20) equals
            // floor(floor(B/2^20)/r), so the driver's MiB figure gives the same number.
            format!(
                "set_default_device_pinned_mem_limit {} {}M",
                g.index,
                g.memory_mib / replicas
            )
        })
        .collect();
    out.push(format!("set_default_active_thread_percentage {}", 100 / replicas));
    out
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
