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

use crate::api::{ConditionSet, GpuNode, condition_status};
use crate::controller::kinds::owned_kinds;
use crate::desired::Desired;
use crate::labels::{DEDICATED, DEVICE_ACCESS, DEVICE_PLUGIN_CONFIG, MANAGED_BY, SCRUB_PENDING, SHARING, TENANT};
pub use hold::Held;
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding;
use k8s_openapi::api::core::v1::{Namespace, Node, Taint};
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

/// GpuNode specs that differ from the live ones; returns whether one is some node's first GPU
/// spec (a fleet joining, [`hold`]).
fn gpu_node_specs(desired: &[GpuNode], live: &[Arc<GpuNode>], out: &mut Vec<Write>) -> bool {
    let live_nodes: BTreeMap<String, &GpuNode> = live.iter().map(|n| (n.name_any(), &**n)).collect();
    let mut joining = false;
    for n in desired {
        let current = live_nodes.get(&n.name_any());
        // A node that is waiting for its agent and has no GpuNode gets none: nothing to say yet.
        let skip = match current {
            Some(l) => l.spec == n.spec,
            None => n.spec.gpus.is_empty(),
        };
        if skip {
            continue;
        }
        joining |= current.is_none_or(|l| l.spec.gpus.is_empty());
        out.push(Write::Apply {
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
    joining
}

/// Tenant namespaces: created or labelled as desired; a namespace that is no longer a tenant's
/// loses our labels (never the namespace: it holds the tenant's workloads).
fn namespace_writes(
    desired: &[Arc<Namespace>],
    live: &[Arc<Namespace>],
    seen: &mut Contained<Arc<Namespace>>,
    out: &mut Vec<Write>,
) {
    let mut never_deleted = Vec::new();
    owned::<_, Namespace, _>(Kind::Namespace, desired, live, seen, out, &mut never_deleted);
    let wanted: BTreeSet<String> = desired.iter().map(|n| n.name_any()).collect();
    for ns in live {
        if !wanted.contains(&ns.name_any()) && ns.labels().contains_key(MANAGED_BY) {
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

/// Every write one pass makes, in the order of the table of kinds
/// ([`crate::controller::kinds::owned_kinds`], which says why): the device plugin's config, node
/// labels and taints, GpuNode specs, statuses, namespaces, quotas, mutating policies then their
/// bindings, validating policies then their bindings, DeviceClasses; then the evictions agents
/// asked for; then the deletes, bindings before their policies.
pub fn diff(d: &Desired, live: &Snapshot) -> Diff {
    diff_with(d, live, &mut Seen::default(), Instant::now())
}

/// [`diff`], comparing again only the owned objects that changed since the pass that left `seen`
/// (their live resourceVersion or their desired content), and holding back the bookkeeping that
/// may wait while nodes join ([`hold`]) where `seen` says it was written shortly before `now`;
/// `seen` becomes this pass's findings.
pub fn diff_with(d: &Desired, live: &Snapshot, seen: &mut Seen, now: Instant) -> Diff {
    let mut pass = Pass {
        d,
        live,
        writes: Vec::new(),
        binding_deletes: Vec::new(),
        deletes: Vec::new(),
        joining: false,
        validating_bindings: None,
    };
    stages(&mut pass, seen);
    let Pass {
        mut writes,
        binding_deletes,
        deletes,
        joining,
        ..
    } = pass;
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

/// What the stages of one pass share.
struct Pass<'a> {
    d: &'a Desired,
    live: &'a Snapshot,
    /// Applies, patches and statuses, row by row.
    writes: Vec<Write>,
    /// Deletes of bindings, made before the other deletes.
    binding_deletes: Vec<Write>,
    deletes: Vec<Write>,
    /// Whether this pass gives some node its first GPU spec: a fleet joining ([`hold`]).
    joining: bool,
    /// The validating bindings to write, worked out before their policies ([`admission`]).
    validating_bindings: Option<Vec<Arc<ValidatingAdmissionPolicyBinding>>>,
}

/// One row's writes, by the table's word for how the kind is written.
macro_rules! stage {
    (owned, $p:ident, $seen:ident, $kind:ident, $ty:ty, $field:ident, $desired:ident) => {
        owned::<_, $ty, _>(
            Kind::$kind,
            &$p.d.$desired,
            &$p.live.$field,
            &mut $seen.$field,
            &mut $p.writes,
            &mut $p.deletes,
        )
    };
    (owned_bindings, $p:ident, $seen:ident, $kind:ident, $ty:ty, $field:ident, $desired:ident) => {
        owned::<_, $ty, _>(
            Kind::$kind,
            &$p.d.$desired,
            &$p.live.$field,
            &mut $seen.$field,
            &mut $p.writes,
            &mut $p.binding_deletes,
        )
    };
    (node_patches, $p:ident, $seen:ident, $kind:ident, $ty:ty, $field:ident, $desired:ident) => {
        node_patches(&$p.d.$desired, &$p.live.$field, &mut $p.writes)
    };
    (specs, $p:ident, $seen:ident, $kind:ident, $ty:ty, $field:ident, $desired:ident) => {
        $p.joining |= gpu_node_specs(&$p.d.$desired, &$p.live.$field, &mut $p.writes)
    };
    (status, $p:ident, $seen:ident, $kind:ident, $ty:ty, $field:ident, $desired:ident) => {
        status(
            Kind::$kind,
            &$p.d.$desired,
            &$p.live.$field,
            |o: &$ty| o.status.as_ref(),
            &mut $p.writes,
        )
    };
    (namespaces, $p:ident, $seen:ident, $kind:ident, $ty:ty, $field:ident, $desired:ident) => {
        namespace_writes(&$p.d.$desired, &$p.live.$field, &mut $seen.$field, &mut $p.writes)
    };
    (validating_policies, $p:ident, $seen:ident, $kind:ident, $ty:ty, $field:ident, $desired:ident) => {{
        let bindings = admission::bindings($p.d, $p.live);
        admission::policy_writes(
            &$p.d.$desired,
            &$p.live,
            &bindings,
            &mut $seen.$field,
            &mut $p.writes,
            &mut $p.deletes,
        );
        $p.validating_bindings = Some(bindings);
    }};
    (validating_bindings, $p:ident, $seen:ident, $kind:ident, $ty:ty, $field:ident, $desired:ident) => {{
        let bindings = $p
            .validating_bindings
            .take()
            .unwrap_or_else(|| admission::bindings($p.d, $p.live));
        owned::<_, $ty, _>(
            Kind::$kind,
            &bindings,
            &$p.live.$field,
            &mut $seen.$field,
            &mut $p.writes,
            &mut $p.binding_deletes,
        )
    }};
}

macro_rules! stages {
    ($( $kind:ident {
        ty: $ty:ty,
        live: $field:ident $held:ident,
        watch: $scope:ident $which:ident,
        write: $write:ident $desired:ident,
        $(seen: $seen:ty,)?
        plan: $plan:ident,
        optional: $optional:literal,
    } )*) => {
        /// Every row's writes, in the table's order; none of an optional kind the API server
        /// does not serve.
        fn stages(p: &mut Pass<'_>, seen: &mut Seen) {
            $(if !p.live.absent.contains(&Kind::$kind) {
                stage!($write, p, seen, $kind, $ty, $field, $desired);
            })*
        }
    };
}

owned_kinds!(stages);

mod admission;
pub mod hold;
mod node_patch;
mod owned;
mod write;
pub use node_patch::NodePatch;
#[cfg(test)]
pub(crate) mod tests;
