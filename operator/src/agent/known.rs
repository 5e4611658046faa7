//! What the agent's last pass read and wrote, so that a poll reads nothing from the API server.
//!
//! A pass needs NVML, the spec and the status last published, not a fresh copy of the GpuNode. The
//! spec changes only with a new `metadata.generation`, which the watch brings with the object, so
//! a pass for it takes its spec from there; the status is this agent's own (field manager
//! `gpu-tenancy-agent`), so what it last wrote is the newest there is: a read could only be as new,
//! or, from a lagging cache, older. A poll is there for drift on the GPUs (a reboot, someone with
//! nvidia-smi) and starts from the same. So the GpuNode is read when the agent starts, after a
//! pass that failed, and when it is gone (the watch says so), and at no other time.
//!
//! Why: every idle agent read its GpuNode (a quorum read from etcd) and its Node at every poll,
//! which costs a shared API server for nothing at fleet size
//! (docs/decisions/idle-agents-read-nothing.md).

use crate::api::{GpuNode, GpuNodeStatus};
use std::time::Duration;
use tokio::time::Instant;

/// What the next pass may start from without reading.
#[derive(Clone, Debug, Default)]
pub(super) struct Known {
    /// The GpuNode as the last pass read it (or created it), its status as that pass published it
    /// (or found it already so; none where the pass created it with its GPUs declared).
    gpu_node: Option<GpuNode>,
    /// The node's `gputenancy.io/config.state` label as last read or written; `None` to read it.
    config_state: Option<String>,
    /// When the pass that created the GpuNode with its GPUs declared ended, while no spec has
    /// come since and no status was published ([`Known::awaiting_spec`]).
    declared_at: Option<Instant>,
}

impl Known {
    /// The GpuNode to apply, if known; taken, so a pass that fails before it is put back leaves
    /// nothing known.
    pub fn take_gpu_node(&mut self) -> Option<GpuNode> {
        self.declared_at = None;
        self.gpu_node.take()
    }

    /// Keeps `node` (as read) with `published`, the status now on the API server.
    pub fn keep_gpu_node(&mut self, mut node: GpuNode, published: GpuNodeStatus) {
        node.status = Some(published);
        self.gpu_node = Some(node);
    }

    /// Keeps `node` as created with its GPUs declared: no status published yet.
    pub fn keep_declared(&mut self, mut node: GpuNode) {
        node.status = None;
        self.gpu_node = Some(node);
        self.declared_at = Some(Instant::now());
    }

    /// The GpuNode created with its GPUs declared, where no spec has come since, no status was
    /// published and `patience` has not passed since: its first status waits for the spec.
    pub fn awaiting_spec(&self, patience: Duration) -> Option<&GpuNode> {
        let declared = self.declared_at?;
        (declared.elapsed() < patience).then_some(self.gpu_node.as_ref()?)
    }

    /// A new generation as the watch brings it: its spec, with the status this agent last
    /// published. With none known (at start, after a failed pass), nothing: the pass reads it.
    pub fn new_generation(&mut self, mut seen: GpuNode) {
        self.declared_at = None;
        if let Some(mine) = self.gpu_node.take() {
            seen.status = mine.status;
            self.gpu_node = Some(seen);
        }
    }

    /// The next pass reads the GpuNode again (it is gone: the pass creates it).
    pub fn forget_gpu_node(&mut self) {
        self.gpu_node = None;
        self.declared_at = None;
    }

    pub fn config_state(&self) -> Option<&str> {
        self.config_state.as_deref()
    }

    /// The label as read or written; `None` where that failed, to read it next time.
    pub fn set_config_state(&mut self, state: Option<String>) {
        self.config_state = state;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::GpuNodeSpec;

    fn node(generation: i64) -> GpuNode {
        let mut n = GpuNode::new("n", GpuNodeSpec::default());
        n.metadata.generation = Some(generation);
        n
    }

    #[tokio::test]
    async fn a_declared_node_awaits_its_spec_until_patience_or_a_new_generation() {
        let patience = Duration::from_millis(100);
        let mut known = Known::default();
        assert!(
            known.awaiting_spec(patience).is_none(),
            "nothing declared, nothing awaited"
        );

        known.keep_declared(node(1));
        assert_eq!(
            known.awaiting_spec(patience).and_then(|n| n.metadata.generation),
            Some(1)
        );
        tokio::time::sleep(patience).await;
        assert!(known.awaiting_spec(patience).is_none(), "awaited past its patience");

        // The spec comes: no longer awaited, whatever the time.
        known.keep_declared(node(1));
        known.new_generation(node(2));
        assert!(known.awaiting_spec(patience).is_none(), "awaited after its spec came");
        assert!(known.take_gpu_node().is_some_and(|n| n.metadata.generation == Some(2)));

        // A pass that takes it (a poll past patience publishes) ends the wait too.
        known.keep_declared(node(1));
        let taken = known.take_gpu_node().expect("the declared node");
        known.keep_gpu_node(taken, GpuNodeStatus::default());
        assert!(
            known.awaiting_spec(patience).is_none(),
            "awaited after a status was published"
        );

        known.keep_declared(node(1));
        known.forget_gpu_node();
        assert!(
            known.awaiting_spec(patience).is_none(),
            "awaited after the GpuNode was gone"
        );
    }
}
