//! What a joining node's agent found, declared on the GpuNode it creates, so the controller can
//! plan the node before the agent's first status.
//!
//! Why: a new node used to cost its agent two status writes (what it found, then what it applied)
//! and the controller a spec write on an object that already held the first status. A GpuNode's
//! every write costs the API server in proportion to the whole object, and the found status was
//! one of a joining node's four writes (docs/decisions/joining-node-declares-gpus.md).
//!
//! The rules, each on the safe side:
//! - The agent declares only GPUs that hold nothing: no MIG instance and no process on any of
//!   them, all read without an error ([`GpuNodeStatus::declarable`]). A plan made without the
//!   agent's status then has nothing to keep or disrupt; the first apply scrubs whatever it hands
//!   out, as for any GPU whose previous owner is not known. A node with anything on its GPUs
//!   publishes its status first, as before, and is planned from it.
//! - The declaration holds the facts the planner reads from a status ([`GpuNodeStatus::facts`]),
//!   from the same NVML read, so the plan made from it is the plan made from the status the agent
//!   then publishes: the controller has nothing to rewrite when it arrives.
//! - It is read only until the agent publishes a status ([`GpuNode::found_gpus`]; a new object's
//!   status holds only the schema's `observedGeneration: 0`); the agent's first status replaces
//!   it for good, even one that reports nothing but a failure. One that does not parse is not
//!   read: the node waits for its agent's status.
//! - It is written by the node's agent, which also writes the status: trusted as that is.

use super::node::GpuNode;
use super::node_status::{GpuNodeStatus, GpuStatus};

/// The annotation of a GpuNode its agent created, with the GPUs it found (JSON of
/// [`GpuNodeStatus::facts`]).
pub const FOUND_GPUS_ANNOTATION: &str = "gputenancy.io/found-gpus";

impl GpuNodeStatus {
    /// Whether a node whose agent found `self` may be planned from its declaration: it has GPUs,
    /// every one read without an error, and none holds a MIG instance or runs a process.
    pub fn declarable(&self) -> bool {
        !self.gpus.is_empty()
            && self.gpu_count == Some(self.gpus.len() as u32)
            && self
                .gpus
                .iter()
                .all(|g| g.reason.is_none() && g.instances.is_empty() && g.processes.is_empty())
    }

    /// Whether no agent wrote this status: it is what the API server gives a new GpuNode (the
    /// schema's `observedGeneration: 0`), with no GPU, count, driver or condition. Every status an
    /// agent publishes has a condition (a failure to read NVML too).
    pub fn is_unpublished(&self) -> bool {
        self.gpu_count.is_none() && self.gpus.is_empty() && self.driver.is_none() && self.conditions.is_empty()
    }

    /// The facts of the GPUs the planner reads (model, memory, NUMA node, compute capability,
    /// UUID, MIG profiles), without what the agent did or saw running. Nothing more: the
    /// annotation stays on the object, in every later write of it.
    pub fn facts(&self) -> GpuNodeStatus {
        GpuNodeStatus {
            gpu_count: self.gpu_count,
            gpus: self
                .gpus
                .iter()
                .map(|g| GpuStatus {
                    index: g.index,
                    uuid: g.uuid.clone(),
                    name: g.name.clone(),
                    pci_device_id: g.pci_device_id.clone(),
                    memory_mib: g.memory_mib,
                    numa_node: g.numa_node,
                    compute_capability: g.compute_capability.clone(),
                    profiles: g.profiles.clone(),
                    ..GpuStatus::default()
                })
                .collect(),
            mig_profiles: self.mig_profiles.clone(),
            ..GpuNodeStatus::default()
        }
    }
}

impl GpuNode {
    /// The GPUs its agent declared when it created it, until the agent publishes a status; `None`
    /// after that, with no declaration, or with one that does not parse.
    pub fn found_gpus(&self) -> Option<GpuNodeStatus> {
        if self.status.as_ref().is_some_and(|s| !s.is_unpublished()) {
            return None;
        }
        let text = self.metadata.annotations.as_ref()?.get(FOUND_GPUS_ANNOTATION)?;
        serde_json::from_str::<GpuNodeStatus>(text).ok()
    }
}

/// What an agent finds on two empty H100s, one per NUMA node, with their 3g.40gb profile (test
/// input here and for the planner's reading of a declaration).
#[cfg(test)]
pub(crate) fn two_empty_h100s() -> GpuNodeStatus {
    use super::node_status::{MigProfileStatus, ModelProfiles};
    GpuNodeStatus {
        gpu_count: Some(2),
        gpus: (0..2)
            .map(|i| GpuStatus {
                index: i,
                uuid: format!("GPU-{i}"),
                name: "NVIDIA H100 80GB HBM3".into(),
                pci_device_id: "0x233010DE".into(),
                memory_mib: 81559,
                numa_node: Some(i as i32),
                compute_capability: Some("9.0".into()),
                ..GpuStatus::default()
            })
            .collect(),
        mig_profiles: vec![ModelProfiles {
            name: "NVIDIA H100 80GB HBM3".into(),
            profiles: vec![MigProfileStatus {
                id: 9,
                name: "3g.40gb".into(),
                memory_mib: 40192,
                ..MigProfileStatus::default()
            }],
        }],
        ..GpuNodeStatus::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{MigInstanceStatus, Placement, ProcessStatus};

    fn found() -> GpuNodeStatus {
        two_empty_h100s()
    }

    #[test]
    fn only_gpus_holding_nothing_are_declared() {
        assert!(found().declarable());
        let mut with_instance = found();
        with_instance.gpus[1].instances.push(MigInstanceStatus {
            profile: "1g.10gb".into(),
            placement: Placement { start: 0, size: 1 },
            ..MigInstanceStatus::default()
        });
        assert!(!with_instance.declarable());
        let mut with_process = found();
        with_process.gpus[0].processes.push(ProcessStatus::default());
        assert!(!with_process.declarable());
        let mut unreadable = found();
        unreadable.gpus[0].reason = Some(crate::api::GpuReason::Unreadable);
        assert!(!unreadable.declarable());
        let mut one_missing = found();
        one_missing.gpus.pop();
        assert!(!one_missing.declarable(), "a GPU NVML counted but did not list");
        assert!(!GpuNodeStatus::default().declarable());
    }

    #[test]
    fn a_declaration_is_read_only_until_the_first_status() {
        let mut node = GpuNode::new("n", Default::default());
        assert_eq!(node.found_gpus(), None);
        let text = serde_json::to_string(&found().facts()).unwrap();
        node.metadata.annotations = Some([(FOUND_GPUS_ANNOTATION.to_string(), text)].into());
        assert_eq!(node.found_gpus(), Some(found().facts()));
        // As the API server returns a new GpuNode: the schema's default, no agent's status yet.
        node.status = Some(GpuNodeStatus {
            observed_generation: Some(0),
            ..GpuNodeStatus::default()
        });
        assert_eq!(node.found_gpus(), Some(found().facts()));
        node.status = Some(found());
        assert_eq!(node.found_gpus(), None, "the status replaces it");
        let mut failed = GpuNodeStatus::default();
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now());
        crate::api::set_condition(
            &mut failed.conditions,
            "Ready",
            false,
            "NvmlFailed",
            "NVML failed",
            None,
            &now,
        );
        node.status = Some(failed);
        assert_eq!(
            node.found_gpus(),
            None,
            "a status that reports only a failure replaces it too"
        );
        node.status = None;
        node.metadata.annotations = Some([(FOUND_GPUS_ANNOTATION.to_string(), "{not json".to_string())].into());
        assert_eq!(node.found_gpus(), None);
    }
}
