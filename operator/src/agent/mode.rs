//! The seam between the agent's shared pass and its modes (how pods reach the node's GPUs: NVIDIA's
//! device plugin, or this agent as a DRA kubelet plugin). The pass applies the GpuNode's spec to
//! the GPUs and publishes their status the same way in every mode; a mode supplies only what
//! differs, through [`NodeMode`], and its own long-running work beside the pass
//! ([`super::options::AgentMode`] starts it). A new mode is a folder that implements this trait,
//! and a variant of `AgentMode`.

use super::pod_resources::Holdings;
use crate::api::{GpuNodeSpec, GpuNodeStatus};
use crate::gpu::mps::MpsConfig;
use futures::future::BoxFuture;
use kube::Client;

/// What a pass shows a mode: the node, the spec it applied and the status last published.
#[derive(Clone, Copy)]
pub struct PassView<'a> {
    pub client: &'a Client,
    pub node: &'a str,
    pub spec: &'a GpuNodeSpec,
    pub prev: Option<&'a GpuNodeStatus>,
}

/// What differs between modes in a pass.
pub trait NodeMode: Send + Sync {
    /// The MPS daemon the GPU layer supervises for this mode's pods; `None` where another
    /// component runs it (NVIDIA's device plugin runs its own, and a second would fight it).
    fn mps(&self) -> Option<MpsConfig>;

    /// What the mode adds to the status the pass just read from the GPUs, before it is published;
    /// returns which pod holds which device where the mode can tell (the signals' and the
    /// metrics' input), `None` where it cannot.
    fn observe<'a>(&'a self, pass: PassView<'a>, status: &'a mut GpuNodeStatus) -> BoxFuture<'a, Option<Holdings>>;

    /// After the pass: `status` is what the API server now holds (where it changed, just
    /// published).
    fn passed<'a>(&'a self, pass: PassView<'a>, status: &'a GpuNodeStatus) -> BoxFuture<'a, ()>;
}
