//! Per planned node: the device-plugin config it uses, and the labels and taints that keep tenants
//! where their tier and dedications allow; the device plugin's ConfigMap; and each tenant's
//! `Isolated` condition, which says plainly which grants Kubernetes enforces.

use super::settings::{Settings, managed_labels};
use crate::api::{ConditionSet, DeviceAccess, GpuNode, GpuPartitionPlan, GpuTenant, Mode, set_condition};
use crate::device_plugin::{NodeConfig, Sharing, UNPLANNED, UNPLANNED_CONFIG};
use crate::inventory::NodeInventory;
use crate::inventory::handover_pending;
use crate::labels::{DEDICATED, DEVICE_ACCESS, DEVICE_PLUGIN_CONFIG, SCRUB_PENDING, SHARING};
use k8s_openapi::api::core::v1::{ConfigMap, Node, NodeSpec, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::ResourceExt;
use std::collections::{BTreeMap, BTreeSet};

/// The one tenant every GPU of a node is dedicated to by its plan, if there is one: such a node is
/// tainted for that tenant, so no other tenant's pod runs there.
fn dedicated_to(node: &GpuNode, plans: &[GpuPartitionPlan], inventory: Option<&NodeInventory>) -> Option<String> {
    let plan = plans.iter().find(|p| Some(p.name_any()) == node.spec.plan)?;
    let all_listed = inventory.is_none_or(|inv| inv.gpus.len() == node.spec.gpus.len());
    let mut owners = plan.spec.gpus.iter().map(|g| g.tenants.as_slice());
    let first = owners.next()?;
    match first {
        [only] if all_listed && !node.spec.gpus.is_empty() && owners.all(|o| o == first) => Some(only.clone()),
        _ => None,
    }
}

pub fn render(
    nodes: &[GpuNode],
    plans: &[GpuPartitionPlan],
    inventory: &[NodeInventory],
    tenants: &[GpuTenant],
    settings: &Settings,
) -> (Vec<Node>, Vec<ConfigMap>) {
    let known: BTreeSet<String> = tenants.iter().map(|t| t.name_any()).collect();
    let by_name: BTreeMap<&str, &NodeInventory> = inventory.iter().map(|n| (n.name.as_str(), n)).collect();
    let mut configs: BTreeMap<String, NodeConfig> = BTreeMap::new();
    let mut out = Vec::new();
    for node in nodes {
        // A DRA node: NVIDIA's device plugin has nothing to serve there, and a device not safe to
        // hand over is tainted in the node's ResourceSlice, not the whole node.
        if node.spec.device_access == DeviceAccess::Dra && !node.spec.gpus.is_empty() {
            let mut labels = managed_labels();
            labels.insert(DEVICE_ACCESS.into(), DeviceAccess::Dra.as_str().into());
            out.push(node_object(node.name_any(), labels, vec![]));
            continue;
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
                out.push(node_object(node.name_any(), labels, vec![]));
                continue;
            }
        };
        configs.insert(key, config);
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
        // A hand-over in progress (this spec, or the current one not yet applied): no new pods
        // until the agent has scrubbed (DESIGN.md §4 invariant 3).
        let inv = by_name.get(node.name_any().as_str()).copied();
        let current = inv.and_then(|i| i.current.as_ref());
        let new_handover = match current {
            Some(c) => hands_over(&c.spec, &node.spec),
            None => handover_pending(&node.spec, None),
        };
        if new_handover || current.is_some_and(|c| c.handover_pending) {
            taints.push(taint(SCRUB_PENDING, "true"));
        }
        if let Some(tenant) = dedicated_to(node, plans, inv)
            && known.contains(&tenant)
        {
            labels.insert(DEDICATED.into(), tenant.clone());
            taints.push(taint(DEDICATED, &tenant));
        }
        out.push(node_object(node.name_any(), labels, taints));
    }
    let mut data: BTreeMap<String, String> = configs
        .iter()
        .map(|(k, c)| {
            (
                k.clone(),
                serde_saphyr::to_string(&c.render()).expect("a plugin config serialises"),
            )
        })
        .collect();
    data.insert(UNPLANNED.into(), UNPLANNED_CONFIG.into());
    let config_map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(settings.device_plugin_config_map.clone()),
            namespace: Some(settings.device_plugin_namespace.clone()),
            labels: Some(managed_labels()),
            ..ObjectMeta::default()
        },
        data: Some(data),
        ..ConfigMap::default()
    };
    (out, vec![config_map])
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

/// Sets each tenant's `Isolated` condition: `True` when Kubernetes enforces every grant, each on a
/// DRA node (the scheduler allocates a claim only the tenant's own devices, and the agent's
/// Prepare refuses any other: reason `DraBound`) or on a node dedicated (and tainted) to it
/// (`DedicatedNodes` when all are); otherwise `False` with reason `CountsOnly`, naming the nodes
/// where the quota enforces how many units the tenant uses but the device plugin chooses which
/// GPU or instance a pod gets.
pub fn isolation_conditions(mut tenants: Vec<GpuTenant>, nodes: &[Node], now: &Time) -> Vec<GpuTenant> {
    let dedicated: BTreeMap<String, String> = nodes
        .iter()
        .filter_map(|n| Some((n.name_any(), n.labels().get(DEDICATED)?.clone())))
        .collect();
    let dra: BTreeSet<String> = nodes
        .iter()
        .filter(|n| n.labels().get(DEVICE_ACCESS).map(String::as_str) == Some(DeviceAccess::Dra.as_str()))
        .map(|n| n.name_any())
        .collect();
    for t in &mut tenants {
        let name = t.name_any();
        let generation = t.metadata.generation;
        let Some(status) = t.status.as_mut() else { continue };
        if status.grants.is_empty() {
            status.conditions.retain(|c| c.type_ != ConditionSet::ISOLATED);
            continue;
        }
        let on_own = |node: &str| dedicated.get(node) == Some(&name);
        let shared: BTreeSet<&str> = status
            .grants
            .iter()
            .filter(|g| !on_own(&g.node) && !dra.contains(&g.node))
            .map(|g| g.node.as_str())
            .collect();
        let any_dra = status.grants.iter().any(|g| !on_own(&g.node) && dra.contains(&g.node));
        let (ok, reason, message) = if shared.is_empty() && !any_dra {
            (
                true,
                "DedicatedNodes",
                "every grant is on a node tainted for this tenant alone".to_string(),
            )
        } else if shared.is_empty() {
            (
                true,
                "DraBound",
                "every grant is on a DRA node, where the scheduler allocates this tenant's claims only its own devices and the node's agent prepares no other, scrubbed before it changes hands (or on a node tainted for this tenant alone)".to_string(),
            )
        } else {
            let listed: Vec<&str> = shared.iter().take(5).copied().collect();
            (
                false,
                "CountsOnly",
                format!(
                    "on {} node{} ({}{}) the quota enforces how many units this tenant uses, but NVIDIA's device plugin picks which GPU or MIG instance a pod gets, so the per-GPU binding is bookkeeping; run the pool in DRA mode (its plan's spec.deviceAccess: DRA) or dedicate whole nodes to the tenant (a plan's spec.gpus[].tenants on every GPU of a node) to enforce it",
                    shared.len(),
                    if shared.len() == 1 { "" } else { "s" },
                    listed.join(", "),
                    if shared.len() > 5 { ", ..." } else { "" }
                ),
            )
        };
        set_condition(
            &mut status.conditions,
            ConditionSet::ISOLATED,
            ok,
            reason,
            message,
            generation,
            now,
        );
    }
    tenants
}

#[cfg(test)]
mod tests {
    use super::hands_over;
    use crate::api::{GpuNodeSpec, GpuSpec, Mode};

    fn spec(mode: Mode, tenants: &[&str]) -> GpuNodeSpec {
        GpuNodeSpec {
            gpus: vec![GpuSpec {
                index: 0,
                mode,
                mig_instances: vec![],
                mps: None,
                time_slicing: None,
                tenants: tenants.iter().map(|t| t.to_string()).collect(),
                shares: vec![],
                scrub: Default::default(),
            }]
            .into(),
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
