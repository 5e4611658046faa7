//! The nodes as the last pass left them, for the next pass to take back where nothing of theirs
//! changed: re-plan only what a change can affect (docs/concepts/planner.md#only-what-a-change-can-affect).
//!
//! A node is taken back when its inventory has the revision it had then (in a cluster, the
//! resourceVersions of its Node and GpuNode: [`crate::inventory::NodeInventory::revision`]) and
//! the plans are those of the last pass ([`crate::planner::PlanMemo`] forgets every node when
//! they are not). Its plan, state and layout are then what the last pass decided, and its GPUs
//! carry that pass's bindings and scrub policies: the allocation memo writes only the bindings
//! of the cells it places again, and the changes step skips a node whose bindings neither moved
//! now nor changed hands then (each marks a node it computes again `recomputed`). The incremental property test
//! (`operator/tests/incremental.rs`) holds the result equal to a pass from nothing.

use super::node::{Decided, NodeDesired, NodeState};
use crate::api::{BusyGpuPolicy, DeviceAccess, GpuPartitionPlanSpec, GpuSpec, SharedVec};
use crate::inventory::NodeInventory;
use crate::selectors::ParsedSelector;
use std::sync::Arc;

/// One node as the last pass left it.
struct KeptNode {
    name: String,
    revision: String,
    plan: Option<String>,
    state: NodeState,
    gpus: SharedVec<GpuSpec>,
    dedicated: Arc<[Vec<String>]>,
    busy_gpu_policy: BusyGpuPolicy,
    device_access: DeviceAccess,
    decided: Decided,
    changing: bool,
    /// The device plugin's config key for its layout.
    plugin_config: Option<String>,
}

/// Every node with a revision as the last pass left it, sorted by name.
#[derive(Default)]
pub struct NodesMemo {
    nodes: Vec<KeptNode>,
    /// How the plans changed since the last pass.
    plans: PlansChange,
}

/// How the plans (sorted by name) changed since the last pass. A node no changed plan selected
/// then or selects now has the same candidate plans, so the same plan, state and layout: only the
/// positions of its tied plans, which [`Decided`] names, may have moved. (Before, any change of
/// any plan forgot every node: a plan's change cost a pass from nothing.)
#[derive(Default)]
pub struct PlansChange {
    /// The node selectors, before and after, of every plan whose spec or validity changed, or
    /// that was added or removed.
    selectors: Vec<ParsedSelector>,
    /// Per plan of the last pass, by position, its position now (`None`: removed); empty when
    /// no plan was added or removed.
    positions: Vec<Option<usize>>,
}

impl PlansChange {
    /// Compares the plans of the last pass with this pass's: `(name, spec, valid)`, each sorted
    /// by name, names unique.
    pub fn between(last: &[(String, GpuPartitionPlanSpec, bool)], now: &[(&str, &GpuPartitionPlanSpec, bool)]) -> Self {
        let mut change = PlansChange::default();
        let mut found = vec![false; now.len()];
        for (name, spec, valid) in last {
            match now.binary_search_by(|(n, _, _)| (*n).cmp(name.as_str())) {
                Ok(i) => {
                    found[i] = true;
                    let (_, new_spec, new_valid) = now[i];
                    if spec != new_spec || *valid != new_valid {
                        change.selectors.push(ParsedSelector::of(&spec.node_selector));
                        change.selectors.push(ParsedSelector::of(&new_spec.node_selector));
                    }
                    change.positions.push(Some(i));
                }
                Err(_) => {
                    change.selectors.push(ParsedSelector::of(&spec.node_selector));
                    change.positions.push(None);
                }
            }
        }
        for (i, (_, spec, _)) in now.iter().enumerate() {
            if !found[i] {
                change.selectors.push(ParsedSelector::of(&spec.node_selector));
            }
        }
        if last.len() == now.len() && found.iter().all(|f| *f) {
            change.positions.clear();
        }
        change
    }

    /// The node's candidate plans may have changed.
    fn reaches(&self, inv: &NodeInventory) -> bool {
        self.selectors.iter().any(|s| s.matches(&inv.labels))
    }

    /// A kept node's tied plans at their positions now; `None` where one is gone (its selector
    /// reaches the node, so this does not happen; if it did, the node is planned again).
    fn moved(&self, tied: &[usize]) -> Option<Vec<usize>> {
        if self.positions.is_empty() {
            return Some(tied.to_vec());
        }
        tied.iter().map(|&i| self.positions.get(i).copied().flatten()).collect()
    }
}

/// Walks the memo beside a pass's nodes, both in name order.
pub struct Reader<'m> {
    nodes: &'m [KeptNode],
    plans: &'m PlansChange,
}

impl NodesMemo {
    pub fn reader(&self) -> Reader<'_> {
        Reader {
            nodes: &self.nodes,
            plans: &self.plans,
        }
    }

    /// Forgets every node: a node's revision says nothing of its layout (the plans' names are
    /// not unique).
    pub fn clear(&mut self) {
        self.nodes.clear();
        self.plans = PlansChange::default();
    }

    /// How the plans changed since the last pass, for this pass's [`Reader`].
    pub fn plans_changed(&mut self, change: PlansChange) {
        self.plans = change;
    }

    /// Keeps this pass's nodes (those with a revision) as they leave it: taken back and left as
    /// they were (moved from the old memo, not copied), or copied.
    pub fn keep(&mut self, nodes: &mut [NodeDesired]) {
        // Made at its size: a node is a few hundred bytes, and thousands were copied at each doubling.
        let mut old = std::mem::replace(&mut self.nodes, Vec::with_capacity(nodes.len()))
            .into_iter()
            .peekable();
        for node in nodes {
            let Some(revision) = &node.inventory.revision else {
                continue;
            };
            while old.next_if(|k| k.name < node.inventory.name).is_some() {}
            let same = node.kept && !node.recomputed;
            match old.next_if(|k| k.name == node.inventory.name) {
                Some(mut k) if same => {
                    // Its tied plans' positions may have moved (a plan added or removed).
                    k.decided.tied.clone_from(&node.decided.tied);
                    self.nodes.push(k);
                }
                was => {
                    // A cell placed again binds every node it reaches anew (a node taken back,
                    // then recomputed), mostly as they were: the list kept where equal, so this
                    // pass's output and the next passes compare it by pointer too. (A node
                    // resolved from its plan again gets its own list.)
                    node.gpus = match was {
                        Some(k) if node.kept && k.gpus == node.gpus => k.gpus,
                        _ => shared_with_current(node),
                    };
                    let config = node.device_plugin_config();
                    node.plugin_config = Some(config.clone());
                    self.nodes.push(KeptNode {
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
                        plugin_config: config,
                    });
                }
            }
        }
    }
}

/// The node's GPU list to keep: the one its GpuNode's spec holds now where they are equal (a
/// node whose spec is written and read back), so that the next passes, taking the node back,
/// find its spec unchanged by a pointer's comparison (`rollout`), not GPU by GPU.
fn shared_with_current(node: &NodeDesired) -> SharedVec<GpuSpec> {
    match &node.inventory.current {
        Some(c) if c.spec.gpus == node.gpus => c.spec.gpus.clone(),
        _ => node.gpus.clone(),
    }
}

impl Reader<'_> {
    /// The node as the last pass left it, when its revision is the one it had then. Nodes come
    /// in name order.
    pub fn kept<'a>(&mut self, inv: &'a NodeInventory) -> Option<NodeDesired<'a>> {
        let skip = self.nodes.iter().take_while(|k| k.name < inv.name).count();
        self.nodes = &self.nodes[skip..];
        let k = self.nodes.first().filter(|k| k.name == inv.name)?;
        if inv.revision.as_ref() != Some(&k.revision) || self.plans.reaches(inv) {
            return None;
        }
        let tied = self.plans.moved(&k.decided.tied)?;
        Some(NodeDesired {
            inventory: inv,
            plan: k.plan.clone(),
            state: k.state.clone(),
            gpus: k.gpus.clone(),
            dedicated: k.dedicated.clone(),
            busy_gpu_policy: k.busy_gpu_policy,
            device_access: k.device_access,
            decided: Decided {
                tied,
                problem: k.decided.problem.clone(),
            },
            kept: true,
            recomputed: false,
            changing: k.changing,
            // Its layout, so its config, is the last pass's.
            plugin_config: Some(k.plugin_config.clone()),
        })
    }
}
