//! `GpuNode`'s status: what its agent sees on the node (the GPUs, their MIG instances, processes,
//! scrubs, health, the MPS daemon) and whether the spec is applied. The agent owns it; the DRA
//! mode's kubelet plugin adds the claims it prepared.

use super::common::{Mode, Placement};
use super::conditions::conditions_schema;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What the agent sees on the node, and whether the spec is applied.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuNodeStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<DriverInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_count: Option<u32>,
    /// The `kubectl get` column: the GPUs grouped by what they run, short at any GPU count, e.g.
    /// `4×[3g.40gb+2×2g.20gb] 2×[7×1g.10gb] 2×Exclusive`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<String>,
    /// Per GPU its MIG instances as placed or its applied mode, e.g. `0:3g.40gb+2g.20gb 1:MPS`
    /// (`kubectl get -o wide`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_layout: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuStatus>,
    /// The MIG profiles of each GPU model on the node (by GPU `name`), as the driver reports
    /// them, written once for all its GPUs when they report the same table; such a GPU lists no
    /// `profiles` of its own. A GPU's profiles are its own `profiles`, or else its model's here.
    // Why: the table was two thirds of an 8-GPU node's status, which every write, read and
    // watch event of the GpuNode carries (`make bench-fleet`: the API server's CPU went mostly
    // to GpuNodes). Readers use `GpuNodeStatus::profiles_of`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub mig_profiles: Vec<ModelProfiles>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps: Option<MpsDaemonStatus>,
    /// How the shares of each MPS or time-sliced GPU are capped in memory, and why not by the
    /// driver where they are not (docs/concepts/isolation.md#memory-limits).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["index"]))]
    pub memory_caps: Vec<super::memory_caps::GpuMemoryCap>,
    /// Pods on this node the agent asks the controller to evict (`busyGpuPolicy: Evict`): they
    /// hold a GPU that is to change. The agent may not evict (an Eviction does not say which node
    /// its pod is on, so no admission rule could keep an agent to its own); the controller evicts
    /// a pod only if it runs on this node and asks for a GPU, and only under that policy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub eviction_requests: Vec<EvictionRequest>,
    /// DRA mode: each device prepared for a claim, with the claim and its tenant. Written by the
    /// agent's kubelet plugin (its own field manager) when a claim is prepared or unprepared.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4096))]
    pub claims: Vec<DeviceClaim>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
}

/// A device of this node's DRA pool prepared for a claim.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceClaim {
    /// The device's name in the node's ResourceSlices (`gpu-0-mig-0-4`).
    #[schemars(length(max = 63))]
    pub device: String,
    /// The claim, `namespace/name`.
    #[schemars(length(max = 317))]
    pub claim: String,
    /// The tenant owning the claim's namespace (the device's tenant: Prepare checked both).
    #[schemars(length(max = 253))]
    pub tenant: String,
    /// What the hand-over of the device to the claim did (the same evidence the agent writes in
    /// the ResourceClaim's `status.devices`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<super::evidence::HandOverEvidence>,
}

/// A pod the agent asks the controller to evict.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EvictionRequest {
    #[schemars(length(max = 63))]
    pub namespace: String,
    #[schemars(length(max = 253))]
    pub name: String,
    /// The pod's UID: a pod of the same name created since is not evicted.
    #[schemars(length(max = 64))]
    pub uid: String,
    /// The busy GPUs it may hold (their indices).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub gpus: Vec<u32>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DriverInfo {
    pub driver_version: String,
    pub nvml_version: String,
    /// CUDA driver API version, e.g. `12.4`.
    pub cuda_version: String,
}

/// Why a GPU does not match its spec (`status.gpus[].reason`), one word a person or a loop can
/// act on; the message says the rest.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum GpuReason {
    /// Still to do: the next apply does it.
    Pending,
    /// Processes run on it (their pids in the message): it is left alone until they end
    /// (`busyGpuPolicy: Evict` asks for their pods' eviction).
    Busy,
    /// A MIG mode change waits for a GPU reset this machine does not expose (a VM): until a reboot.
    ResetRequired,
    /// NVML cannot read it: left alone with its last known record.
    Unreadable,
    /// The spec names a GPU the node does not have.
    NotFound,
    /// The spec cannot be applied to it (an impossible MIG layout).
    InvalidSpec,
    /// The spec asks for MIG on a GPU without it.
    MigNotSupported,
    /// Handed to a tenant whose scrub is still to do: not handed over yet.
    ScrubPending,
    /// Its scrub failed (retried on the next apply); the old tenant keeps it.
    ScrubFailed,
    /// It joins or leaves MPS and waits for the daemon (clients running, a default refused).
    MpsPending,
    /// An NVML call failed (retried on the next apply).
    Failed,
}

impl GpuReason {
    pub fn as_str(self) -> &'static str {
        match self {
            GpuReason::Pending => "Pending",
            GpuReason::Busy => "Busy",
            GpuReason::ResetRequired => "ResetRequired",
            GpuReason::Unreadable => "Unreadable",
            GpuReason::NotFound => "NotFound",
            GpuReason::InvalidSpec => "InvalidSpec",
            GpuReason::MigNotSupported => "MigNotSupported",
            GpuReason::ScrubPending => "ScrubPending",
            GpuReason::ScrubFailed => "ScrubFailed",
            GpuReason::MpsPending => "MpsPending",
            GpuReason::Failed => "Failed",
        }
    }

    /// A failed NVML call or scrub: the next apply may well succeed, so the agent tries again
    /// within seconds (with backoff) rather than at its next poll.
    pub fn retries_soon(self) -> bool {
        matches!(self, GpuReason::Failed | GpuReason::ScrubFailed)
    }

    /// A reason a new apply cannot fix by itself: the spec or the node must change.
    pub fn stalls(self) -> bool {
        matches!(
            self,
            GpuReason::InvalidSpec | GpuReason::NotFound | GpuReason::MigNotSupported
        )
    }
}

impl std::fmt::Display for GpuReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One GPU as the driver reports it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuStatus {
    pub index: u32,
    #[serde(rename = "uuid")]
    pub uuid: String,
    pub name: String,
    /// PCI device ID with vendor, as NVML and mig-parted write it: `0x233010DE`.
    pub pci_device_id: String,
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<i32>,
    /// The device's minor number (`/dev/nvidia<minor>`), as NVML reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor_number: Option<u32>,
    /// CUDA compute capability, `major.minor` (`9.0`), as NVML reports it: NVIDIA's MPS daemon
    /// serves at most 16 clients below 7.5 and 48 from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = r"^[0-9]+\.[0-9]+$"))]
    pub compute_capability: Option<String>,
    /// `Default`, `ExclusiveProcess` or `Prohibited`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_mode: Option<MigModeStatus>,
    /// GPU instance profiles with IDs and placements, as the driver reports them; empty when
    /// the node's `migProfiles` holds them for this GPU's model.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub profiles: Vec<MigProfileStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<MigInstanceStatus>,
    /// Compute processes running on the GPU or its instances.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<ProcessStatus>,
    /// Mode and tenants as last applied by the agent (what a change of hands is measured against).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_mode: Option<Mode>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub applied_tenants: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scrub: Option<ScrubRecord>,
    /// Whether this GPU matches its spec; `None` when the spec does not mention it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied: Option<bool>,
    /// Why it is not applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<GpuReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Why the GPU is unhealthy, all its instances with it (docs/concepts/health.md); absent while
    /// nothing wrong is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unhealthy: Option<Unhealthy>,
}

/// What makes a device unhealthy: no new claim or pod gets it until the agent restarts (a node
/// reboot or GPU reset usually follows what the driver reports).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Unhealthy {
    pub reason: HealthReason,
    pub message: String,
}

/// Why a device is unhealthy.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
pub enum HealthReason {
    /// The driver reported an XID error that is not an application's own (docs/concepts/health.md).
    Xid,
    /// The driver reported an uncorrectable (double-bit) ECC error.
    EccUncorrectable,
    /// NVML cannot read the GPU (fallen off the bus, driver trouble).
    Unreadable,
    /// The agent cannot watch the GPU's events, so an error on it would go unnoticed.
    Unmonitored,
}

impl HealthReason {
    pub fn as_str(self) -> &'static str {
        match self {
            HealthReason::Xid => "Xid",
            HealthReason::EccUncorrectable => "EccUncorrectable",
            HealthReason::Unreadable => "Unreadable",
            HealthReason::Unmonitored => "Unmonitored",
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct MigModeStatus {
    pub current: bool,
    pub pending: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigProfileStatus {
    /// Profile ID as `nvidia-smi mig -lgip` prints it (not the NVML enum index).
    pub id: u32,
    pub name: String,
    pub compute_slices: u32,
    pub memory_slices: u32,
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    pub max_instances: u32,
    pub placements: Vec<Placement>,
}

/// One GPU model's MIG profiles, shared by the node's GPUs of that name.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelProfiles {
    /// The GPUs' `name`, as NVML reports it (`NVIDIA H100 80GB HBM3`).
    pub name: String,
    pub profiles: Vec<MigProfileStatus>,
}

impl GpuNodeStatus {
    /// The MIG profiles of `gpu`, one of this status's GPUs: its own, or else its model's.
    pub fn profiles_of<'a>(&'a self, gpu: &'a GpuStatus) -> &'a [MigProfileStatus] {
        if !gpu.profiles.is_empty() {
            return &gpu.profiles;
        }
        self.mig_profiles
            .iter()
            .find(|m| m.name == gpu.name)
            .map_or(&[], |m| m.profiles.as_slice())
    }

    /// Moves the GPUs' profile tables into `mig_profiles`, one per model (GPU name), where every
    /// GPU of the model has the same table; otherwise each keeps its own, so a GPU without a
    /// table still reads as having none. A GPU without a table of its own first takes its
    /// model's, from this status or else from `earlier` (the tables of the status it was carried
    /// over from: an unreadable GPU keeps its last known state), so sharing twice gives the same
    /// status and [`GpuNodeStatus::profiles_of`] reads every GPU's table as before.
    pub fn share_profiles(&mut self, earlier: &[ModelProfiles]) {
        let shared = std::mem::take(&mut self.mig_profiles);
        for g in self.gpus.iter_mut().filter(|g| g.profiles.is_empty()) {
            if let Some(m) = shared.iter().chain(earlier).find(|m| m.name == g.name) {
                g.profiles = m.profiles.clone();
            }
        }
        let mut models: Vec<ModelProfiles> = Vec::new();
        for g in &self.gpus {
            if models.iter().any(|m| m.name == g.name) {
                continue;
            }
            let mut same = self.gpus.iter().filter(|o| o.name == g.name);
            if !g.profiles.is_empty() && same.all(|o| o.profiles == g.profiles) {
                models.push(ModelProfiles {
                    name: g.name.clone(),
                    profiles: g.profiles.clone(),
                });
            }
        }
        for g in &mut self.gpus {
            if models.iter().any(|m| m.name == g.name) {
                g.profiles = Vec::new();
            }
        }
        models.sort_by(|a, b| a.name.cmp(&b.name));
        self.mig_profiles = models;
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigInstanceStatus {
    pub gpu_instance_id: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_instance_id: Option<u32>,
    pub profile_id: u32,
    pub profile: String,
    pub placement: Placement,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Tenant the instance was last applied for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scrub: Option<ScrubRecord>,
    /// Why this instance is unhealthy (an error the driver reported in it); an unhealthy GPU's
    /// instances say so on the GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unhealthy: Option<Unhealthy>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProcessStatus {
    pub pid: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_instance_id: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_instance_id: Option<u32>,
    #[serde(default, rename = "usedMemoryMiB", skip_serializing_if = "Option::is_none")]
    pub used_memory_mib: Option<u64>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScrubRecord {
    /// RFC 3339 time the scrub finished.
    pub time: String,
    pub result: ScrubResult,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(default, rename = "bytesCleared", skip_serializing_if = "Option::is_none")]
    pub bytes_cleared: Option<u64>,
}

/// How a scrub ended.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ScrubResult {
    /// Memory was zeroed and verified.
    #[default]
    Scrubbed,
    /// Not scrubbed: the policy is `Never`.
    Skipped,
    /// The scrub did not finish; the GPU or instance is not handed over.
    Failed,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MpsDaemonStatus {
    pub running: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// UUIDs of the GPUs the daemon serves.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<String>,
    #[serde(default)]
    pub restarts: u32,
    /// Control commands that set the daemon's defaults, as sent after its last start.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub settings: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn table(ids: &[u32]) -> Vec<MigProfileStatus> {
        ids.iter()
            .map(|&id| MigProfileStatus {
                id,
                name: format!("p{id}"),
                memory_mib: 1000 * id as u64,
                ..Default::default()
            })
            .collect()
    }

    fn gpu(index: u32, name: &str, profiles: Vec<MigProfileStatus>) -> GpuStatus {
        GpuStatus {
            index,
            name: name.into(),
            profiles,
            ..Default::default()
        }
    }

    /// Each GPU's table as a reader saw it before sharing: its own, else the first of its model's
    /// in the status, then in `earlier` (the definition, written out without the code's helpers).
    fn tables_read(s: &GpuNodeStatus, earlier: &[ModelProfiles]) -> Vec<Vec<MigProfileStatus>> {
        s.gpus
            .iter()
            .map(|g| {
                if !g.profiles.is_empty() {
                    return g.profiles.clone();
                }
                for m in s.mig_profiles.iter().chain(earlier) {
                    if m.name == g.name {
                        return m.profiles.clone();
                    }
                }
                vec![]
            })
            .collect()
    }

    #[test]
    fn eight_gpus_of_one_model_publish_their_table_once() {
        let mut s = GpuNodeStatus {
            gpus: (0..8).map(|i| gpu(i, "H100", table(&[19, 14, 9]))).collect(),
            ..Default::default()
        };
        let before = serde_json::to_string(&s).unwrap().len();
        s.share_profiles(&[]);
        assert_eq!(s.mig_profiles.len(), 1);
        assert!(s.gpus.iter().all(|g| g.profiles.is_empty()));
        assert!(s.gpus.iter().all(|g| s.profiles_of(g) == table(&[19, 14, 9])));
        let after = serde_json::to_string(&s).unwrap().len();
        assert!(after * 3 < before, "{before} -> {after} bytes");
    }

    #[test]
    fn a_model_whose_gpus_differ_is_not_shared_and_a_carried_gpu_keeps_its_table() {
        let mut s = GpuNodeStatus {
            gpus: vec![
                gpu(0, "A100", table(&[19, 14])),
                gpu(1, "A100", table(&[19])),
                // Carried over from the last status (an unreadable GPU): its table was shared.
                gpu(2, "H200", vec![]),
                // No MIG: no table anywhere.
                gpu(3, "T4", vec![]),
            ],
            ..Default::default()
        };
        let earlier = [ModelProfiles {
            name: "H200".into(),
            profiles: table(&[9]),
        }];
        s.share_profiles(&earlier);
        let names: Vec<&str> = s.mig_profiles.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["H200"], "the A100s differ: each keeps its own");
        assert_eq!(s.gpus[1].profiles, table(&[19]));
        assert_eq!(s.profiles_of(&s.gpus[0]), table(&[19, 14]));
        assert_eq!(s.profiles_of(&s.gpus[2]), table(&[9]));
        assert!(s.profiles_of(&s.gpus[3]).is_empty());
    }

    fn status() -> impl Strategy<Value = (GpuNodeStatus, Vec<ModelProfiles>)> {
        let name = prop::sample::select(vec!["A100", "H100", "T4"]);
        let tab = prop::sample::select(vec![vec![], vec![19], vec![19, 14], vec![9]]);
        let gpus = prop::collection::vec((name.clone(), tab.clone()), 0..9);
        let models = prop::collection::vec((name, tab), 0..3);
        (gpus, models.clone(), models).prop_map(|(gpus, shared, earlier)| {
            let models = |v: Vec<(&str, Vec<u32>)>| -> Vec<ModelProfiles> {
                v.into_iter()
                    .map(|(n, t)| ModelProfiles {
                        name: n.into(),
                        profiles: table(&t),
                    })
                    .collect()
            };
            let s = GpuNodeStatus {
                gpus: gpus
                    .into_iter()
                    .enumerate()
                    .map(|(i, (n, t))| gpu(i as u32, n, table(&t)))
                    .collect(),
                mig_profiles: models(shared),
                ..Default::default()
            };
            (s, models(earlier))
        })
    }

    proptest! {
        /// Sharing changes how the tables are written, never what a reader finds; each model is
        /// written once; sharing again changes nothing (a status read back is published as is).
        #[test]
        fn sharing_keeps_every_gpus_table((s, earlier) in status()) {
            let read = tables_read(&s, &earlier);
            let mut shared = s.clone();
            shared.share_profiles(&earlier);
            let after: Vec<Vec<MigProfileStatus>> = shared.gpus.iter().map(|g| shared.profiles_of(g).to_vec()).collect();
            prop_assert_eq!(&after, &read);
            let mut names: Vec<&str> = shared.mig_profiles.iter().map(|m| m.name.as_str()).collect();
            names.dedup();
            prop_assert_eq!(names.len(), shared.mig_profiles.len());
            let mut again = shared.clone();
            again.share_profiles(&[]);
            prop_assert_eq!(again, shared);
        }
    }
}
