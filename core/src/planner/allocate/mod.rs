//! Grants: which tenant gets which MIG instance, whole GPU or GPU share.
//!
//! How much, then which. How much: priority first; within a priority, capacity dedicated to a
//! tenant goes to it, then open capacity is split by weighted fair share, then anything a rule
//! (co-location, topology, policy caps, memory limit) kept from one tenant goes to the others. That
//! pass is blind to what runs now, so amounts never depend on history. Which: [`sticky`] places
//! those same amounts starting from the current bindings, so a tenant keeps the GPUs and instances
//! it holds unless the inputs force a move (DESIGN.md §4, invariant 4). Every loop walks capacity
//! in node-name, GPU and placement order, so the result is deterministic.

mod cell_nodes;
mod cells;
mod exclusive;
mod holders;
mod pools;
mod report;
mod scope;
mod shared;
mod side_by_side;
mod sticky;

use super::fairshare::weighted_fair_share;
use super::nodes::NodeDesired;
use crate::api::{AllocationSummary, Grant, Grants, Mode};
use crate::mig::nominal_memory_mib;
use crate::policy::TenantProfile;
use cell_nodes::CellNodes;
pub use cells::AllocationMemo;
use cells::GpuBindings;
use exclusive::{Domain, ExclusivePool};
use foldhash::HashMap;
use holders::{Current, Placings};
use pools::Template;
use report::Placed;
use scope::Scope;
use std::borrow::Cow;
use std::collections::BTreeMap;
use sticky::{Amounts, Step};

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

/// What one tenant received in one cell: its grants a list of their own, moved (not copied) into
/// the tenant's merged [`TenantGrants`] when the cell is placed in this pass.
#[derive(Clone, Debug, Default, PartialEq)]
struct CellGrants {
    grants: Vec<Grant>,
    /// One entry per request of the tenant in the cell, in request order.
    allocation: Vec<AllocationSummary>,
    memory_mib: u64,
    shortfalls: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Family {
    Mig(String),
    Exclusive,
    Shared(Mode),
}

impl Family {
    fn of(mode: Mode, profile: Option<&str>) -> Family {
        match mode {
            Mode::Mig => Family::Mig(profile.unwrap_or_default().to_string()),
            Mode::Exclusive => Family::Exclusive,
            m => Family::Shared(m),
        }
    }

    /// Whether a request of `mode` (and MIG `profile`) draws from this family: [`Family::of`]
    /// without building one.
    fn is(&self, mode: Mode, profile: Option<&str>) -> bool {
        match (self, mode) {
            (Family::Mig(p), Mode::Mig) => p == profile.unwrap_or_default(),
            (Family::Exclusive, Mode::Exclusive) => true,
            (Family::Shared(m), _) => *m == mode,
            _ => false,
        }
    }

    fn label(&self) -> String {
        match self {
            Family::Mig(p) => format!("MIG {p}"),
            Family::Exclusive => "Exclusive GPUs".into(),
            Family::Shared(m) => format!("{m} shares"),
        }
    }
}

/// (node position, GPU position in the node's spec list).
type GpuRef = (u32, u32);

/// A unit a tenant received, by position: a pass that is not kept never builds its grants.
#[derive(Clone, Copy, Debug)]
enum Unit {
    /// A MIG instance: its GPU and its position in the GPU's instance list.
    Instance(GpuRef, u32),
    /// An exclusive GPU.
    Gpu(GpuRef),
}

/// Capacity of one kind, open (no tenants) or dedicated to the tenants listed.
type PoolKey = (Family, Vec<String>);

/// Per tenant: units received per (request, pool).
type Targets = BTreeMap<(usize, PoolKey), u32>;

/// Per tenant and request: why it fell short, if it did.
type Reasons = Vec<Vec<Option<Shortfall>>>;

struct MigPool {
    /// (GPU, instance position in its spec).
    slots: Vec<(GpuRef, u32)>,
    /// Memory of one instance for the tenants' memory limits: as the driver reports the profile
    /// (GpuNode status), else from the model's table (never above the GPU's memory), else the
    /// profile name's nominal size; the largest over the pool's GPUs, so a limit is never exceeded.
    unit_mib: u64,
    /// Slot indices in the order grants use them: plan order, and when placing from the current
    /// bindings, instances nobody holds now first.
    order: Vec<usize>,
    taken: Vec<bool>,
    /// Entries of `order` before this one are all taken.
    next: usize,
    free: usize,
}

#[derive(Clone)]
struct SharedGpu {
    at: GpuRef,
    /// maxClients or replicas of the plan.
    setting: u32,
    memory_mib: u64,
    pinned_mib: Option<u64>,
    /// Shares this GPU offers, fixed by its first tenant's policy (memory headroom).
    capacity: Option<u32>,
    used: u32,
    tier: Option<String>,
    /// Taken by a `coLocation: Forbidden` tenant: nobody else may join.
    locked: bool,
}

enum Pool {
    Mig(MigPool),
    Exclusive(ExclusivePool),
    Shared {
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
    fn free(&self, family: &Family, headroom_percent: u32) -> u64 {
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

impl SharedGpu {
    /// Memory one share stands for: an MPS client is pinned to memory / maxClients by the device
    /// plugin's daemon (the plan's pinnedMemoryLimit may only repeat that value); a time-sliced
    /// share is bookkeeping only (nothing bounds a process's memory there).
    fn share_mib(&self) -> u64 {
        self.pinned_mib
            .unwrap_or(self.memory_mib / u64::from(self.setting.max(1)))
    }

    /// Shares the GPU offers under a policy keeping `headroom_percent` of its memory: an MPS GPU
    /// only the clients whose pinned memory fits in the rest; a time-sliced GPU its replicas.
    fn capacity_under(&self, family: &Family, headroom_percent: u32) -> u32 {
        let usable = self.memory_mib * u64::from(100 - headroom_percent.min(100)) / 100;
        match family {
            Family::Shared(Mode::Mps) if self.share_mib() > 0 => self.setting.min((usable / self.share_mib()) as u32),
            _ => self.setting,
        }
    }
}

/// Why a tenant got less than it asked.
#[derive(Clone, Debug, PartialEq)]
enum Shortfall {
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

struct TenantState {
    remaining: Vec<u32>,
    granted: Vec<u32>,
    memory_mib: u64,
    /// MIG instances and exclusive GPUs received, made into [`Grant`]s once, on the pass kept.
    units: Vec<Unit>,
    /// Shares per shared GPU, merged into one grant each at the end.
    shares: BTreeMap<(Family, Vec<String>, usize), u32>,
    /// Per request: the reason it is short, if it is.
    why: Vec<Option<Shortfall>>,
    /// Units received per (request, pool).
    by_pool: Targets,
}

struct Allocator<'n, 'v, 'a> {
    tenants: &'n [TenantProfile],
    nodes: &'n mut CellNodes<'v, 'a>,
    /// The cell placed: only its families' pools exist, only its GPUs change.
    scope: &'n Scope,
    pools: BTreeMap<PoolKey, Pool>,
    state: Vec<TenantState>,
    /// How a placing pass (see [`sticky`]) treats each pool; `None` in the blind pass.
    placing: Option<Placings>,
    /// Per pool, the units each tenant holds now: (MIG slot or shared GPU, 0), or exclusive (domain, GPU position).
    held: pools::Held<'n>,
    /// Every grant in the order it was made: the blind pass's log is replayed by the placing pass.
    log: Vec<Step>,
}

/// Grants for every tenant, placed cell by cell ([`cells`]). With a memo, a cell whose inputs
/// are those of the memo's last pass gets its last result back; the result is the same either way.
pub fn allocate(
    tenants: &[TenantProfile],
    nodes: &mut [NodeDesired],
    memo: Option<&mut AllocationMemo>,
) -> BTreeMap<String, TenantGrants> {
    match memo {
        None => {
            let cells = cells::cells(tenants, nodes);
            // The cores this process may use (its cgroup's CPU quota counts).
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
            let parts = side_by_side::place_cells(nodes, &cells, threads, |c, nodes| {
                allocate_cell(&c.profiles(tenants), nodes, &c.scope)
            })
            .into_iter()
            .map(Cow::Owned)
            .collect();
            report::merge(tenants, &cells, parts)
        }
        Some(memo) => {
            // Every cell's inputs are compared before any cell writes a binding: a MIG GPU can
            // hold instances of two cells.
            let (cells, stale) = memo.cells_and_stale(tenants, nodes);
            for (cell, stale) in cells.iter().zip(&stale) {
                if *stale {
                    unbind_kept(nodes, &cell.scope);
                    let profiles = cell.profiles(tenants);
                    let grants = allocate_cell(&profiles, &mut CellNodes::all(nodes), &cell.scope);
                    memo.remember(cell, profiles, nodes, grants);
                } else {
                    memo.recall(cell, nodes);
                }
            }
            memo.keep_only(&cells);
            memo.placed = stale.iter().filter(|s| **s).count();
            memo.reused = cells.len() - memo.placed;
            let grants = memo.merge(tenants, &cells, &stale);
            memo.keep_cells(cells);
            grants
        }
    }
}

/// A cell placed again starts from none of its bindings, as on nodes built anew: on the nodes taken
/// back from the last pass its GPUs carry that pass's. Every node it holds GPUs of is recomputed.
fn unbind_kept(nodes: &mut [NodeDesired], scope: &Scope) {
    for &(n, g) in &scope.gpus {
        let node = &mut nodes[n as usize];
        node.recomputed = true;
        if node.kept {
            GpuBindings::unbind(&mut node.gpus, g as usize, scope);
        }
    }
}

/// One cell's grants, by tenant name, placed on `nodes`. Its passes run in place, each from none
/// of the cell's bindings, so a unit no pass grants is left to nobody (nodes built anew carry
/// none; on nodes taken back from the last pass, [`unbind_kept`] has taken them off).
fn allocate_cell(tenants: &[TenantProfile], nodes: &mut CellNodes, scope: &Scope) -> BTreeMap<String, CellGrants> {
    if tenants.is_empty() {
        // Capacity nobody asks for (a MIG profile no tenant requests): every pass would only
        // take the units off their holders, as this does.
        unbind_cell(nodes, scope);
        return BTreeMap::new();
    }
    let mut order: Vec<usize> = (0..tenants.len()).collect();
    order.sort_by(|&x, &y| {
        tenants[y]
            .priority
            .cmp(&tenants[x].priority)
            .then(tenants[x].name.cmp(&tenants[y].name))
    });
    unbind_cell(nodes, scope);
    let cell = CellPasses {
        tenants,
        scope,
        now: Current::from_inventory(nodes, &scope.gpus),
        template: Template::of(nodes, scope),
        order,
    };
    // How much each tenant gets: blind to what runs now.
    let amounts = blind_pass(tenants, nodes, scope, &cell.template, &cell.order).into_amounts();
    // Which units: from the current bindings. Where nothing runs now (a fleet planned from
    // empty) there is nothing to keep, and the blind pass's placement, on the nodes now, stands
    // for that pass.
    let first = if cell.now.holds_nothing() {
        None
    } else {
        match cell.place_from_now(nodes, &amounts) {
            Some(first) => Some(first),
            None => return cell.as_blind(nodes),
        }
    };
    // Once more from that result, every unit kept: shares over shared GPUs are then split as the
    // next plan would split them (feeding the output back changes nothing). Where that result
    // is what runs now and every pool kept first, this pass would be the one just made (the
    // same inputs place the same), so that one is kept.
    let placed = Current::from_plan(nodes, &cell.scope.gpus);
    if let Some((first, placings)) = first
        && placings.is_empty()
        && placed == cell.now
    {
        return first.grants(tenants, nodes);
    }
    unbind_cell(nodes, scope);
    let kept = match sticky::place(
        tenants,
        nodes,
        scope,
        &cell.template,
        &placed,
        &Placings::new(),
        &amounts,
        &cell.order,
    ) {
        Ok(kept) => kept,
        Err(_) => match cell.place_from_now(nodes, &amounts) {
            // The first placement again (the same inputs place the same).
            Some((kept, _)) => kept,
            None => return cell.as_blind(nodes),
        },
    };
    kept.grants(tenants, nodes)
}

/// What every placing pass of one cell starts from.
struct CellPasses<'c> {
    tenants: &'c [TenantProfile],
    scope: &'c Scope,
    /// Who holds each unit now.
    now: Current,
    template: Template,
    /// Tenants by priority, then name.
    order: Vec<usize>,
}

impl CellPasses<'_> {
    /// Places `amounts` from the current bindings. A pool where the units kept leave no room for
    /// some amount (shared GPUs: co-location splits them by tier) is placed again with less
    /// stickiness: kept level by level, then as the blind pass placed it. `None`: only the blind
    /// pass's placement gives the amounts (memory limits tie pools together).
    fn place_from_now(&self, nodes: &mut CellNodes, amounts: &Amounts) -> Option<(Placed, Placings)> {
        let mut placings = Placings::new();
        loop {
            unbind_cell(nodes, self.scope);
            let at = sticky::place(
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

    /// The blind pass's placement, where no placing from current bindings gives its amounts.
    fn as_blind(&self, nodes: &mut CellNodes) -> BTreeMap<String, CellGrants> {
        unbind_cell(nodes, self.scope);
        let placed = blind_pass(self.tenants, nodes, self.scope, &self.template, &self.order).finish();
        placed.grants(self.tenants, nodes)
    }
}

/// The pass that decides how much each tenant gets, blind to what runs now.
fn blind_pass<'n, 'v, 'a>(
    tenants: &'n [TenantProfile],
    nodes: &'n mut CellNodes<'v, 'a>,
    scope: &'n Scope,
    template: &Template,
    order: &[usize],
) -> Allocator<'n, 'v, 'a> {
    let mut blind = Allocator::new(tenants, nodes, scope, template, None);
    for level in order.chunk_by(|&x, &y| tenants[x].priority == tenants[y].priority) {
        blind.serve_level(level);
    }
    blind
}

/// Takes every tenant of the cell's families off its GPUs: where each of its passes starts.
fn unbind_cell(nodes: &mut CellNodes, scope: &Scope) {
    for &(n, g) in &scope.gpus {
        GpuBindings::unbind(&mut nodes[n as usize].gpus, g as usize, scope);
    }
}

impl<'n, 'v, 'a> Allocator<'n, 'v, 'a> {
    /// An allocator over `nodes`; a placing pass passes the current bindings and how each pool uses them.
    fn new(
        tenants: &'n [TenantProfile],
        nodes: &'n mut CellNodes<'v, 'a>,
        scope: &'n Scope,
        template: &Template,
        current: Option<(&'n Current, &Placings)>,
    ) -> Self {
        let (pools, held) = template.pools(current);
        let state = tenants
            .iter()
            .map(|t| TenantState {
                remaining: t.requests.iter().map(|r| r.count).collect(),
                granted: vec![0; t.requests.len()],
                memory_mib: 0,
                units: vec![],
                shares: BTreeMap::new(),
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
        }
    }
}

impl Allocator<'_, '_, '_> {
    fn serve_level(&mut self, level: &[usize]) {
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
    fn take(&mut self, t: usize, r: usize, want: u32, dedicated: bool) {
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
    fn take_from(&mut self, t: usize, r: usize, key: &PoolKey, want: u32) -> u32 {
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

    fn count(&mut self, t: usize, r: usize, key: &PoolKey, units: u32) {
        if units > 0 {
            *self.state[t].by_pool.entry((r, key.clone())).or_default() += units;
        }
    }

    /// Units of request `r` tenant `t` has from pool `key` so far.
    fn have(&self, t: usize, r: usize, key: &PoolKey) -> u32 {
        self.state[t].by_pool.get(&(r, key.clone())).copied().unwrap_or(0)
    }

    /// What this pass decided, for the placing pass.
    fn into_amounts(mut self) -> Amounts {
        let shared_gpus = self
            .pools
            .keys()
            .filter(|k| matches!(k.0, Family::Shared(_)))
            .map(|k| (k.clone(), self.gpu_users(k)))
            .collect();
        Amounts {
            targets: self.state.iter_mut().map(|s| std::mem::take(&mut s.by_pool)).collect(),
            log: std::mem::take(&mut self.log),
            why: self.state.iter_mut().map(|s| std::mem::take(&mut s.why)).collect(),
            shared_gpus,
        }
    }

    /// How many units of `unit_mib` the tenant's memory limit still allows (up to `want`).
    fn memory_allows(&mut self, t: usize, r: usize, unit_mib: u64, want: u32) -> u32 {
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

    fn record(&mut self, t: usize, r: usize, units: u32, unit_mib: u64) {
        let s = &mut self.state[t];
        s.remaining[r] -= units;
        s.granted[r] += units;
        s.memory_mib += unit_mib * u64::from(units);
    }

    fn take_mig(&mut self, t: usize, r: usize, key: &PoolKey, want: u32, profile: &str) -> u32 {
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

    fn bind_instance(&mut self, t: usize, (node, gpu): GpuRef, inst: u32) {
        let spec = &mut self.nodes[node as usize].gpus[gpu as usize];
        spec.mig_instances[inst as usize].tenant = Some(self.tenants[t].name.clone());
        self.state[t].units.push(Unit::Instance((node, gpu), inst));
    }

    fn bind_whole(&mut self, t: usize, (node, gpu): GpuRef, mode: Mode, count: u32) {
        let name = self.tenants[t].name.clone();
        let nd = &mut self.nodes[node as usize];
        let spec = &mut nd.gpus[gpu as usize];
        if !spec.tenants.contains(&name) {
            spec.tenants.push(name.clone());
        }
        if mode.is_shared() {
            match spec.shares.iter_mut().find(|s| s.tenant == name) {
                Some(s) => s.count += count,
                None => {
                    spec.shares.push(crate::api::TenantShares { tenant: name, count });
                    spec.shares.sort();
                }
            }
        }
        if mode == Mode::Exclusive {
            self.state[t].units.push(Unit::Gpu((node, gpu)));
        }
    }
}
