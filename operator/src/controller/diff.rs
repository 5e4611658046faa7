//! From the desired state and what the cluster holds now, the writes to make, in order, and the
//! events a person should see. Pure: no client, so tests state exactly which requests a pass
//! makes. Nothing is written that is already so: the API server is the shared, scarce resource.
//!
//! Objects the controller owns completely (quotas, admission policies, the device plugin's
//! ConfigMap, GpuNode specs) are server-side applied when the live object does not already contain
//! every desired field, and deleted when no longer desired (found by their `managed-by` label).
//! Objects others own too get surgical writes: statuses only through `/status`; a Node's labels and
//! taints by a merge patch that touches only our keys and is conditional on its resourceVersion
//! (taints are one list that the kubelet and node controllers also write); a Namespace's labels.

use crate::api::{ConditionSet, GpuNode, GpuPartitionPlan, GpuTenant, SharingPolicy, condition_status};
use crate::desired::Desired;
use crate::labels::{DEDICATED, DEVICE_ACCESS, DEVICE_PLUGIN_CONFIG, MANAGED_BY, SCRUB_PENDING, SHARING, TENANT};
pub use hold::Held;
use k8s_openapi::api::core::v1::{Namespace, ResourceQuota};
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::{Resource, ResourceExt};
pub use owned::Seen;
use owned::{Contained, owned, to_value};
use serde::Serialize;
use serde_json::json;
use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;
pub use write::{Kind, Write};

use super::stores::Snapshot;

/// An event for a person: on which object, normal or warning, why, and what happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    pub kind: Kind,
    pub name: String,
    pub warning: bool,
    pub reason: String,
    pub message: String,
}

/// The writes of one pass, in the order they must be made, its events, and the bookkeeping
/// held back while nodes join ([`hold`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Diff {
    pub writes: Vec<Write>,
    pub notes: Vec<Note>,
    pub held: Held,
}

pub use crate::runtime::object::contains;

/// The status write of an object whose computed status differs from its live one.
fn status<T: Resource<DynamicType = ()> + ResourceExt, S: PartialEq + Serialize, D: Borrow<T>, L: Borrow<T>>(
    kind: Kind,
    desired: &[D],
    live: &[L],
    status_of: impl Fn(&T) -> Option<&S>,
    out: &mut Vec<Write>,
) {
    let live: BTreeMap<String, &T> = live.iter().map(|l| (l.borrow().name_any(), l.borrow())).collect();
    for d in desired {
        let d = d.borrow();
        let Some(want) = status_of(d) else { continue };
        let Some(l) = live.get(&d.name_any()) else { continue };
        if status_of(l) != Some(want) {
            out.push(Write::Status {
                kind,
                name: d.name_any(),
                object: json!({
                    "apiVersion": T::api_version(&()),
                    "kind": T::kind(&()),
                    "metadata": {"name": d.name_any()},
                    "status": to_value(want),
                }),
            });
        }
    }
}

/// The labels and taints this operator owns on a Node.
const NODE_LABELS: [&str; 5] = [DEVICE_PLUGIN_CONFIG, DEVICE_ACCESS, SHARING, DEDICATED, MANAGED_BY];
const NODE_TAINTS: [&str; 3] = [SHARING, DEDICATED, SCRUB_PENDING];

fn ours(labels: &BTreeMap<String, String>, keys: &[&str]) -> BTreeMap<String, String> {
    labels
        .iter()
        .filter(|(k, _)| keys.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Node labels and taints: only our keys change; other writers' taints are kept, and the patch
/// fails only if the taints changed since they were read (the next pass reads them again).
fn node_patches(desired: &[Arc<Node>], live: &[Arc<Node>], out: &mut Vec<Write>) {
    let wanted: BTreeMap<String, &Node> = desired.iter().map(|n| (n.name_any(), &**n)).collect();
    for l in live {
        let name = l.name_any();
        let want = wanted.get(&name);
        if want.is_none() && !l.labels().contains_key(MANAGED_BY) {
            continue; // never ours
        }
        let want_labels = want.map(|w| ours(w.labels(), &NODE_LABELS)).unwrap_or_default();
        let want_taints: Vec<Taint> = want.and_then(|w| w.spec.as_ref()?.taints.clone()).unwrap_or_default();
        let live_labels = ours(l.labels(), &NODE_LABELS);
        let read_taints = l.spec.as_ref().and_then(|s| s.taints.clone());
        let (mine, others): (Vec<Taint>, Vec<Taint>) = read_taints
            .clone()
            .unwrap_or_default()
            .into_iter()
            .partition(|t| NODE_TAINTS.contains(&t.key.as_str()));
        if live_labels == want_labels && mine == want_taints {
            continue;
        }
        let mut labels = BTreeMap::new();
        for k in live_labels.keys().filter(|k| !want_labels.contains_key(*k)) {
            labels.insert(k.clone(), None);
        }
        for (k, v) in &want_labels {
            if live_labels.get(k) != Some(v) {
                labels.insert(k.clone(), Some(v.clone()));
            }
        }
        let taints = (mine != want_taints).then(|| (read_taints, others.into_iter().chain(want_taints).collect()));
        out.push(Write::NodePatch(NodePatch {
            name,
            labels,
            had_labels: l.metadata.labels.as_ref().is_some_and(|m| !m.is_empty()),
            taints,
            resource_version: l.resource_version(),
        }));
    }
}

/// Tenant namespaces: created or labelled as desired; a namespace that is no longer a tenant's
/// loses our labels (never the namespace: it holds the tenant's workloads).
fn namespace_writes(d: &Desired, live: &Snapshot, seen: &mut Contained<Arc<Namespace>>, out: &mut Vec<Write>) {
    let mut desired = Vec::new();
    let mut deletes = Vec::new();
    owned::<_, Namespace, _>(
        Kind::Namespace,
        &d.namespaces,
        &live.namespaces,
        seen,
        &mut desired,
        &mut deletes,
    );
    out.extend(desired);
    let wanted: BTreeSet<String> = d.namespaces.iter().map(|n| n.name_any()).collect();
    for ns in &live.namespaces {
        let labels = ns.labels();
        if !wanted.contains(&ns.name_any()) && labels.contains_key(MANAGED_BY) {
            out.push(Write::Patch {
                kind: Kind::Namespace,
                name: ns.name_any(),
                patch: json!({"metadata": {"labels": {MANAGED_BY: null, TENANT: null}}}),
            });
        }
    }
}

/// Events for what changed state: a condition that flipped, a rollout step.
fn notes(d: &Desired, live: &Snapshot) -> Vec<Note> {
    let mut out = Vec::new();
    let flips = |kind: Kind,
                 name: String,
                 was: &[crate::api::Condition],
                 now: &[crate::api::Condition],
                 out: &mut Vec<Note>| {
        for (type_, bad_when, reason) in [
            (ConditionSet::VALID, false, "Invalid"),
            (ConditionSet::CAPACITY_SHORT, true, "CapacityShort"),
            (ConditionSet::STALLED, true, "Stalled"),
        ] {
            let (before, after) = (condition_status(was, type_), condition_status(now, type_));
            if after == Some(bad_when)
                && before != after
                && let Some(c) = now.iter().find(|c| c.type_ == type_)
            {
                out.push(Note {
                    kind,
                    name: name.clone(),
                    warning: true,
                    reason: reason.into(),
                    message: c.message.clone(),
                });
            }
        }
    };
    // Conditions borrowed, never the statuses cloned: a tenant's status holds its grants.
    fn conditions(s: Option<&Vec<crate::api::Condition>>) -> &[crate::api::Condition] {
        s.map_or(&[], |c| &c[..])
    }
    let live_tenants: BTreeMap<String, &[crate::api::Condition]> = live
        .tenants
        .iter()
        .map(|t| (t.name_any(), conditions(t.status.as_ref().map(|s| &s.conditions))))
        .collect();
    for t in &d.tenants {
        let name = t.name_any();
        let was = live_tenants.get(&name).copied().unwrap_or_default();
        let now = conditions(t.status.as_ref().map(|s| &s.conditions));
        flips(Kind::GpuTenant, name, was, now, &mut out);
    }
    let live_plans: BTreeMap<String, &[crate::api::Condition]> = live
        .plans
        .iter()
        .map(|p| (p.name_any(), conditions(p.status.as_ref().map(|s| &s.conditions))))
        .collect();
    for p in &d.plans {
        let name = p.name_any();
        let was = live_plans.get(&name).copied().unwrap_or_default();
        let now = conditions(p.status.as_ref().map(|s| &s.conditions));
        flips(Kind::GpuPartitionPlan, name, was, now, &mut out);
    }
    // A rollout step: nodes of a plan whose spec changes in this pass.
    let live_specs: BTreeMap<String, &GpuNode> = live.gpu_nodes.iter().map(|n| (n.name_any(), &**n)).collect();
    let mut steps: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for n in &d.nodes {
        if let (Some(plan), Some(l)) = (&n.spec.plan, live_specs.get(&n.name_any()))
            && l.spec != n.spec
            && !n.spec.gpus.is_empty()
        {
            steps.entry(plan.clone()).or_default().push(n.name_any());
        }
    }
    for (plan, nodes) in steps {
        out.push(Note {
            kind: Kind::GpuPartitionPlan,
            name: plan,
            warning: false,
            reason: "RolloutStep".into(),
            message: format!(
                "new GPU layout written for {} node(s): {}",
                nodes.len(),
                nodes.join(", ")
            ),
        });
    }
    out
}

/// The evictions agents ask for in their GpuNode status, for the nodes whose spec (as written)
/// says `busyGpuPolicy: Evict`: an agent asking for more gets nothing.
fn evictions(live: &Snapshot) -> Vec<Write> {
    live.gpu_nodes
        .iter()
        .filter(|n| n.spec.busy_gpu_policy == crate::api::BusyGpuPolicy::Evict)
        .flat_map(|n| {
            let node = n.name_any();
            n.status
                .iter()
                .flat_map(|s| s.eviction_requests.iter())
                .map(move |r| Write::Evict {
                    namespace: r.namespace.clone(),
                    name: r.name.clone(),
                    uid: r.uid.clone(),
                    node: node.clone(),
                })
        })
        .collect()
}

/// Every write one pass makes, in order: the device plugin's config, node labels and taints,
/// GpuNode specs, statuses, namespaces, quotas, admission policies then their bindings, the
/// evictions agents asked for; deletes last, bindings before their policies. A node's taints go before its GpuNode spec: a spec that
/// hands a GPU or instance over must not reach the agent, nor the node take new pods, while the
/// node lacks the scrub-pending taint (docs/design.md#scrub-on-change-of-hands); a label names only a config written.
pub fn diff(d: &Desired, live: &Snapshot) -> Diff {
    diff_with(d, live, &mut Seen::default(), Instant::now())
}

/// [`diff`], comparing again only the owned objects that changed since the pass that left `seen`
/// (their live resourceVersion or their desired content), and holding back the bookkeeping that
/// may wait while nodes join ([`hold`]) where `seen` says it was written shortly before `now`;
/// `seen` becomes this pass's findings.
pub fn diff_with(d: &Desired, live: &Snapshot, seen: &mut Seen, now: Instant) -> Diff {
    let mut writes = Vec::new();
    let mut deletes = Vec::new();
    owned(
        Kind::ConfigMap,
        &d.config_maps,
        &live.config_maps,
        &mut seen.config_maps,
        &mut writes,
        &mut deletes,
    );
    node_patches(&d.node_labels, &live.nodes, &mut writes);

    let live_nodes: BTreeMap<String, &GpuNode> = live.gpu_nodes.iter().map(|n| (n.name_any(), &**n)).collect();
    // Whether this pass gives some node its first GPU spec: a fleet joining ([`hold`]).
    let mut joining = false;
    for n in &d.nodes {
        let current = live_nodes.get(&n.name_any());
        // A node that is waiting for its agent and has no GpuNode gets none: nothing to say yet.
        let skip = match current {
            Some(l) => l.spec == n.spec,
            None => n.spec.gpus.is_empty(),
        };
        if !skip {
            joining |= current.is_none_or(|l| l.spec.gpus.is_empty());
            writes.push(Write::Apply {
                kind: Kind::GpuNode,
                namespace: None,
                name: n.name_any(),
                object: json!({
                    "apiVersion": GpuNode::api_version(&()),
                    "kind": GpuNode::kind(&()),
                    "metadata": {"name": n.name_any()},
                    "spec": to_value(&n.spec),
                }),
            });
        }
    }
    status(
        Kind::SharingPolicy,
        &d.policies,
        &live.policies,
        |p: &SharingPolicy| p.status.as_ref(),
        &mut writes,
    );
    status(
        Kind::GpuTenant,
        &d.tenants,
        &live.tenants,
        |t: &GpuTenant| t.status.as_ref(),
        &mut writes,
    );
    status(
        Kind::GpuPartitionPlan,
        &d.plans,
        &live.plans,
        |p: &GpuPartitionPlan| p.status.as_ref(),
        &mut writes,
    );
    namespace_writes(d, live, &mut seen.namespaces, &mut writes);
    owned::<_, ResourceQuota, _>(
        Kind::ResourceQuota,
        &d.resource_quotas,
        &live.quotas,
        &mut seen.quotas,
        &mut writes,
        &mut deletes,
    );
    let mut binding_deletes = Vec::new();
    // The mutating policies before the validating ones: a no-tenant pod is refused without the
    // node affinity the mutating policy adds (a missing one refuses, never lets a pod through).
    owned(
        Kind::MutatingAdmissionPolicy,
        &d.mutating_policies,
        &live.mutating_policies,
        &mut seen.mutating_policies,
        &mut writes,
        &mut deletes,
    );
    owned(
        Kind::MutatingAdmissionPolicyBinding,
        &d.mutating_bindings,
        &live.mutating_bindings,
        &mut seen.mutating_bindings,
        &mut writes,
        &mut binding_deletes,
    );
    admission::writes(d, live, seen, &mut writes, &mut binding_deletes, &mut deletes);
    // DRA: the classes the tenants' claims name (no order needed: a class missing refuses,
    // never hands over).
    owned(
        Kind::DeviceClass,
        &d.device_classes,
        &live.device_classes,
        &mut seen.device_classes,
        &mut writes,
        &mut deletes,
    );
    let held = if joining {
        seen.recent.hold(&mut writes, d, live, now)
    } else {
        seen.recent.wrote(&writes, now)
    };
    writes.extend(evictions(live));
    writes.extend(binding_deletes);
    writes.extend(deletes);
    Diff {
        writes,
        notes: notes(d, live),
        held,
    }
}

mod admission;
pub mod hold;
mod node_patch;
mod owned;
mod write;
pub use node_patch::NodePatch;
#[cfg(test)]
mod tests;
