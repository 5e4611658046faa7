//! `GpuPartitionPlan`: how the GPUs of selected nodes are cut.

use super::common::{MIG_PROFILE_PATTERN, Mode, QUANTITY_PATTERN};
use super::conditions::conditions_schema;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How the GPUs of the selected nodes are cut: MIG layouts, MPS, time-slicing or whole GPUs.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "gputenancy.io",
    version = "v1alpha1",
    kind = "GpuPartitionPlan",
    plural = "gpupartitionplans",
    shortname = "gpp",
    category = "gputenancy",
    derive = "PartialEq",
    status = "GpuPartitionPlanStatus",
    printcolumn = r#"{"name":"Priority","type":"integer","jsonPath":".spec.priority","description":"The higher plan wins a node two plans select"}"#,
    printcolumn = r#"{"name":"Selected","type":"integer","jsonPath":".status.nodes.selected","description":"Nodes this plan governs"}"#,
    printcolumn = r#"{"name":"Updated","type":"integer","jsonPath":".status.nodes.updated","description":"Nodes whose GpuNode spec is the plan's layout"}"#,
    printcolumn = r#"{"name":"Applied","type":"integer","jsonPath":".status.nodes.applied","description":"Updated nodes whose agent reported the spec applied"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct GpuPartitionPlanSpec {
    /// Nodes this plan applies to (e.g. by `nvidia.com/gpu.product`).
    #[serde(default)]
    pub node_selector: LabelSelector,
    /// When two plans select a node the higher priority wins; a tie is a conflict and neither applies.
    #[serde(default)]
    #[schemars(range(min = -1000, max = 1000))]
    pub priority: i32,
    /// GPU groups by device index, each with its sharing mode.
    #[schemars(length(min = 1, max = 16))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "!self.exists(g, g.devices == 'all') || self.size() == 1",
         "message": "devices 'all' must be the only GPU group of a plan", "reason": "FieldValueInvalid"}
    ]))]
    pub gpus: Vec<GpuGroup>,
    /// How fast the change rolls across nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<Rollout>,
    /// How pods reach these nodes' GPUs: `DevicePlugin` (NVIDIA's device plugin, configured by this
    /// operator; the binding of a device to a tenant is bookkeeping on shared nodes) or `DRA`
    /// (this operator's DRA driver: every device bound to its tenant, checked at Prepare). Moving a
    /// pool from one to the other is a rollout like any plan change.
    #[serde(default)]
    pub device_access: DeviceAccess,
}

/// How pods reach a node's GPUs.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
pub enum DeviceAccess {
    /// NVIDIA's device plugin advertises the GPUs as extended resources.
    #[default]
    DevicePlugin,
    /// This operator's DRA driver (`gpu.gputenancy.io`) publishes each device with its tenant.
    #[serde(rename = "DRA")]
    Dra,
}

impl DeviceAccess {
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceAccess::DevicePlugin => "DevicePlugin",
            DeviceAccess::Dra => "DRA",
        }
    }
}

/// GPUs of a node, by index, and how they are shared.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.mode == 'MIG' ? has(self.mig) : !has(self.mig)",
     "message": "mig settings are required with mode MIG and allowed only with it", "fieldPath": ".mig", "reason": "FieldValueInvalid"},
    {"rule": "self.mode == 'MPS' || !has(self.mps)",
     "message": "mps settings are allowed only with mode MPS", "fieldPath": ".mps", "reason": "FieldValueForbidden"},
    {"rule": "self.mode == 'TimeSlicing' ? has(self.timeSlicing) : !has(self.timeSlicing)",
     "message": "timeSlicing settings are required with mode TimeSlicing and allowed only with it", "fieldPath": ".timeSlicing", "reason": "FieldValueInvalid"}
]))]
pub struct GpuGroup {
    /// Device indices: `all`, `0,2`, `4-7`, `0-3,6`.
    #[schemars(length(min = 1, max = 64), extend("pattern" = r"^(all|[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*)$"))]
    pub devices: String,
    pub mode: Mode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<MigSettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps: Option<MpsSettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_slicing: Option<TimeSlicingSettings>,
    /// Dedicate these GPUs to these tenants; no other tenant is granted them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), extend("x-kubernetes-list-type" = "set"))]
    pub tenants: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigSettings {
    /// MIG profiles to create on each GPU of the group, e.g. `[3g.40gb, 2g.20gb, 2g.20gb]`.
    /// Empty means MIG mode on with no instances (mig-parted's `all-enabled`).
    #[serde(default)]
    #[schemars(length(max = 7))]
    #[schemars(extend("items" = {"type": "string", "pattern": MIG_PROFILE_PATTERN}))]
    pub profiles: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MpsSettings {
    /// Client shares one GPU is divided into.
    #[serde(default = "default_mps_clients")]
    #[schemars(range(min = 2, max = 48))]
    pub max_clients: u32,
    /// Default share of SMs for each client (`set_default_active_thread_percentage`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub active_thread_percentage: Option<u32>,
    /// Default pinned device memory per client (`set_default_device_pinned_mem_limit`), e.g. `20Gi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = QUANTITY_PATTERN))]
    pub pinned_memory_limit: Option<String>,
}

fn default_mps_clients() -> u32 {
    DEFAULT_MPS.max_clients
}

/// What an MPS GPU runs with where its plan gives no settings.
static DEFAULT_MPS: MpsSettings = MpsSettings {
    max_clients: 4,
    active_thread_percentage: None,
    pinned_memory_limit: None,
};

impl Default for MpsSettings {
    fn default() -> Self {
        DEFAULT_MPS.clone()
    }
}

impl MpsSettings {
    /// The settings an MPS GPU (or group of them) runs with where its plan gives `given`: those,
    /// or the defaults.
    pub fn in_effect(given: Option<&MpsSettings>) -> &MpsSettings {
        given.unwrap_or(&DEFAULT_MPS)
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TimeSlicingSettings {
    /// How many replicas the device plugin advertises each GPU as.
    #[schemars(range(min = 2, max = 64))]
    pub replicas: u32,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Rollout {
    /// Nodes reconfiguring at once: a number (at least 1) or a percentage like `25%`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "string(self).matches('^([1-9][0-9]*|[1-9][0-9]?%|100%)$')",
         "message": "maxUnavailable must be a number of nodes >= 1 or a percentage from 1% to 100%", "reason": "FieldValueInvalid"}
    ]))]
    pub max_unavailable: Option<IntOrString>,
    /// What to do when a GPU to change still runs processes.
    #[serde(default)]
    pub busy_gpu_policy: BusyGpuPolicy,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum BusyGpuPolicy {
    /// Leave the GPU as it is until its processes end.
    #[default]
    Wait,
    /// Evict the pods that use the GPU.
    Evict,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuPartitionPlanStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<PlanNodeCounts>,
    /// Nodes held back, waiting or failed, with the reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_details: Vec<PlanNodeDetail>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanNodeCounts {
    /// Nodes the plan governs, and nodes where it conflicts with another plan.
    /// `selected` = `applied` + `pending` + `waiting` + `failed`.
    pub selected: u32,
    /// Nodes whose GpuNode spec is the plan's layout (applied or on its way).
    #[serde(default)]
    pub updated: u32,
    /// Updated nodes whose agent reported that spec applied.
    pub applied: u32,
    /// Nodes still to apply the plan: updated and not yet applied, or waiting for the rollout.
    pub pending: u32,
    /// Nodes whose agent has not reported its GPUs yet; the plan applies there once it does.
    #[serde(default)]
    pub waiting: u32,
    /// Nodes that cannot take the plan: it does not fit, plans conflict, or the agent gave up.
    pub failed: u32,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanNodeDetail {
    pub node: String,
    /// `HeldBack` (waiting for the rollout), `Waiting` (for the agent), `Failed` or `Conflict`.
    pub state: String,
    pub message: String,
}
