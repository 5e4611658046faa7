//! Per planned node: the device-plugin config it uses, and the labels and taints that keep tenants
//! where their tier and dedications allow; the device plugin's ConfigMap; and each tenant's
//! `Isolated` condition, which says plainly which grants Kubernetes enforces.

use super::settings::{Settings, managed_labels};
use crate::api::{DeviceAccess, GpuNode, GpuNodeSpec, GpuPartitionPlan, GpuTenant, Mode, name_of};
use crate::device_plugin::{NodeConfig, Sharing, UNPLANNED, UNPLANNED_CONFIG};
use crate::inventory::NodeInventory;
use crate::inventory::handover_pending;
use crate::labels::{DEDICATED, DEVICE_ACCESS, DEVICE_PLUGIN_CONFIG, SCRUB_PENDING, SHARING};
use foldhash::{HashMap, HashMapExt, HashSet};
use k8s_openapi::api::core::v1::{ConfigMap, Node, NodeSpec, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The tenant a plan dedicates every GPU to, if one: its nodes are tainted for that tenant.
fn sole_tenant(plan: &GpuPartitionPlan) -> Option<&str> {
    let mut owners = plan.spec.gpus.iter().map(|g| g.tenants.as_slice());
    let first = owners.next()?;
    match first {
        [only] if owners.all(|o| o == first) => Some(only),
        _ => None,
    }
}

/// What one node's labels, taints and plugin config are made of: equal inputs render equal
/// objects.
#[derive(Debug, PartialEq)]
struct NodeInputs {
    /// The spec planned for it.
    spec: GpuNodeSpec,
    /// The revision of its inventory (its Node's and GpuNode's), which says its current spec and
    /// hand-over; an inventory without one is never taken back.
    revision: String,
    /// The known tenant its plan dedicates it to.
    dedicated: Option<String>,
}

/// One node as rendered.
#[derive(Debug)]
struct RenderedNode {
    name: String,
    inputs: NodeInputs,
    node: Arc<Node>,
    /// Its device-plugin config, under its key.
    config: Option<(String, NodeConfig)>,
    /// Served by DRA.
    dra: bool,
    /// Labelled and tainted for its dedicated tenant.
    dedicated: bool,
}

/// Each node's labels and taints as the last pass rendered them, sorted by name, for the next
/// pass to take back where the inputs are equal, rather than render every node on every pass.
/// `operator/tests/incremental.rs` holds the desired state with the memo equal to
/// one rendered from nothing after random changes.
#[derive(Debug, Default)]
pub struct NodeLabelsMemo {
    last: Vec<RenderedNode>,
}

/// What the rendered nodes say about each tenant's isolation: the nodes dedicated to a tenant
/// and the DRA nodes, by name.
#[derive(Debug, Default)]
pub struct NodeRoles<'a> {
    pub(super) dedicated: HashMap<&'a str, &'a str>,
    pub(super) dra: HashSet<&'a str>,
}

/// Per planned node, its labels and taints (shared with the memo), and the device plugin's
/// ConfigMap; with a memo, the nodes whose inputs are the last pass's are taken back.
pub fn render<'a>(
    nodes: &'a [GpuNode],
    plans: &'a [GpuPartitionPlan],
    inventory: &[NodeInventory],
    tenants: &[Arc<GpuTenant>],
    settings: &Settings,
    memo: Option<&mut NodeLabelsMemo>,
) -> (Vec<Arc<Node>>, Vec<ConfigMap>, NodeRoles<'a>) {
    let known: HashSet<&str> = tenants.iter().map(|t| name_of(t.as_ref())).collect();
    let by_name: HashMap<&str, &NodeInventory> = inventory.iter().map(|n| (n.name.as_str(), n)).collect();
    let mut dedicating: HashMap<&str, Option<&str>> = HashMap::new();
    for p in plans {
        // The first of two plans of one name, as a lookup by name finds it.
        dedicating.entry(name_of(p)).or_insert_with(|| sole_tenant(p));
    }
    let mut memo = memo;
    let mut last = memo
        .as_deref_mut()
        .map(|m| std::mem::take(&mut m.last).into_iter().peekable());
    let mut rendered = Vec::with_capacity(nodes.len());
    let mut roles = NodeRoles::default();
    for node in nodes {
        let name = name_of(node);
        let inv = by_name.get(name).copied();
        let dedicated = dedicated_tenant(node, inv, &dedicating, &known);
        let was = last.as_mut().and_then(|last| {
            // Both lists are sorted by name: the last pass's nodes before this one are gone.
            while last.next_if(|l| l.name.as_str() < name).is_some() {}
            last.next_if(|l| l.name == name)
        });
        let entry = taken_back_or_rendered(node, inv, dedicated, was);
        if entry.dra {
            roles.dra.insert(name);
        }
        if let Some(t) = dedicated.filter(|_| entry.dedicated) {
            roles.dedicated.insert(name, t);
        }
        rendered.push(entry);
    }
    let mut configs: BTreeMap<&str, NodeConfig> = BTreeMap::new();
    for r in &rendered {
        if let Some((key, config)) = &r.config {
            configs.insert(key.as_str(), *config);
        }
    }
    let config_map = config_map(&configs, settings);
    let out = rendered.iter().map(|r| r.node.clone()).collect();
    if let Some(m) = memo {
        m.last = rendered;
    }
    (out, vec![config_map], roles)
}

/// The tenant the node's plan dedicates it to, where that tenant is `known` (exists) and every
/// GPU of the node is listed.
fn dedicated_tenant<'p>(
    node: &GpuNode,
    inv: Option<&NodeInventory>,
    dedicating: &HashMap<&str, Option<&'p str>>,
    known: &HashSet<&str>,
) -> Option<&'p str> {
    node.spec
        .plan
        .as_deref()
        .and_then(|p| dedicating.get(p).copied().flatten())
        .filter(|t| {
            known.contains(t)
                && !node.spec.gpus.is_empty()
                && inv.is_none_or(|inv| inv.gpus.len() == node.spec.gpus.len())
        })
}

/// The node as the last pass rendered it (`was`) where its inputs are the same, else rendered now.
fn taken_back_or_rendered(
    node: &GpuNode,
    inv: Option<&NodeInventory>,
    dedicated: Option<&str>,
    was: Option<RenderedNode>,
) -> RenderedNode {
    let revision = inv.and_then(|i| i.revision.as_deref());
    let same = |w: &RenderedNode| {
        revision.is_some_and(|r| r == w.inputs.revision)
            && w.inputs.dedicated.as_deref() == dedicated
            && w.inputs.spec == node.spec
    };
    match was {
        Some(mut w) if same(&w) => {
            // The revision stands for the inventory: checked in every test run.
            debug_assert_eq!(
                render_node(node, inv, dedicated, revision).node,
                w.node,
                "node {} taken back from the last pass as it renders now",
                w.name
            );
            // Equal, maybe not the same list: keep this pass's, so the next pass compares
            // by pointer (the planner shares a node's list between passes).
            w.inputs.spec.gpus = node.spec.gpus.clone();
            w
        }
        _ => render_node(node, inv, dedicated, revision),
    }
}

/// One node's labels, taints and plugin config.
fn render_node(
    node: &GpuNode,
    inv: Option<&NodeInventory>,
    dedicated: Option<&str>,
    revision: Option<&str>,
) -> RenderedNode {
    let mut out = RenderedNode {
        name: node.name_any(),
        inputs: NodeInputs {
            spec: node.spec.clone(),
            revision: revision.unwrap_or_default().to_string(),
            dedicated: dedicated.map(str::to_string),
        },
        node: Arc::default(),
        config: None,
        dra: false,
        dedicated: false,
    };
    // A DRA node: NVIDIA's device plugin has nothing to serve there, and a device not safe to
    // hand over is tainted in the node's ResourceSlice, not the whole node.
    if node.spec.device_access == DeviceAccess::Dra && !node.spec.gpus.is_empty() {
        let mut labels = managed_labels();
        labels.insert(DEVICE_ACCESS.into(), DeviceAccess::Dra.as_str().into());
        out.node = Arc::new(node_object(out.name.clone(), labels, vec![]));
        out.dra = true;
        return out;
    }
    // One source for the label and the GpuNode: the planner's key (UNPLANNED for a node with
    // no GPUs planned, which gets no taints of ours either).
    let key = node
        .spec
        .device_plugin_config
        .clone()
        .unwrap_or_else(|| UNPLANNED.to_string());
    let mut labels = managed_labels();
    labels.insert(DEVICE_PLUGIN_CONFIG.into(), key.clone());
    labels.insert(DEVICE_ACCESS.into(), DeviceAccess::DevicePlugin.as_str().into());
    let config = match NodeConfig::of_gpus(&node.spec.gpus) {
        Ok(c) if !node.spec.gpus.is_empty() && key != UNPLANNED => c,
        _ => {
            out.node = Arc::new(node_object(out.name.clone(), labels, vec![]));
            return out;
        }
    };
    let mut taints = Vec::new();
    if let Some(Sharing::Mps { .. } | Sharing::TimeSlicing { .. }) = config.sharing {
        let mode = node
            .spec
            .gpus
            .iter()
            .map(|g| g.mode)
            .find(|m| m.is_shared())
            .unwrap_or(Mode::TimeSlicing);
        labels.insert(SHARING.into(), mode.to_string());
        taints.push(taint(SHARING, mode.as_str()));
    }
    out.config = Some((key, config));
    // A hand-over in progress (this spec, or the current one not yet applied): no new pods
    // until the agent has scrubbed (docs/design.md#scrub-on-change-of-hands).
    let current = inv.and_then(|i| i.current.as_ref());
    let new_handover = match current {
        Some(c) => hands_over(&c.spec, &node.spec),
        None => handover_pending(&node.spec, None),
    };
    if new_handover || current.is_some_and(|c| c.handover_pending) {
        taints.push(taint(SCRUB_PENDING, "true"));
    }
    if let Some(tenant) = dedicated {
        labels.insert(DEDICATED.into(), tenant.to_string());
        taints.push(taint(DEDICATED, tenant));
        out.dedicated = true;
    }
    out.node = Arc::new(node_object(out.name.clone(), labels, taints));
    out
}

/// The device plugin's ConfigMap: one key per distinct node config, and the unplanned one.
fn config_map(configs: &BTreeMap<&str, NodeConfig>, settings: &Settings) -> ConfigMap {
    let mut data: BTreeMap<String, String> = configs
        .iter()
        .map(|(k, c)| {
            (
                k.to_string(),
                serde_saphyr::to_string(&c.render()).expect("a plugin config serialises"),
            )
        })
        .collect();
    data.insert(UNPLANNED.into(), UNPLANNED_CONFIG.into());
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(settings.device_plugin_config_map.clone()),
            namespace: Some(settings.device_plugin_namespace.clone()),
            labels: Some(managed_labels()),
            ..ObjectMeta::default()
        },
        data: Some(data),
        ..ConfigMap::default()
    }
}

/// Does `new` hand some GPU or instance of `old` to a tenant that did not have it? (Freeing a unit
/// hands it to nobody: the scrub comes when someone gets it. Joining a shared GPU the others keep
/// hands nothing over: [`crate::handover`].)
fn hands_over(old: &crate::api::GpuNodeSpec, new: &crate::api::GpuNodeSpec) -> bool {
    new.gpus.iter().any(|n| {
        let o = old.gpus.iter().find(|o| o.index == n.index);
        let gpu = n.tenants.iter().any(|t| o.is_none_or(|o| !o.tenants.contains(t)))
            && o.is_none_or(|o| crate::handover::gpu_changes_hands(Some(o.mode), &o.tenants, n.mode, &n.tenants));
        let instances = n.mig_instances.iter().filter(|i| i.tenant.is_some()).any(|i| {
            !o.is_some_and(|o| {
                o.mig_instances
                    .iter()
                    .any(|x| x.placement == i.placement && x.profile == i.profile && x.tenant == i.tenant)
            })
        });
        gpu || instances
    })
}

fn node_object(name: String, labels: BTreeMap<String, String>, taints: Vec<Taint>) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            taints: Some(taints),
            ..NodeSpec::default()
        }),
        ..Node::default()
    }
}

fn taint(key: &str, value: &str) -> Taint {
    Taint {
        key: key.into(),
        value: Some(value.into()),
        effect: "NoSchedule".into(),
        ..Taint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::hands_over;
    use crate::api::{GpuNodeSpec, GpuSpec, Mode};

    fn spec(mode: Mode, tenants: &[&str]) -> GpuNodeSpec {
        GpuNodeSpec {
            gpus: vec![GpuSpec::new(0, mode).with_tenants(tenants)].into(),
            ..GpuNodeSpec::default()
        }
    }

    /// The `scrub-pending` taint follows the change of hands: a tenant joining a shared GPU whose
    /// tenants stay takes nothing over, so its node is not tainted; a new tenant where the old one
    /// goes, on a GPU nobody used, on an exclusive GPU or in another mode is.
    #[test]
    fn a_join_on_a_shared_gpu_hands_nothing_over() {
        for mode in [Mode::Mps, Mode::TimeSlicing] {
            assert!(!hands_over(&spec(mode, &["a"]), &spec(mode, &["a", "b"])), "{mode}");
            assert!(
                !hands_over(&spec(mode, &["a", "b"]), &spec(mode, &["a"])),
                "{mode}: freeing"
            );
            assert!(hands_over(&spec(mode, &["a"]), &spec(mode, &["b"])), "{mode}");
            assert!(hands_over(&spec(mode, &[]), &spec(mode, &["a"])), "{mode}");
        }
        assert!(hands_over(
            &spec(Mode::Exclusive, &["a"]),
            &spec(Mode::Exclusive, &["a", "b"])
        ));
        assert!(hands_over(
            &spec(Mode::Mps, &["a"]),
            &spec(Mode::TimeSlicing, &["a", "b"])
        ));
    }
}
