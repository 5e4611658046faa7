//! Bindings stay put (docs/design.md#minimal-disruption): the amounts the blind pass decided, placed
//! starting from what runs now.
//!
//! Every tenant first keeps the units it holds now (same node, GPU and placement; same shared GPU),
//! up to its amount in that pool; then the blind pass's grants are replayed in their order for
//! what is still missing, taking units nobody holds now first. So a binding moves only when its
//! tenant's amount in that pool shrank (smaller request, fair share, a higher priority), the tenant
//! is gone or invalid, the plan changed the GPU, or a rule (tier caps, co-location, NUMA topology,
//! memory limit) refuses to keep it; and amounts are exactly the blind pass's.
//!
//! Keeping everything first can leave no room for an amount the blind pass found room for: shared
//! GPUs serve one tier each, so kept shares spread over many GPUs can leave another tier none.
//! Such a pool is placed again keeping level by level (a priority level keeps and takes before the
//! next keeps anything), and failing that as the blind pass placed it ([`Placing`]).
//!
//! A cell's passes ([`CellPasses`]) start from the same template, order and current bindings:
//! from what runs now, then once more from their own result, every unit kept, so that feeding the
//! output back changes nothing.

use super::allocator::{Allocator, Step, Targets, units_in};
use super::bound::Bound;
use super::cell_nodes::CellNodes;
use super::holders::{Current, Placing, Placings};
use super::pools::{GpuUser, Pool};
use super::report::{Built, Placed};
use super::scope::Scope;
use super::spread::spread;
use super::template::Template;
use super::units::{Family, PoolKey, Reasons};
use crate::api::TopologyPolicy;
use crate::mig::nominal_memory_mib;
use crate::policy::TenantProfile;
use std::collections::{BTreeMap, BTreeSet};

/// What the blind pass decided.
pub(super) struct Amounts<'t> {
    /// Per tenant, units per (request, pool).
    pub targets: Vec<Targets>,
    /// Its grants in order.
    pub log: Vec<Step>,
    /// Per tenant and request, why it fell short.
    pub why: Reasons,
    /// Per shared pool, the GPUs each tier uses (and each `coLocation: Forbidden` tenant locks).
    pub shared_gpus: BTreeMap<PoolKey, GpuUsers<'t>>,
}

/// How many GPUs of a shared pool each user ([`GpuUser`]) has in use.
pub(super) type GpuUsers<'t> = BTreeMap<GpuUser<'t>, u32>;

/// What every placing pass of one cell starts from.
pub(super) struct CellPasses<'c> {
    pub(super) tenants: &'c [TenantProfile],
    pub(super) scope: &'c Scope,
    /// Who holds each unit now.
    pub(super) now: Current<'c>,
    pub(super) template: Template,
    /// Tenants by priority, then name.
    pub(super) order: Vec<usize>,
}

impl<'c> CellPasses<'c> {
    /// The passes of the cell of `scope` over `nodes`, its `tenants` served by priority, then name.
    pub(super) fn new(tenants: &'c [TenantProfile], nodes: &'c CellNodes, scope: &'c Scope) -> Self {
        let mut order: Vec<usize> = (0..tenants.len()).collect();
        order.sort_by(|&x, &y| {
            tenants[y]
                .priority
                .cmp(&tenants[x].priority)
                .then(tenants[x].name.cmp(&tenants[y].name))
        });
        CellPasses {
            tenants,
            scope,
            now: Current::from_inventory(nodes, scope),
            template: Template::of(nodes, scope),
            order,
        }
    }
}

impl CellPasses<'_> {
    /// Where nothing runs now and the blind pass's placement (its bindings, `blind_bound`) is not
    /// shown stable: placed again from itself; failing that, from what runs now; failing that, as
    /// the blind pass placed it.
    pub(super) fn again_from_blind(&self, nodes: &CellNodes, blind_bound: Option<Bound>, amounts: &Amounts) -> Placed {
        let placed = match &blind_bound {
            Some(bound) => bound.holders(self.tenants),
            None => Current::of(Vec::new()),
        };
        match self.place_again(nodes, &placed, amounts) {
            Ok(kept) => kept,
            Err(_) => match self.place_from_now(nodes, amounts) {
                Some((kept, _)) => kept,
                None => self.as_blind(nodes),
            },
        }
    }

    /// Places `amounts` from the current bindings. A pool where the units kept leave no room for
    /// some amount (shared GPUs: co-location splits them by tier) is placed again with less
    /// stickiness: kept level by level, then as the blind pass placed it. `None`: only the blind
    /// pass's placement gives the amounts (memory limits tie pools together).
    pub(super) fn place_from_now(&self, nodes: &CellNodes, amounts: &Amounts) -> Option<(Placed, Placings)> {
        let mut placings = Placings::new();
        loop {
            let at = place(
                self.tenants,
                nodes,
                self.scope,
                &self.template,
                &self.now,
                &placings,
                amounts,
                &self.order,
            );
            match at {
                Ok(placed) => return Some((placed, placings)),
                Err(failed) => {
                    for key in failed {
                        let p = placings.entry(key).or_default();
                        *p = p.less_sticky()?;
                    }
                }
            }
        }
    }

    /// Places `amounts` again from `placed`, a placement just made, every unit kept: the pass
    /// that makes a result the one the next plan would make.
    pub(super) fn place_again(
        &self,
        nodes: &CellNodes,
        placed: &Current,
        amounts: &Amounts,
    ) -> Result<Placed, Vec<PoolKey>> {
        place(
            self.tenants,
            nodes,
            self.scope,
            &self.template,
            placed,
            &Placings::new(),
            amounts,
            &self.order,
        )
    }

    /// `built` from a placement that placing again from itself gives back ([`super::stable`]). Debug
    /// builds (every test) place again all the same, and compare: the grants built, or handed
    /// back from an earlier pass, with those of the placement again, built anew.
    pub(super) fn again_in_debug(&self, nodes: &CellNodes, amounts: &Amounts, built: Built) -> Built {
        if cfg!(debug_assertions) {
            let (grants, bound, _, _) = &built;
            let placed = bound.holders(self.tenants);
            let again = self
                .place_again(nodes, &placed, amounts)
                .expect("a stable placement places again");
            let (again_grants, again_bound) = again.grants(self.tenants, nodes);
            assert!(
                again_bound.holders(self.tenants) == placed,
                "a placement found stable moved when placed again"
            );
            assert_eq!(&again_grants, grants, "a stable placement's grants changed");
        }
        built
    }

    /// The blind pass's placement, where no placing from current bindings gives its amounts.
    pub(super) fn as_blind(&self, nodes: &CellNodes) -> Placed {
        Allocator::blind(self.tenants, nodes, self.scope, &self.template, &self.order, true).finish()
    }
}

/// Places `amounts` on `nodes` from the bindings in `current`, each pool as `placings` says. The
/// pools where some amount could not be placed exactly are the error.
#[allow(clippy::too_many_arguments)]
pub(super) fn place(
    tenants: &[TenantProfile],
    nodes: &CellNodes,
    scope: &Scope,
    template: &Template,
    current: &Current,
    placings: &Placings,
    amounts: &Amounts,
    order: &[usize],
) -> Result<Placed, Vec<PoolKey>> {
    let mut a = Allocator::new(tenants, nodes, scope, template, Some((current, placings)), true);
    let placing = |key: &PoolKey| placings.get(key).copied().unwrap_or_default();
    a.keep(amounts, order, |key| placing(key) == Placing::KeepFirst);
    let mut log = amounts.log.iter().peekable();
    for level in order.chunk_by(|&x, &y| tenants[x].priority == tenants[y].priority) {
        a.keep(amounts, level, |key| placing(key) == Placing::ByLevel);
        // The blind pass served levels in order, so its log runs level by level too. (By
        // priority, not `level.contains`: one level may hold every tenant of the fleet.)
        let priority = tenants[level[0]].priority;
        while let Some(s) = log.next_if(|s| tenants[s.t].priority == priority) {
            if placing(&s.key) == Placing::Blind {
                a.take_from(s.t, s.r, &s.key, s.asked);
                continue;
            }
            let target = units_in(&amounts.targets[s.t], s.r, &s.key);
            let want = s.units.min(target.saturating_sub(a.have(s.t, s.r, &s.key)));
            if want > 0 {
                a.take_from(s.t, s.r, &s.key, want);
            }
        }
        for &t in level {
            for ((r, key), &n) in &amounts.targets[t] {
                let have = a.have(t, *r, key);
                if have < n && placing(key) != Placing::Blind {
                    a.take_from(t, *r, key, n - have);
                }
            }
        }
    }
    let mut failed = BTreeSet::new();
    for (s, target) in a.state.iter().zip(&amounts.targets) {
        for k in s.by_pool.keys().chain(target.keys()) {
            if s.by_pool.get(k) != target.get(k) {
                failed.insert(k.1.clone());
            }
        }
    }
    if !failed.is_empty() {
        return Err(failed.into_iter().collect());
    }
    for (s, why) in a.state.iter_mut().zip(&amounts.why) {
        s.why = why.clone();
    }
    let stable = a.is_stable(amounts, order);
    let mut placed = a.finish();
    placed.stable = stable;
    Ok(placed)
}

impl<'n> Allocator<'n, '_, '_> {
    /// What this pass decided, for the placing pass (the pass can still be finished: its
    /// reasons are copied, its counts per pool and log taken).
    pub(super) fn amounts(&mut self) -> Amounts<'n> {
        let shared_gpus = self
            .pools
            .keys()
            .filter(|k| matches!(k.0, Family::Shared(_)))
            .map(|k| (k.clone(), self.gpu_users(k)))
            .collect();
        Amounts {
            targets: self.state.iter_mut().map(|s| std::mem::take(&mut s.by_pool)).collect(),
            log: std::mem::take(&mut self.log),
            why: self.state.iter().map(|s| s.why.clone()).collect(),
            shared_gpus,
        }
    }

    /// Whether grants from pool `key` are placed from the current bindings.
    pub(super) fn sticky(&self, key: &PoolKey) -> bool {
        self.placing
            .as_ref()
            .is_some_and(|p| p.get(key) != Some(&Placing::Blind))
    }

    /// Tenants in `order` keep the units they hold now, up to their amount in each pool `which` names.
    fn keep(&mut self, amounts: &Amounts, order: &[usize], which: impl Fn(&PoolKey) -> bool) {
        let targets = &amounts.targets;
        let mut opened: BTreeMap<PoolKey, GpuUsers> = BTreeMap::new();
        for &t in order {
            for ((r, key), &n) in &targets[t] {
                if !which(key) {
                    continue;
                }
                let units = self
                    .held
                    .get(key)
                    .and_then(|h| h.get(self.tenants[t].name.as_str()))
                    .cloned()
                    .unwrap_or_default();
                match &key.0 {
                    Family::Mig(profile) => self.keep_instances(t, *r, key, n, &units, profile),
                    Family::Exclusive => self.keep_gpus(t, *r, key, n, units),
                    Family::Shared(_) => {
                        if !opened.contains_key(key) {
                            opened.insert(key.clone(), self.gpu_users(key));
                        }
                        let quota = amounts.shared_gpus.get(key);
                        let opened = opened.get_mut(key).expect("inserted above");
                        self.keep_shares(t, *r, key, n, units, quota, opened);
                    }
                }
            }
        }
        let shared: BTreeSet<&PoolKey> = order
            .iter()
            .flat_map(|&t| targets[t].keys().map(|(_, k)| k))
            .filter(|k| matches!(k.0, Family::Shared(_)) && which(k))
            .collect();
        for key in shared {
            self.spread_kept(targets, order, key);
        }
    }

    fn keep_instances(&mut self, t: usize, r: usize, key: &PoolKey, n: u32, units: &[(usize, u32)], profile: &str) {
        let unit = match self.pools.get(key) {
            Some(Pool::Mig(p)) => p.unit_mib,
            _ => nominal_memory_mib(profile).unwrap_or(0),
        };
        let mut kept = 0;
        for &(s, _) in units {
            if kept == n || self.memory_allows(t, r, unit, 1) == 0 {
                break;
            }
            let Some(Pool::Mig(pool)) = self.pools.get_mut(key) else {
                return;
            };
            if pool.taken[s] {
                continue;
            }
            pool.taken[s] = true;
            pool.free -= 1;
            let (at, inst) = pool.slots[s];
            self.bind_instance(t, at, inst);
            self.record(t, r, 1, unit);
            kept += 1;
        }
        self.count(t, r, key, kept);
    }

    /// The shares the tenant holds on each shared GPU, up to its amount (where it holds more, the
    /// GPUs where it holds the most first, so a shrinking grant leaves GPUs rather than thins
    /// them; where the count is not known, one share, the rest spread later), as long as the GPUs
    /// left can still serve every other tier as many GPUs as the blind pass gave it ([`may_open`]):
    /// GPUs serve one tier each, so a tier that keeps too many leaves another too few. Keeping the
    /// counts, not only the GPUs, is what keeps another tenant's change from moving these shares.
    #[allow(clippy::too_many_arguments)]
    fn keep_shares(
        &mut self,
        t: usize,
        r: usize,
        key: &PoolKey,
        n: u32,
        mut units: Vec<(usize, u32)>,
        quota: Option<&GpuUsers>,
        opened: &mut GpuUsers<'n>,
    ) {
        let who = GpuUser::of(&self.tenants[t]);
        let none = GpuUsers::new();
        let quota = quota.unwrap_or(&none);
        units.sort_by_key(|&(i, count)| (std::cmp::Reverse(count), i));
        for (i, count) in units {
            let have = self.have(t, r, key);
            if have >= n {
                break;
            }
            let Some(Pool::Shared { gpus, .. }) = self.pools.get(key) else {
                return;
            };
            let opens = gpus[i].capacity.is_none();
            if opens && !may_open(who, quota, opened, gpus.len() as u32) {
                continue;
            }
            let got = self.try_gpu(t, r, key, i, count.max(1).min(n - have), &mut false);
            if got > 0 && opens {
                *opened.entry(who).or_default() += 1;
            }
            self.count(t, r, key, got);
        }
    }

    /// The GPUs of shared pool `key` in use so far, by user.
    pub(super) fn gpu_users(&self, key: &PoolKey) -> GpuUsers<'n> {
        let Some(Pool::Shared { gpus, .. }) = self.pools.get(key) else {
            return GpuUsers::new();
        };
        // Counted hashed: a pool has 12,000 GPUs in a 5,000-node fleet, and a few users.
        let mut users: foldhash::HashMap<GpuUser, u32> = foldhash::HashMap::default();
        for user in gpus.iter().filter_map(|g| g.user(self.tenants)) {
            *users.entry(user).or_default() += 1;
        }
        users.into_iter().collect()
    }

    /// Exclusive GPUs: a multi-GPU grant under a topology policy keeps the domains where it holds
    /// the most first; `Required` keeps only that one domain (the rest must join it).
    fn keep_gpus(&mut self, t: usize, r: usize, key: &PoolKey, n: u32, mut units: Vec<(usize, u32)>) {
        let topology = self.tenants[t].topology;
        if n > 1 && topology != TopologyPolicy::Ignore {
            let mut per_domain: BTreeMap<usize, usize> = BTreeMap::new();
            for &(d, _) in &units {
                *per_domain.entry(d).or_default() += 1;
            }
            units.sort_by_key(|&(d, g)| (std::cmp::Reverse(per_domain[&d]), d, g));
            if topology == TopologyPolicy::Required
                && let Some(&(first, _)) = units.first()
            {
                units.retain(|&(d, _)| d == first);
            }
        }
        let mut kept = 0;
        for (d, gpu) in units {
            if kept == n {
                break;
            }
            let Some(Pool::Exclusive(pool)) = self.pools.get(key) else {
                return;
            };
            if !pool.domain(d).free.contains(&gpu) {
                continue;
            }
            if !self.take_gpu(t, r, key, d, gpu) {
                break;
            }
            kept += 1;
        }
        self.count(t, r, key, kept);
    }

    /// Shared GPUs: after one share on each GPU a tenant keeps, the rest of its amount goes to those
    /// same GPUs as far as they have room, split so that as much as possible fits ([`spread`]).
    fn spread_kept(&mut self, targets: &[Targets], order: &[usize], key: &PoolKey) {
        let mut claims = Vec::new(); // (tenant, request, still needed)
        for &t in order {
            for ((r, k), &n) in &targets[t] {
                if k == key {
                    claims.push((t, *r, n - self.have(t, *r, key)));
                }
            }
        }
        let Some(Pool::Shared { id, gpus, .. }) = self.pools.get(key) else {
            return;
        };
        // Sized first: the claimants' shares are walked list by list.
        let mut pairs = Vec::with_capacity(claims.iter().map(|&(t, _, _)| self.state[t].shares.len()).sum());
        for (c, &(t, _, _)) in claims.iter().enumerate() {
            pairs.extend(self.shared_gpus_of(t, *id).map(|i| (c, i)));
        }
        if pairs.is_empty() {
            return;
        }
        let room: Vec<u32> = gpus
            .iter()
            .map(|g| g.capacity.map_or(0, |c| c.saturating_sub(g.used)))
            .collect();
        let need: Vec<u32> = claims.iter().map(|c| c.2).collect();
        let split = spread(&need, &room, &pairs);
        for (&(c, i), units) in pairs.iter().zip(split) {
            if units > 0 {
                let (t, r, _) = claims[c];
                let got = self.try_gpu(t, r, key, i, units, &mut false);
                self.count(t, r, key, got);
            }
        }
    }
}

/// Whether `who` (a tier, or a tenant that locks its GPUs) may start using one more GPU of a shared
/// pool of `total` GPUs: within what the blind pass gave it (`quota`), or beyond that when the GPUs
/// nobody uses yet still cover what every user has yet to get of its quota.
fn may_open(who: GpuUser, quota: &GpuUsers, opened: &GpuUsers, total: u32) -> bool {
    let need = |u: &GpuUser| {
        let q = quota.get(u).copied().unwrap_or(0);
        q.saturating_sub(opened.get(u).copied().unwrap_or(0))
    };
    if need(&who) > 0 {
        return true;
    }
    let unused = total.saturating_sub(opened.values().sum());
    unused > quota.keys().map(need).sum::<u32>()
}
