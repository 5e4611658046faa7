//! `SharingPolicy`: which isolation each trust tier may use.

use super::common::{DNS_LABEL_PATTERN, DNS_SUBDOMAIN_PATTERN, Mode};
use super::conditions::conditions_schema;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Which isolation each trust tier may use, and the guards that apply to all of them.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "gputenancy.io",
    version = "v1alpha1",
    kind = "SharingPolicy",
    plural = "sharingpolicies",
    shortname = "gsp",
    category = "gputenancy",
    derive = "PartialEq",
    status = "SharingPolicyStatus",
    printcolumn = r#"{"name":"Tiers","type":"string","jsonPath":".status.tiers","description":"Trust tiers this policy defines"}"#,
    printcolumn = r#"{"name":"Headroom","type":"integer","jsonPath":".spec.memoryHeadroomPercent","description":"Percent of shared GPU memory never granted"}"#,
    printcolumn = r#"{"name":"Tenants","type":"integer","jsonPath":".status.tenants","description":"Tenants that reference this policy"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct SharingPolicySpec {
    /// Trust tiers, each with the sharing modes its tenants may receive.
    #[schemars(length(min = 1, max = 32))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.all(t, self.filter(u, u.name == t.name).size() == 1)",
         "message": "tier names must be unique", "reason": "FieldValueInvalid"}
    ]))]
    pub tiers: Vec<Tier>,

    /// Percent of a shared (MPS) GPU's memory never handed out as pinned memory: an overcommit guard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 90))]
    pub memory_headroom_percent: Option<u32>,

    /// Limits on MPS GPUs that serve this policy's tenants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps: Option<MpsPolicy>,

    /// Limits on time-sliced GPUs that serve this policy's tenants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_slicing: Option<TimeSlicingPolicy>,

    /// Keep a tenant's multi-GPU grants on one NUMA domain of one node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<TopologyPolicy>,
}

/// One trust tier.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(self.idleLendingPercent) || !has(self.coLocation) || self.coLocation != 'Forbidden'",
     "message": "a tier that forbids co-location lends no capacity: a borrowed unit may sit on a GPU beside another tenant's",
     "fieldPath": ".idleLendingPercent", "reason": "FieldValueForbidden"}
]))]
pub struct Tier {
    /// Name tenants use in `spec.tier`.
    #[schemars(length(min = 1, max = 63), extend("pattern" = DNS_LABEL_PATTERN))]
    pub name: String,
    /// Sharing modes tenants of this tier may receive.
    #[schemars(length(min = 1, max = 4), extend("x-kubernetes-list-type" = "set"))]
    pub modes: Vec<Mode>,
    /// Whether tenants of this tier may share a non-MIG GPU with other tenants.
    #[serde(default)]
    pub co_location: CoLocation,
    /// When the agent clears GPU memory before a GPU or MIG instance serves this tier's tenant.
    #[serde(default)]
    pub scrub_memory: ScrubMemory,
    /// Whether this tier's tenants get a time-sliced share the node cannot cap in memory:
    /// `BestEffort` (default) hands it out and the node's status says it is not capped;
    /// `Required` does not hand it out. An MPS share is always capped (docs/concepts/isolation.md#memory-limits).
    #[serde(default)]
    pub memory_caps: super::memory_caps::MemoryCapPolicy,
    /// The Pod Security Standard the API server enforces in this tier's namespaces (the
    /// `pod-security.kubernetes.io/enforce` label the controller sets): `Baseline` (default)
    /// or `Restricted`. Both refuse privileged containers and hostPath volumes, the ways to
    /// reach a node's GPUs without the device plugin.
    #[serde(default)]
    pub pod_security: PodSecurity,
    /// PriorityClasses this tier's pods may name (`spec.priorityClassName`); pods naming any
    /// other are refused, so a tenant cannot preempt other tenants' GPU pods with a class above
    /// theirs. Empty (the default): only pods without a class, which get the cluster's default.
    /// The system classes (`system-` names) can never be listed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    #[schemars(extend(
        "x-kubernetes-list-type" = "set",
        "items" = {"type": "string", "maxLength": 253, "pattern": DNS_SUBDOMAIN_PATTERN},
        "x-kubernetes-validations" = [
            {"rule": "self.all(c, !c.startsWith('system-'))",
             "message": "system PriorityClasses (system-node-critical, system-cluster-critical) preempt any pod; a tenant tier may not use them",
             "reason": "FieldValueForbidden"}
        ]
    ))]
    pub priority_class_names: Vec<String>,
    /// With Kueue: the percent of each tenant's grant, per resource, that its ClusterQueue lends
    /// to the other tenants of this tier while idle, and may borrow from them beyond its grant
    /// (the queue's `lendingLimit` and `borrowingLimit`, rounded down). The tier's tenants then
    /// share a Cohort. Absent: they neither lend nor borrow. Not allowed with `coLocation:
    /// Forbidden`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub idle_lending_percent: Option<u32>,
}

/// A Pod Security Standard (kubernetes.io/docs/concepts/security/pod-security-standards).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum PodSecurity {
    /// Refuses known privilege escalations: privileged containers, host namespaces, hostPath
    /// volumes, added capabilities beyond the defaults.
    #[default]
    Baseline,
    /// Baseline, and pods must run as non-root with all capabilities dropped.
    Restricted,
}

impl PodSecurity {
    /// The level as the `pod-security.kubernetes.io/*` labels spell it.
    pub fn label_value(self) -> &'static str {
        match self {
            PodSecurity::Baseline => "baseline",
            PodSecurity::Restricted => "restricted",
        }
    }
}

/// May a tier's tenants share a non-MIG GPU (MPS, time-slicing) with other tenants?
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum CoLocation {
    /// Never: each non-MIG GPU serves this tenant alone.
    Forbidden,
    /// Only with tenants of the same tier.
    #[default]
    SameTier,
}

/// When GPU memory is cleared before a GPU or MIG instance is handed to a tenant.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
pub enum ScrubMemory {
    /// Never clear (the GpuNode status says scrubbing was skipped).
    Never,
    /// Clear when the GPU or instance changes tenant or mode.
    #[default]
    OnTenantChange,
    /// Clear on every (re)configuration, even for the same tenant.
    Always,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MpsPolicy {
    /// Most MPS clients one GPU may serve (Hopper supports 48).
    #[schemars(range(min = 1, max = 48))]
    pub max_clients_per_gpu: u32,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TimeSlicingPolicy {
    /// Most time-slicing replicas one GPU may be advertised as.
    #[schemars(range(min = 2, max = 64))]
    pub max_replicas: u32,
}

/// How strongly a tenant's multi-GPU grants stay on one NUMA domain of one node.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum TopologyPolicy {
    /// A multi-GPU request is granted only on one NUMA domain.
    Required,
    /// Prefer one NUMA domain, spread when none has room.
    #[default]
    Preferred,
    /// Place GPUs anywhere.
    Ignore,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SharingPolicyStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The tier names, comma-separated, for `kubectl get` (a printer column shows only the first
    /// element of a list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tiers: Option<String>,
    /// Number of tenants that reference this policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenants: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
}

impl SharingPolicySpec {
    pub fn tier(&self, name: &str) -> Option<&Tier> {
        self.tiers.iter().find(|t| t.name == name)
    }

    pub fn headroom_percent(&self) -> u32 {
        self.memory_headroom_percent.unwrap_or(0)
    }

    pub fn max_mps_clients(&self) -> u32 {
        self.mps.as_ref().map_or(48, |m| m.max_clients_per_gpu)
    }

    pub fn max_time_slicing_replicas(&self) -> u32 {
        self.time_slicing.as_ref().map_or(64, |t| t.max_replicas)
    }
}
