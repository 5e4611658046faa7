//! The capacity pools a pass takes from: each kind of capacity (MIG profile, exclusive GPUs by
//! NUMA domain, MPS or time-slicing GPUs), open or dedicated to tenants, with what is still free.
//! [`super::template`] makes them for each pass.

use super::units::{Family, GpuRef};
use crate::api::{CoLocation, Mode};
use crate::policy::TenantProfile;
use foldhash::HashMap;
use std::collections::{BTreeMap, BTreeSet};

pub(super) struct MigPool {
    /// (GPU, instance position in its spec).
    pub(super) slots: Vec<(GpuRef, u32)>,
    /// Memory of one instance for the tenants' memory limits: as the driver reports the profile
    /// (GpuNode status), else from the model's table (never above the GPU's memory), else the
    /// profile name's nominal size; the largest over the pool's GPUs, so a limit is never exceeded.
    pub(super) unit_mib: u64,
    /// Slot indices in the order grants use them: plan order, and when placing from the current
    /// bindings, instances nobody holds now first.
    pub(super) order: Vec<usize>,
    pub(super) taken: Vec<bool>,
    /// Entries of `order` before this one are all taken.
    pub(super) next: usize,
    pub(super) free: usize,
}

#[derive(Clone)]
pub(super) struct SharedGpu {
    pub(super) at: GpuRef,
    /// Its position in the cell's GPUs (`Scope::gpus`), where a pass binds it ([`super::bound::Bound`]).
    pub(super) position: u32,
    /// maxClients or replicas of the plan.
    pub(super) setting: u32,
    pub(super) memory_mib: u64,
    pub(super) pinned_mib: Option<u64>,
    /// Shares this GPU offers, fixed by its first tenant's policy (memory headroom).
    pub(super) capacity: Option<u32>,
    pub(super) used: u32,
    /// The tenant (position in the pass's tenants) that opened it: its tier is the GPU's.
    pub(super) opener: Option<usize>,
    /// Taken by a `coLocation: Forbidden` tenant: nobody else may join.
    pub(super) locked: bool,
}

pub(super) enum Pool {
    Mig(MigPool),
    Exclusive(ExclusivePool),
    Shared {
        /// Its position among the pass's pools, in key order ([`super::allocator::TenantState::shares`]).
        id: usize,
        gpus: Vec<SharedGpu>,
        /// GPUs before this index are all in use.
        next_empty: usize,
        /// In-use GPUs with free shares, by the tier using them.
        partial: HashMap<String, Vec<usize>>,
    },
}

impl Pool {
    /// Units still free, for the fair-share split (shared GPUs count at their nominal setting).
    /// Units still free for claimants whose policies keep `headroom_percent` of an MPS GPU's memory.
    pub(super) fn free(&self, family: &Family, headroom_percent: u32) -> u64 {
        match self {
            Pool::Mig(p) => p.free as u64,
            Pool::Exclusive(p) => p.free_gpus(),
            Pool::Shared { gpus, .. } => gpus
                .iter()
                .filter(|g| !g.locked)
                .map(|g| {
                    let capacity = g.capacity.unwrap_or_else(|| g.capacity_under(family, headroom_percent));
                    u64::from(capacity.saturating_sub(g.used))
                })
                .sum(),
        }
    }
}

/// Who uses a shared GPU: a tier, whose tenants alone may join it, or a `coLocation: Forbidden`
/// tenant, which locks it. (Ordered as the tiers first, then the locking tenants, by name.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum GpuUser<'t> {
    Tier(&'t str),
    Locked(&'t str),
}

impl<'t> GpuUser<'t> {
    /// The user of the GPUs `tenant` opens: its tier, or itself where its tier forbids
    /// co-location.
    pub(super) fn of(tenant: &'t TenantProfile) -> GpuUser<'t> {
        if tenant.co_location == CoLocation::Forbidden {
            GpuUser::Locked(&tenant.name)
        } else {
            GpuUser::Tier(&tenant.tier)
        }
    }
}

impl SharedGpu {
    /// The tier using the GPU, of `tenants` (the pass's): none while nobody does.
    pub(super) fn tier<'t>(&self, tenants: &'t [TenantProfile]) -> Option<&'t str> {
        self.opener.map(|t| tenants[t].tier.as_str())
    }

    /// Who uses the GPU, of `tenants` (the pass's): its opener's user ([`GpuUser::of`]), since
    /// only the opener's tier may join it, and nobody a GPU it locks; none while nobody does.
    pub(super) fn user<'t>(&self, tenants: &'t [TenantProfile]) -> Option<GpuUser<'t>> {
        self.opener.map(|t| GpuUser::of(&tenants[t]))
    }

    /// Memory one share stands for: an MPS client is pinned to memory / maxClients by the device
    /// plugin's daemon (the plan's pinnedMemoryLimit may only repeat that value); a time-sliced
    /// share is bookkeeping only (nothing bounds a process's memory there).
    pub(super) fn share_mib(&self) -> u64 {
        self.pinned_mib
            .unwrap_or(self.memory_mib / u64::from(self.setting.max(1)))
    }

    /// Shares the GPU offers under a policy keeping `headroom_percent` of its memory: an MPS GPU
    /// only the clients whose pinned memory fits in the rest; a time-sliced GPU its replicas.
    pub(super) fn capacity_under(&self, family: &Family, headroom_percent: u32) -> u32 {
        let usable = self.memory_mib * u64::from(100 - headroom_percent.min(100)) / 100;
        match family {
            Family::Shared(Mode::Mps) if self.share_mib() > 0 => self.setting.min((usable / self.share_mib()) as u32),
            _ => self.setting,
        }
    }
}

pub(super) struct Domain {
    pub(super) node: u32,
    /// GPU positions still free (nobody holds them now first, when placing from current bindings).
    pub(super) free: Vec<u32>,
}

/// The exclusive GPUs of one pool, by NUMA domain, with the indexes a grant picks from.
#[derive(Default)]
pub(super) struct ExclusivePool {
    domains: Vec<Domain>,
    /// `by_free[c]`: the domains with `c` free GPUs, in domain order.
    by_free: Vec<BTreeSet<usize>>,
    /// Per tenant, the domains it took GPUs from and how many, so its later GPUs join its first.
    by_user: HashMap<usize, BTreeMap<usize, usize>>,
    free_gpus: u64,
}

impl ExclusivePool {
    pub(super) fn len(&self) -> usize {
        self.domains.len()
    }

    pub(super) fn domain(&self, d: usize) -> &Domain {
        &self.domains[d]
    }

    pub(super) fn free_gpus(&self) -> u64 {
        self.free_gpus
    }

    /// The domains tenant `t` took GPUs from, and how many from each.
    pub(super) fn taken_by(&self, t: usize) -> Option<&BTreeMap<usize, usize>> {
        self.by_user.get(&t)
    }

    /// Adds a NUMA domain, filed by its free GPUs.
    pub(super) fn add_domain(&mut self, domain: Domain) {
        let d = self.domains.len();
        self.file(d, domain.free.len());
        self.free_gpus += domain.free.len() as u64;
        self.domains.push(domain);
    }

    pub(super) fn file(&mut self, d: usize, free: usize) {
        if self.by_free.len() <= free {
            self.by_free.resize_with(free + 1, BTreeSet::new);
        }
        self.by_free[free].insert(d);
    }

    /// GPU `gpu` of domain `d` goes to tenant `t`.
    pub(super) fn take(&mut self, d: usize, gpu: u32, t: usize) {
        let before = self.domains[d].free.len();
        self.domains[d].free.retain(|&g| g != gpu);
        let after = self.domains[d].free.len();
        if after == before {
            return;
        }
        self.by_free[before].remove(&d);
        self.file(d, after);
        self.free_gpus -= 1;
        *self.by_user.entry(t).or_default().entry(d).or_default() += 1;
    }

    /// Domains with at least `min` free GPUs, fewest free first (then domain order).
    pub(super) fn fullest_first(&self, min: usize) -> impl Iterator<Item = usize> + '_ {
        self.by_free.iter().skip(min.max(1)).flat_map(|set| set.iter().copied())
    }

    /// Domains with free GPUs, most free first (then domain order).
    pub(super) fn emptiest_first(&self) -> impl Iterator<Item = usize> + '_ {
        self.by_free.iter().skip(1).rev().flat_map(|set| set.iter().copied())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::fixtures::{TenantBuilder, policy};
    use crate::policy::check_tenants;

    /// A shared GPU is used by its opener's tier, or by its opener alone where the opener's tier
    /// forbids co-location (`external`): the rule the sticky placing and its stability check
    /// count GPUs by.
    #[test]
    fn a_shared_gpu_is_used_by_its_openers_tier_or_locked_by_it() {
        let tenants = [
            TenantBuilder::new("ext", "external").want(Mode::Mps, 1).build(),
            TenantBuilder::new("int", "internal").want(Mode::Mps, 1).build(),
        ];
        let profiles = check_tenants(&[policy()], &tenants, &Default::default()).valid;
        let gpu = |opener: Option<usize>| SharedGpu {
            at: (0, 0),
            position: 0,
            setting: 4,
            memory_mib: 40_960,
            pinned_mib: None,
            capacity: opener.map(|_| 4),
            used: opener.map_or(0, |_| 1),
            opener,
            locked: opener == Some(0),
        };
        assert_eq!(GpuUser::of(&profiles[0]), GpuUser::Locked("ext"));
        assert_eq!(GpuUser::of(&profiles[1]), GpuUser::Tier("internal"));
        assert_eq!(gpu(None).user(&profiles), None);
        assert_eq!(gpu(Some(0)).user(&profiles), Some(GpuUser::Locked("ext")));
        assert_eq!(gpu(Some(1)).user(&profiles), Some(GpuUser::Tier("internal")));
    }
}
