//! The fleet and its tenants, generated (pure, deterministic from the node count and a seed).
//!
//! Nodes are mixed H100 / A100-40GB / H200 with 8 GPUs and the labels NVIDIA's GPU feature
//! discovery sets, in pools: every tenth node (all H100) is the `fleet-rollout` pool, cut by a MIG
//! plan with `maxUnavailable: 10%` (the plan the benchmark changes); the other H100s mix MIG layouts
//! and whole GPUs, the A100s serve MPS, the H200s time-slicing or whole GPUs. One SharingPolicy
//! with the three tiers of `examples/`, and a third as many tenants as nodes (several hundred for a
//! thousand nodes), each asking for what its tier allows, about half of the capacity overall.

use crate::rng::Rng;
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// Label every fleet Node carries (to list and remove them).
pub const FLEET_LABEL: &str = "gpu-tenancy-fleet";
/// The pool label the plans select on.
pub const POOL_LABEL: &str = "gputenancy.io/pool";
/// The plan the benchmark changes, its pool, and its layouts before and after.
pub const ROLLOUT_PLAN: &str = "fleet-rollout";
pub const ROLLOUT_BEFORE: [&str; 3] = ["3g.40gb", "2g.20gb", "2g.20gb"];
pub const ROLLOUT_AFTER: [&str; 2] = ["3g.40gb", "3g.40gb"];
/// The rollout plan's `maxUnavailable`, and what it allows on its pool of `pool_size` nodes.
pub const ROLLOUT_MAX_UNAVAILABLE: &str = "10%";
pub const POLICY: &str = "fleet";
pub const GPUS_PER_NODE: u32 = 8;

/// GPU models of the fleet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Model {
    H100,
    A100,
    H200,
}

impl Model {
    pub const ALL: [Model; 3] = [Model::H100, Model::A100, Model::H200];

    /// PCI device ID with vendor, as NVML reports it.
    pub fn pci_device_id(self) -> &'static str {
        match self {
            Model::H100 => "0x233010DE",
            Model::A100 => "0x20B010DE",
            Model::H200 => "0x233510DE",
        }
    }

    /// `nvidia.com/gpu.product` as GPU feature discovery writes it.
    pub fn product(self) -> &'static str {
        match self {
            Model::H100 => "NVIDIA-H100-80GB-HBM3",
            Model::A100 => "NVIDIA-A100-SXM4-40GB",
            Model::H200 => "NVIDIA-H200",
        }
    }

    fn family(self) -> &'static str {
        match self {
            Model::A100 => "ampere",
            Model::H100 | Model::H200 => "hopper",
        }
    }

    /// `nvidia.com/gpu.memory` (MiB).
    fn memory_mib(self) -> u64 {
        match self {
            Model::H100 => 81559,
            Model::A100 => 40960,
            Model::H200 => 143771,
        }
    }
}

/// A node pool: which plan cuts its GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Pool {
    Rollout,
    H100Mig,
    A100Mps,
    H200TimeSlicing,
    H200Exclusive,
}

impl Pool {
    pub fn name(self) -> &'static str {
        match self {
            Pool::Rollout => ROLLOUT_PLAN,
            Pool::H100Mig => "fleet-h100-mig",
            Pool::A100Mps => "fleet-a100-mps",
            Pool::H200TimeSlicing => "fleet-h200-timeslicing",
            Pool::H200Exclusive => "fleet-h200-exclusive",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FleetNode {
    pub name: String,
    pub model: Model,
    pub pool: Pool,
    pub labels: BTreeMap<String, String>,
}

/// Node `i` of a fleet: its model and pool repeat every ten nodes (4 H100, 3 A100, 3 H200).
pub fn node(i: usize) -> FleetNode {
    let (model, pool) = match i % 10 {
        0 => (Model::H100, Pool::Rollout),
        1..=3 => (Model::H100, Pool::H100Mig),
        4..=6 => (Model::A100, Pool::A100Mps),
        7 => (Model::H200, Pool::H200TimeSlicing),
        _ => (Model::H200, Pool::H200Exclusive),
    };
    let labels: BTreeMap<String, String> = [
        ("nvidia.com/gpu.present", "true".to_string()),
        ("nvidia.com/gpu.product", model.product().to_string()),
        ("nvidia.com/gpu.count", GPUS_PER_NODE.to_string()),
        ("nvidia.com/gpu.memory", model.memory_mib().to_string()),
        ("nvidia.com/gpu.family", model.family().to_string()),
        ("nvidia.com/mig.capable", "true".to_string()),
        (POOL_LABEL, pool.name().to_string()),
        (FLEET_LABEL, "true".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    FleetNode {
        name: format!("fleet-{i:05}"),
        model,
        pool,
        labels,
    }
}

/// The Node object of a fleet node (no kubelet: what GPU feature discovery would have labelled).
pub fn node_object(n: &FleetNode) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n.name, "labels": n.labels}})
}

/// Tenants for a fleet of `nodes` nodes: a third as many, at least ten.
pub fn tenant_count(nodes: usize) -> usize {
    (nodes / 3).max(10)
}

/// The rollout plan with `profiles` on every GPU.
pub fn rollout_plan(profiles: &[&str]) -> Value {
    plan(
        Pool::Rollout,
        json!([{"devices": "all", "mode": "MIG", "mig": {"profiles": profiles}}]),
        json!({"maxUnavailable": ROLLOUT_MAX_UNAVAILABLE, "busyGpuPolicy": "Wait"}),
    )
}

fn plan(pool: Pool, gpus: Value, rollout: Value) -> Value {
    json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuPartitionPlan", "metadata": {"name": pool.name()},
        "spec": {"nodeSelector": {"matchLabels": {POOL_LABEL: pool.name()}}, "gpus": gpus, "rollout": rollout}})
}

/// The policy, the plans and `tenants` tenants (see [`tenant_count`]).
pub fn objects(tenants: usize, seed: u64) -> Vec<Value> {
    let policy = json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "SharingPolicy", "metadata": {"name": POLICY},
        "spec": {"tiers": [
            {"name": "external", "modes": ["MIG", "Exclusive"], "coLocation": "Forbidden", "scrubMemory": "Always"},
            {"name": "internal", "modes": ["MIG", "MPS", "Exclusive"], "coLocation": "SameTier", "scrubMemory": "OnTenantChange"},
            {"name": "experimental", "modes": ["MIG", "MPS", "TimeSlicing", "Exclusive"], "coLocation": "SameTier", "scrubMemory": "OnTenantChange"}],
          "memoryHeadroomPercent": 10, "mps": {"maxClientsPerGpu": 48}, "timeSlicing": {"maxReplicas": 16}, "topology": "Preferred"}});
    let plans = vec![
        rollout_plan(&ROLLOUT_BEFORE),
        plan(
            Pool::H100Mig,
            json!([
                {"devices": "0-3", "mode": "MIG", "mig": {"profiles": ["3g.40gb", "2g.20gb", "2g.20gb"]}},
                {"devices": "4,5", "mode": "MIG", "mig": {"profiles": ["1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb"]}},
                {"devices": "6-7", "mode": "Exclusive"}]),
            json!({"maxUnavailable": "20%", "busyGpuPolicy": "Wait"}),
        ),
        plan(
            Pool::A100Mps,
            json!([{"devices": "all", "mode": "MPS", "mps": {"maxClients": 4, "activeThreadPercentage": 25, "pinnedMemoryLimit": "10Gi"}}]),
            json!({"maxUnavailable": "20%"}),
        ),
        plan(
            Pool::H200TimeSlicing,
            json!([{"devices": "all", "mode": "TimeSlicing", "timeSlicing": {"replicas": 4}}]),
            json!({"maxUnavailable": "20%"}),
        ),
        plan(
            Pool::H200Exclusive,
            json!([{"devices": "all", "mode": "Exclusive"}]),
            json!({"maxUnavailable": "20%"}),
        ),
    ];
    let mut rng = Rng::new(seed);
    let mut out = vec![policy];
    out.extend(plans);
    out.extend((0..tenants).map(|t| tenant(t, &mut rng)));
    out
}

/// Name of tenant `t`.
pub fn tenant_name(t: usize) -> String {
    format!("fleet-t{t:04}")
}

fn tenant(t: usize, rng: &mut Rng) -> Value {
    let mut between = |lo: u64, hi: u64| lo + rng.below(hi - lo + 1);
    let (tier, resources) = match t % 3 {
        0 => (
            "external",
            json!([
                {"mode": "MIG", "profile": "3g.40gb", "count": between(1, 6)},
                {"mode": "MIG", "profile": "1g.10gb", "count": between(2, 10)},
                {"mode": "Exclusive", "count": between(1, 4)}]),
        ),
        1 => (
            "internal",
            json!([
                {"mode": "MPS", "count": between(10, 40)},
                {"mode": "MIG", "profile": "2g.20gb", "count": between(2, 12)},
                {"mode": "Exclusive", "count": between(1, 4)}]),
        ),
        _ => (
            "experimental",
            json!([
                // One shared mode per tenant (the device plugin counts both as gpu.shared).
                {"mode": "TimeSlicing", "count": between(4, 20)},
                {"mode": "MIG", "profile": "2g.20gb", "count": between(2, 10)},
                {"mode": "MIG", "profile": "1g.10gb", "count": between(2, 10)},
                {"mode": "Exclusive", "count": between(1, 4)}]),
        ),
    };
    let name = tenant_name(t);
    json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuTenant", "metadata": {"name": name},
        "spec": {"tier": tier, "policyRef": POLICY, "namespaces": [format!("{name}-prod"), format!("{name}-dev")],
                 "priority": if t.is_multiple_of(7) { 10 } else { 0 }, "weight": 1 + (t % 3) as u32, "resources": resources}})
}

/// An inventory file (`gpu-tenancy plan --inventory`) of nodes `0..nodes`.
pub fn inventory(nodes: usize) -> Value {
    let nodes: Vec<Value> = (0..nodes)
        .map(|i| {
            let n = node(i);
            json!({"name": n.name, "labels": n.labels,
                   "gpus": [{"pciDeviceId": n.model.pci_device_id(), "count": GPUS_PER_NODE / 2, "numaNode": 0},
                            {"pciDeviceId": n.model.pci_device_id(), "count": GPUS_PER_NODE / 2, "numaNode": 1}]})
        })
        .collect();
    json!({ "nodes": nodes })
}
