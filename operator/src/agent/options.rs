//! What the agent is told: its node, libraries, poll, device plugin and mode.

use super::attribution::Attribution;
use super::dra::DraOptions;
use super::metrics::AgentMetrics;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct Options {
    pub node: String,
    /// The NVML and CUDA libraries of [`super::run`]'s backend (other backends ignore them).
    pub nvml_lib: Option<OsString>,
    pub cuda_lib: Option<PathBuf>,
    /// How often the GPUs are read again without a spec change (drift).
    pub poll: Duration,
    /// Namespace and label selector of NVIDIA's device plugin pods (restarted after a MIG change).
    pub device_plugin_namespace: String,
    pub device_plugin_selector: String,
    /// The device plugin's MPS root, whose daemon this node's `MpsDaemonReady` condition reports;
    /// `None` reports nothing (backends without a device plugin).
    pub mps_root: Option<PathBuf>,
    /// The kubelet's pod-resources socket, read in the device-plugin mode for which pod holds
    /// which device (condition `PodResources`); `None` reads nothing (backends without a kubelet),
    /// and evictions go by resource names.
    pub pod_resources_socket: Option<PathBuf>,
    pub mode: AgentMode,
    /// Where each pass's GPUs, holdings and events go (`None`: nowhere).
    pub metrics: Option<Arc<AgentMetrics>>,
    /// Whose processes keep MPS and time-sliced GPUs busy, and which namespaces hold the
    /// tenants' devices, for the metrics (`None`: not told; a shared GPU's use stays `shared`).
    pub attribution: Option<Arc<Attribution>>,
}

/// How pods reach this node's GPUs.
#[derive(Clone, Debug, Default)]
pub enum AgentMode {
    /// Through NVIDIA's device plugin, which this operator configures: the agent restarts the
    /// plugin's pod after a MIG change, reports its MPS daemon and lists the pods on a busy GPU.
    #[default]
    DevicePlugin,
    /// Through this agent as a DRA kubelet plugin ([`super::dra`]); it runs its own MPS daemon.
    Dra(Box<DraOptions>),
}
