//! The planner's node inputs read from a cluster's Nodes and GpuNodes, and the controller's memo
//! of them, which reads again only the nodes whose objects changed since its last pass.

use super::NodeInventory;
use crate::api::GpuNode;
use k8s_openapi::api::core::v1::Node;
use std::borrow::Borrow;
use std::collections::BTreeMap;

/// The planner's node inputs from a cluster's objects, as the controller reads them (and `plan`
/// from `kubectl get nodes,gpunodes -o yaml`): every Node that has a GpuNode or is labelled a GPU
/// node (`nvidia.com/gpu.present=true`), with its labels, and its GpuNode (what the agent
/// reports, what the controller last wrote), sorted by name. A Node with no GpuNode status yet
/// is waiting for its agent. A GpuNode whose Node is gone is not planned.
pub fn cluster_inventories<N: Borrow<Node>, G: Borrow<GpuNode>>(nodes: &[N], gpu_nodes: &[G]) -> Vec<NodeInventory> {
    planned(nodes, gpu_nodes)
        .into_iter()
        .map(|(name, node, gpu_node)| read(name, node, gpu_node))
        .collect()
}

/// The inventories of the controller's last pass, each with the revision it was read at
/// ([`NodeInventory::revision`]). A pass reads only the nodes whose Node or GpuNode changed (or
/// appeared) and takes the others back as they were: copying and reading every node's objects
/// again (each GPU, MIG instance and profile of its GpuNode's status), whatever changed, was more
/// than half of a tenant's change on a converged bench cluster's objects (`pass_profile`).
/// Objects not read from an API server have no revision and are always read again, as
/// [`cluster_inventories`] reads them.
#[derive(Debug, Default)]
pub struct ClusterInventories {
    /// Sorted by name.
    last: Vec<NodeInventory>,
    /// Nodes read (again) by the last pass, and by every pass since this memo's first.
    read_last: usize,
    read_since_first: usize,
    passes: u64,
}

impl ClusterInventories {
    /// The inventories of `nodes` and `gpu_nodes`, equal to [`cluster_inventories`] of them.
    pub fn read<N: Borrow<Node>, G: Borrow<GpuNode>>(&mut self, nodes: &[N], gpu_nodes: &[G]) -> &[NodeInventory] {
        let mut last = std::mem::take(&mut self.last).into_iter().peekable();
        let mut read_now = 0;
        self.last = planned(nodes, gpu_nodes)
            .into_iter()
            .map(|(name, node, gpu_node)| {
                // Both lists are sorted by name: the last pass's nodes before this one are gone.
                while last.next_if(|l| l.name.as_str() < name).is_some() {}
                match last.next_if(|l| l.name == name && same_revision(l.revision.as_deref(), node, gpu_node)) {
                    Some(kept) => {
                        // Every test run checks the trust in resourceVersions.
                        debug_assert_eq!(
                            kept,
                            read(name, node, gpu_node),
                            "node {name}: same revision, other objects"
                        );
                        kept
                    }
                    None => {
                        read_now += 1;
                        read(name, node, gpu_node)
                    }
                }
            })
            .collect();
        if self.passes > 0 {
            self.read_since_first += read_now;
        }
        self.passes += 1;
        self.read_last = read_now;
        &self.last
    }

    /// Whether a memo of the nodes' plans started afresh now would be laid out better than the
    /// one kept: when a burst of nodes read again (a fleet growing, a rollout) has ended (the
    /// last pass read at most 1% of the nodes) and, since this memo's first pass, a quarter of
    /// its nodes have been read again. A memo kept through a growing fleet's convergence holds
    /// each node's data where the pass that first read it put it, among that pass's freed
    /// scratch, and walking it is slower than walking a memo built in one pass, for the same
    /// instructions (measure with `pass_profile`, `PASS_PROFILE_GROW=40`).
    pub fn worth_starting_afresh(&self) -> bool {
        let nodes = self.last.len();
        self.read_last * 100 <= nodes && self.read_since_first * 4 >= nodes && self.read_since_first > 0
    }
}

/// The Nodes to plan with their GpuNodes, sorted by name.
fn planned<'a, N: Borrow<Node>, G: Borrow<GpuNode>>(
    nodes: &'a [N],
    gpu_nodes: &'a [G],
) -> Vec<(&'a str, &'a Node, Option<&'a GpuNode>)> {
    // Hashed, not a search tree: every pass looks up every node.
    let by_name: foldhash::HashMap<&str, &GpuNode> = gpu_nodes
        .iter()
        .map(|g| (name_of(&g.borrow().metadata), g.borrow()))
        .collect();
    let mut out: Vec<_> = nodes
        .iter()
        .map(|n| {
            let n = n.borrow();
            let name = name_of(&n.metadata);
            (name, n, by_name.get(name).copied())
        })
        .filter(|(_, n, gpu_node)| {
            gpu_node.is_some()
                || n.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(crate::labels::GPU_PRESENT))
                    .is_some_and(|v| v == "true")
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(b.0));
    out
}

/// An object's name, borrowed, as `ResourceExt::name_any` has it: its `generateName` or `""` for
/// one not read from an API server that has none.
fn name_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> &str {
    meta.name
        .as_deref()
        .or(meta.generate_name.as_deref())
        .unwrap_or_default()
}

fn read(name: &str, node: &Node, gpu_node: Option<&GpuNode>) -> NodeInventory {
    let no_labels = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&no_labels);
    let mut inv = NodeInventory::from_cluster(name, labels, gpu_node);
    inv.revision = revision(node, gpu_node);
    inv
}

/// The revision of a node's inventory read from its Node and GpuNode (none: `-`): both
/// resourceVersions, or `None` where the Node has none (an object not read from an API server).
fn revision(node: &Node, gpu_node: Option<&GpuNode>) -> Option<String> {
    let (of_node, of_gpu_node) = resource_versions(node, gpu_node)?;
    Some(format!("{of_node}/{of_gpu_node}"))
}

fn resource_versions<'a>(node: &'a Node, gpu_node: Option<&'a GpuNode>) -> Option<(&'a str, &'a str)> {
    let of_node = node.metadata.resource_version.as_deref()?;
    let of_gpu_node = match gpu_node {
        Some(g) => g.metadata.resource_version.as_deref()?,
        None => "-",
    };
    Some((of_node, of_gpu_node))
}

/// Whether `kept` is the revision `node` and `gpu_node` have now ([`revision`], not allocated).
fn same_revision(kept: Option<&str>, node: &Node, gpu_node: Option<&GpuNode>) -> bool {
    let (Some(kept), Some((of_node, of_gpu_node))) = (kept, resource_versions(node, gpu_node)) else {
        return false;
    };
    kept.strip_prefix(of_node)
        .and_then(|rest| rest.strip_prefix('/'))
        .is_some_and(|rest| rest == of_gpu_node)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::ResourceExt;

    fn node(name: &str, rv: Option<&str>) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.metadata.resource_version = rv.map(Into::into);
        n.metadata.labels = Some(BTreeMap::from([(
            crate::labels::GPU_PRESENT.to_string(),
            "true".to_string(),
        )]));
        n
    }

    fn gpu_node(name: &str, rv: Option<&str>) -> GpuNode {
        let mut g = GpuNode::new(name, Default::default());
        g.metadata.resource_version = rv.map(Into::into);
        g
    }

    /// A memo is started afresh after a burst of nodes read again, once the burst is over, and
    /// not while it lasts, nor for a node or two read again now and then.
    #[test]
    fn a_memo_is_started_afresh_after_a_burst() {
        let fleet = |rv: usize, n: usize| -> (Vec<Node>, Vec<GpuNode>) {
            let nodes = (0..n)
                .map(|i| node(&format!("n{i:03}"), Some(&rv.to_string())))
                .collect();
            let gpu_nodes = (0..n).map(|i| gpu_node(&format!("n{i:03}"), Some("1"))).collect();
            (nodes, gpu_nodes)
        };
        let mut memo = ClusterInventories::default();
        let (nodes, gpu_nodes) = fleet(1, 100);
        memo.read(&nodes, &gpu_nodes);
        assert!(!memo.worth_starting_afresh(), "built in one pass");
        // A node or two read again at a time: not a quarter of the fleet.
        let mut nodes = nodes;
        for i in 0..10 {
            nodes[i].metadata.resource_version = Some("2".into());
            memo.read(&nodes, &gpu_nodes);
            assert!(!memo.worth_starting_afresh(), "{} nodes read again", i + 1);
        }
        // The fleet doubles: while nodes keep coming, not yet.
        let (grown, grown_gpu_nodes) = fleet(1, 200);
        let mut nodes: Vec<Node> = nodes.into_iter().chain(grown.into_iter().skip(100)).collect();
        memo.read(&nodes, &grown_gpu_nodes);
        assert!(!memo.worth_starting_afresh(), "the burst's pass");
        memo.read(&nodes, &grown_gpu_nodes);
        assert!(memo.worth_starting_afresh(), "the burst is over");
        // Started afresh: its first pass counts as built.
        let mut memo = ClusterInventories::default();
        memo.read(&nodes, &grown_gpu_nodes);
        nodes[0].metadata.resource_version = Some("3".into());
        memo.read(&nodes, &grown_gpu_nodes);
        assert!(!memo.worth_starting_afresh());
    }

    /// A node read from the cluster carries both objects' resourceVersions as its revision (what
    /// the planner's memo trusts); an object not read from an API server carries none.
    #[test]
    fn a_cluster_node_is_revised_by_its_objects_resource_versions() {
        let nodes = [
            node("a", Some("10")),
            node("b", Some("11")),
            node("c", None),
            node("d", Some("13")),
        ];
        let gpu_nodes = [
            gpu_node("a", Some("20")),
            gpu_node("c", Some("21")),
            gpu_node("d", None),
        ];
        let revisions: Vec<Option<String>> = cluster_inventories(&nodes, &gpu_nodes)
            .into_iter()
            .map(|i| i.revision)
            .collect();
        assert_eq!(
            revisions,
            [Some("10/20".to_string()), Some("11/-".to_string()), None, None]
        );
    }

    /// The memo reads as [`cluster_inventories`] reads through changes of every kind, and takes
    /// back (does not read again) exactly the nodes whose objects kept their resourceVersions.
    #[test]
    fn the_memo_reads_again_only_what_changed() {
        let with_gpus = |name: &str, rv: &str| {
            let mut g = gpu_node(name, Some(rv));
            g.status = Some(crate::api::found::two_empty_h100s());
            g
        };
        let mut nodes = vec![
            node("a", Some("1")),
            node("b", Some("2")),
            node("c", Some("3")),
            node("e", None),
        ];
        let mut gpu_nodes = vec![
            with_gpus("a", "11"),
            with_gpus("b", "12"),
            with_gpus("c", "13"),
            with_gpus("e", "15"),
        ];
        let mut memo = ClusterInventories::default();
        let gpus_at = |read: &[NodeInventory]| -> BTreeMap<String, *const crate::inventory::NodeGpu> {
            read.iter().map(|i| (i.name.clone(), i.gpus.as_ptr())).collect()
        };
        let first = gpus_at(memo.read(&nodes, &gpu_nodes));
        assert_eq!(memo.last, cluster_inventories(&nodes, &gpu_nodes));

        // b's GpuNode changes, c's Node is relabelled, d appears, a stays; e has no revision.
        let mut status = crate::api::found::two_empty_h100s();
        status.gpus[1].memory_mib -= 1024;
        gpu_nodes[1].status = Some(status);
        gpu_nodes[1].metadata.resource_version = Some("22".into());
        nodes[2].labels_mut().insert("pool".into(), "other".into());
        nodes[2].metadata.resource_version = Some("23".into());
        nodes.insert(0, node("d", Some("4")));
        gpu_nodes.push(with_gpus("d", "14"));
        let second = gpus_at(memo.read(&nodes, &gpu_nodes));
        assert_eq!(memo.last, cluster_inventories(&nodes, &gpu_nodes));
        assert_eq!(second["a"], first["a"], "a's objects kept their versions: taken back");
        for changed in ["b", "c", "e"] {
            assert_ne!(second[changed], first[changed], "{changed} is read again");
        }

        // a's GpuNode goes (a stays planned by its label), c's Node goes.
        gpu_nodes.retain(|g| g.metadata.name.as_deref() != Some("a"));
        nodes.retain(|n| n.metadata.name.as_deref() != Some("c"));
        memo.read(&nodes, &gpu_nodes);
        assert_eq!(memo.last, cluster_inventories(&nodes, &gpu_nodes));
        let names: Vec<&str> = memo.last.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "d", "e"]);
        assert!(!memo.last[0].reported, "a without its GpuNode waits for its agent");
    }
}
