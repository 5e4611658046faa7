//! The inventory file: a described fleet for offline planning (`gpu-tenancy plan --inventory`).
//!
//! ```yaml
//! nodes:
//! - name: gpu-a1
//!   labels: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}
//!   gpus:
//!   - {pciDeviceId: "0x233010DE", count: 8}   # or model: "NVIDIA H100 80GB HBM3"
//! ```

use crate::api::{
    ConditionSet, GpuNode, GpuNodeSpec, GpuNodeStatus, GpuSpec, GpuStatus, MigProfileStatus, Mode, Placement,
};
use crate::mig::{GpuModel, model_by_name, model_by_pci_id};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

mod cluster;
pub use cluster::{ClusterInventories, cluster_inventories};

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct InventoryFile {
    pub nodes: Vec<InventoryNode>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct InventoryNode {
    pub name: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    pub gpus: Vec<InventoryGpus>,
    /// What runs on the node now, per GPU index (what the agent would report): lets the offline
    /// plan show what a change moves. GPUs not listed are taken as empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub current: Vec<InventoryCurrentGpu>,
}

/// The current state of one GPU in an inventory file.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct InventoryCurrentGpu {
    pub gpu: u32,
    pub mode: Mode,
    /// MIG instances present now, with the tenant each serves.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<InventoryInstance>,
    /// Tenants whose pods use the whole GPU now (MPS, TimeSlicing, Exclusive).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tenants: Vec<String>,
    /// On an MPS or time-sliced GPU, how many shares each tenant holds now (as a GpuNode spec's
    /// `shares`); a tenant listed in `tenants` without a count holds at least one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<crate::api::TenantShares>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct InventoryInstance {
    pub profile: String,
    /// `start:size` in memory slices, as `nvidia-smi mig -lgi` prints it.
    pub placement: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// A run of identical GPUs; indices are numbered in file order.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct InventoryGpus {
    /// PCI device ID, with or without vendor: `0x233010DE` or `0x2330`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_device_id: Option<String>,
    /// NVML name (`NVIDIA H100 80GB HBM3`), product label or model key (`H100-80GB`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default = "one")]
    pub count: u32,
    /// NUMA node of these GPUs (topology-aware placement keeps multi-GPU grants on one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<i32>,
    /// Memory per GPU, required for GPUs this tool has no model of (they cannot use MIG).
    #[serde(default, rename = "memoryMiB", skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    /// CUDA compute capability (`8.9`), for GPUs this tool has no model of: MPS beyond 16 clients
    /// needs 7.5 or later, and a GPU of unknown capability gets at most 16.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_capability: Option<String>,
}

fn one() -> u32 {
    1
}

/// `major.minor` as (major, minor).
pub fn parse_compute_capability(s: &str) -> Option<(u32, u32)> {
    let (major, minor) = s.split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// The most GPUs one inventory node may have. The largest servers hold 8 to 16 GPUs (a rack-scale
/// NVL72 tray is 4); 64 leaves room and keeps a typo like `count: 4000000000` from allocating.
pub const MAX_GPUS_PER_NODE: u32 = 64;

/// One GPU of a node as the planner sees it: what it is and what runs on it now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeGpu {
    pub index: u32,
    pub model: Option<&'static GpuModel>,
    /// NVML name, for messages.
    pub name: String,
    pub memory_mib: u64,
    pub numa_node: i32,
    /// CUDA compute capability (major, minor): the model's, or as reported; `None` when unknown.
    pub compute_capability: Option<(u32, u32)>,
    pub uuid: Option<String>,
    /// MIG instances present now (profile, placement); used to keep what can stay.
    pub instances: Vec<crate::mig::ExistingInstance>,
    /// Tenant each current MIG instance is bound to, by placement (the bindings that stay put).
    pub instance_tenants: BTreeMap<Placement, String>,
    /// Mode the GPU is in now, when known.
    pub mode: Option<Mode>,
    /// Tenants bound to the whole GPU now (MPS, TimeSlicing, Exclusive), sorted.
    pub tenants: Vec<String>,
    /// On an MPS or time-sliced GPU, the shares each tenant of `tenants` holds now, where known
    /// (the GpuNode spec's `shares`): the next pass keeps these counts (docs/design.md#minimal-disruption).
    pub shares: BTreeMap<String, u32>,
    /// Memory per MIG profile as the driver reports it (name → MiB); preferred over the tables.
    pub profile_memory_mib: BTreeMap<String, u64>,
}

/// A GPU node as the planner sees it: from the inventory file offline, from its Node and GpuNode in
/// a cluster ([`cluster_inventories`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeInventory {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub gpus: Vec<NodeGpu>,
    /// Whether the node's agent has reported its GPUs, in its status or in the declaration of a
    /// GpuNode it created. A node that has not is counted as waiting and not planned: the planner
    /// never guesses what a node has.
    pub reported: bool,
    /// The node's GpuNode as it is now (spec the controller wrote, whether the agent applied it):
    /// the rollout step's input. `None` offline and for a node without a GpuNode.
    pub current: Option<CurrentNode>,
    /// What this inventory was read from, where that says it: in a cluster, the resourceVersions
    /// of the node's Node and GpuNode. The API server gives an object a new one on every change,
    /// so two inventories of a node with the same revision are equal, and the planner's memo
    /// skips comparing them ([`crate::planner::PlanMemo`]). `None` (offline): always compared.
    pub revision: Option<String>,
}

/// A GpuNode as it is in the cluster now, reduced to what the rollout step needs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CurrentNode {
    pub spec: crate::api::GpuNodeSpec,
    pub generation: Option<i64>,
    /// The generation the agent last reported on, and how it went.
    pub observed_generation: Option<i64>,
    pub applied: AppliedState,
    /// Some GPU or MIG instance of the spec serves tenants its agent has not yet reported applied
    /// (and so scrubbed for): a hand-over in progress.
    pub handover_pending: bool,
    /// How its agent reports its shared GPUs' shares capped in memory (`status.memoryCaps`).
    pub memory_caps: Vec<crate::api::GpuMemoryCap>,
}

/// Whether the agent has applied the GpuNode's current spec.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum AppliedState {
    /// No report for the current generation yet (the agent is working on it, or is down).
    #[default]
    Pending,
    /// Every GPU matches the spec.
    Applied,
    /// The agent gave up on the spec and needs a person; carries its message.
    Failed(String),
}

impl InventoryFile {
    /// Resolves models and numbers GPUs. Errors name the field: `nodes[2].gpus[0].pciDeviceId: ...`.
    pub fn resolve(&self) -> Result<Vec<NodeInventory>, Vec<String>> {
        let mut errors = Vec::new();
        let mut nodes = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for (n, node) in self.nodes.iter().enumerate() {
            if !seen.insert(node.name.as_str()) {
                errors.push(format!("nodes[{n}].name: node {:?} is listed twice", node.name));
            }
            if let Some(node) = node.resolve(n, &mut errors) {
                nodes.push(node);
            }
        }
        if errors.is_empty() { Ok(nodes) } else { Err(errors) }
    }
}

impl InventoryNode {
    /// The node as the planner sees it, `n`th in the file; `None` where it has too many GPUs to make.
    fn resolve(&self, n: usize, errors: &mut Vec<String>) -> Option<NodeInventory> {
        // Checked before any GPU is made: the counts are the input's, not ours.
        let total = self.gpus.iter().fold(0u64, |sum, e| sum + u64::from(e.count));
        if total > u64::from(MAX_GPUS_PER_NODE) {
            let at = self
                .gpus
                .iter()
                .position(|e| e.count > MAX_GPUS_PER_NODE)
                .map_or(format!("nodes[{n}].gpus"), |g| format!("nodes[{n}].gpus[{g}].count"));
            errors.push(format!(
                "{at}: the node has {total} GPUs; a node has at most {MAX_GPUS_PER_NODE}"
            ));
            return None;
        }
        let mut gpus = Vec::new();
        for (g, entry) in self.gpus.iter().enumerate() {
            let Some(gpu) = entry.resolve(&format!("nodes[{n}].gpus[{g}]"), errors) else {
                continue;
            };
            for _ in 0..entry.count {
                gpus.push(NodeGpu {
                    index: gpus.len() as u32,
                    ..gpu.clone()
                });
            }
        }
        for (c, cur) in self.current.iter().enumerate() {
            let at = format!("nodes[{n}].current[{c}]");
            let count = gpus.len();
            let Some(gpu) = gpus.get_mut(cur.gpu as usize) else {
                errors.push(format!(
                    "{at}.gpu: the node has {count} GPUs, so GPU {} does not exist",
                    cur.gpu
                ));
                continue;
            };
            cur.apply_to(gpu, &at, errors);
        }
        Some(NodeInventory {
            name: self.name.clone(),
            labels: self.labels.clone(),
            gpus,
            // An inventory file describes what the nodes have: it is their report.
            reported: true,
            current: None,
            revision: None,
        })
    }
}

impl InventoryGpus {
    /// One GPU of this run (index 0, nothing running), at field `at`; `None` where the entry
    /// names no model this tool knows and gives no memory, or a capability that does not parse.
    fn resolve(&self, at: &str, errors: &mut Vec<String>) -> Option<NodeGpu> {
        let model = self.model(at, errors)?;
        let name = model
            .and_then(|m| {
                let id = self.pci_device_id.as_deref().and_then(crate::mig::parse_pci_id);
                id.and_then(crate::mig::variant_name).or(Some(m.name()))
            })
            .map(str::to_string)
            .or_else(|| self.model.clone())
            .unwrap_or_else(|| self.pci_device_id.clone().unwrap_or_default());
        let compute_capability = match self.compute_capability.as_deref() {
            None => model.map(|m| m.compute_capability),
            Some(cc) => match parse_compute_capability(cc) {
                Some(cc) => Some(cc),
                None => {
                    errors.push(format!(
                        "{at}.computeCapability: {cc:?} is not a compute capability; write major.minor, e.g. 8.9"
                    ));
                    return None;
                }
            },
        };
        Some(NodeGpu {
            index: 0,
            model,
            name,
            memory_mib: self.memory_mib.or(model.map(|m| m.memory_mib)).unwrap_or(0),
            numa_node: self.numa_node.unwrap_or(0),
            compute_capability,
            ..NodeGpu::default()
        })
    }

    /// The known model the entry names (`Some(None)`: an unknown GPU whose memory is given).
    fn model(&self, at: &str, errors: &mut Vec<String>) -> Option<Option<&'static GpuModel>> {
        match (&self.pci_device_id, &self.model) {
            (Some(id), _) => match model_by_pci_id(id) {
                Some(m) => Some(Some(m)),
                None if self.memory_mib.is_some() => Some(None),
                None => {
                    errors.push(format!(
                        "{at}.pciDeviceId: unknown GPU {id:?}; use a known MIG-capable model or give memoryMiB"
                    ));
                    None
                }
            },
            (None, Some(name)) => match model_by_name(name) {
                Some(m) => Some(Some(m)),
                None if self.memory_mib.is_some() => Some(None),
                None => {
                    errors.push(format!(
                        "{at}.model: unknown GPU model {name:?}; give pciDeviceId or memoryMiB"
                    ));
                    None
                }
            },
            (None, None) => {
                errors.push(format!("{at}: give pciDeviceId or model"));
                None
            }
        }
    }
}

impl InventoryCurrentGpu {
    /// Sets what runs on `gpu` now, at field `at`; an instance whose placement does not parse is left out.
    fn apply_to(&self, gpu: &mut NodeGpu, at: &str, errors: &mut Vec<String>) {
        gpu.mode = Some(self.mode);
        gpu.tenants = self.tenants.clone();
        gpu.tenants.extend(self.shares.iter().map(|s| s.tenant.clone()));
        gpu.tenants.sort();
        gpu.tenants.dedup();
        gpu.shares = self.shares.iter().map(|s| (s.tenant.clone(), s.count)).collect();
        for (i, inst) in self.instances.iter().enumerate() {
            let Some(placement) = parse_placement(&inst.placement) else {
                errors.push(format!(
                    "{at}.instances[{i}].placement: {:?} is not a placement; write start:size, e.g. 0:4",
                    inst.placement
                ));
                continue;
            };
            if let Some(t) = &inst.tenant {
                gpu.instance_tenants.insert(placement, t.clone());
            }
            gpu.instances.push(crate::mig::ExistingInstance {
                profile: inst.profile.clone(),
                placement,
                gpu_instance_id: None,
            });
        }
    }
}

impl NodeInventory {
    /// A node as the cluster describes it: labels from its Node, GPUs from its GpuNode's status
    /// (what the agent found), and what runs now. Bindings and layouts come from the GpuNode's
    /// spec where it covers a GPU (the controller's last decision, applied or on its way), else
    /// from what the agent reports as applied, so feeding the planner its own output changes
    /// nothing. A node whose GpuNode has no status yet is `reported` only where its agent
    /// declared the GPUs it found when it created it, which it does where they held nothing
    /// ([`crate::api::FOUND_GPUS_ANNOTATION`]).
    pub fn from_cluster(name: &str, labels: &BTreeMap<String, String>, gpu_node: Option<&GpuNode>) -> NodeInventory {
        let status = gpu_node.and_then(|n| n.status.as_ref());
        // The GPUs' facts: from the declaration until the agent publishes a status, then from that.
        let declared = gpu_node.and_then(GpuNode::found_gpus);
        let found = declared.as_ref().or(status);
        let spec = gpu_node.map(|n| &n.spec);
        let gpus = found
            .map(|s| {
                s.gpus
                    .iter()
                    .map(|g| {
                        let spec = spec.and_then(|sp| sp.gpus.iter().find(|x| x.index == g.index));
                        node_gpu(g, s.profiles_of(g), spec)
                    })
                    .collect()
            })
            .unwrap_or_default();
        NodeInventory {
            name: name.to_string(),
            labels: labels.clone(),
            gpus,
            reported: found.is_some_and(|s| s.gpu_count.is_some() || !s.gpus.is_empty()),
            revision: None,
            current: gpu_node.map(|n| CurrentNode {
                spec: n.spec.clone(),
                generation: n.metadata.generation,
                observed_generation: status.and_then(|s| s.observed_generation),
                applied: applied_state(n),
                handover_pending: handover_pending(&n.spec, status),
                memory_caps: status.map(|s| s.memory_caps.clone()).unwrap_or_default(),
            }),
        }
    }
}

/// `profiles`: the GPU's MIG profiles, its own or its model's ([`GpuNodeStatus::profiles_of`]).
fn node_gpu(g: &GpuStatus, profiles: &[MigProfileStatus], spec: Option<&GpuSpec>) -> NodeGpu {
    let model = model_by_pci_id(&g.pci_device_id);
    let mut gpu = NodeGpu {
        index: g.index,
        model,
        name: g.name.clone(),
        memory_mib: g.memory_mib,
        numa_node: g.numa_node.unwrap_or(0),
        compute_capability: g
            .compute_capability
            .as_deref()
            .and_then(parse_compute_capability)
            .or(model.map(|m| m.compute_capability)),
        uuid: Some(g.uuid.clone()).filter(|u| !u.is_empty()),
        profile_memory_mib: profiles.iter().map(|p| (p.name.clone(), p.memory_mib)).collect(),
        ..NodeGpu::default()
    };
    match spec {
        Some(s) => {
            gpu.mode = Some(s.mode);
            gpu.tenants = s.tenants.clone();
            gpu.shares = s.shares.iter().map(|x| (x.tenant.clone(), x.count)).collect();
            for i in &s.mig_instances {
                gpu.instances.push(crate::mig::ExistingInstance {
                    profile: i.profile.clone(),
                    placement: i.placement,
                    gpu_instance_id: None,
                });
                if let Some(t) = &i.tenant {
                    gpu.instance_tenants.insert(i.placement, t.clone());
                }
            }
        }
        None => {
            gpu.mode = g.applied_mode;
            gpu.tenants = g.applied_tenants.clone();
            for i in &g.instances {
                gpu.instances.push(crate::mig::ExistingInstance {
                    profile: i.profile.clone(),
                    placement: i.placement,
                    gpu_instance_id: Some(i.gpu_instance_id),
                });
                if let Some(t) = &i.tenant {
                    gpu.instance_tenants.insert(i.placement, t.clone());
                }
            }
        }
    }
    gpu.tenants.sort();
    gpu
}

/// Does the spec hand a GPU or instance to tenants the agent has not yet applied (scrubbed for)?
/// Without a status every binding is pending: an unknown previous owner is a change of hands.
/// Tenants joining a shared GPU the agent applied to the others hand nothing over
/// ([`crate::handover`]).
pub fn handover_pending(spec: &GpuNodeSpec, status: Option<&GpuNodeStatus>) -> bool {
    spec.gpus.iter().any(|want| {
        let got = status.and_then(|s| s.gpus.iter().find(|g| g.index == want.index));
        let whole = !want.tenants.is_empty()
            && got.is_none_or(|g| {
                crate::handover::gpu_changes_hands(g.applied_mode, &g.applied_tenants, want.mode, &want.tenants)
            });
        let instances = want.mig_instances.iter().filter(|i| i.tenant.is_some()).any(|i| {
            !got.is_some_and(|g| {
                g.instances
                    .iter()
                    .any(|x| x.placement == i.placement && x.profile == i.profile && x.tenant == i.tenant)
            })
        });
        whole || instances
    })
}

/// Applied when the agent reported on this generation with `Ready=True`; failed on `Stalled=True`.
fn applied_state(node: &GpuNode) -> AppliedState {
    let Some(status) = &node.status else {
        return AppliedState::Pending;
    };
    if status.observed_generation != node.metadata.generation {
        return AppliedState::Pending;
    }
    let find = |t: &str| status.conditions.iter().find(|c| c.type_ == t && c.status == "True");
    if let Some(c) = find(ConditionSet::STALLED) {
        AppliedState::Failed(c.message.clone())
    } else if find(ConditionSet::READY).is_some() {
        AppliedState::Applied
    } else {
        AppliedState::Pending
    }
}

/// Parses `start:size` (memory slices).
pub fn parse_placement(s: &str) -> Option<Placement> {
    let (start, size) = s.trim().split_once(':')?;
    let placement = Placement {
        start: start.trim().parse().ok()?,
        size: size.trim().parse().ok()?,
    };
    (placement.start <= 7 && (1..=8).contains(&placement.size) && placement.start + placement.size <= 8)
        .then_some(placement)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A binding is pending until the agent reports the GPU (or instance) applied with those tenants.
    #[test]
    fn a_handover_is_pending_until_the_agent_applied_it() {
        use crate::api::{GpuNodeSpec, GpuNodeStatus, GpuSpec, GpuStatus, MigInstanceSpec, MigInstanceStatus};
        let spec = GpuNodeSpec {
            gpus: vec![
                GpuSpec::exclusive(0, "a"),
                GpuSpec::mig(1, vec![MigInstanceSpec::new("7g.80gb", 0, 8).for_tenant("b")]),
            ]
            .into(),
            ..GpuNodeSpec::default()
        };
        assert!(handover_pending(&spec, None), "no status: every binding is pending");
        let mut status = GpuNodeStatus {
            gpus: vec![
                GpuStatus {
                    index: 0,
                    applied_mode: Some(Mode::Exclusive),
                    applied_tenants: vec!["a".into()],
                    ..GpuStatus::default()
                },
                GpuStatus {
                    index: 1,
                    instances: vec![MigInstanceStatus {
                        profile: "7g.80gb".into(),
                        placement: Placement { start: 0, size: 8 },
                        tenant: Some("old".into()),
                        ..MigInstanceStatus::default()
                    }],
                    ..GpuStatus::default()
                },
            ],
            ..GpuNodeStatus::default()
        };
        assert!(
            handover_pending(&spec, Some(&status)),
            "the instance still serves its old tenant"
        );
        status.gpus[1].instances[0].tenant = Some("b".into());
        assert!(!handover_pending(&spec, Some(&status)));
        status.gpus[0].applied_tenants = vec![];
        assert!(handover_pending(&spec, Some(&status)));
    }

    /// A node planned from the GPUs its agent declared is planned from the same facts as from the
    /// status the agent publishes once it applied the spec: the status gives the planner nothing
    /// new to rewrite the spec for. Before the declaration, and with one that does not parse, the
    /// node waits for its agent.
    #[test]
    fn a_declared_node_reads_as_its_first_status_will() {
        use crate::api::{FOUND_GPUS_ANNOTATION, GpuNodeSpec, GpuNodeStatus, MigInstanceSpec, MigInstanceStatus};
        let found = crate::api::found::two_empty_h100s();
        let labels = BTreeMap::from([("pool".to_string(), "p".to_string())]);
        let mut node = GpuNode::new("n", GpuNodeSpec::default());
        assert!(!NodeInventory::from_cluster("n", &labels, Some(&node)).reported);
        let annotate = |node: &mut GpuNode, text: String| {
            node.metadata.annotations = Some(BTreeMap::from([(FOUND_GPUS_ANNOTATION.to_string(), text)]));
        };
        annotate(&mut node, "{\"gpus\": 2}".into());
        assert!(
            !NodeInventory::from_cluster("n", &labels, Some(&node)).reported,
            "a declaration that does not parse is not read"
        );
        annotate(&mut node, serde_json::to_string(&found.facts()).unwrap());
        // As the API server returns a new GpuNode: the schema's default status.
        node.status = Some(GpuNodeStatus {
            observed_generation: Some(0),
            ..GpuNodeStatus::default()
        });
        let declared = NodeInventory::from_cluster("n", &labels, Some(&node));
        assert!(declared.reported);

        // The agent applies a spec and publishes what it found and did.
        let placement = Placement { start: 0, size: 4 };
        node.spec.gpus = (0..2)
            .map(|i| GpuSpec::mig(i, vec![MigInstanceSpec::new("3g.40gb", 0, 4).for_tenant("t")]))
            .collect::<Vec<_>>()
            .into();
        let mut status = found.clone();
        for g in &mut status.gpus {
            g.applied = Some(true);
            g.applied_mode = Some(Mode::Mig);
            g.instances = vec![MigInstanceStatus {
                profile: "3g.40gb".into(),
                placement,
                tenant: Some("t".into()),
                ..MigInstanceStatus::default()
            }];
        }
        node.status = Some(status);
        let reported = NodeInventory::from_cluster("n", &labels, Some(&node));
        assert!(reported.reported);
        // What ran before the spec (nothing, then the spec's) aside, the facts are the same.
        let facts = |inv: &NodeInventory| -> Vec<NodeGpu> {
            inv.gpus
                .iter()
                .map(|g| NodeGpu {
                    instances: vec![],
                    instance_tenants: BTreeMap::new(),
                    mode: None,
                    tenants: vec![],
                    shares: BTreeMap::new(),
                    ..g.clone()
                })
                .collect()
        };
        assert_eq!(facts(&declared), facts(&reported));
        assert_eq!(declared.gpus[1].numa_node, 1);
        assert_eq!(declared.gpus[0].profile_memory_mib["3g.40gb"], 40192);
    }

    /// The share counts of a shared GPU come back as the planner's previous state, from the file's
    /// `current` and from the GpuNode spec the controller wrote.
    #[test]
    fn share_counts_are_read_back() {
        let file: InventoryFile = serde_saphyr::from_str(
            "nodes:\n- name: a\n  gpus:\n  - {model: A100-40GB, count: 2}\n  current:\n  - {gpu: 1, mode: MPS, shares: [{tenant: t1, count: 3}, {tenant: t2, count: 1}]}\n",
        )
        .unwrap();
        let nodes = file.resolve().unwrap();
        let g = &nodes[0].gpus[1];
        assert_eq!(g.tenants, ["t1", "t2"], "a tenant with shares uses the GPU");
        assert_eq!(g.shares, BTreeMap::from([("t1".into(), 3), ("t2".into(), 1)]));
        let spec = GpuSpec::new(0, Mode::Mps)
            .with_tenants(&["t1"])
            .with_shares(&[("t1", 5)]);
        let status = GpuStatus {
            index: 0,
            ..GpuStatus::default()
        };
        assert_eq!(
            node_gpu(&status, &[], Some(&spec)).shares,
            BTreeMap::from([("t1".into(), 5)])
        );
        assert!(
            node_gpu(&status, &[], None).shares.is_empty(),
            "no spec: counts not known"
        );
    }

    #[test]
    fn resolves_models_and_numbers_gpus() {
        let file: InventoryFile = serde_saphyr::from_str(
            "nodes:\n- name: a\n  gpus:\n  - {pciDeviceId: \"0x233010DE\", count: 2, numaNode: 1}\n  - {model: H200}\n",
        )
        .unwrap();
        let nodes = file.resolve().unwrap();
        let gpus = &nodes[0].gpus;
        assert_eq!(gpus.len(), 3);
        assert_eq!(gpus[0].name, "NVIDIA H100 80GB HBM3");
        assert_eq!(gpus[1].numa_node, 1);
        assert_eq!(gpus[2].index, 2);
        assert_eq!(gpus[2].model.unwrap().key, "H200");
    }

    #[test]
    fn unknown_gpus_need_memory() {
        let file: InventoryFile =
            serde_saphyr::from_str("nodes:\n- name: a\n  gpus:\n  - {pciDeviceId: \"0x1EB810DE\"}\n").unwrap();
        let err = file.resolve().unwrap_err();
        assert_eq!(err.len(), 1);
        assert!(
            err[0].starts_with("nodes[0].gpus[0].pciDeviceId: unknown GPU"),
            "{}",
            err[0]
        );
        let file: InventoryFile =
            serde_saphyr::from_str("nodes:\n- name: a\n  gpus:\n  - {pciDeviceId: \"0x1EB810DE\", memoryMiB: 15360}\n")
                .unwrap();
        let nodes = file.resolve().unwrap();
        assert!(nodes[0].gpus[0].model.is_none());
    }
}
