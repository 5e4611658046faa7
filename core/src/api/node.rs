//! `GpuNode`: one per GPU node. The controller owns `spec` (the resolved desired state), the agent
//! owns `status` (what the GPUs really are, and whether the spec is applied: `node_status`).

use super::common::{MIG_PROFILE_PATTERN, Mode, Placement};
use super::memory_caps::MemoryCapPolicy;
use super::node_status::GpuNodeStatus;
use super::plan::{BusyGpuPolicy, DeviceAccess, MpsSettings, TimeSlicingSettings};
use super::policy::ScrubMemory;
use super::shared_vec::SharedVec;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The desired GPU state of one node, fully resolved, and what its agent reports.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "gputenancy.io",
    version = "v1alpha1",
    kind = "GpuNode",
    plural = "gpunodes",
    shortname = "gn",
    category = "gputenancy",
    derive = "PartialEq",
    status = "GpuNodeStatus",
    printcolumn = r#"{"name":"Plan","type":"string","jsonPath":".spec.plan","description":"GpuPartitionPlan that governs this node"}"#,
    printcolumn = r#"{"name":"GPUs","type":"integer","jsonPath":".status.gpuCount","description":"GPUs the agent found"}"#,
    printcolumn = r#"{"name":"Layout","type":"string","jsonPath":".status.layout","description":"The GPUs grouped by what they run, e.g. 4×[3g.40gb+2×2g.20gb] 4×MPS"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Placement","type":"string","priority":1,"jsonPath":".status.gpuLayout","description":"Per GPU its MIG instances as placed or its applied mode (-o wide)"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct GpuNodeSpec {
    /// The GpuPartitionPlan this state comes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
    /// Desired state per GPU. GPUs not listed are left as they are.
    #[serde(default)]
    #[schemars(length(max = 64))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["index"]))]
    pub gpus: SharedVec<GpuSpec>,
    /// Key of the device-plugin ConfigMap this node uses (label `nvidia.com/device-plugin.config`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_plugin_config: Option<String>,
    /// What the agent does when a GPU to change still runs processes: `Wait` until they end, or
    /// `Evict` their pods (through the Eviction API, so PodDisruptionBudgets hold). From the plan.
    #[serde(default)]
    pub busy_gpu_policy: BusyGpuPolicy,
    /// How pods reach this node's GPUs (the plan's `deviceAccess`): in `DRA` the agent is the DRA
    /// kubelet plugin and publishes the node's devices; in `DevicePlugin` NVIDIA's plugin serves them.
    #[serde(default)]
    pub device_access: DeviceAccess,
}

/// Desired state of one GPU.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.mode == 'MIG' || !has(self.migInstances) || size(self.migInstances) == 0",
     "message": "migInstances are allowed only with mode MIG", "fieldPath": ".migInstances", "reason": "FieldValueForbidden"}
]))]
pub struct GpuSpec {
    /// GPU index as NVML numbers it.
    #[schemars(range(max = 63))]
    pub index: u32,
    pub mode: Mode,
    /// MIG instances with their placements; instances not listed are destroyed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 7))]
    pub mig_instances: Vec<MigInstanceSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps: Option<MpsSettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_slicing: Option<TimeSlicingSettings>,
    /// Tenants whose pods may run on the whole GPU (MPS, TimeSlicing, Exclusive), sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tenants: Vec<String>,
    /// On an MPS or time-sliced GPU, how many of its shares each tenant holds (sorted by tenant):
    /// what the DRA mode publishes, one device per share.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["tenant"]))]
    pub shares: Vec<TenantShares>,
    /// When to clear memory before the GPU or its instances change hands.
    #[serde(default)]
    pub scrub: ScrubMemory,
    /// Whether a time-sliced share the node cannot cap in memory may still be handed out: the
    /// strictest `memoryCaps` of the tiers of its tenants.
    #[serde(default)]
    pub memory_caps: MemoryCapPolicy,
}

impl GpuSpec {
    /// GPU `index` in `mode`, with no settings, no instances and no tenant yet.
    pub fn new(index: u32, mode: Mode) -> GpuSpec {
        GpuSpec {
            index,
            mode,
            mig_instances: vec![],
            mps: None,
            time_slicing: None,
            tenants: vec![],
            shares: vec![],
            scrub: ScrubMemory::default(),
            memory_caps: MemoryCapPolicy::default(),
        }
    }

    /// GPU `index` used whole and alone by `tenant`.
    pub fn exclusive(index: u32, tenant: &str) -> GpuSpec {
        GpuSpec::new(index, Mode::Exclusive).with_tenants(&[tenant])
    }

    /// GPU `index` cut into MIG `instances`.
    pub fn mig(index: u32, instances: Vec<MigInstanceSpec>) -> GpuSpec {
        GpuSpec {
            mig_instances: instances,
            ..GpuSpec::new(index, Mode::Mig)
        }
    }

    /// GPU `index` shared through MPS into `max_clients` client shares.
    pub fn mps(index: u32, max_clients: u32) -> GpuSpec {
        GpuSpec {
            mps: Some(MpsSettings {
                max_clients,
                ..MpsSettings::default()
            }),
            ..GpuSpec::new(index, Mode::Mps)
        }
    }

    /// GPU `index` time-sliced into `replicas` shares.
    pub fn time_sliced(index: u32, replicas: u32) -> GpuSpec {
        GpuSpec {
            time_slicing: Some(TimeSlicingSettings { replicas }),
            ..GpuSpec::new(index, Mode::TimeSlicing)
        }
    }

    /// The same GPU used whole by `tenants` (kept in the order given: the spec wants them sorted).
    pub fn with_tenants(mut self, tenants: &[&str]) -> GpuSpec {
        self.tenants = tenants.iter().map(|t| t.to_string()).collect();
        self
    }

    /// The same shared GPU with `(tenant, count)` shares (in the order given: sorted by tenant).
    pub fn with_shares(mut self, shares: &[(&str, u32)]) -> GpuSpec {
        self.shares = shares
            .iter()
            .map(|&(tenant, count)| TenantShares {
                tenant: tenant.to_string(),
                count,
            })
            .collect();
        self
    }

    /// The same GPU with other MPS settings.
    pub fn with_mps(mut self, mps: MpsSettings) -> GpuSpec {
        self.mps = Some(mps);
        self
    }

    /// The same GPU with another scrub policy.
    pub fn with_scrub(mut self, scrub: ScrubMemory) -> GpuSpec {
        self.scrub = scrub;
        self
    }
}

impl MigInstanceSpec {
    /// A `profile` instance at `start:size`, reserved for no tenant yet.
    pub fn new(profile: &str, start: u32, size: u32) -> MigInstanceSpec {
        MigInstanceSpec {
            profile: profile.to_string(),
            placement: Placement { start, size },
            tenant: None,
        }
    }

    /// The same instance reserved for `tenant`.
    pub fn for_tenant(mut self, tenant: &str) -> MigInstanceSpec {
        self.tenant = Some(tenant.to_string());
        self
    }
}

/// A tenant's shares of one shared GPU.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenantShares {
    #[schemars(length(min = 1, max = 63))]
    pub tenant: String,
    #[schemars(range(min = 1, max = 64))]
    pub count: u32,
}

/// A MIG GPU instance (with one compute instance spanning it) at a fixed placement.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigInstanceSpec {
    #[schemars(extend("pattern" = MIG_PROFILE_PATTERN))]
    pub profile: String,
    pub placement: Placement,
    /// Tenant this instance is reserved for, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}
