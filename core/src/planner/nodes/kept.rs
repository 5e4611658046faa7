//! The nodes as the last pass left them, for the next pass to take back where nothing of theirs
//! changed (ISSUE 18, item 4: re-plan only what a change can affect).
//!
//! A node is taken back when its inventory has the revision it had then (in a cluster, the
//! resourceVersions of its Node and GpuNode: [`crate::inventory::NodeInventory::revision`]) and
//! the plans are those of the last pass ([`crate::planner::PlanMemo`] forgets every node when
//! they are not). Its plan, state and layout are then what the last pass decided, and its GPUs
//! carry that pass's bindings and scrub policies: the allocation memo writes only the bindings
//! of the cells it places again, and the changes step skips a node whose bindings neither moved
//! now nor changed hands then (each marks a node it computes again `recomputed`). The incremental property test
//! (`operator/tests/incremental.rs`) holds the result equal to a pass from nothing.

use super::{Decided, NodeDesired, NodeState};
use crate::api::{BusyGpuPolicy, DeviceAccess, GpuSpec, SharedVec};
use crate::inventory::NodeInventory;

/// One node as the last pass left it.
struct KeptNode {
    name: String,
    revision: String,
    plan: Option<String>,
    state: NodeState,
    gpus: SharedVec<GpuSpec>,
    dedicated: Vec<Vec<String>>,
    busy_gpu_policy: BusyGpuPolicy,
    device_access: DeviceAccess,
    decided: Decided,
    changing: bool,
}

/// Every node with a revision as the last pass left it, sorted by name.
#[derive(Default)]
pub struct NodesMemo {
    nodes: Vec<KeptNode>,
}

/// Walks the memo beside a pass's nodes, both in name order.
pub struct Reader<'m> {
    nodes: &'m [KeptNode],
}

impl NodesMemo {
    pub fn reader(&self) -> Reader<'_> {
        Reader { nodes: &self.nodes }
    }

    /// Forgets every node: the plans changed, so a node's revision says nothing of its layout.
    pub fn clear(&mut self) {
        self.nodes.clear();
    }

    /// Keeps this pass's nodes (those with a revision) as they leave it: taken back and left as
    /// they were (moved from the old memo, not copied), or copied.
    pub fn keep(&mut self, nodes: &[NodeDesired]) {
        let mut old = std::mem::take(&mut self.nodes).into_iter().peekable();
        for node in nodes {
            let Some(revision) = &node.inventory.revision else {
                continue;
            };
            while old.next_if(|k| k.name < node.inventory.name).is_some() {}
            let same = node.kept && !node.recomputed;
            match old.next_if(|k| k.name == node.inventory.name) {
                Some(k) if same => self.nodes.push(k),
                _ => self.nodes.push(KeptNode {
                    name: node.inventory.name.clone(),
                    revision: revision.clone(),
                    plan: node.plan.clone(),
                    state: node.state.clone(),
                    gpus: node.gpus.clone(),
                    dedicated: node.dedicated.clone(),
                    busy_gpu_policy: node.busy_gpu_policy,
                    device_access: node.device_access,
                    decided: node.decided.clone(),
                    changing: node.changing,
                }),
            }
        }
    }
}

impl Reader<'_> {
    /// The node as the last pass left it, when its revision is the one it had then. Nodes come
    /// in name order.
    pub fn kept<'a>(&mut self, inv: &'a NodeInventory) -> Option<NodeDesired<'a>> {
        let skip = self.nodes.iter().take_while(|k| k.name < inv.name).count();
        self.nodes = &self.nodes[skip..];
        let k = self.nodes.first().filter(|k| k.name == inv.name)?;
        (inv.revision.as_ref() == Some(&k.revision)).then(|| NodeDesired {
            inventory: inv,
            plan: k.plan.clone(),
            state: k.state.clone(),
            gpus: k.gpus.clone(),
            dedicated: k.dedicated.clone(),
            busy_gpu_policy: k.busy_gpu_policy,
            device_access: k.device_access,
            decided: k.decided.clone(),
            kept: true,
            recomputed: false,
            changing: k.changing,
        })
    }
}
