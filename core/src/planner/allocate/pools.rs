//! The capacity pools: each kind of capacity (MIG profile, exclusive GPUs by NUMA domain, MPS or
//! time-slicing GPUs), open or dedicated to tenants, with the units each tenant holds now when a
//! pass places from the current bindings.
//!
//! A cell is placed by two passes or more (the blind pass, then placings from the current
//! bindings), over the same layouts: the pools are made from the nodes once per cell
//! ([`Template`]) and each pass takes a copy, with the holders of its own current bindings.

use super::cell_nodes::CellNodes;
use super::holders::{Current, Placing, Placings};
use super::scope::Scope;
use super::units::{Family, GpuRef, PoolKey};
use crate::api::{Mode, quantity_to_mib};
use foldhash::{HashMap, HashMapExt};
use std::collections::{BTreeMap, BTreeSet};

/// Per pool placed from the current bindings, the units each tenant holds now, by its name as
/// [`Current`] holds it.
pub(super) type Held<'c> = HashMap<PoolKey, HashMap<&'c str, Vec<(usize, u32)>>>;

/// A GPU's position in its node's spec list and in the cell's GPUs.
type GpuAt = (u32, u32);

/// A pool's family (mode, and MIG profile or empty) and dedication, borrowed.
type PoolOf<'x> = (Mode, &'x str, &'x [String]);

/// One pool as the layouts make it, and where the holders of each of its units are read: a
/// position in the cell's GPUs (`Scope::gpus`, the order [`Current`] lists them in).
enum Made {
    /// Per slot, its GPU's position and the instance's.
    Mig(MigPool, Vec<(u32, u32)>),
    /// Per shared GPU, its position.
    Shared(Vec<SharedGpu>, Vec<u32>),
    /// Per NUMA domain, its node and its GPUs (position in the node's spec list) in GPU order,
    /// each with its position in the cell's GPUs. The pool itself is made per pass: a placing
    /// pass puts the GPUs nobody holds now first.
    Exclusive(Vec<(u32, Vec<GpuAt>)>),
}

/// A cell's pools, made once from its nodes' layouts.
#[derive(Default)]
pub(super) struct Template {
    keys: Vec<PoolKey>,
    made: Vec<Made>,
}

/// The pools as they are made: found by family and dedication without building a key (a fleet
/// has a few pools and hundreds of thousands of units).
#[derive(Default)]
struct Builder<'x> {
    index: HashMap<PoolOf<'x>, usize>,
    /// The pool found last: the next unit is nearly always of the same one.
    last: Option<(PoolOf<'x>, usize)>,
    template: Template,
}

impl<'x> Builder<'x> {
    /// The pool of `of`'s mode (MIG profile; empty otherwise) dedicated to its tenants (sorted),
    /// made with `new` the first time.
    fn pool(&mut self, of: PoolOf<'x>, new: impl FnOnce() -> Made) -> &mut Made {
        let i = match self.last {
            Some((last, i)) if last == of => i,
            _ => {
                let (mode, profile, dedicated) = of;
                let t = &mut self.template;
                let n = t.made.len();
                let i = *self.index.entry(of).or_insert_with(|| {
                    t.keys.push((Family::of(mode, Some(profile)), dedicated.to_vec()));
                    t.made.push(new());
                    n
                });
                self.last = Some((of, i));
                i
            }
        };
        &mut self.template.made[i]
    }
}

impl Template {
    /// The pools of `scope`'s families over its GPUs, as `nodes` lay them out.
    pub fn of(nodes: &CellNodes, scope: &Scope) -> Template {
        let mut b = Builder::default();
        let default_mps = crate::api::MpsSettings::default();
        // The pinned memory limit as MiB, parsed once per distinct value (one per plan group).
        let mut pinned: Vec<(&str, Option<u64>)> = Vec::new();
        let mut position = 0u32;
        for on_node in scope.gpus.chunk_by(|a, b| a.0 == b.0) {
            let n = on_node[0].0 as usize;
            let node = &nodes[n];
            // Per (dedication, NUMA node): the GPUs with their positions.
            let mut domains: BTreeMap<(&[String], i32), Vec<GpuAt>> = BTreeMap::new();
            for &(_, g) in on_node {
                let at = (n as u32, g);
                let j = position;
                position += 1;
                let gpu = &node.gpus[g as usize];
                // Sorted when the node's layout was resolved (`planner::nodes`).
                let ded = node.dedicated[g as usize].as_slice();
                let inv = &node.inventory.gpus[gpu.index as usize];
                match gpu.mode {
                    Mode::Mig => {
                        // One instance's memory per profile of the GPU: its instances repeat profiles.
                        let mut memory_of: Option<(&str, u64)> = None;
                        for (i, inst) in gpu.mig_instances.iter().enumerate() {
                            if !scope.has_mig(&inst.profile) {
                                continue;
                            }
                            let memory = match memory_of {
                                Some((profile, mib)) if profile == inst.profile => mib,
                                _ => {
                                    let mib = inv
                                        .profile_memory_mib
                                        .get(&inst.profile)
                                        .copied()
                                        .or_else(|| inv.model.and_then(|m| m.profile_memory_mib(&inst.profile)))
                                        .or_else(|| crate::mig::nominal_memory_mib(&inst.profile))
                                        .unwrap_or(0);
                                    memory_of = Some((&inst.profile, mib));
                                    mib
                                }
                            };
                            let made = b.pool((Mode::Mig, &inst.profile, ded), || {
                                Made::Mig(
                                    MigPool {
                                        slots: vec![],
                                        unit_mib: 0,
                                        order: vec![],
                                        taken: vec![],
                                        next: 0,
                                        free: 0,
                                    },
                                    vec![],
                                )
                            });
                            if let Made::Mig(p, holders_at) = made {
                                p.unit_mib = p.unit_mib.max(memory);
                                p.slots.push((at, i as u32));
                                p.taken.push(false);
                                p.free += 1;
                                holders_at.push((j, i as u32));
                            }
                        }
                    }
                    Mode::Exclusive => domains.entry((ded, inv.numa_node)).or_default().push((g, j)),
                    mode => {
                        let (setting, pinned_mib) = match mode {
                            Mode::Mps => {
                                let mps = gpu.mps.as_ref().unwrap_or(&default_mps);
                                let mib = mps.pinned_memory_limit.as_deref().and_then(|q| {
                                    match pinned.iter().find(|(seen, _)| *seen == q) {
                                        Some(&(_, mib)) => mib,
                                        None => {
                                            let mib = quantity_to_mib(q);
                                            pinned.push((q, mib));
                                            mib
                                        }
                                    }
                                });
                                (mps.max_clients, mib)
                            }
                            _ => (gpu.time_slicing.as_ref().map_or(1, |t| t.replicas), None),
                        };
                        // An open pool sized for the cell's GPUs still to come: the MPS cell's holds
                        // 12,000 GPUs at 5,000 nodes, and a list grown by doubling copies them
                        // again. (Not a dedicated one: a cell may have one per tenant.)
                        let left = if ded.is_empty() {
                            scope.gpus.len() - j as usize
                        } else {
                            0
                        };
                        let new = || Made::Shared(Vec::with_capacity(left), Vec::with_capacity(left));
                        if let Made::Shared(gpus, holders_at) = b.pool((mode, "", ded), new) {
                            gpus.push(SharedGpu {
                                at,
                                position: j,
                                setting,
                                memory_mib: inv.memory_mib,
                                pinned_mib,
                                capacity: None,
                                used: 0,
                                opener: None,
                                locked: false,
                            });
                            holders_at.push(j);
                        }
                    }
                }
            }
            for ((ded, _numa), gpus) in domains {
                if let Made::Exclusive(d) = b.pool((Mode::Exclusive, "", ded), || Made::Exclusive(vec![])) {
                    d.push((n as u32, gpus));
                }
            }
        }
        b.template
    }

    /// A pass's pools: each a copy of the template's, with the units each tenant holds now in the
    /// pools `current` places from its bindings (`None`: the blind pass).
    pub fn pools<'c>(&self, current: Option<(&'c Current, &Placings)>) -> (BTreeMap<PoolKey, Pool>, Held<'c>) {
        let mut pools = BTreeMap::new();
        let mut held: Held = HashMap::new();
        for (key, made) in self.keys.iter().zip(&self.made) {
            // Current bindings count in the pools placed from them.
            let now = current
                .filter(|(_, p)| p.get(key) != Some(&Placing::Blind))
                .map(|(c, _)| c);
            let mut holders: HashMap<&'c str, Vec<(usize, u32)>> = HashMap::new();
            let pool = match made {
                Made::Mig(p, at) => {
                    let mut busy = vec![false; at.len()];
                    for (s, &(j, i)) in at.iter().enumerate() {
                        if let Some(h) = now.and_then(|c| c.instance(j, i)) {
                            holders.entry(h).or_default().push((s, 0));
                            busy[s] = true;
                        }
                    }
                    // Instances nobody holds now first, each part in slot order: a new grant
                    // takes no instance it need not.
                    let (free, held): (Vec<usize>, Vec<usize>) = (0..at.len()).partition(|&s| !busy[s]);
                    let mut order = free;
                    order.extend(held);
                    Pool::Mig(MigPool {
                        slots: p.slots.clone(),
                        unit_mib: p.unit_mib,
                        order,
                        taken: p.taken.clone(),
                        next: p.next,
                        free: p.free,
                    })
                }
                Made::Shared(gpus, at) => {
                    if let Some(c) = now {
                        for (unit, &j) in at.iter().enumerate() {
                            // Each holder with its share count: the next pass keeps as many.
                            let h = c.gpu(j);
                            for (t, name) in h.whole.iter().enumerate() {
                                let count = h.shares.get(t).copied().unwrap_or(0);
                                holders.entry(name).or_default().push((unit, count));
                            }
                        }
                    }
                    Pool::Shared {
                        id: 0,
                        gpus: gpus.clone(),
                        next_empty: 0,
                        partial: HashMap::new(),
                    }
                }
                Made::Exclusive(domains) => {
                    let mut p = ExclusivePool::default();
                    for (node, gpus) in domains {
                        let d = p.len();
                        let mut free: Vec<u32> = gpus.iter().map(|&(g, _)| g).collect();
                        if let Some(c) = now {
                            let whole = |j: u32| &c.gpu(j).whole;
                            for &(g, j) in gpus {
                                for h in whole(j) {
                                    holders.entry(h).or_default().push((d, g));
                                }
                            }
                            // Free GPUs first: a new grant hands over no GPU it does not have to.
                            let mut order: Vec<(bool, u32)> =
                                gpus.iter().map(|&(g, j)| (!whole(j).is_empty(), g)).collect();
                            order.sort();
                            free = order.into_iter().map(|(_, g)| g).collect();
                        }
                        p.push(Domain { node: *node, free });
                    }
                    Pool::Exclusive(p)
                }
            };
            if !holders.is_empty() {
                held.insert(key.clone(), holders);
            }
            pools.insert(key.clone(), pool);
        }
        // Shared pools by their position in key order: how a tenant's shares name them.
        for (n, pool) in pools.values_mut().enumerate() {
            if let Pool::Shared { id, .. } = pool {
                *id = n;
            }
        }
        (pools, held)
    }
}

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

impl SharedGpu {
    /// The tier using the GPU, of `tenants` (the pass's): none while nobody does.
    pub(super) fn tier<'t>(&self, tenants: &'t [crate::policy::TenantProfile]) -> Option<&'t str> {
        self.opener.map(|t| tenants[t].tier.as_str())
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

    pub(super) fn push(&mut self, domain: Domain) {
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
