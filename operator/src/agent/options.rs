//! What the agent is told: its node, libraries, poll, and mode. Each mode's own settings live in
//! its variant of [`AgentMode`], the registration of the modes ([`super::mode`]).

use super::RunError;
use super::attribution::Attribution;
use super::device_plugin::DevicePluginOptions;
use super::dra::DraOptions;
use super::metrics::AgentMetrics;
use super::mode::NodeMode;
use super::watches::Watches;
use crate::gpu::Gpus;
use kube::Client;
use std::ffi::OsString;
use std::future::Future;
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
    pub mode: AgentMode,
    /// Where each pass's GPUs, holdings and events go (`None`: nowhere).
    pub metrics: Option<Arc<AgentMetrics>>,
    /// Whose processes keep MPS and time-sliced GPUs busy, and which namespaces hold the
    /// tenants' devices, for the metrics (`None`: not told; a shared GPU's use stays `shared`).
    pub attribution: Option<Arc<Attribution>>,
}

/// How pods reach this node's GPUs, with the mode's own settings. A mode is a folder of
/// [`super`] that implements [`NodeMode`], and one variant here.
#[derive(Clone, Debug)]
pub enum AgentMode {
    /// Through NVIDIA's device plugin, which this operator configures ([`super::device_plugin`]).
    DevicePlugin(DevicePluginOptions),
    /// Through this agent as a DRA kubelet plugin ([`super::dra`]).
    Dra(Box<DraOptions>),
}

impl Default for AgentMode {
    fn default() -> Self {
        AgentMode::DevicePlugin(DevicePluginOptions::default())
    }
}

impl AgentMode {
    /// What the mode does in each pass.
    pub fn node_mode(&self) -> &dyn NodeMode {
        match self {
            AgentMode::DevicePlugin(o) => o,
            AgentMode::Dra(o) => o.as_ref(),
        }
    }

    /// The mode's own work beside the passes, until `shutdown`: the DRA mode's kubelet plugin;
    /// nothing for the device plugin (NVIDIA's plugin serves the kubelet).
    pub async fn serve<G: Gpus + 'static>(
        self,
        client: Client,
        metrics: Option<Arc<AgentMetrics>>,
        node: String,
        gpus: Arc<G>,
        watches: Watches,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), RunError> {
        match self {
            AgentMode::DevicePlugin(_) => Ok(()),
            AgentMode::Dra(o) => super::dra::run(client, metrics, node, gpus, *o, &watches, shutdown)
                .await
                .map_err(RunError::Dra),
        }
    }
}
