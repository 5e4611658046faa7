//! What the agent's last pass read and wrote, so that a poll reads nothing from the API server.
//!
//! A poll is there for drift on the GPUs (a reboot, someone with nvidia-smi): it needs NVML, the
//! spec and the status last published, not a fresh copy of either. The spec changes only with a
//! new `metadata.generation`, which the watch brings (and that pass reads the GpuNode again); the
//! status is this agent's own (field manager `gpu-tenancy-agent`), so what it last wrote is the
//! newest there is: a read could only be as new, or, from a lagging cache, older. At a poll of 30 s
//! each of 1,000 idle agents read its GpuNode (a quorum read from etcd, about 5 ms of the API
//! server's CPU) and its Node every time: a fifth of a core of the API server for nothing
//! (README, "Fleet benchmark").
//!
//! Forgotten whenever the agent cannot be sure: a new generation or the GpuNode gone (the watch),
//! and any pass that failed, so the next pass reads both again.

use crate::api::{GpuNode, GpuNodeStatus};

/// What the next pass may start from without reading.
#[derive(Clone, Debug, Default)]
pub(super) struct Known {
    /// The GpuNode as the last pass read it (or created it), its status as that pass published it
    /// (or found it already so).
    gpu_node: Option<GpuNode>,
    /// The node's `gputenancy.io/config.state` label as last read or written; `None` to read it.
    config_state: Option<String>,
}

impl Known {
    /// The GpuNode to apply, if known; taken, so a pass that fails before it is put back leaves
    /// nothing known.
    pub fn take_gpu_node(&mut self) -> Option<GpuNode> {
        self.gpu_node.take()
    }

    /// Keeps `node` (as read) with `published`, the status now on the API server.
    pub fn keep_gpu_node(&mut self, mut node: GpuNode, published: GpuNodeStatus) {
        node.status = Some(published);
        self.gpu_node = Some(node);
    }

    /// The next pass reads the GpuNode again (a new spec, or the GpuNode gone).
    pub fn forget_gpu_node(&mut self) {
        self.gpu_node = None;
    }

    pub fn config_state(&self) -> Option<&str> {
        self.config_state.as_deref()
    }

    /// The label as read or written; `None` where that failed, to read it next time.
    pub fn set_config_state(&mut self, state: Option<String>) {
        self.config_state = state;
    }
}
