//! ValidatingAdmissionPolicies that keep each tenant's pods inside its tier (DESIGN.md §4
//! invariant 2), enforced by the API server itself.
//!
//! One policy and binding per tenant, matched to its namespaces by the label
//! `gputenancy.io/tenant=<name>`; every refusal names the tenant and the rule. A pod of tenant T is
//! refused when it:
//! - asks for a device-plugin resource of a mode T's tier does not allow (`nvidia.com/mig-*` for
//!   MIG, `nvidia.com/gpu` for Exclusive, `nvidia.com/gpu.shared` for MPS and TimeSlicing);
//! - asks for more GPUs in its containers than `limits.maxGpusPerPod` (a LimitRange cannot say
//!   this: once it sets a `max` for a resource, LimitRanger refuses every pod that does not set a
//!   limit for it, GPU pod or not, `plugin/pkg/admission/limitranger` `maxConstraint`);
//! - tolerates another tenant's dedicated-node taint, or every taint (a toleration without key);
//! - tolerates the sharing taint of a mode its tier does not allow (MPS and time-sliced nodes
//!   advertise the same `nvidia.com/gpu.shared`, so the taint is what tells them apart);
//! - selects another tenant's dedicated nodes, or names a node (`spec.nodeName` bypasses the
//!   scheduler and so the taints).
//!
//! A tenant with problems is refused every GPU resource (fail closed). A last policy refuses GPU
//! resources and the operator's taints to pods in namespaces that belong to no tenant.

use super::Settings;
use super::quota::owner;
use crate::api::{GpuTenant, Mode, SharingPolicy};
use crate::device_plugin::{MIG_RESOURCE_PREFIX, RESOURCE_GPU, RESOURCE_SHARED};
use crate::labels::{DEDICATED, SCRUB_PENDING, SHARING, TENANT};
use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use kube::ResourceExt;
use serde_json::{Value, json};

/// Prefix of each tenant's policy and binding name (`gputenancy.io-tenant-<name>`).
pub const POLICY_PREFIX: &str = "gputenancy.io-tenant-";
/// The policy for namespaces that belong to no tenant.
pub const UNTENANTED_POLICY: &str = "gputenancy.io-no-tenant";

/// CEL: does the container `c` ask for a resource whose name satisfies `pred` (over `k`)?
fn asks(pred: &str) -> String {
    format!(
        "variables.containers.exists(c, has(c.resources) && ((has(c.resources.limits) && c.resources.limits.exists(k, {pred})) || (has(c.resources.requests) && c.resources.requests.exists(k, {pred}))))"
    )
}

fn is_gpu_resource(k: &str) -> String {
    format!("{k} == '{RESOURCE_GPU}' || {k} == '{RESOURCE_SHARED}' || {k}.startsWith('{MIG_RESOURCE_PREFIX}')")
}

/// CEL: does the pod tolerate taint `key` with `value` (or any value when `None`)?
fn tolerates(key: &str, value: Option<&str>) -> String {
    let value_match = match value {
        Some(v) => format!("(has(t.value) && t.value == '{v}')"),
        None => "true".into(),
    };
    format!(
        "has(object.spec.tolerations) && object.spec.tolerations.exists(t, has(t.key) && t.key == '{key}' && ((has(t.operator) && t.operator == 'Exists') || {value_match}))"
    )
}

fn validation(forbidden_when: String, message: String) -> Value {
    json!({"expression": format!("!({forbidden_when})"), "message": message, "reason": "Forbidden"})
}

const ANY_TOLERATION: &str = "has(object.spec.tolerations) && object.spec.tolerations.exists(t, (!has(t.key) || t.key == '') && has(t.operator) && t.operator == 'Exists')";

fn variables() -> Value {
    json!([
        {"name": "containers", "expression": "object.spec.containers + (has(object.spec.initContainers) ? object.spec.initContainers : [])"},
        // GPUs the pod's containers ask for at once (init containers run one at a time, before).
        {"name": "gpus", "expression": format!(
            "object.spec.containers.map(c, has(c.resources) && has(c.resources.limits) ? c.resources.limits.filter(k, {}).map(k, quantity(string(c.resources.limits[k])).asInteger()) : [0]).map(l, l.sum()).sum()",
            is_gpu_resource("k"))},
    ])
}

fn policy(name: &str, validations: Vec<Value>, labels: &Value, owner: Option<Value>) -> ValidatingAdmissionPolicy {
    let mut metadata = json!({"name": name, "labels": labels});
    if let Some(o) = owner {
        metadata["ownerReferences"] = o;
    }
    serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": metadata,
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["pods"]
            }]},
            "variables": variables(),
            "validations": validations,
        }
    }))
    .expect("a ValidatingAdmissionPolicy built from its own fields deserialises")
}

fn binding(
    name: &str,
    namespace_selector: Value,
    labels: &Value,
    owner: Option<Value>,
) -> ValidatingAdmissionPolicyBinding {
    let mut metadata = json!({"name": name, "labels": labels});
    if let Some(o) = owner {
        metadata["ownerReferences"] = o;
    }
    serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": metadata,
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": namespace_selector},
        }
    }))
    .expect("a ValidatingAdmissionPolicyBinding built from its own fields deserialises")
}

/// The modes a tenant's tier allows; `None` when the tenant or its tier is not valid.
fn allowed_modes(tenant: &GpuTenant, policies: &[SharingPolicy]) -> Option<Vec<Mode>> {
    let valid = tenant
        .status
        .as_ref()
        .is_some_and(|s| crate::api::condition_status(&s.conditions, crate::api::ConditionSet::VALID) == Some(true));
    if !valid {
        return None;
    }
    let policy = policies.iter().find(|p| p.name_any() == tenant.spec.policy_ref)?;
    Some(policy.spec.tier(&tenant.spec.tier)?.modes.clone())
}

fn tenant_validations(tenant: &GpuTenant, modes: Option<&[Mode]>) -> Vec<Value> {
    let name = tenant.name_any();
    let who = format!("GpuTenant {name} (tier {})", tenant.spec.tier);
    let mut out = Vec::new();
    match modes {
        None => out.push(validation(
            asks(&is_gpu_resource("k")),
            format!("{who} is not valid, so its pods get no GPUs; see its Valid condition"),
        )),
        Some(modes) => {
            let allows = modes.iter().map(|m| m.as_str()).collect::<Vec<_>>().join(", ");
            let rules = [
                (
                    Mode::Mig,
                    format!("k.startsWith('{MIG_RESOURCE_PREFIX}')"),
                    "MIG instances (nvidia.com/mig-*)",
                ),
                (
                    Mode::Exclusive,
                    format!("k == '{RESOURCE_GPU}'"),
                    "whole GPUs (nvidia.com/gpu)",
                ),
            ];
            for (mode, pred, what) in rules {
                if !modes.contains(&mode) {
                    out.push(validation(
                        asks(&pred),
                        format!("{who} may not use {what}: its tier allows {allows}"),
                    ));
                }
            }
            if !modes.contains(&Mode::Mps) && !modes.contains(&Mode::TimeSlicing) {
                out.push(validation(
                    asks(&format!("k == '{RESOURCE_SHARED}'")),
                    format!("{who} may not use shared GPUs (nvidia.com/gpu.shared): its tier allows {allows}"),
                ));
            }
            for mode in [Mode::Mps, Mode::TimeSlicing] {
                if !modes.contains(&mode) {
                    out.push(validation(
                        tolerates(SHARING, Some(mode.as_str())),
                        format!(
                            "{who} may not tolerate the taint {SHARING}={mode}: its tier does not allow {mode} (it allows {allows})"
                        ),
                    ));
                }
            }
        }
    }
    if let Some(max) = tenant.spec.limits.as_ref().and_then(|l| l.max_gpus_per_pod) {
        out.push(json!({
            "expression": format!("variables.gpus <= {max}"),
            "messageExpression": format!(
                "'{who} allows at most {max} GPUs per pod (spec.limits.maxGpusPerPod); this pod asks for ' + string(variables.gpus)"
            ),
            "reason": "Forbidden",
        }));
    }
    out.push(validation(
        tolerates(SCRUB_PENDING, None),
        format!("{who} may not tolerate {SCRUB_PENDING}: a node carries it while a GPU changes hands and its memory is not yet scrubbed"),
    ));
    out.push(validation(
        ANY_TOLERATION.into(),
        format!("{who}: a toleration without a key tolerates every taint, including other tenants' dedicated nodes; name the taints to tolerate"),
    ));
    out.push(validation(
        format!(
            "has(object.spec.tolerations) && object.spec.tolerations.exists(t, has(t.key) && t.key == '{DEDICATED}' && ((has(t.operator) && t.operator == 'Exists') || !has(t.value) || t.value != '{name}'))"
        ),
        format!("{who} may tolerate only its own dedicated nodes ({DEDICATED}={name}), not another tenant's"),
    ));
    out.push(validation(
        format!(
            "has(object.spec.nodeSelector) && '{DEDICATED}' in object.spec.nodeSelector && object.spec.nodeSelector['{DEDICATED}'] != '{name}'"
        ),
        format!("{who} may select only its own dedicated nodes ({DEDICATED}={name}), not another tenant's"),
    ));
    out.push(validation(
        "request.operation == 'CREATE' && has(object.spec.nodeName) && object.spec.nodeName != ''".into(),
        format!("{who}: a pod may not name its node (spec.nodeName bypasses the scheduler and the taints that keep dedicated nodes); use a node selector"),
    ));
    out
}

pub fn render(
    policies: &[SharingPolicy],
    tenants: &[GpuTenant],
    settings: &Settings,
) -> (Vec<ValidatingAdmissionPolicy>, Vec<ValidatingAdmissionPolicyBinding>) {
    let labels = serde_json::to_value(super::managed_labels()).expect("labels serialise");
    let mut out_policies = Vec::new();
    let mut out_bindings = Vec::new();
    for t in tenants {
        let name = format!("{POLICY_PREFIX}{}", t.name_any());
        let modes = allowed_modes(t, policies);
        let owner = owner(t).map(|o| serde_json::to_value(o).expect("owner references serialise"));
        out_policies.push(policy(
            &name,
            tenant_validations(t, modes.as_deref()),
            &labels,
            owner.clone(),
        ));
        out_bindings.push(binding(
            &name,
            json!({"matchLabels": {TENANT: t.name_any()}}),
            &labels,
            owner,
        ));
    }
    let gpu = is_gpu_resource("k");
    let untenanted = vec![
        validation(
            asks(&gpu),
            "the namespace belongs to no GpuTenant, so its pods get no GPUs; add it to a tenant's spec.namespaces"
                .into(),
        ),
        validation(
            format!(
                "{} || {} || {ANY_TOLERATION}",
                tolerates(DEDICATED, None),
                tolerates(SHARING, None)
            ),
            format!(
                "the namespace belongs to no GpuTenant, so its pods may not tolerate the taints of GPU nodes ({DEDICATED}, {SHARING}, {SCRUB_PENDING}) or every taint"
            ),
        ),
    ];
    out_policies.push(policy(UNTENANTED_POLICY, untenanted, &labels, None));
    let mut excluded = settings.system_namespaces.clone();
    excluded.push(settings.device_plugin_namespace.clone());
    excluded.sort();
    excluded.dedup();
    out_bindings.push(binding(
        UNTENANTED_POLICY,
        json!({"matchExpressions": [
            {"key": TENANT, "operator": "DoesNotExist"},
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": excluded},
        ]}),
        &labels,
        None,
    ));
    out_policies.sort_by_key(|p| p.name_any());
    out_bindings.sort_by_key(|b| b.name_any());
    (out_policies, out_bindings)
}
