//! Mutating admission policies. Pods of namespaces of no tenant get a required node affinity
//! that keeps them off GPU nodes ([`untenanted`]).
//!
//! Pods written for the device plugin, served by DRA: per tenant whose units of a device-plugin
//! name (`nvidia.com/mig-1g.10gb`) are all on DRA nodes, a MutatingAdmissionPolicy renames that
//! name in its pods' container resources to the tenant's own extended resource
//! (`team-a.gputenancy.io/mig-1g.10gb`), which the tenant's DeviceClass serves (`desired::dra`).
//!
//! The rename is convenience, not enforcement, so it fails closed without it: a pod that still
//! asks for the device plugin's name is refused by the tenant's validating policy (the name is not
//! in its allow-list while every unit of it is on DRA nodes), and one asking another tenant's
//! name is refused the same way. A name with units on device-plugin nodes too is left alone (the
//! device plugin serves it there; the tenant asks for its DRA units by its own name).

use super::rules::TenantRules;
use crate::desired::settings::managed_labels;
use crate::labels::NAMESPACE_NAME;
use k8s_openapi::api::admissionregistration::v1::{MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};

/// Prefix of each tenant's mutating policy and binding (`gputenancy.io-dra-names-<tenant>`).
pub const MUTATION_PREFIX: &str = "gputenancy.io-dra-names-";
pub use super::cel::OFF_GPU_NODES;

/// CEL map literal of the renames.
fn renames_literal(renames: &BTreeMap<String, String>) -> String {
    let entries: Vec<String> = renames
        .iter()
        .map(|(from, to)| format!("{}: {}", super::cel::quote(from), super::cel::quote(to)))
        .collect();
    format!("{{{}}}", entries.join(", "))
}

/// CEL: the JSON patch operations that rename, in `field` (`containers`, `initContainers`) and
/// `part` (`limits`, `requests`), each name of `variables.renames` to its new name, same value.
fn patches(field: &str, part: &str) -> String {
    let list = if field == "containers" {
        "object.spec.containers".to_string()
    } else {
        format!("(has(object.spec.{field}) ? object.spec.{field} : [])")
    };
    let path = format!("'/spec/{field}/' + string(i) + '/resources/{part}/'");
    format!(
        "{list}.transformList(i, c, has(c.resources) && has(c.resources.{part}) ? c.resources.{part}.filter(k, k in variables.renames).map(k, [JSONPatch{{op: 'remove', path: {path} + jsonpatch.escapeKey(k)}}, JSONPatch{{op: 'add', path: {path} + jsonpatch.escapeKey(variables.renames[k]), value: c.resources.{part}[k]}}]).flatten() : []).flatten()"
    )
}

fn policy(name: &str, renames: &BTreeMap<String, String>) -> MutatingAdmissionPolicy {
    let all: Vec<String> = ["containers", "initContainers"]
        .iter()
        .flat_map(|f| ["limits", "requests"].map(|p| patches(f, p)))
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": name, "labels": managed_labels()},
        "spec": {
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"],
            }]},
            "variables": [{"name": "renames", "expression": renames_literal(renames)}],
            "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": all.join(" + ")}}],
        }
    }))
    .expect("a MutatingAdmissionPolicy built from its own fields deserialises")
}

fn binding(name: &str, operator: &str, namespaces: &BTreeSet<String>) -> MutatingAdmissionPolicyBinding {
    serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": managed_labels()},
        "spec": {
            "policyName": name,
            "matchResources": {"namespaceSelector": {"matchExpressions": [
                {"key": NAMESPACE_NAME, "operator": operator, "values": namespaces},
            ]}},
        }
    }))
    .expect("a MutatingAdmissionPolicyBinding built from its own fields deserialises")
}

/// The policy and binding of tenant `t` over `namespaces`, when it has names to rename.
pub fn tenant(
    t: &TenantRules,
    namespaces: &BTreeSet<String>,
) -> Option<(MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding)> {
    let renames = &t.granted.as_ref()?.renames;
    if renames.is_empty() || namespaces.is_empty() {
        return None;
    }
    let name = format!("{MUTATION_PREFIX}{}", t.name);
    Some((policy(&name, renames), binding(&name, "In", namespaces)))
}

/// CEL: the JSON patch operations that make every term of the pod's required node affinity
/// require each GPU node label to be absent, adding the affinity, its required part or a term's
/// expressions where the pod has none. Terms are alternatives, so every one of them gets both.
fn off_gpu_nodes_patches() -> String {
    let required = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution";
    format!(
        "!has(object.spec.affinity) ? [JSONPatch{{op: 'add', path: '/spec/affinity', value: {{'nodeAffinity': variables.nodeAffinity}}}}] : \
         !has(object.spec.affinity.nodeAffinity) ? [JSONPatch{{op: 'add', path: '/spec/affinity/nodeAffinity', value: variables.nodeAffinity}}] : \
         !has(object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution) ? [JSONPatch{{op: 'add', path: '{required}', value: variables.required}}] : \
         object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms.transformList(i, t, \
           !has(t.matchExpressions) ? [JSONPatch{{op: 'add', path: '{required}/nodeSelectorTerms/' + string(i) + '/matchExpressions', value: variables.offGpu}}] : \
           variables.offGpu.filter(e, !t.matchExpressions.exists(m, m.key == e.key && m.operator == 'DoesNotExist')).map(e, JSONPatch{{op: 'add', path: '{required}/nodeSelectorTerms/' + string(i) + '/matchExpressions/-', value: e}})).flatten()"
    )
}

/// The mutating policy and binding that keep new pods of namespaces of no tenant off GPU nodes,
/// bound to every namespace but `excluded` (the exempt ones and the tenants'). Convenience, not
/// enforcement: the no-tenant validating policy refuses a pod without the affinity this adds.
pub fn untenanted(excluded: &BTreeSet<String>) -> (MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding) {
    let absent: Vec<String> = super::cel::GPU_NODE_LABELS
        .iter()
        .map(|k| format!("{{'key': {}, 'operator': 'DoesNotExist'}}", super::cel::quote(k)))
        .collect();
    let policy: MutatingAdmissionPolicy = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": OFF_GPU_NODES, "labels": managed_labels()},
        "spec": {
            "failurePolicy": "Fail",
            "reinvocationPolicy": "IfNeeded",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"],
            }]},
            "variables": [
                {"name": "offGpu", "expression": format!("[{}]", absent.join(", "))},
                {"name": "required", "expression": "{'nodeSelectorTerms': [{'matchExpressions': variables.offGpu}]}"},
                {"name": "nodeAffinity", "expression": "{'requiredDuringSchedulingIgnoredDuringExecution': variables.required}"},
            ],
            "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": off_gpu_nodes_patches()}}],
        }
    }))
    .expect("a MutatingAdmissionPolicy built from its own fields deserialises");
    (policy, binding(OFF_GPU_NODES, "NotIn", excluded))
}

/// Every JSON patch a policy's expression can produce names a path under a container's resources.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_expression_renames_both_parts_of_both_container_lists() {
        let p = policy(
            "x",
            &BTreeMap::from([(
                "nvidia.com/mig-1g.10gb".to_string(),
                "a.gputenancy.io/mig-1g.10gb".to_string(),
            )]),
        );
        let spec = p.spec.unwrap();
        let mutations = spec.mutations.unwrap();
        let expr = mutations[0].json_patch.as_ref().unwrap().expression.as_deref().unwrap();
        for (f, part) in [
            ("containers", "limits"),
            ("containers", "requests"),
            ("initContainers", "limits"),
            ("initContainers", "requests"),
        ] {
            assert!(
                expr.contains(&format!("'/spec/{f}/' + string(i) + '/resources/{part}/'")),
                "{f} {part}"
            );
        }
        let v: serde_json::Value = serde_json::to_value(&spec.variables.unwrap()[0]).unwrap();
        assert_eq!(
            v["expression"],
            "{'nvidia.com/mig-1g.10gb': 'a.gputenancy.io/mig-1g.10gb'}"
        );
    }
}
