//! One node as the planner decides it: why it has no applied plan, its GPU specs while the passes
//! work on them, and the GpuNode they become.

use crate::api::{BusyGpuPolicy, DeviceAccess, GpuNode, GpuNodeSpec, GpuSpec, SharedVec};
use crate::inventory::NodeInventory;
use crate::problem::Problem;
use std::sync::Arc;

/// Why a node has no applied plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeState {
    /// The plan's layout is resolved for this node.
    Planned,
    /// No plan selects the node.
    Unplanned,
    /// The node's agent has not reported its GPUs yet; nothing is planned for it until it does.
    Waiting,
    /// Plans of equal priority select it; none applies.
    Conflict { plans: Vec<String>, message: String },
    /// The winning plan cannot be applied to this node (or is invalid); GPUs are left as they are.
    Failed(String),
}

/// One node's desired state while the planner works on it.
#[derive(Clone, Debug)]
pub struct NodeDesired<'a> {
    pub inventory: &'a NodeInventory,
    pub plan: Option<String>,
    pub state: NodeState,
    /// Shared with the last pass's memo and output while nothing changes them (copied on the
    /// first change: [`SharedVec`]).
    pub gpus: SharedVec<GpuSpec>,
    /// Per entry of `gpus`: the tenants the plan dedicates that GPU to (empty: open to all).
    /// Shared with the memo: a node taken back on every pass does not copy it.
    pub dedicated: Arc<[Vec<String>]>,
    /// What the agent does with a GPU to change that still runs processes (the plan's rollout).
    pub busy_gpu_policy: BusyGpuPolicy,
    /// How pods reach the node's GPUs (the plan's).
    pub device_access: DeviceAccess,
    /// Plans (positions in the pass's plans) of equal priority that all select it, and the
    /// problem its plan has here: what the node adds to the pass's problems.
    pub decided: Decided,
    /// Taken back from the last pass ([`NodesMemo`]): `gpus` carry that pass's bindings and
    /// scrub policies, the allocation writes only those its changed cells change.
    pub kept: bool,
    /// Its bindings or scrub policies were computed in this pass, not taken back: a cell placed
    /// again holds some of its GPUs, or the changes step looked at it again.
    pub recomputed: bool,
    /// Some of its bindings change against what runs now (set by the changes step).
    pub changing: bool,
    /// The device plugin's config key for its layout, once known: a node taken back has the
    /// last pass's ([`super::NodesMemo`]), so its GPUs are not walked for it on every pass.
    pub plugin_config: Option<Option<String>>,
}

/// What picking a node's plan found that the pass reports.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decided {
    pub tied: Vec<usize>,
    pub problem: Option<Problem>,
}

pub struct Fleet<'a> {
    pub nodes: Vec<NodeDesired<'a>>,
    pub problems: Vec<Problem>,
}

impl<'a> NodeDesired<'a> {
    /// A node no plan governs yet, with nothing decided.
    pub fn unplanned(inventory: &'a NodeInventory) -> NodeDesired<'a> {
        NodeDesired {
            inventory,
            plan: None,
            state: NodeState::Unplanned,
            gpus: SharedVec::default(),
            dedicated: Arc::from([]),
            busy_gpu_policy: BusyGpuPolicy::default(),
            device_access: DeviceAccess::default(),
            decided: Decided::default(),
            kept: false,
            recomputed: false,
            changing: false,
            plugin_config: None,
        }
    }
}

impl NodeDesired<'_> {
    /// The node's desired GpuNode. Takes the GPU specs, the last thing the planner builds from
    /// them (a copy of 400,000 of them at 50,000 nodes is not free); the state and plan stay.
    pub fn take_gpu_node(&mut self) -> GpuNode {
        let device_plugin_config = self.plugin_config.take().unwrap_or_else(|| self.device_plugin_config());
        GpuNode::new(
            &self.inventory.name,
            GpuNodeSpec {
                plan: self.plan.clone(),
                gpus: std::mem::take(&mut self.gpus),
                device_plugin_config,
                busy_gpu_policy: self.busy_gpu_policy,
                device_access: self.device_access,
            },
        )
    }
}

impl NodeDesired<'_> {
    /// The key of the device plugin's config its layout needs. (NVIDIA's device plugin has no
    /// business on a DRA node: no config for it there.)
    pub fn device_plugin_config(&self) -> Option<String> {
        match self.device_access {
            DeviceAccess::DevicePlugin => device_plugin_config(&self.gpus),
            _ => None,
        }
    }
}

/// Key of the device-plugin config a node needs (one sharing setting per node, docs/nvidia.md#the-device-plugin-and-mig-parted), the
/// value of its `nvidia.com/device-plugin.config` label: the one source of both. A node with no
/// GPUs planned (no plan, a plan with problems, an agent that has not reported) gets the config
/// the plugin refuses, so it advertises none of them.
fn device_plugin_config(gpus: &[GpuSpec]) -> Option<String> {
    if gpus.is_empty() {
        return Some(crate::device_plugin::UNPLANNED.into());
    }
    Some(
        crate::device_plugin::NodeConfig::of_gpus(gpus)
            .map(|c| c.key())
            .unwrap_or_else(|_| crate::device_plugin::UNPLANNED.into()),
    )
}
