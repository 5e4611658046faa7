//! `GpuTenant`: a team, its namespaces, what it asks for and its limits.

use super::common::{DNS_LABEL_PATTERN, MIG_PROFILE_PATTERN, Mode, QUANTITY_PATTERN};
use super::conditions::conditions_schema;
use super::shared_vec::SharedVec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A team, its namespaces, the GPU capacity it asks for and its limits.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "gputenancy.io",
    version = "v1alpha1",
    kind = "GpuTenant",
    plural = "gputenants",
    shortname = "gt",
    category = "gputenancy",
    derive = "PartialEq",
    status = "GpuTenantStatus",
    printcolumn = r#"{"name":"Tier","type":"string","jsonPath":".spec.tier","description":"Trust tier"}"#,
    printcolumn = r#"{"name":"Priority","type":"integer","jsonPath":".spec.priority","description":"Higher is served first when capacity is short"}"#,
    printcolumn = r#"{"name":"Granted","type":"string","jsonPath":".status.summary","description":"Units granted of units requested"}"#,
    printcolumn = r#"{"name":"Isolation","type":"string","jsonPath":".status.conditions[?(@.type==\"Isolated\")].reason","description":"How the grants are enforced: DraBound or DedicatedNodes (Isolated=True), CountsOnly (only the counts)"}"#,
    printcolumn = r#"{"name":"Queue","type":"string","jsonPath":".status.queue","priority":1,"description":"With Kueue: the tenant's ClusterQueue (kubectl get clusterqueue shows its workloads)"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct GpuTenantSpec {
    /// Trust tier, one of the referenced SharingPolicy's `spec.tiers[].name`.
    #[schemars(length(min = 1, max = 63), extend("pattern" = DNS_LABEL_PATTERN))]
    pub tier: String,

    /// Name of the SharingPolicy that defines the tier.
    #[serde(default = "default_policy_ref")]
    #[schemars(length(min = 1, max = 253))]
    pub policy_ref: String,

    /// Namespaces whose pods use this tenant's capacity.
    #[serde(default)]
    #[schemars(length(max = 64))]
    #[schemars(extend("x-kubernetes-list-type" = "set", "items" = {"type": "string", "maxLength": 63, "pattern": DNS_LABEL_PATTERN}))]
    pub namespaces: Vec<String>,

    /// Higher is served first when capacity is short.
    #[serde(default)]
    #[schemars(range(min = -1000, max = 1000))]
    pub priority: i32,

    /// Fair-share weight among tenants of equal priority.
    #[serde(default = "default_weight")]
    #[schemars(range(min = 1, max = 1000))]
    pub weight: u32,

    /// Capacity to reserve for this tenant.
    #[serde(default)]
    #[schemars(length(max = 64))]
    pub resources: Vec<ResourceRequest>,

    /// Caps that apply to all of this tenant's grants and pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<TenantLimits>,
}

fn default_policy_ref() -> String {
    "default".to_string()
}

fn default_weight() -> u32 {
    1
}

/// One kind of capacity a tenant asks for.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.mode != 'MIG' || has(self.profile)", "message": "a MIG request needs a profile, e.g. 3g.40gb",
     "fieldPath": ".profile", "reason": "FieldValueRequired"},
    {"rule": "self.mode == 'MIG' || !has(self.profile)", "message": "profile applies only to mode MIG",
     "fieldPath": ".profile", "reason": "FieldValueForbidden"}
]))]
pub struct ResourceRequest {
    /// Sharing mode of this capacity.
    pub mode: Mode,
    /// MIG profile name as the GPU reports it (e.g. `3g.40gb`); only and always with mode MIG.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = MIG_PROFILE_PATTERN))]
    pub profile: Option<String>,
    /// MIG instances, whole GPUs (Exclusive) or client shares (MPS, TimeSlicing).
    #[schemars(range(min = 1, max = 10000))]
    pub count: u32,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenantLimits {
    /// Most GPUs (or GPU shares) one pod may request; becomes a LimitRange in each namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub max_gpus_per_pod: Option<u32>,
    /// Cap on the GPU memory of all grants together, e.g. `160Gi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = QUANTITY_PATTERN))]
    pub memory: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuTenantStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Granted units of requested units, e.g. `5/7`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// What is reserved for this tenant, GPU by GPU.
    #[serde(default, skip_serializing_if = "Grants::is_empty")]
    pub grants: Grants,
    /// Requested and granted units per kind of capacity.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allocation: Vec<AllocationSummary>,
    /// GPU memory of all grants, in MiB.
    #[serde(default, rename = "grantedMemoryMiB", skip_serializing_if = "Option::is_none")]
    pub granted_memory_mib: Option<u64>,
    /// Quota state per namespace (written by the controller).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<NamespaceQuotaState>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
    /// What the tenant's pods and claims may ask for, written by the controller from its grants
    /// and tier. Its admission policies read it as their parameter: absent (a tenant not valid,
    /// or not yet reconciled), its pods get no GPU and may name no PriorityClass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<TenantAdmission>,
    /// With Kueue: the tenant's ClusterQueue, over all its namespaces (`kubectl get clusterqueue
    /// <queue>` shows its pending and admitted workloads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
}

/// The parameter of the tenants' admission policies (`paramKind: GpuTenant`): kept here rather
/// than in the policies' expressions, so every tenant shares two policies (one for pods, one for
/// claims), and a tenant's grants growing with the fleet changes its status, not a policy the API
/// server would compile again.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenantAdmission {
    /// GPU resource names its pods may ask for (sorted): the device plugin's names of its grants,
    /// and its own extended resources for devices on DRA nodes.
    #[serde(default)]
    pub resource_names: Vec<String>,
    /// DeviceClasses its ResourceClaims may name, beside those the controller trusts (sorted).
    #[serde(default)]
    pub device_classes: Vec<String>,
    /// The shared modes it holds shares of: the values of the sharing taint its pods may tolerate.
    #[serde(default)]
    pub shared_modes: Vec<Mode>,
    /// The PriorityClasses its pods may name: those its tier lists.
    #[serde(default)]
    pub priority_class_names: Vec<String>,
}

impl GpuTenant {
    /// Whether its status says it is valid (`Valid=True`): only a valid tenant's grants count,
    /// and a tenant not yet planned is not (fail closed).
    pub fn is_valid(&self) -> bool {
        self.status
            .as_ref()
            .is_some_and(|s| crate::api::condition_status(&s.conditions, crate::api::ConditionSet::VALID) == Some(true))
    }
}

/// Capacity reserved for a tenant on one GPU.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Grant {
    pub node: String,
    /// GPU index on the node.
    pub gpu: u32,
    #[serde(default, rename = "gpuUUID", skip_serializing_if = "Option::is_none")]
    pub gpu_uuid: Option<String>,
    pub mode: Mode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// MIG placement `start:size` in memory slices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<String>,
    #[serde(default, rename = "instanceUUID", skip_serializing_if = "Option::is_none")]
    pub instance_uuid: Option<String>,
    /// Units on this GPU: 1 for a MIG instance or an exclusive GPU, client shares for MPS and TimeSlicing.
    pub count: u32,
}

/// A tenant's grants, a list shared rather than copied: the planner's memo and the statuses of
/// consecutive passes hold the same list where the tenant's grants did not change (a copy of
/// every tenant's grants each pass was a tenth of a 5,000-node re-plan). Serialised, and in the
/// CRD schema, exactly as the list.
pub type Grants = SharedVec<Grant>;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AllocationSummary {
    pub mode: Mode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    pub requested: u32,
    pub granted: u32,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceQuotaState {
    pub namespace: String,
    /// `Enforced`, `Missing` (namespace does not exist) or `Conflict` (claimed by another tenant).
    pub state: String,
}
