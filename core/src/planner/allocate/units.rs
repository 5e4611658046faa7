//! The allocation's words: the families of capacity, a pool's key, a unit by its position, what
//! a tenant received (in all and in one cell) and why a request fell short. Every other part of
//! the allocation reads them; they read nothing of it.

use crate::api::{AllocationSummary, Grant, Grants, Mode};
use std::sync::Arc;

/// What one tenant received.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
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
/// look each tenant up once), each shared: the memo hands the last pass's back to a tenant its
/// change did not reach, and the statuses compare them by address first.
pub type GrantsByTenant = foldhash::HashMap<String, Arc<TenantGrants>>;

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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Unit {
    /// A MIG instance: its GPU and its position in the GPU's instance list.
    Instance(GpuRef, u32),
    /// An exclusive GPU.
    Gpu(GpuRef),
}

/// Capacity of one kind, open (no tenants) or dedicated to the tenants listed.
pub(super) type PoolKey = (Family, Vec<String>);

/// A tenant's shares per shared GPU, by (pool, GPU position in it), in that order: the pool by
/// its position among the pass's pools in key order (`Pool::Shared::id`), so walked in key, then
/// GPU order. A list kept sorted, not a map: a tenant holds shares on a handful of GPUs, looked up
/// at every share a pass places, and GPUs are mostly taken in order (so added at the end).
#[derive(Debug, Default)]
pub(super) struct Shares(Vec<((usize, usize), u32)>);

impl Shares {
    fn search(&self, at: (usize, usize)) -> Result<usize, usize> {
        match self.0.last() {
            Some(&(last, _)) if last < at => Err(self.0.len()),
            _ => self.0.binary_search_by_key(&at, |&(k, _)| k),
        }
    }

    /// Whether the tenant holds shares of GPU `i` of shared pool `id`.
    pub(super) fn holds(&self, id: usize, i: usize) -> bool {
        self.search((id, i)).is_ok()
    }

    /// `n` more shares of GPU `i` of shared pool `id`.
    pub(super) fn add(&mut self, id: usize, i: usize, n: u32) {
        match self.search((id, i)) {
            Ok(at) => self.0[at].1 += n,
            Err(at) => self.0.insert(at, ((id, i), n)),
        }
    }

    /// The GPUs (positions in shared pool `id`) where the tenant holds shares, in order.
    pub(super) fn gpus_in(&self, id: usize) -> impl Iterator<Item = usize> + '_ {
        let start = self.0.partition_point(|&((p, _), _)| p < id);
        self.0[start..]
            .iter()
            .take_while(move |&&((p, _), _)| p == id)
            .map(|&((_, i), _)| i)
    }

    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    /// Every ((pool, GPU), shares), in order.
    pub(super) fn into_entries(self) -> impl Iterator<Item = ((usize, usize), u32)> {
        self.0.into_iter()
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    proptest! {
        /// The sorted list answers as the map it replaced: holdings, GPUs of a pool in order, and
        /// every entry in (pool, GPU) order, whatever order the shares come in.
        #[test]
        fn shares_answer_as_a_map(adds in prop::collection::vec((0usize..3, 0usize..12, 1u32..4), 0..40)) {
            let mut list = Shares::default();
            let mut map: BTreeMap<(usize, usize), u32> = BTreeMap::new();
            for &(id, i, n) in &adds {
                prop_assert_eq!(list.holds(id, i), map.contains_key(&(id, i)));
                list.add(id, i, n);
                *map.entry((id, i)).or_insert(0) += n;
                prop_assert_eq!(list.len(), map.len());
            }
            for id in 0..3 {
                let gpus: Vec<usize> = list.gpus_in(id).collect();
                let want: Vec<usize> = map.range((id, 0)..(id + 1, 0)).map(|(&(_, i), _)| i).collect();
                prop_assert_eq!(gpus, want);
            }
            let entries: Vec<((usize, usize), u32)> = list.into_entries().collect();
            prop_assert_eq!(entries, map.into_iter().collect::<Vec<_>>());
        }
    }
}
