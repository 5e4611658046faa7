//! The allocation's words: the families of capacity, a pool's key, a unit by its position, what
//! a tenant received (in all and in one cell) and why a request fell short. Every other part of
//! the allocation reads them; they read nothing of it.

use crate::api::{AllocationSummary, Grant, Grants, Mode};
use std::collections::BTreeMap;

/// What one tenant received.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TenantGrants {
    /// Sorted by node, GPU and placement.
    pub grants: Grants,
    /// One entry per request, in request order.
    pub allocation: Vec<AllocationSummary>,
    pub memory_mib: u64,
    /// Why requests fell short, one sentence each.
    pub shortfalls: Vec<String>,
}

/// Every tenant's grants, by name (hashed: a pass builds it for every tenant, and the statuses
/// look each tenant up once).
pub type GrantsByTenant = foldhash::HashMap<String, TenantGrants>;

/// What one tenant received in one cell: its grants a list of their own, moved (not copied) into
/// the tenant's merged [`TenantGrants`] when the cell is placed in this pass.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct CellGrants {
    pub(super) grants: Vec<Grant>,
    /// One entry per request of the tenant in the cell, in request order.
    pub(super) allocation: Vec<AllocationSummary>,
    pub(super) memory_mib: u64,
    pub(super) shortfalls: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Family {
    Mig(String),
    Exclusive,
    Shared(Mode),
}

impl Family {
    pub(super) fn of(mode: Mode, profile: Option<&str>) -> Family {
        match mode {
            Mode::Mig => Family::Mig(profile.unwrap_or_default().to_string()),
            Mode::Exclusive => Family::Exclusive,
            m => Family::Shared(m),
        }
    }

    /// Whether a request of `mode` (and MIG `profile`) draws from this family: [`Family::of`]
    /// without building one.
    pub(super) fn is(&self, mode: Mode, profile: Option<&str>) -> bool {
        match (self, mode) {
            (Family::Mig(p), Mode::Mig) => p == profile.unwrap_or_default(),
            (Family::Exclusive, Mode::Exclusive) => true,
            (Family::Shared(m), _) => *m == mode,
            _ => false,
        }
    }

    pub(super) fn label(&self) -> String {
        match self {
            Family::Mig(p) => format!("MIG {p}"),
            Family::Exclusive => "Exclusive GPUs".into(),
            Family::Shared(m) => format!("{m} shares"),
        }
    }
}

/// (node position, GPU position in the node's spec list).
pub(super) type GpuRef = (u32, u32);

/// A unit a tenant received, by position: a pass that is not kept never builds its grants.
#[derive(Clone, Copy, Debug)]
pub(super) enum Unit {
    /// A MIG instance: its GPU and its position in the GPU's instance list.
    Instance(GpuRef, u32),
    /// An exclusive GPU.
    Gpu(GpuRef),
}

/// Capacity of one kind, open (no tenants) or dedicated to the tenants listed.
pub(super) type PoolKey = (Family, Vec<String>);

/// Per tenant: units received per (request, pool).
pub(super) type Targets = BTreeMap<(usize, PoolKey), u32>;

/// Per tenant and request: why it fell short, if it did.
pub(super) type Reasons = Vec<Vec<Option<Shortfall>>>;

/// Why a tenant got less than it asked.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Shortfall {
    Capacity {
        available: u64,
        demand: u64,
        tenants: usize,
        priority: i32,
    },
    Memory {
        limit_mib: u64,
    },
    Topology {
        count: u32,
    },
    Rules,
}
