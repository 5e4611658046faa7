//! The GPU models of the nodes each plan selects (what a plan's layout must fit), kept between
//! passes: on every pass each plan's selector was matched against every node's labels, 4% of a
//! tenant's change at 5,000 nodes, for a list that changes only with a node or a selector.

use crate::api::GpuPartitionPlan;
use crate::inventory::NodeInventory;
use crate::mig::GpuModel;
use crate::policy::models_of_selected_nodes;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Per node selector, the models of the nodes it selected in the last pass, and those nodes'
/// names and revisions.
#[derive(Default)]
pub(super) struct ModelsMemo {
    nodes: Vec<(String, String)>,
    by_selector: Vec<(LabelSelector, Vec<&'static GpuModel>)>,
}

impl ModelsMemo {
    /// Per plan of `plans`, in order, the models of the nodes its selector selects: the last
    /// pass's for a selector it had while every node is the one it read (same name, same
    /// revision, in the same order; a node without a revision, as offline, is read again).
    pub fn of(&mut self, plans: &[&GpuPartitionPlan], nodes: &[NodeInventory]) -> Vec<Vec<&'static GpuModel>> {
        let same_nodes = self.nodes.len() == nodes.len()
            && self
                .nodes
                .iter()
                .zip(nodes)
                .all(|((name, revision), n)| *name == n.name && n.revision.as_ref() == Some(revision));
        if !same_nodes {
            self.by_selector.clear();
            // A node without a revision: none is kept, and the next pass reads every node.
            self.nodes = nodes
                .iter()
                .map(|n| Some((n.name.clone(), n.revision.clone()?)))
                .collect::<Option<_>>()
                .unwrap_or_default();
        }
        let models: Vec<Vec<&'static GpuModel>> = plans
            .iter()
            .map(|p| {
                let selector = &p.spec.node_selector;
                match self.by_selector.iter().find(|(s, _)| s == selector) {
                    Some((_, models)) => models.clone(),
                    None => models_of_selected_nodes(p, nodes),
                }
            })
            .collect();
        self.by_selector = plans
            .iter()
            .zip(&models)
            .map(|(p, m)| (p.spec.node_selector.clone(), m.clone()))
            .collect();
        debug_assert!(
            plans
                .iter()
                .zip(&models)
                .all(|(p, m)| *m == models_of_selected_nodes(p, nodes)),
            "models of selected nodes taken back differ from those read again"
        );
        models
    }
}

#[cfg(test)]
mod tests {
    use super::ModelsMemo;
    use crate::api::Mode;
    use crate::planner::fixtures::{group, node, plan_for};

    /// A node that joins a plan's pool (its labels changed, so its revision did) adds its model;
    /// the same node at the same revision is not read again (debug builds compare with reading
    /// every node: a memo that ignored revisions fails here).
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
    }
}
