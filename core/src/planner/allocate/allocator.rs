//! One pass of the allocator over a cell's pools: the tenants of a priority level served in turn
//! (capacity dedicated to them, then open capacity by weighted fair share, then what rules kept
//! from some to the others), each grant bound on the cell's GPUs, counted and logged. How a grant
//! picks its units is the pools' own: MIG instances here, exclusive GPUs in [`super::exclusive`],
//! shares in [`super::shared`]; [`super::sticky`] replays a pass's log from what runs now.

use super::bound::Bound;
use super::cell_nodes::CellNodes;
use super::holders::{Current, Placings};
use super::pools::Pool;
use super::scope::Scope;
use super::template::{Held, Template};
use super::units::{Family, GpuRef, PoolKey, Shares, Shortfall, Unit};
use crate::api::Mode;
use crate::mig::nominal_memory_mib;
use crate::planner::fairshare::weighted_fair_share;
use crate::policy::TenantProfile;
use std::collections::BTreeMap;

/// Per tenant: units received per (request, pool).
pub(super) type Targets = BTreeMap<(usize, PoolKey), u32>;

/// Units of request `r` from pool `key` in `targets`, found without building a key: a tenant has
/// an entry or two per request, and a key is a family and a list of names to copy.
pub(super) fn units_in(targets: &Targets, r: usize, key: &PoolKey) -> u32 {
    targets
        .iter()
        .find(|((at, k), _)| *at == r && k == key)
        .map_or(0, |(_, n)| *n)
}

/// Adds `units` of request `r` from pool `key` to `targets` (the key copied only for a new entry).
pub(super) fn add_units(targets: &mut Targets, r: usize, key: &PoolKey, units: u32) {
    match targets.iter_mut().find(|((at, k), _)| *at == r && k == key) {
        Some((_, n)) => *n += units,
        None => {
            targets.insert((r, key.clone()), units);
        }
    }
}

/// One grant of the blind pass: tenant, request, pool, units asked and received.
#[derive(Clone, Debug)]
pub(super) struct Step {
    pub t: usize,
    pub r: usize,
    pub key: PoolKey,
    pub asked: u32,
    pub units: u32,
}

pub(super) struct TenantState {
    pub(super) remaining: Vec<u32>,
    pub(super) granted: Vec<u32>,
    pub(super) memory_mib: u64,
    /// MIG instances and exclusive GPUs received, made into [`Grant`](crate::api::Grant)s once, on the pass kept.
    pub(super) units: Vec<Unit>,
    /// Shares per shared GPU, merged into one grant each at the end.
    pub(super) shares: Shares,
    /// Per request: the reason it is short, if it is.
    pub(super) why: Vec<Option<Shortfall>>,
    /// Units received per (request, pool).
    pub(super) by_pool: Targets,
}

pub(super) struct Allocator<'n, 'v, 'a> {
    pub(super) tenants: &'n [TenantProfile],
    /// Read only: what a pass binds goes to `bound`.
    pub(super) nodes: &'n CellNodes<'v, 'a>,
    /// The cell placed: only its families' pools exist, only its GPUs change.
    pub(super) scope: &'n Scope,
    pub(super) pools: BTreeMap<PoolKey, Pool>,
    pub(super) state: Vec<TenantState>,
    /// How a placing pass (see [`super::sticky`]) treats each pool; `None` in the blind pass.
    pub(super) placing: Option<Placings>,
    /// Per pool, the units each tenant holds now: (MIG slot or shared GPU, 0), or exclusive (domain, GPU position).
    pub(super) held: Held<'n>,
    /// Every grant in the order it was made: the blind pass's log is replayed by the placing pass.
    pub(super) log: Vec<Step>,
    /// What the pass binds, written on the nodes only for the pass kept ([`Bound`]); `None` for
    /// a blind pass whose placement a pass from what runs now replaces.
    pub(super) bound: Option<Bound>,
}

impl<'n, 'v, 'a> Allocator<'n, 'v, 'a> {
    /// An allocator over `nodes`; a placing pass passes the current bindings and how each pool
    /// uses them. `binds`: whether its grants are bound (in [`Bound`]).
    pub(super) fn new(
        tenants: &'n [TenantProfile],
        nodes: &'n CellNodes<'v, 'a>,
        scope: &'n Scope,
        template: &Template,
        current: Option<(&'n Current, &Placings)>,
        binds: bool,
    ) -> Self {
        let (pools, held) = template.pools(current);
        let state = tenants
            .iter()
            .map(|t| TenantState {
                remaining: t.requests.iter().map(|r| r.count).collect(),
                granted: vec![0; t.requests.len()],
                memory_mib: 0,
                units: vec![],
                shares: Shares::default(),
                why: vec![None; t.requests.len()],
                by_pool: BTreeMap::new(),
            })
            .collect();
        Allocator {
            tenants,
            nodes,
            scope,
            pools,
            state,
            placing: current.map(|(_, p)| p.clone()),
            held,
            log: vec![],
            bound: binds.then(|| Bound::none(nodes, scope)),
        }
    }

    /// The pass that decides how much each tenant gets, blind to what runs now, its tenants served
    /// level by level in `order`; `binds`: whether its grants are bound.
    pub(super) fn blind(
        tenants: &'n [TenantProfile],
        nodes: &'n CellNodes<'v, 'a>,
        scope: &'n Scope,
        template: &Template,
        order: &[usize],
        binds: bool,
    ) -> Self {
        let mut blind = Allocator::new(tenants, nodes, scope, template, None, binds);
        for level in order.chunk_by(|&x, &y| tenants[x].priority == tenants[y].priority) {
            blind.serve_level(level);
        }
        blind
    }
}

impl Allocator<'_, '_, '_> {
    pub(super) fn serve_level(&mut self, level: &[usize]) {
        // 1. Capacity dedicated to a tenant goes to it first.
        for &t in level {
            for r in 0..self.tenants[t].requests.len() {
                let want = self.state[t].remaining[r];
                self.take(t, r, want, true);
            }
        }
        // 2. Open capacity: weighted fair share per kind of capacity.
        let mut families: BTreeMap<Family, Vec<(usize, usize)>> = BTreeMap::new();
        for &t in level {
            for (r, req) in self.tenants[t].requests.iter().enumerate() {
                families
                    .entry(Family::of(req.mode, req.profile.as_deref()))
                    .or_default()
                    .push((t, r));
            }
        }
        for (family, claims) in &families {
            // The strictest headroom among the claimants: never promise shares a GPU cannot give.
            let headroom = claims
                .iter()
                .map(|&(t, _)| self.tenants[t].headroom_percent)
                .max()
                .unwrap_or(0);
            let available: u64 = self
                .pools
                .iter()
                .filter(|((f, d), _)| f == family && d.is_empty())
                .map(|(_, p)| p.free(family, headroom))
                .sum();
            let demands: Vec<(u64, u64)> = claims
                .iter()
                .map(|&(t, r)| (u64::from(self.state[t].remaining[r]), u64::from(self.tenants[t].weight)))
                .collect();
            let demand: u64 = demands.iter().map(|d| d.0).sum();
            let shares = weighted_fair_share(available, &demands);
            for (&(t, r), share) in claims.iter().zip(shares) {
                if demand > available && u64::from(self.state[t].remaining[r]) > share {
                    self.state[t].why[r] = Some(Shortfall::Capacity {
                        available,
                        demand,
                        tenants: claims.len(),
                        priority: self.tenants[t].priority,
                    });
                }
                self.take(t, r, share as u32, false);
            }
        }
        // 3. What rules kept from some tenants goes to the others (work-conserving).
        for claims in families.values() {
            for &(t, r) in claims {
                let want = self.state[t].remaining[r];
                if want > 0 {
                    self.take(t, r, want, false);
                }
            }
        }
    }

    /// Grants up to `want` units of request `r` to tenant `t`, from dedicated or open pools.
    pub(super) fn take(&mut self, t: usize, r: usize, want: u32, dedicated: bool) {
        if want == 0 {
            return;
        }
        let req = &self.tenants[t].requests[r];
        let family = Family::of(req.mode, req.profile.as_deref());
        let name = &self.tenants[t].name;
        let keys: Vec<PoolKey> = self
            .pools
            .keys()
            .filter(|(f, d)| *f == family && if dedicated { d.contains(name) } else { d.is_empty() })
            .cloned()
            .collect();
        let mut left = want;
        for key in keys {
            if left == 0 {
                break;
            }
            left -= self.take_from(t, r, &key, left);
        }
    }

    /// Grants up to `want` units of request `r` to tenant `t` from pool `key`, counted and logged.
    pub(super) fn take_from(&mut self, t: usize, r: usize, key: &PoolKey, want: u32) -> u32 {
        let got = match &key.0 {
            Family::Mig(p) => self.take_mig(t, r, key, want, p),
            Family::Exclusive => self.take_exclusive(t, r, key, want),
            Family::Shared(_) => self.take_shared(t, r, key, want),
        };
        if got > 0 {
            self.count(t, r, key, got);
            self.log.push(Step {
                t,
                r,
                key: key.clone(),
                asked: want,
                units: got,
            });
        }
        got
    }

    /// The position of shared pool `key` among the pass's pools, as tenants' shares name it.
    pub(super) fn shared_id(&self, key: &PoolKey) -> Option<usize> {
        match self.pools.get(key) {
            Some(Pool::Shared { id, .. }) => Some(*id),
            _ => None,
        }
    }

    /// The GPUs (positions in shared pool `id`) where tenant `t` holds shares, in order.
    pub(super) fn shared_gpus_of(&self, t: usize, id: usize) -> impl Iterator<Item = usize> + '_ {
        self.state[t].shares.gpus_in(id)
    }

    pub(super) fn count(&mut self, t: usize, r: usize, key: &PoolKey, units: u32) {
        if units > 0 {
            add_units(&mut self.state[t].by_pool, r, key, units);
        }
    }

    /// Units of request `r` tenant `t` has from pool `key` so far.
    pub(super) fn have(&self, t: usize, r: usize, key: &PoolKey) -> u32 {
        units_in(&self.state[t].by_pool, r, key)
    }

    /// How many units of `unit_mib` the tenant's memory limit still allows (up to `want`).
    pub(super) fn memory_allows(&mut self, t: usize, r: usize, unit_mib: u64, want: u32) -> u32 {
        let Some(limit) = self.tenants[t].memory_limit_mib else {
            return want;
        };
        if unit_mib == 0 {
            return want;
        }
        let room = limit.saturating_sub(self.state[t].memory_mib) / unit_mib;
        if room < u64::from(want) {
            self.state[t].why[r] = Some(Shortfall::Memory { limit_mib: limit });
        }
        room.min(u64::from(want)) as u32
    }

    pub(super) fn record(&mut self, t: usize, r: usize, units: u32, unit_mib: u64) {
        let s = &mut self.state[t];
        s.remaining[r] -= units;
        s.granted[r] += units;
        s.memory_mib += unit_mib * u64::from(units);
    }

    pub(super) fn take_mig(&mut self, t: usize, r: usize, key: &PoolKey, want: u32, profile: &str) -> u32 {
        let unit = match self.pools.get(key) {
            Some(Pool::Mig(p)) => p.unit_mib,
            _ => nominal_memory_mib(profile).unwrap_or(0),
        };
        let want = self.memory_allows(t, r, unit, want);
        let Some(Pool::Mig(pool)) = self.pools.get_mut(key) else {
            return 0;
        };
        let mut taken = Vec::new();
        let mut k = pool.next;
        while taken.len() < want as usize && k < pool.order.len() {
            let s = pool.order[k];
            if !pool.taken[s] {
                pool.taken[s] = true;
                taken.push(pool.slots[s]);
            }
            k += 1;
        }
        while pool.next < pool.order.len() && pool.taken[pool.order[pool.next]] {
            pool.next += 1;
        }
        pool.free -= taken.len();
        let n = taken.len() as u32;
        for (at, inst) in taken {
            self.bind_instance(t, at, inst);
        }
        self.record(t, r, n, unit);
        n
    }

    pub(super) fn bind_instance(&mut self, t: usize, at: GpuRef, inst: u32) {
        if let Some(bound) = &mut self.bound {
            bound.instance(self.scope, at, inst, t);
        }
        self.state[t].units.push(Unit::Instance(at, inst));
    }

    /// The exclusive GPU at `at` to tenant `t` (a shared GPU's shares are bound by its position,
    /// in [`super::shared`]).
    pub(super) fn bind_gpu(&mut self, t: usize, at: GpuRef) {
        self.state[t].units.push(Unit::Gpu(at));
        if let Some(bound) = &mut self.bound {
            bound.whole(self.scope, at, Mode::Exclusive, t, 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Mode;
    use proptest::prelude::*;

    proptest! {
        /// Units counted per (request, pool) without building a key are the map's own entries.
        #[test]
        fn units_are_counted_as_the_map_counts(adds in prop::collection::vec((0usize..3, 0usize..3, 1u32..4), 0..20)) {
            let key = |p: usize| (Family::Shared(Mode::Mps), (0..p).map(|d| format!("t{d}")).collect::<Vec<_>>());
            let mut targets = Targets::new();
            let mut map: BTreeMap<(usize, PoolKey), u32> = BTreeMap::new();
            for &(r, p, n) in &adds {
                add_units(&mut targets, r, &key(p), n);
                *map.entry((r, key(p))).or_default() += n;
            }
            prop_assert_eq!(&targets, &map);
            for r in 0..3 {
                for p in 0..3 {
                    prop_assert_eq!(units_in(&targets, r, &key(p)), map.get(&(r, key(p))).copied().unwrap_or(0));
                }
            }
        }
    }
}
