//! Everything the controller writes, computed in one pure function: [`desired`].
//!
//! `gpu-tenancy plan` prints exactly this and the controller applies exactly this, so the offline
//! plan is what the cluster gets. From the planner's results (GpuNode specs, grants, statuses) it
//! renders the Kubernetes objects that enforce them:
//!
//! - per tenant namespace: the label `gputenancy.io/tenant`, and a ResourceQuota on the device
//!   plugin's resource names ([`quota`]);
//! - per tenant: a ValidatingAdmissionPolicy and its binding that refuse a pod asking for a mode
//!   its tier forbids, more GPUs than `limits.maxGpusPerPod`, or tolerating another tenant's
//!   dedicated nodes; one more for namespaces of no tenant ([`admission`]);
//! - per planned node: its device-plugin config label, dedicated and sharing labels and taints,
//!   and the device plugin's ConfigMap with one key per distinct node config ([`nodes`]).
//!
//! What Kubernetes cannot enforce is said, not pretended: NVIDIA's device plugin hands any free
//! device of a resource name on a node to any pod that asks, so a binding of one GPU or MIG
//! instance to one tenant on a shared node is bookkeeping; counts are enforced by quota, whole
//! nodes by taints and admission. Each tenant's `Isolated` condition says which of its grants are
//! which.

mod admission;
mod nodes;
mod quota;

use crate::api::{GpuNode, GpuPartitionPlan, GpuTenant, SharingPolicy};
use crate::planner::{BindingChange, PlanInput, plan};
use crate::problem::Problem;
use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, ResourceQuota};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::Serialize;

pub use admission::{POLICY_PREFIX, UNTENANTED_POLICY};
pub use quota::QUOTA_NAME;

/// Where the objects that are not per tenant go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Namespace of NVIDIA's device plugin, where its config ConfigMap lives.
    pub device_plugin_namespace: String,
    /// Name of the device plugin's config ConfigMap (the plugin's `config.name` Helm value).
    pub device_plugin_config_map: String,
    /// Namespaces whose pods the admission policies never judge (the cluster's own).
    pub system_namespaces: Vec<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            device_plugin_namespace: "nvidia-device-plugin".into(),
            device_plugin_config_map: "gpu-tenancy-device-plugin-configs".into(),
            system_namespaces: vec!["kube-system".into(), "kube-public".into(), "kube-node-lease".into()],
        }
    }
}

/// Everything the controller writes, and the problems found. Lists are sorted by name.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Desired {
    /// GpuNode specs to write now (after the rollout step).
    pub nodes: Vec<GpuNode>,
    /// GpuTenants with their status.
    pub tenants: Vec<GpuTenant>,
    /// GpuPartitionPlans with their status.
    pub plans: Vec<GpuPartitionPlan>,
    /// SharingPolicies with their status.
    pub policies: Vec<SharingPolicy>,
    /// Tenant namespaces with the labels this operator owns.
    pub namespaces: Vec<Namespace>,
    /// One per tenant namespace.
    pub resource_quotas: Vec<ResourceQuota>,
    /// Planned nodes with the labels and taints this operator owns (nothing else).
    pub node_labels: Vec<Node>,
    /// The device plugin's config: one key per distinct node config.
    pub config_maps: Vec<ConfigMap>,
    pub admission_policies: Vec<ValidatingAdmissionPolicy>,
    pub admission_bindings: Vec<ValidatingAdmissionPolicyBinding>,
    /// Per GPU or MIG instance whose tenant changes: old and new tenant, why, scrub and eviction.
    pub changes: Vec<BindingChange>,
    pub problems: Vec<Problem>,
}

/// Computes everything the controller writes. Pure and deterministic; `now` stamps condition
/// transitions (pass a fixed time for reproducible output).
pub fn desired(input: &PlanInput, settings: &Settings, now: &Time) -> Desired {
    let out = plan(input, now);
    let (namespaces, resource_quotas) = quota::render(&out);
    let (admission_policies, admission_bindings) = admission::render(input.policies, &out.tenants, settings);
    let (node_labels, config_maps) = nodes::render(&out.nodes, input.plans, input.nodes, &out.tenants, settings);
    let tenants = nodes::isolation_conditions(out.tenants, &node_labels, now);
    Desired {
        nodes: out.nodes,
        tenants,
        plans: out.plans,
        policies: out.policies,
        namespaces,
        resource_quotas,
        node_labels,
        config_maps,
        admission_policies,
        admission_bindings,
        changes: out.changes,
        problems: out.problems,
    }
}

/// Labels on every object this operator creates, so the controller finds what it owns.
pub(crate) fn managed_labels() -> std::collections::BTreeMap<String, String> {
    std::collections::BTreeMap::from([(
        crate::labels::MANAGED_BY.to_string(),
        crate::labels::MANAGED_BY_VALUE.to_string(),
    )])
}

#[cfg(test)]
mod tests;
