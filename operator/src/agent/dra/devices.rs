//! The devices a node publishes in DRA mode, from its GpuNode alone (pure): every whole GPU,
//! every MIG instance and every MPS or time-slicing share, each with the tenant the spec binds it
//! to, and why it may not be handed over yet when it may not.
//!
//! **Shares are devices, one per share**, not consumable capacity of one device per GPU: a GPU
//! shared by two tenants needs a device per tenant anyway (a device has one `tenant`), and with
//! one device per share the scheduler's own counting keeps a tenant granted 3 shares of a GPU to
//! 3 claims of it, with no capacity rules of ours (consumable capacity is beta in 1.37). A share's
//! name holds its tenant (a hash of it) and its number among that tenant's shares, so a share
//! keeps its name when other tenants' counts change: a prepared claim never ends up naming
//! another tenant's share.

use crate::api::{
    DeviceAccess, GpuNode, GpuNodeStatus, GpuReason, GpuSpec, GpuStatus, MemoryCapMethod, MigInstanceSpec, Mode,
    MpsSettings, Placement, ScrubMemory, Unhealthy,
};
use gpu_tenancy_core::memory_caps;

pub use crate::dra::DRIVER;

/// What a device is on its GPU.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Unit {
    /// The whole GPU (Exclusive).
    Gpu,
    /// A MIG instance at this placement.
    Instance(Placement),
    /// Share number `k` of a tenant on an MPS or time-sliced GPU.
    Share { k: u32 },
}

/// Why a device may not be handed over now: published with a device taint, so the scheduler does
/// not pick it, and refused by Prepare.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NotReady {
    /// The spec binds it to no tenant.
    NoTenant,
    /// The agent has not read the GPU yet, or reports nothing for the unit: its previous owner
    /// is unknown.
    Unknown,
    /// The GPU does not match the spec yet.
    NotApplied,
    /// Handed to its tenant in the spec, not yet scrubbed for it.
    ScrubPending,
    /// Processes run on the GPU that the spec is to change.
    Busy,
    /// A time-sliced share the node cannot cap in memory, of a tier whose `memoryCaps` is
    /// `Required`.
    NoMemoryCap,
}

impl NotReady {
    /// The value of the device taint `gputenancy.io/not-ready`.
    pub fn as_str(self) -> &'static str {
        match self {
            NotReady::NoTenant => "NoTenant",
            NotReady::Unknown => "Unknown",
            NotReady::NotApplied => "NotApplied",
            NotReady::ScrubPending => "ScrubPending",
            NotReady::Busy => "Busy",
            NotReady::NoMemoryCap => "NoMemoryCap",
        }
    }
}

/// One device of the node's pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DraDevice {
    /// Its name in the ResourceSlice (a DNS label).
    pub name: String,
    /// Index of its GPU.
    pub gpu: u32,
    pub unit: Unit,
    pub mode: Mode,
    pub tenant: Option<String>,
    /// The MIG profile of an instance.
    pub profile: Option<String>,
    /// The device's own UUID: the GPU's, a MIG device's; a share's is its GPU's.
    pub uuid: Option<String>,
    /// The GPU's UUID, for MIG instances and shares.
    pub parent_uuid: Option<String>,
    pub product_name: String,
    pub numa_node: Option<i32>,
    /// Memory it gives a claim: the GPU's, the instance's, a share's part of its GPU.
    pub memory_mib: u64,
    /// The GPU's MPS settings (an MPS share's limits come from them).
    pub mps: Option<MpsSettings>,
    /// What caps a share's memory (`memory_mib`): the node's status says, per GPU; `None` for
    /// whole GPUs and MIG instances, whose memory is theirs alone.
    pub memory_cap: Option<MemoryCapMethod>,
    /// When its memory is cleared between claims (the strictest of its GPU's tenants).
    pub scrub: ScrubMemory,
    pub not_ready: Option<NotReady>,
    /// Why it is unhealthy (its GPU's or its own error, docs/concepts/health.md): published as
    /// the device taint `gputenancy.io/unhealthy`, refused by Prepare, and streamed to the
    /// kubelet for the status of the pods that have it.
    pub unhealthy: Option<Unhealthy>,
    /// The GPU's minor number (`/dev/nvidia<minor>`).
    pub minor: Option<u32>,
    /// A MIG instance's GPU instance and compute instance IDs (its capability device nodes).
    pub instance_ids: Option<(u32, u32)>,
}

/// 32-bit FNV-1a, as 8 hex digits: a tenant's mark in its shares' names (tenant names are up to
/// 63 characters, more than a device name has room for beside the rest).
fn mark(tenant: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in tenant.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("{h:08x}")
}

/// The device name of a unit of GPU `gpu`.
pub fn device_name(gpu: u32, unit: &Unit, mode: Mode, tenant: Option<&str>) -> String {
    match unit {
        Unit::Gpu => format!("gpu-{gpu}"),
        Unit::Instance(p) => format!("gpu-{gpu}-mig-{}-{}", p.start, p.size),
        Unit::Share { k } => format!(
            "gpu-{gpu}-{}-{}-{k}",
            if mode == Mode::Mps { "mps" } else { "ts" },
            mark(tenant.unwrap_or_default())
        ),
    }
}

/// Why the whole GPU (or its shares) may not be handed over now, from its status.
fn gpu_not_ready(spec: &GpuSpec, status: Option<&GpuStatus>, tenant: Option<&str>) -> Option<NotReady> {
    let Some(tenant) = tenant else {
        return Some(NotReady::NoTenant);
    };
    let Some(st) = status else {
        return Some(NotReady::Unknown);
    };
    match st.reason {
        Some(GpuReason::Busy) => return Some(NotReady::Busy),
        Some(GpuReason::ScrubPending | GpuReason::ScrubFailed) => return Some(NotReady::ScrubPending),
        _ => {}
    }
    if st.applied != Some(true) || st.applied_mode != Some(spec.mode) {
        return Some(NotReady::NotApplied);
    }
    // Handed over only once the agent records the tenant as applied (after its scrub).
    (!st.applied_tenants.iter().any(|t| t == tenant)).then_some(NotReady::ScrubPending)
}

/// The devices of `node`, in a stable order (GPU index, then unit); none unless its spec says
/// `deviceAccess: DRA`: on a device-plugin node NVIDIA's plugin hands the GPUs out, and a device
/// the scheduler could also allocate would be handed out twice.
pub fn devices(node: &GpuNode) -> Vec<DraDevice> {
    if node.spec.device_access != DeviceAccess::Dra {
        return vec![];
    }
    let status = node.status.as_ref();
    let current = status.is_some_and(|s| s.observed_generation == node.metadata.generation);
    let mut out = Vec::new();
    for spec in &node.spec.gpus {
        let gpu = GpuView {
            spec,
            st: status.and_then(|s| s.gpus.iter().find(|g| g.index == spec.index)),
            status,
            current,
        };
        match spec.mode {
            Mode::Exclusive => out.push(gpu.whole()),
            Mode::Mig => out.extend(spec.mig_instances.iter().map(|inst| gpu.instance(inst))),
            Mode::Mps | Mode::TimeSlicing => gpu.shares(&mut out),
        }
    }
    out
}

/// One GPU of a node's spec, with what its status says of it.
struct GpuView<'a> {
    spec: &'a GpuSpec,
    st: Option<&'a GpuStatus>,
    status: Option<&'a GpuNodeStatus>,
    /// Whether the status reports on the spec's generation.
    current: bool,
}

impl GpuView<'_> {
    /// A device of this GPU, with what the GPU's status says of it.
    fn device(&self, unit: Unit, tenant: Option<String>, not_ready: Option<NotReady>) -> DraDevice {
        let (spec, st) = (self.spec, self.st);
        DraDevice {
            name: device_name(spec.index, &unit, spec.mode, tenant.as_deref()),
            gpu: spec.index,
            unit,
            mode: spec.mode,
            tenant,
            profile: None,
            uuid: st.map(|g| g.uuid.clone()).filter(|u| !u.is_empty()),
            parent_uuid: None,
            product_name: st.map(|g| g.name.clone()).unwrap_or_default(),
            numa_node: st.and_then(|g| g.numa_node),
            memory_mib: st.map_or(0, |g| g.memory_mib),
            mps: spec.mps.clone(),
            memory_cap: None,
            scrub: spec.scrub,
            // A spec the agent has not reported on yet: nothing is known to match it.
            not_ready: not_ready.or((!self.current).then_some(NotReady::NotApplied)),
            unhealthy: st.and_then(|g| g.unhealthy.clone()),
            minor: st.and_then(|g| g.minor_number),
            instance_ids: None,
        }
    }

    /// An exclusive GPU: one device, its tenant's.
    fn whole(&self) -> DraDevice {
        let tenant = self.spec.tenants.first().cloned();
        let nr = gpu_not_ready(self.spec, self.st, tenant.as_deref());
        self.device(Unit::Gpu, tenant, nr)
    }

    /// A MIG instance of the spec, ready once the instance found there is its tenant's.
    fn instance(&self, inst: &MigInstanceSpec) -> DraDevice {
        let st = self.st;
        let found = st.and_then(|g| {
            g.instances
                .iter()
                .find(|i| i.placement == inst.placement && i.profile == inst.profile)
        });
        let nr = match (&inst.tenant, found) {
            (None, _) => Some(NotReady::NoTenant),
            (Some(_), None) => Some(NotReady::NotApplied),
            (Some(t), Some(f)) if f.tenant.as_ref() != Some(t) => Some(NotReady::ScrubPending),
            (Some(_), Some(f)) if f.uuid.is_none() => Some(NotReady::Unknown),
            _ => st.and_then(|g| (g.reason == Some(GpuReason::Busy)).then_some(NotReady::Busy)),
        };
        let mut d = self.device(Unit::Instance(inst.placement), inst.tenant.clone(), nr);
        d.profile = Some(inst.profile.clone());
        d.parent_uuid = d.uuid.take();
        d.uuid = found.and_then(|f| f.uuid.clone());
        d.instance_ids = found.map(|f| (f.gpu_instance_id, f.compute_instance_id.unwrap_or(0)));
        d.unhealthy = d.unhealthy.or_else(|| found.and_then(|f| f.unhealthy.clone()));
        d.memory_mib = st
            .zip(self.status)
            .and_then(|(g, s)| s.profiles_of(g).iter().find(|p| p.name == inst.profile))
            .map_or(0, |p| p.memory_mib);
        d
    }

    /// An MPS or time-sliced GPU: one device per share, each with its part of the memory and
    /// what caps it.
    fn shares(&self, out: &mut Vec<DraDevice>) {
        let spec = self.spec;
        let cap = self.memory_cap();
        let uncapped = (!memory_caps::may_hand_out(spec.mode, cap, spec.memory_caps)).then_some(NotReady::NoMemoryCap);
        for share in &spec.shares {
            let nr = gpu_not_ready(spec, self.st, Some(&share.tenant)).or(uncapped);
            for k in 0..share.count {
                let mut d = self.device(Unit::Share { k }, Some(share.tenant.clone()), nr);
                d.parent_uuid = d.uuid.clone();
                d.memory_mib = memory_caps::share_mib(spec, d.memory_mib);
                d.memory_cap = Some(cap);
                out.push(d);
            }
        }
    }

    /// What caps this GPU's shares, as the status says; where it says nothing, the fallback
    /// that needs nothing of the node (fail closed): the agent's MPS daemon for MPS, none for
    /// time-slicing.
    fn memory_cap(&self) -> MemoryCapMethod {
        let said = self
            .status
            .and_then(|s| s.memory_caps.iter().find(|c| c.index == self.spec.index));
        match (said, self.spec.mode) {
            (Some(c), _) => c.method,
            (None, Mode::Mps) => MemoryCapMethod::MpsDaemon,
            (None, _) => MemoryCapMethod::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{GpuNodeSpec, MigInstanceStatus, MigProfileStatus};

    fn node() -> GpuNode {
        let mut n = GpuNode::new(
            "n1",
            GpuNodeSpec {
                gpus: vec![
                    GpuSpec::mig(
                        0,
                        vec![
                            MigInstanceSpec::new("3g.40gb", 0, 4).for_tenant("a"),
                            MigInstanceSpec::new("3g.40gb", 4, 4).for_tenant("b"),
                        ],
                    )
                    .with_scrub(ScrubMemory::Always),
                    GpuSpec::mps(1, 4)
                        .with_tenants(&["a", "b"])
                        .with_shares(&[("a", 3), ("b", 1)])
                        .with_scrub(ScrubMemory::OnTenantChange),
                ]
                .into(),
                device_access: DeviceAccess::Dra,
                ..Default::default()
            },
        );
        n.metadata.generation = Some(3);
        n.status = Some(GpuNodeStatus {
            observed_generation: Some(3),
            gpus: vec![
                GpuStatus {
                    index: 0,
                    uuid: "GPU-0".into(),
                    name: "NVIDIA H100 80GB HBM3".into(),
                    memory_mib: 81559,
                    applied: Some(true),
                    applied_mode: Some(Mode::Mig),
                    profiles: vec![MigProfileStatus {
                        name: "3g.40gb".into(),
                        memory_mib: 40448,
                        ..Default::default()
                    }],
                    instances: vec![
                        MigInstanceStatus {
                            profile: "3g.40gb".into(),
                            placement: Placement { start: 0, size: 4 },
                            uuid: Some("MIG-a".into()),
                            tenant: Some("a".into()),
                            ..Default::default()
                        },
                        // Still the previous tenant's: not scrubbed for b yet.
                        MigInstanceStatus {
                            profile: "3g.40gb".into(),
                            placement: Placement { start: 4, size: 4 },
                            uuid: Some("MIG-b".into()),
                            tenant: Some("old".into()),
                            ..Default::default()
                        },
                    ],
                    ..Default::default()
                },
                GpuStatus {
                    index: 1,
                    uuid: "GPU-1".into(),
                    name: "NVIDIA H100 80GB HBM3".into(),
                    memory_mib: 81559,
                    applied: Some(true),
                    applied_mode: Some(Mode::Mps),
                    applied_tenants: vec!["a".into(), "b".into()],
                    ..Default::default()
                },
            ],
            ..Default::default()
        });
        n
    }

    /// A node whose spec says DevicePlugin publishes nothing, whatever its GPUs: NVIDIA's plugin
    /// serves them there.
    #[test]
    fn a_device_plugin_node_has_no_dra_devices() {
        let mut n = node();
        n.spec.device_access = DeviceAccess::DevicePlugin;
        assert!(devices(&n).is_empty());
    }

    /// Every instance and share with its tenant, exactly the spec's counts, and an instance not
    /// yet scrubbed for its new tenant marked so.
    #[test]
    fn devices_follow_the_spec_exactly() {
        let d = devices(&node());
        let summary: Vec<(&str, Option<&str>, Option<NotReady>, u64)> = d
            .iter()
            .map(|d| (d.name.as_str(), d.tenant.as_deref(), d.not_ready, d.memory_mib))
            .collect();
        let (a, b) = (mark("a"), mark("b"));
        let names = [
            "gpu-0-mig-0-4".to_string(),
            "gpu-0-mig-4-4".to_string(),
            format!("gpu-1-mps-{a}-0"),
            format!("gpu-1-mps-{a}-1"),
            format!("gpu-1-mps-{a}-2"),
            format!("gpu-1-mps-{b}-0"),
        ];
        assert_eq!(
            summary,
            [
                (names[0].as_str(), Some("a"), None, 40448),
                (names[1].as_str(), Some("b"), Some(NotReady::ScrubPending), 40448),
                (names[2].as_str(), Some("a"), None, 20389),
                (names[3].as_str(), Some("a"), None, 20389),
                (names[4].as_str(), Some("a"), None, 20389),
                (names[5].as_str(), Some("b"), None, 20389),
            ]
        );
        assert_eq!(d[0].uuid.as_deref(), Some("MIG-a"));
        assert_eq!(d[0].parent_uuid.as_deref(), Some("GPU-0"));
        assert_eq!(d[2].parent_uuid.as_deref(), Some("GPU-1"));
        assert!(names.iter().all(|n| n.len() <= 63));
    }

    /// A share keeps its name when another tenant's count changes.
    #[test]
    fn a_share_keeps_its_name_when_others_change() {
        let mut n = node();
        let before: Vec<String> = devices(&n)
            .into_iter()
            .filter(|d| d.tenant.as_deref() == Some("b"))
            .map(|d| d.name)
            .collect();
        n.spec.gpus[1].shares[0].count = 1;
        let after: Vec<String> = devices(&n)
            .into_iter()
            .filter(|d| d.tenant.as_deref() == Some("b"))
            .map(|d| d.name)
            .collect();
        assert_eq!(before, after);
    }

    /// A spec the agent has not reported on, a GPU it has not read, a busy GPU: none is handed over.
    #[test]
    fn what_is_not_known_is_not_ready() {
        let mut n = node();
        n.metadata.generation = Some(4);
        assert!(devices(&n).iter().all(|d| d.not_ready.is_some()));
        let mut n = node();
        n.status.as_mut().unwrap().gpus.remove(1);
        assert!(
            devices(&n)
                .iter()
                .filter(|d| d.gpu == 1)
                .all(|d| d.not_ready == Some(NotReady::Unknown))
        );
        let mut n = node();
        n.status.as_mut().unwrap().gpus[1].reason = Some(GpuReason::Busy);
        assert!(
            devices(&n)
                .iter()
                .filter(|d| d.gpu == 1)
                .all(|d| d.not_ready == Some(NotReady::Busy))
        );
    }

    /// A share's cap is what the status says of its GPU; where it says nothing, the fallback
    /// that needs nothing of the node. A time-sliced share nothing caps is not ready under a
    /// `Required` tier and is handed out under `BestEffort`.
    #[test]
    fn shares_follow_the_status_memory_caps_and_the_tier_rule() {
        use crate::api::{GpuMemoryCap, MemoryCapPolicy, MemoryCapReason};
        let mut n = node();
        let caps = |d: &[DraDevice]| {
            d.iter()
                .filter(|d| d.gpu == 1)
                .map(|d| d.memory_cap)
                .collect::<Vec<_>>()
        };
        assert_eq!(caps(&devices(&n)), [Some(MemoryCapMethod::MpsDaemon); 4]);
        assert!(
            devices(&n)
                .iter()
                .filter(|d| d.gpu == 0)
                .all(|d| d.memory_cap.is_none())
        );
        n.status.as_mut().unwrap().memory_caps = vec![GpuMemoryCap {
            index: 1,
            method: MemoryCapMethod::Driver,
            reason: None,
            found: None,
        }];
        assert_eq!(caps(&devices(&n)), [Some(MemoryCapMethod::Driver); 4]);

        // GPU 1 time-sliced into 7: 81559 / 7 = 11651 MiB a share, by hand.
        let mut ts = GpuSpec::time_sliced(1, 7)
            .with_tenants(&["a", "b"])
            .with_shares(&[("a", 3), ("b", 1)]);
        ts.scrub = ScrubMemory::OnTenantChange;
        n.spec.gpus = vec![n.spec.gpus[0].clone(), ts].into();
        let st = n.status.as_mut().unwrap();
        st.gpus[1].applied_mode = Some(Mode::TimeSlicing);
        st.memory_caps = vec![GpuMemoryCap {
            index: 1,
            method: MemoryCapMethod::None,
            reason: Some(MemoryCapReason::ToolkitMissing),
            found: None,
        }];
        let shared = |n: &GpuNode| {
            devices(n)
                .into_iter()
                .filter(|d| d.gpu == 1)
                .map(|d| (d.memory_mib, d.memory_cap, d.not_ready))
                .collect::<Vec<_>>()
        };
        assert_eq!(shared(&n), [(11651, Some(MemoryCapMethod::None), None); 4]);
        n.spec.gpus[1].memory_caps = MemoryCapPolicy::Required;
        assert_eq!(
            shared(&n),
            [(11651, Some(MemoryCapMethod::None), Some(NotReady::NoMemoryCap)); 4]
        );
        // A status that says nothing of the GPU: uncapped, so not ready either.
        n.status.as_mut().unwrap().memory_caps.clear();
        assert!(shared(&n).iter().all(|s| s.2 == Some(NotReady::NoMemoryCap)));
    }
}
