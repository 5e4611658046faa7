//! Everything the controller writes, computed in one pure function: [`desired`].
//!
//! `gpu-tenancy plan` prints exactly this and the controller applies exactly this, so the offline
//! plan is what the cluster gets. From the planner's results (GpuNode specs, grants, statuses) it
//! renders the Kubernetes objects that enforce them:
//!
//! - per tenant namespace: the label `gputenancy.io/tenant`, and a ResourceQuota on the device
//!   plugin's resource names ([`quota`]);
//! - per tenant: a ValidatingAdmissionPolicy and its binding (by namespace name) that refuse a
//!   pod asking for a GPU resource it was not granted, more GPUs than `limits.maxGpusPerPod`,
//!   reaching GPUs outside the device plugin, tolerating capacity that is not its own or naming a
//!   priority class its tier does not list, and one on its claims; the same for every namespace
//!   no tenant owns, a policy on ConfigMap and Secret keys for all of them, and per tenant whose
//!   device-plugin names DRA serves a MutatingAdmissionPolicy renaming them ([`admission`]);
//! - per tenant and kind of device it holds on DRA nodes, a DeviceClass selecting only its
//!   devices ([`dra`]);
//! - with Kueue on, per tenant a ClusterQueue, a LocalQueue in each of its namespaces and a
//!   WorkloadPriorityClass, per GPU pool a ResourceFlavor, per lending tier a Cohort; the
//!   namespace quotas are then ceilings at the whole grant ([`kueue`]);
//! - per planned node: its device-plugin config label, dedicated and sharing labels and taints,
//!   and the device plugin's ConfigMap with one key per distinct node config ([`nodes`]).
//!
//! What Kubernetes cannot enforce is said, not pretended: NVIDIA's device plugin hands any free
//! device of a resource name on a node to any pod that asks, so a binding of one GPU or MIG
//! instance to one tenant on a shared node is bookkeeping; counts are enforced by quota, whole
//! nodes by taints and admission. Each tenant's `Isolated` condition says which of its grants are
//! which.

mod admission;
pub mod dra;
mod isolation;
pub mod kueue;
mod memory_caps;
mod nodes;
mod quota;
mod settings;
mod tenant_key;

use crate::api::{GpuNode, GpuPartitionPlan, GpuTenant, SharingPolicy};
use crate::planner::{BindingChange, PlanInput, PlanMemo, plan_with};
use crate::problem::Problem;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, ResourceQuota};
use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::Serialize;
use std::sync::Arc;

pub use admission::{
    Bindings, CLAIMS_PREFIX, CONFIG_KEYS_POLICY, Coverage, MUTATION_PREFIX, NODE_FILES_POLICY, NamespaceRules,
    OFF_GPU_NODES, POLICY_PREFIX, TENANTS_CLAIMS_POLICY, TENANTS_POLICY, UNTENANTED_CLAIMS_POLICY, UNTENANTED_POLICY,
    coverage, tenant_bindings, untenanted_bindings,
};
pub use quota::QUOTA_NAME;
pub use settings::Settings;

/// Everything the controller writes, and the problems found. Lists are sorted by name.
#[derive(Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Desired {
    /// GpuNode specs to write now (after the rollout step).
    pub nodes: Vec<GpuNode>,
    /// GpuTenants with their status (shared with the planner's memo, which hands an unchanged
    /// tenant's back on the next pass).
    pub tenants: Vec<Arc<GpuTenant>>,
    /// GpuPartitionPlans with their status.
    pub plans: Vec<GpuPartitionPlan>,
    /// SharingPolicies with their status.
    pub policies: Vec<SharingPolicy>,
    /// Tenant namespaces with the labels this operator owns.
    /// Shared with the quota memo.
    pub namespaces: Vec<Arc<Namespace>>,
    /// One per tenant namespace; shared with the quota memo.
    pub resource_quotas: Vec<Arc<ResourceQuota>>,
    /// Planned nodes with the labels and taints this operator owns (nothing else); shared with
    /// the memo.
    pub node_labels: Vec<Arc<Node>>,
    /// The device plugin's config: one key per distinct node config.
    pub config_maps: Vec<ConfigMap>,
    /// Per tenant and kind of device it holds on DRA nodes, the class its claims use.
    pub device_classes: Vec<DeviceClass>,
    pub admission_policies: Vec<Arc<ValidatingAdmissionPolicy>>,
    pub admission_bindings: Vec<Arc<ValidatingAdmissionPolicyBinding>>,
    /// Per tenant whose device-plugin names DRA serves, the policy renaming them in its pods.
    pub mutating_policies: Vec<MutatingAdmissionPolicy>,
    pub mutating_bindings: Vec<MutatingAdmissionPolicyBinding>,
    /// With Kueue on ([`Settings::kueue`]): one per GPU pool, and one for the other resources.
    pub resource_flavors: Vec<crate::kueue::ResourceFlavor>,
    /// One per tier that lends idle capacity.
    pub cohorts: Vec<crate::kueue::Cohort>,
    /// One per tenant.
    pub cluster_queues: Vec<crate::kueue::ClusterQueue>,
    /// One per tenant namespace.
    pub local_queues: Vec<crate::kueue::LocalQueue>,
    /// One per tenant.
    pub workload_priority_classes: Vec<crate::kueue::WorkloadPriorityClass>,
    /// What Kueue's own Configuration needs to count the tenants' ResourceClaims: one mapping
    /// per DeviceClass. Not an object the controller writes (`plan -o kueue-config` prints it).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kueue_device_class_mappings: Vec<crate::kueue::DeviceClassMapping>,
    /// Which rule set governs each namespace: what the admission bindings say, as data, so the
    /// controller can order a change of rule sets without a namespace under none.
    #[serde(skip)]
    pub namespace_rules: Arc<NamespaceRules>,
    /// Per GPU or MIG instance whose tenant changes: old and new tenant, why, scrub and eviction.
    pub changes: Vec<BindingChange>,
    /// Not written when empty: `plan -o json` prints its own, which name their files.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<Problem>,
}

/// Computes everything the controller writes. Pure and deterministic; `now` stamps condition
/// transitions (pass a fixed time for reproducible output).
pub fn desired(input: &PlanInput, settings: &Settings, now: &Time) -> Desired {
    desired_with(input, settings, now, None)
}

/// What a pass keeps for the next: the planner's memo ([`crate::planner::plan_with`]), and the
/// quotas, node labels, admission bindings and tenants' `Isolated` conditions as rendered.
#[derive(Default)]
pub struct DesiredMemo {
    pub plan: PlanMemo,
    quotas: quota::QuotaMemo,
    node_labels: nodes::NodeLabelsMemo,
    admission: admission::AdmissionMemo,
    namespace_rules: admission::RulesMemo,
    isolation: isolation::IsolationMemo,
}

/// [`desired`], planning with what `memo` kept of the last pass ([`crate::planner::plan_with`])
/// and taking back what is rendered from unchanged inputs: the quotas of tenants whose grants are
/// unchanged, the labels of nodes whose spec, inventory and dedicated tenant are, the admission
/// bindings of tenants whose namespaces are, and the namespace rules while every tenant's name
/// and namespaces are.
pub fn desired_with(input: &PlanInput, settings: &Settings, now: &Time, memo: Option<&mut DesiredMemo>) -> Desired {
    let exempt = settings.exempt();
    let (mut plan_memo, quota_memo, nodes_memo, bindings_memo, rules_memo, isolation_memo) = match memo {
        Some(m) => (
            Some(&mut m.plan),
            Some(&mut m.quotas),
            Some(&mut m.node_labels),
            Some(&mut m.admission),
            Some(&mut m.namespace_rules),
            Some(&mut m.isolation),
        ),
        None => (None, None, None, None, None, None),
    };
    if let Some(m) = plan_memo.as_deref_mut() {
        m.statuses_handed_back();
    }
    let mut out = plan_with(input, &exempt, now, plan_memo.as_deref_mut());
    let namespace_rules = match rules_memo {
        Some(m) => NamespaceRules::of_with(&out.tenants, exempt, m),
        None => Arc::new(NamespaceRules::of(&out.tenants, exempt)),
    };
    let holdings = dra::DraHoldings::of(&out.nodes, &out.tenants);
    let (namespaces, resource_quotas) = quota::render(
        &out,
        input.policies,
        &namespace_rules,
        &holdings,
        settings.kueue,
        quota_memo,
    );
    let mut queues = match settings.kueue {
        true => kueue::render(&out.tenants, &out.nodes, input.plans, input.policies, &namespace_rules),
        false => kueue::KueueObjects::default(),
    };
    out.problems.append(&mut queues.problems);
    kueue::name_queues(&mut out.tenants, settings.kueue);
    let device_classes = dra::device_classes(&holdings);
    let kueue_device_class_mappings = match settings.kueue {
        true => kueue::device_class_mappings(&holdings),
        false => Vec::new(),
    };
    let admission = admission::render(
        input.policies,
        &mut out.tenants,
        &namespace_rules,
        settings,
        &holdings,
        bindings_memo,
    );
    let (node_labels, config_maps, roles) =
        nodes::render(&out.nodes, input.plans, input.nodes, &out.tenants, settings, nodes_memo);
    let tenants = isolation::isolation_conditions(out.tenants, &roles, now, isolation_memo);
    let tenants = memory_caps::memory_cap_conditions(tenants, input.nodes, now);
    if let Some(m) = plan_memo {
        m.keep_statuses(&tenants);
    }
    Desired {
        nodes: out.nodes,
        tenants,
        plans: out.plans,
        policies: out.policies,
        namespaces,
        resource_quotas,
        node_labels,
        config_maps,
        device_classes,
        admission_policies: admission.policies,
        admission_bindings: admission.bindings,
        mutating_policies: admission.mutating_policies,
        mutating_bindings: admission.mutating_bindings,
        resource_flavors: queues.resource_flavors,
        cohorts: queues.cohorts,
        cluster_queues: queues.cluster_queues,
        local_queues: queues.local_queues,
        workload_priority_classes: queues.workload_priority_classes,
        kueue_device_class_mappings,
        namespace_rules,
        changes: out.changes,
        problems: out.problems,
    }
}

#[cfg(test)]
mod tests;
