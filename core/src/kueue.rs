//! Kueue's objects (`kueue.x-k8s.io/v1beta2`, the version Kueue v0.19 stores), as far as this
//! operator writes them: only the fields it sets, so a live object read back (with Kueue's
//! defaults and status) deserialises into them and the diff compares the fields it owns.
//!
//! Field names and limits follow Kueue's CRDs, of the release this operator is tested with
//! (`e2e/kueue/go.mod`); in the e2e suite the API server validates every object against them,
//! and Kueue's own manager admits workloads with them.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Prefix of every Kueue object name this operator writes.
pub const PREFIX: &str = "gpu-tenancy-";

/// The name of tenant `tenant`'s ClusterQueue (and of its WorkloadPriorityClass).
pub fn queue_name(tenant: &str) -> String {
    format!("{PREFIX}{tenant}")
}

/// The label a workload names its LocalQueue by.
pub const QUEUE_NAME_LABEL: &str = "kueue.x-k8s.io/queue-name";
/// The label a workload names its WorkloadPriorityClass by.
pub const PRIORITY_CLASS_LABEL: &str = "kueue.x-k8s.io/priority-class";

/// A tenant's queue: its quota per flavor and resource, the namespaces it admits from, its cohort
/// and fair-share weight.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kueue.x-k8s.io",
    version = "v1beta2",
    kind = "ClusterQueue",
    plural = "clusterqueues",
    schema = "disabled",
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterQueueSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resource_groups: Vec<ResourceGroup>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cohort_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fair_sharing: Option<FairSharing>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemption: Option<Preemption>,
}

/// Whom a pending workload of the queue may preempt. Kueue's default is nobody; the lending
/// tiers' queues set `reclaimWithinCohort: Any`, so a lender takes back what it lent.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Preemption {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaim_within_cohort: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub within_cluster_queue: Option<String>,
}

/// Resources covered together by a list of flavors; each flavor lists every covered resource,
/// in the same order.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ResourceGroup {
    pub covered_resources: Vec<String>,
    pub flavors: Vec<FlavorQuotas>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FlavorQuotas {
    pub name: String,
    pub resources: Vec<ResourceQuota>,
}

/// One resource's quota in one flavor.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ResourceQuota {
    pub name: String,
    pub nominal_quota: Quantity,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrowing_limit: Option<Quantity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lending_limit: Option<Quantity>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FairSharing {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<Quantity>,
}

/// A queue in one namespace, pointing at its tenant's ClusterQueue.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kueue.x-k8s.io",
    version = "v1beta2",
    kind = "LocalQueue",
    plural = "localqueues",
    namespaced,
    schema = "disabled",
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct LocalQueueSpec {
    pub cluster_queue: String,
}

/// A kind of node: the labels Kueue adds to the node selector of a workload admitted on it.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kueue.x-k8s.io",
    version = "v1beta2",
    kind = "ResourceFlavor",
    plural = "resourceflavors",
    schema = "disabled",
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct ResourceFlavorSpec {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_labels: BTreeMap<String, String>,
}

/// A group of ClusterQueues that lend each other their unused quota. This operator writes no
/// quota of the cohort's own: its members' limits bound the lending.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kueue.x-k8s.io",
    version = "v1beta2",
    kind = "Cohort",
    plural = "cohorts",
    schema = "disabled",
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct CohortSpec {}

/// A workload priority. Not a Kubernetes type with a spec: its fields are at the top level
/// beside the metadata, as Kueue defines it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadPriorityClass {
    #[serde(default = "WorkloadPriorityClass::api_version")]
    pub api_version: String,
    #[serde(default = "WorkloadPriorityClass::kind")]
    pub kind: String,
    pub metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    pub value: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

impl WorkloadPriorityClass {
    fn api_version() -> String {
        "kueue.x-k8s.io/v1beta2".into()
    }

    fn kind() -> String {
        "WorkloadPriorityClass".into()
    }

    pub fn new(name: &str, value: i32, description: String) -> WorkloadPriorityClass {
        WorkloadPriorityClass {
            api_version: Self::api_version(),
            kind: Self::kind(),
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            value,
            description: Some(description),
        }
    }
}

impl kube::Resource for WorkloadPriorityClass {
    type DynamicType = ();
    type Scope = kube::core::ClusterResourceScope;

    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        "WorkloadPriorityClass".into()
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        "kueue.x-k8s.io".into()
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        "v1beta2".into()
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        "workloadpriorityclasses".into()
    }
    fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        &mut self.metadata
    }
}

/// An entry of Kueue's Configuration, `resources.deviceClassMappings`: the DeviceClasses whose
/// devices a ResourceClaim counts as `name` against its ClusterQueue's quota. Kueue reads its
/// Configuration when it starts; a workload whose claims name an unmapped class is not admitted.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct DeviceClassMapping {
    pub name: String,
    pub device_class_names: Vec<String>,
}

/// A Kueue Configuration holding only `resources.deviceClassMappings`, to merge into Kueue's own.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ConfigurationFragment<'a> {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub resources: ResourcesFragment<'a>,
}

#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ResourcesFragment<'a> {
    pub device_class_mappings: &'a [DeviceClassMapping],
}

/// [`ConfigurationFragment`] of `mappings`.
pub fn configuration_fragment(mappings: &[DeviceClassMapping]) -> ConfigurationFragment<'_> {
    ConfigurationFragment {
        api_version: "config.kueue.x-k8s.io/v1beta2",
        kind: "Configuration",
        resources: ResourcesFragment {
            device_class_mappings: mappings,
        },
    }
}
