//! Small builders of policies, tenants, plans and nodes for the planner's tests and those of the
//! crates built on it (feature `test-support`).

use crate::api::*;
use crate::inventory::{NodeGpu, NodeInventory};
use crate::mig::model_by_name;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::BTreeMap;

/// Tenants as the planner reads them: shared, as the controller's stores hold them.
pub fn shared(tenants: &[GpuTenant]) -> Vec<std::sync::Arc<GpuTenant>> {
    tenants.iter().cloned().map(std::sync::Arc::new).collect()
}

pub fn now() -> Time {
    Time(jiff::Timestamp::from_second(1_700_000_000).unwrap())
}

pub fn policy() -> SharingPolicy {
    let tier = |name: &str, modes: &[Mode], co: CoLocation, scrub: ScrubMemory| Tier {
        name: name.into(),
        modes: modes.to_vec(),
        co_location: co,
        scrub_memory: scrub,
        memory_caps: Default::default(),
        pod_security: Default::default(),
        priority_class_names: vec![],
        idle_lending_percent: None,
    };
    SharingPolicy::new(
        "default",
        SharingPolicySpec {
            tiers: vec![
                tier(
                    "external",
                    &[Mode::Mig, Mode::Exclusive, Mode::Mps],
                    CoLocation::Forbidden,
                    ScrubMemory::Always,
                ),
                tier(
                    "internal",
                    &[Mode::Mig, Mode::Mps, Mode::Exclusive],
                    CoLocation::SameTier,
                    ScrubMemory::OnTenantChange,
                ),
                tier("experimental", &Mode::ALL, CoLocation::SameTier, ScrubMemory::Never),
            ],
            memory_headroom_percent: Some(10),
            mps: None,
            time_slicing: None,
            topology: Some(TopologyPolicy::Preferred),
        },
    )
}

pub struct TenantBuilder(GpuTenant);

impl TenantBuilder {
    pub fn new(name: &str, tier: &str) -> Self {
        TenantBuilder(GpuTenant::new(
            name,
            GpuTenantSpec {
                tier: tier.into(),
                policy_ref: "default".into(),
                namespaces: vec![name.to_string()],
                priority: 0,
                weight: 1,
                resources: vec![],
                limits: None,
            },
        ))
    }
    pub fn mig(mut self, profile: &str, count: u32) -> Self {
        self.0.spec.resources.push(ResourceRequest {
            mode: Mode::Mig,
            profile: Some(profile.into()),
            count,
        });
        self
    }
    pub fn want(mut self, mode: Mode, count: u32) -> Self {
        self.0.spec.resources.push(ResourceRequest {
            mode,
            profile: None,
            count,
        });
        self
    }
    pub fn priority(mut self, p: i32) -> Self {
        self.0.spec.priority = p;
        self
    }
    pub fn weight(mut self, w: u32) -> Self {
        self.0.spec.weight = w;
        self
    }
    pub fn memory(mut self, q: &str) -> Self {
        self.0.spec.limits = Some(TenantLimits {
            max_gpus_per_pod: None,
            memory: Some(q.into()),
        });
        self
    }
    pub fn build(self) -> GpuTenant {
        self.0
    }
}

pub fn group(devices: &str, mode: Mode) -> GpuGroup {
    GpuGroup {
        devices: devices.into(),
        mode,
        mig: None,
        mps: (mode == Mode::Mps).then(MpsSettings::default),
        time_slicing: (mode == Mode::TimeSlicing).then_some(TimeSlicingSettings { replicas: 4 }),
        tenants: vec![],
    }
}

pub fn mig_group(devices: &str, profiles: &[&str]) -> GpuGroup {
    GpuGroup {
        mig: Some(MigSettings {
            profiles: profiles.iter().map(|s| s.to_string()).collect(),
        }),
        ..group(devices, Mode::Mig)
    }
}

pub fn plan_for(name: &str, pool: &str, gpus: Vec<GpuGroup>) -> GpuPartitionPlan {
    GpuPartitionPlan::new(
        name,
        GpuPartitionPlanSpec {
            node_selector: LabelSelector {
                match_labels: Some(BTreeMap::from([("pool".to_string(), pool.to_string())])),
                match_expressions: None,
            },
            priority: 0,
            gpus,
            rollout: None,
            device_access: Default::default(),
        },
    )
}

pub fn node(name: &str, pool: &str, model: &str, count: u32, numa_split: bool) -> NodeInventory {
    let model = model_by_name(model).unwrap();
    NodeInventory {
        name: name.into(),
        labels: BTreeMap::from([("pool".to_string(), pool.to_string())]),
        gpus: (0..count)
            .map(|i| NodeGpu {
                index: i,
                model: Some(model),
                name: model.name().into(),
                memory_mib: model.memory_mib,
                numa_node: if numa_split && i >= count / 2 { 1 } else { 0 },
                uuid: Some(format!("GPU-{name}-{i}")),
                ..NodeGpu::default()
            })
            .collect(),
        reported: true,
        current: None,
        revision: None,
    }
}
