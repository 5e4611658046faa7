//! Valid objects of each kind, the base that the tests mutate (field names: docs/design.md#resources and
//! the CRDs in crds/).

use gpu_tenancy_e2e::{GROUP, VERSION};
use serde_json::{Value, json};

/// A valid object of `kind` named `name`.
pub fn valid(kind: &str, name: &str) -> Value {
    let spec = match kind {
        "SharingPolicy" => json!({
            "tiers": [
                {"name": "external", "modes": ["MIG", "Exclusive"], "coLocation": "Forbidden", "scrubMemory": "Always", "memoryCaps": "Required"},
                {"name": "internal", "modes": ["MIG", "MPS", "Exclusive"], "coLocation": "SameTier", "scrubMemory": "OnTenantChange",
                 "podSecurity": "Baseline", "priorityClassNames": ["batch-low"], "idleLendingPercent": 50},
                {"name": "experimental", "modes": ["MIG", "MPS", "TimeSlicing", "Exclusive"], "coLocation": "SameTier", "scrubMemory": "OnTenantChange"}
            ],
            "memoryHeadroomPercent": 10,
            "mps": {"maxClientsPerGpu": 48},
            "timeSlicing": {"maxReplicas": 16},
            "topology": "Preferred"
        }),
        "GpuTenant" => json!({
            "tier": "external",
            "policyRef": "default",
            "namespaces": ["alpha-prod", "alpha-dev"],
            "priority": 0,
            "weight": 1,
            "resources": [
                {"mode": "MIG", "profile": "3g.40gb", "count": 2},
                {"mode": "Exclusive", "count": 1},
                {"mode": "MPS", "count": 4},
                {"mode": "TimeSlicing", "count": 2}
            ],
            "limits": {"maxGpusPerPod": 2, "memory": "160Gi"}
        }),
        "GpuPartitionPlan" => json!({
            "nodeSelector": {
                "matchLabels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                "matchExpressions": [{"key": "nvidia.com/gpu.count", "operator": "Exists"}]
            },
            "priority": 0,
            "gpus": [
                {"devices": "0-3", "mode": "MIG", "mig": {"profiles": ["3g.40gb", "2g.20gb", "2g.20gb"]}},
                {"devices": "4,5", "mode": "MPS", "mps": {"maxClients": 4, "activeThreadPercentage": 25, "pinnedMemoryLimit": "20Gi"}, "tenants": ["team-beta"]},
                {"devices": "6", "mode": "TimeSlicing", "timeSlicing": {"replicas": 4}},
                {"devices": "7", "mode": "Exclusive"}
            ],
            "rollout": {"maxUnavailable": 1, "busyGpuPolicy": "Wait"},
            "deviceAccess": "DevicePlugin"
        }),
        "GpuNode" => json!({
            "plan": "h100-mixed",
            "deviceAccess": "DRA",
            "busyGpuPolicy": "Wait",
            "gpus": [
                {"index": 0, "mode": "MIG", "scrub": "Always",
                 "migInstances": [{"profile": "3g.40gb", "placement": {"start": 0, "size": 4}}]},
                {"index": 1, "mode": "MPS", "mps": {"maxClients": 4, "activeThreadPercentage": 25, "pinnedMemoryLimit": "20Gi"},
                 "tenants": ["team-beta"], "shares": [{"tenant": "team-beta", "count": 4}]},
                {"index": 2, "mode": "TimeSlicing", "timeSlicing": {"replicas": 4}, "memoryCaps": "Required"},
                {"index": 3, "mode": "Exclusive"}
            ]
        }),
        other => panic!("no fixture for kind {other}"),
    };
    json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": kind,
        "metadata": {"name": name},
        "spec": spec,
    })
}
