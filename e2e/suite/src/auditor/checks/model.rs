//! What a check reads and says: one snapshot of the cluster, a finding with its kind and class,
//! and the lookups every check makes on a snapshot (a tenant's tier, its headroom, a quantity).

use gpu_tenancy::api::{GpuNode, GpuTenant, SharingPolicy, Tier};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;

/// What one snapshot holds.
#[derive(Clone, Default)]
pub struct Snapshot {
    pub gpu_nodes: Vec<GpuNode>,
    pub tenants: Vec<GpuTenant>,
    pub policies: Vec<SharingPolicy>,
    pub nodes: Vec<Node>,
    pub pods: Vec<Pod>,
}

/// The kinds of violation, one per invariant the auditor checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// More instances, clients, tenants or memory on a GPU than it (or its plan's setting) provides.
    Overcommit,
    /// Tenants of different tiers, or a `Forbidden` tenant with another, on a non-MIG GPU; a mode
    /// the tier does not allow.
    TierIsolation,
    /// A GPU or instance reported serving a new tenant without a scrub record for it.
    HandOverWithoutScrub,
    /// A hand-over the agent has not applied while the node lacks the scrub-pending taint.
    ScrubTaintMissing,
    /// A unit in a GpuNode spec that its tenant's status does not list.
    GrantLost,
    /// A unit listed twice, or by a tenant whose GpuNode spec does not give it.
    GrantDoubled,
    /// A pod that exists and breaks its tenant's isolation.
    PodBreaksIsolation,
}

/// How long a finding must last before it is a violation: writes of one controller pass land one
/// after another, so a view across objects may be briefly inconsistent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Within one object, or an event the status reports: a violation at once.
    Instant,
    /// Across objects: a violation once it lasts the grace period.
    Settling,
    /// Grants against specs: held-back rollouts keep old specs on purpose, so it counts only while
    /// every GpuNode and GpuTenant has observed its generation, for the grace period.
    Quiescent,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub kind: Kind,
    pub class: Class,
    /// `Kind/name`.
    pub object: String,
    pub message: String,
}

pub(super) fn f(kind: Kind, class: Class, object: String, message: String) -> Finding {
    Finding {
        kind,
        class,
        object,
        message,
    }
}

/// The tier of a tenant, from its SharingPolicy.
pub(super) fn tier_of<'a>(snap: &'a Snapshot, tenant: &str) -> Option<(&'a GpuTenant, String, &'a Tier)> {
    let t = snap.tenants.iter().find(|t| t.name_any() == tenant)?;
    let p = snap.policies.iter().find(|p| p.name_any() == t.spec.policy_ref)?;
    let tier = p.spec.tiers.iter().find(|x| x.name == t.spec.tier)?;
    Some((t, format!("{}/{}", p.name_any(), tier.name), tier))
}

pub(super) fn headroom_of(snap: &Snapshot, tenant: &str) -> u32 {
    snap.tenants
        .iter()
        .find(|t| t.name_any() == tenant)
        .and_then(|t| snap.policies.iter().find(|p| p.name_any() == t.spec.policy_ref))
        .and_then(|p| p.spec.memory_headroom_percent)
        .unwrap_or(0)
}

/// Bytes of a Kubernetes quantity (`20Gi`, `512Mi`, `1000000`), in MiB.
pub(super) fn quantity_mib(q: &str) -> Option<u64> {
    let units = [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
    ];
    let (num, mult) = units
        .iter()
        .find_map(|(s, m)| q.strip_suffix(s).map(|n| (n, *m)))
        .unwrap_or((q, 1));
    Some(num.trim().parse::<u64>().ok()? * mult / (1 << 20))
}
