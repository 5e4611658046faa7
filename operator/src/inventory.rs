//! The inventory file: a described fleet for offline planning (`gpu-tenancy plan --inventory`).
//!
//! ```yaml
//! nodes:
//! - name: gpu-a1
//!   labels: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}
//!   gpus:
//!   - {pciDeviceId: "0x233010DE", count: 8}   # or model: "NVIDIA H100 80GB HBM3"
//! ```

use crate::mig::{GpuModel, model_by_name, model_by_pci_id};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

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
}

fn one() -> u32 {
    1
}

/// One GPU of a node as the planner sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeGpu {
    pub index: u32,
    pub model: Option<&'static GpuModel>,
    /// NVML name, for messages.
    pub name: String,
    pub memory_mib: u64,
    pub numa_node: i32,
    pub uuid: Option<String>,
    /// MIG instances present now (profile, placement); used to keep what can stay.
    pub instances: Vec<crate::mig::ExistingInstance>,
}

/// A GPU node as the planner sees it: from the inventory file offline, from GpuNode status in a cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeInventory {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub gpus: Vec<NodeGpu>,
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
            let mut gpus = Vec::new();
            for (g, entry) in node.gpus.iter().enumerate() {
                let at = format!("nodes[{n}].gpus[{g}]");
                let model = match (&entry.pci_device_id, &entry.model) {
                    (Some(id), _) => match model_by_pci_id(id) {
                        Some(m) => Some(m),
                        None if entry.memory_mib.is_some() => None,
                        None => {
                            errors.push(format!(
                                "{at}.pciDeviceId: unknown GPU {id:?}; use a known MIG-capable model or give memoryMiB"
                            ));
                            continue;
                        }
                    },
                    (None, Some(name)) => match model_by_name(name) {
                        Some(m) => Some(m),
                        None if entry.memory_mib.is_some() => None,
                        None => {
                            errors.push(format!(
                                "{at}.model: unknown GPU model {name:?}; give pciDeviceId or memoryMiB"
                            ));
                            continue;
                        }
                    },
                    (None, None) => {
                        errors.push(format!("{at}: give pciDeviceId or model"));
                        continue;
                    }
                };
                let name = model
                    .and_then(|m| {
                        let id = entry.pci_device_id.as_deref().and_then(crate::mig::parse_pci_id);
                        id.and_then(crate::mig::variant_name).or(Some(m.name()))
                    })
                    .map(str::to_string)
                    .or_else(|| entry.model.clone())
                    .unwrap_or_else(|| entry.pci_device_id.clone().unwrap_or_default());
                for _ in 0..entry.count {
                    gpus.push(NodeGpu {
                        index: gpus.len() as u32,
                        model,
                        name: name.clone(),
                        memory_mib: entry.memory_mib.or(model.map(|m| m.memory_mib)).unwrap_or(0),
                        numa_node: entry.numa_node.unwrap_or(0),
                        uuid: None,
                        instances: vec![],
                    });
                }
            }
            nodes.push(NodeInventory {
                name: node.name.clone(),
                labels: node.labels.clone(),
                gpus,
            });
        }
        if errors.is_empty() { Ok(nodes) } else { Err(errors) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
