//! The GPU models of the nodes each plan selects (what a plan's layout must fit), kept between
//! passes: on every pass each plan's selector was matched against every node's labels, 4% of a
//! tenant's change at 5,000 nodes, for a list that changes only with a node or a selector. A pass
//! where some nodes changed (an agent's write, the controller's own write of a GpuNode coming
//! back: a change's second pass) reads only those again: each plan's models are counted per
//! node, and a changed node's count taken out and put back (matching every node again was 15% of
//! such a pass).

use crate::api::GpuPartitionPlan;
use crate::inventory::NodeInventory;
use crate::mig::GpuModel;
use crate::policy::models_of_selected_nodes;
use crate::selectors::ParsedSelector;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use std::collections::BTreeMap;

/// The plans' node selectors of the last pass, and per selector how many of the nodes it
/// selected have each model; each node read then, by name and revision.
#[derive(Default)]
pub(super) struct ModelsMemo {
    selectors: Vec<LabelSelector>,
    /// Per selector, per model key: the model and how many selected nodes have it.
    counts: Vec<BTreeMap<&'static str, (&'static GpuModel, u32)>>,
    nodes: Vec<ReadNode>,
}

/// One node as the memo read it: the models of its GPUs (each once) and which selectors
/// selected it.
struct ReadNode {
    name: String,
    revision: String,
    models: Vec<&'static GpuModel>,
    selected: Vec<bool>,
}

impl ReadNode {
    fn of(node: &NodeInventory, revision: &str, selectors: &[ParsedSelector]) -> ReadNode {
        let mut models: Vec<&'static GpuModel> = Vec::new();
        for model in node.gpus.iter().filter_map(|g| g.model) {
            if !models.iter().any(|m| m.key == model.key) {
                models.push(model);
            }
        }
        ReadNode {
            name: node.name.clone(),
            revision: revision.to_string(),
            models,
            selected: selectors.iter().map(|s| s.matches(&node.labels)).collect(),
        }
    }

    /// Adds (`up`) or takes out this node's models from the selectors that select it.
    fn count(&self, counts: &mut [BTreeMap<&'static str, (&'static GpuModel, u32)>], up: bool) {
        for (c, _) in counts.iter_mut().zip(&self.selected).filter(|(_, s)| **s) {
            for m in &self.models {
                if up {
                    c.entry(m.key).or_insert((m, 0)).1 += 1;
                } else if let Some(entry) = c.get_mut(m.key) {
                    entry.1 -= 1;
                    if entry.1 == 0 {
                        c.remove(m.key);
                    }
                }
            }
        }
    }
}

impl ModelsMemo {
    /// Per plan of `plans`, in order, the models of the nodes its selector selects. Counted again
    /// from every node unless the selectors are the last pass's and so are the nodes (the same
    /// names in the same order); then only the nodes whose revision changed are read again. A
    /// node without a revision (offline) keeps nothing: every pass reads every node.
    pub fn of(&mut self, plans: &[&GpuPartitionPlan], nodes: &[NodeInventory]) -> Vec<Vec<&'static GpuModel>> {
        let same_selectors = self.selectors.len() == plans.len()
            && self
                .selectors
                .iter()
                .zip(plans)
                .all(|(s, p)| *s == p.spec.node_selector);
        let same_nodes =
            self.nodes.len() == nodes.len() && self.nodes.iter().zip(nodes).all(|(kept, n)| kept.name == n.name);
        let revisions: Option<Vec<&str>> = nodes.iter().map(|n| n.revision.as_deref()).collect();
        let models: Vec<Vec<&'static GpuModel>> = match revisions {
            None => {
                *self = ModelsMemo::default();
                plans.iter().map(|p| models_of_selected_nodes(p, nodes)).collect()
            }
            Some(revisions) => {
                let parsed: Vec<ParsedSelector> = plans
                    .iter()
                    .map(|p| ParsedSelector::of(&p.spec.node_selector))
                    .collect();
                if same_selectors && same_nodes {
                    self.read_changed(nodes, &revisions, &parsed);
                } else {
                    self.read_all(plans, nodes, &revisions, &parsed);
                }
                self.counts
                    .iter()
                    .map(|c| c.values().map(|(m, _)| *m).collect())
                    .collect()
            }
        };
        debug_assert!(
            plans
                .iter()
                .zip(&models)
                .all(|(p, m)| *m == models_of_selected_nodes(p, nodes)),
            "models of selected nodes taken back differ from those read again"
        );
        models
    }

    fn read_all(
        &mut self,
        plans: &[&GpuPartitionPlan],
        nodes: &[NodeInventory],
        revisions: &[&str],
        parsed: &[ParsedSelector],
    ) {
        self.selectors = plans.iter().map(|p| p.spec.node_selector.clone()).collect();
        self.counts = vec![BTreeMap::new(); plans.len()];
        self.nodes = nodes
            .iter()
            .zip(revisions)
            .map(|(n, r)| ReadNode::of(n, r, parsed))
            .collect();
        for n in &self.nodes {
            n.count(&mut self.counts, true);
        }
    }

    fn read_changed(&mut self, nodes: &[NodeInventory], revisions: &[&str], parsed: &[ParsedSelector]) {
        for ((kept, n), r) in self.nodes.iter_mut().zip(nodes).zip(revisions) {
            if kept.revision != *r {
                kept.count(&mut self.counts, false);
                *kept = ReadNode::of(n, r, parsed);
                kept.count(&mut self.counts, true);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ModelsMemo;
    use crate::api::Mode;
    use crate::planner::fixtures::{group, node, plan_for};

    /// A node that joins a plan's pool (its labels changed, so its revision did) adds its model,
    /// and leaving takes it out; the same node at the same revision is not read again (debug
    /// builds compare with reading every node: a memo that ignored revisions fails here, tried).
    #[test]
    fn a_node_relabelled_into_a_pool_adds_its_model() {
        let plan = plan_for("p", "x", vec![group("all", Mode::Mps)]);
        let mut nodes = vec![
            node("a", "x", "A100-40GB", 1, false),
            node("b", "y", "H100-80GB", 1, false),
        ];
        for n in &mut nodes {
            n.revision = Some("1".into());
        }
        let names = |m: &[Vec<&'static crate::mig::GpuModel>]| -> Vec<Vec<&str>> {
            m.iter().map(|p| p.iter().map(|g| g.name()).collect()).collect()
        };
        let mut memo = ModelsMemo::default();
        assert_eq!(names(&memo.of(&[&plan], &nodes)), [["NVIDIA A100-SXM4-40GB"]]);
        assert_eq!(names(&memo.of(&[&plan], &nodes)), [["NVIDIA A100-SXM4-40GB"]]);
        nodes[1].labels.insert("pool".into(), "x".into());
        nodes[1].revision = Some("2".into());
        assert_eq!(
            names(&memo.of(&[&plan], &nodes)),
            [["NVIDIA A100-SXM4-40GB", "NVIDIA H100 80GB HBM3"]]
        );
        // It leaves again: its model is taken out (the count of a node read again).
        nodes[1].labels.insert("pool".into(), "y".into());
        nodes[1].revision = Some("3".into());
        assert_eq!(names(&memo.of(&[&plan], &nodes)), [["NVIDIA A100-SXM4-40GB"]]);
    }
}
