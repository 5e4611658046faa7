//! The capacity pools: each kind of capacity (MIG profile, exclusive GPUs by NUMA domain, MPS or
//! time-slicing GPUs), open or dedicated to tenants, with the units each tenant holds now when a
//! pass places from the current bindings.

use super::cells::Scope;
use super::sticky::{Current, Placing, Placings};
use super::{Domain, ExclusivePool, Family, MigPool, Pool, PoolKey, SharedGpu};
use crate::api::{Mode, quantity_to_mib};
use crate::planner::nodes::NodeDesired;
use foldhash::{HashMap, HashMapExt};
use std::collections::BTreeMap;

pub(super) type Held = HashMap<PoolKey, BTreeMap<String, Vec<(usize, u32)>>>;

/// The pools as they are built: found by family and dedication without building a key (a fleet
/// has a few pools and hundreds of thousands of units; a key per unit was a string copied and
/// freed twice per MIG instance, and each pass builds the pools again), each holder's units by
/// its name as the current bindings hold it.
#[derive(Default)]
struct Builder<'x, 'c> {
    index: HashMap<PoolOf<'x>, usize>,
    /// The pool found last: the next unit is nearly always of the same one.
    last: Option<(PoolOf<'x>, usize)>,
    keys: Vec<PoolKey>,
    pools: Vec<Pool>,
    /// Per pool: whether it is placed from the current bindings, and who holds which units now.
    sticky: Vec<bool>,
    held: Vec<HashMap<&'c str, Vec<(usize, u32)>>>,
}

/// A pool's family (mode, and MIG profile or empty) and dedication, borrowed.
type PoolOf<'x> = (Mode, &'x str, &'x [String]);

impl<'x, 'c> Builder<'x, 'c> {
    /// The pool of `mode` (MIG `profile`; empty otherwise) dedicated to `dedicated` (sorted),
    /// made with `new` the first time.
    fn pool(&mut self, of: PoolOf<'x>, placings: Option<&Placings>, new: impl FnOnce() -> Pool) -> usize {
        if let Some((last, i)) = self.last
            && last == of
        {
            return i;
        }
        let (mode, profile, dedicated) = of;
        let n = self.pools.len();
        let i = *self.index.entry(of).or_insert_with(|| {
            let key = (Family::of(mode, Some(profile)), dedicated.to_vec());
            // Current bindings count in the pools placed from them.
            self.sticky
                .push(placings.is_some_and(|p| p.get(&key) != Some(&Placing::Blind)));
            self.keys.push(key);
            self.pools.push(new());
            self.held.push(HashMap::new());
            n
        });
        self.last = Some((of, i));
        i
    }

    fn hold(&mut self, pool: usize, holder: &'c str, unit: (usize, u32)) {
        self.held[pool].entry(holder).or_default().push(unit);
    }

    fn finish(self) -> (BTreeMap<PoolKey, Pool>, Held) {
        let mut held: Held = HashMap::new();
        let mut pools = BTreeMap::new();
        for ((key, mut pool), holders) in self.keys.into_iter().zip(self.pools).zip(self.held) {
            if let Pool::Mig(p) = &mut pool {
                // Instances nobody holds now first: a new grant takes no instance it need not.
                let mut busy = vec![false; p.slots.len()];
                for &(s, _) in holders.values().flatten() {
                    busy[s] = true;
                }
                p.order = (0..p.slots.len()).collect();
                p.order.sort_by_key(|&s| (busy[s], s));
            }
            if !holders.is_empty() {
                let by_name = holders.into_iter().map(|(h, units)| (h.to_string(), units)).collect();
                held.insert(key.clone(), by_name);
            }
            pools.insert(key, pool);
        }
        (pools, held)
    }
}

pub(super) fn build_pools<'c>(
    nodes: &[NodeDesired],
    scope: &Scope,
    current: Option<(&'c Current, &Placings)>,
) -> (BTreeMap<PoolKey, Pool>, Held) {
    let placings = current.map(|(_, p)| p);
    let mut b = Builder::default();
    let default_mps = crate::api::MpsSettings::default();
    // The pinned memory limit as MiB, parsed once per distinct value (one per plan group).
    let mut pinned: Vec<(&str, Option<u64>)> = Vec::new();
    let mut base = 0;
    for on_node in scope.gpus.chunk_by(|a, b| a.0 == b.0) {
        // The holders of the node's GPU `g` (`Current` lists the scope's GPUs in order).
        let holders_of = |c: &'c Current, g: u32| {
            let j = on_node
                .iter()
                .position(|&(_, x)| x == g)
                .expect("a GPU of the node's scope");
            &c.gpus[base + j]
        };
        let n = on_node[0].0 as usize;
        let node = &nodes[n];
        let mut domains: BTreeMap<(&[String], i32), Vec<u32>> = BTreeMap::new();
        for &(_, g) in on_node {
            let g = g as usize;
            let gpu = &node.gpus[g];
            // Sorted when the node's layout was resolved (`planner::nodes`).
            let ded = node.dedicated[g].as_slice();
            let at = (n as u32, g as u32);
            let inv = &node.inventory.gpus[gpu.index as usize];
            let now = current.map(|(c, _)| holders_of(c, g as u32));
            match gpu.mode {
                Mode::Mig => {
                    for (i, inst) in gpu.mig_instances.iter().enumerate() {
                        if !scope.has_mig(&inst.profile) {
                            continue;
                        }
                        let pool = b.pool((Mode::Mig, &inst.profile, ded), placings, || {
                            Pool::Mig(MigPool {
                                slots: vec![],
                                unit_mib: 0,
                                order: vec![],
                                taken: vec![],
                                next: 0,
                                free: 0,
                            })
                        });
                        let holder = now.filter(|_| b.sticky[pool]).and_then(|h| h.instances[i].as_deref());
                        let Pool::Mig(p) = &mut b.pools[pool] else {
                            continue;
                        };
                        let memory = inv
                            .profile_memory_mib
                            .get(&inst.profile)
                            .copied()
                            .or_else(|| inv.model.and_then(|m| m.profile_memory_mib(&inst.profile)))
                            .or_else(|| crate::mig::nominal_memory_mib(&inst.profile))
                            .unwrap_or(0);
                        p.unit_mib = p.unit_mib.max(memory);
                        let unit = (p.slots.len(), 0);
                        p.slots.push((at, i as u32));
                        p.taken.push(false);
                        p.free += 1;
                        if let Some(h) = holder {
                            b.hold(pool, h, unit);
                        }
                    }
                }
                Mode::Exclusive => domains.entry((ded, inv.numa_node)).or_default().push(g as u32),
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
                    let pool = b.pool((mode, "", ded), placings, || Pool::Shared {
                        gpus: vec![],
                        next_empty: 0,
                        partial: HashMap::new(),
                    });
                    let holders = now.filter(|_| b.sticky[pool]);
                    let Pool::Shared { gpus, .. } = &mut b.pools[pool] else {
                        continue;
                    };
                    let unit = gpus.len();
                    gpus.push(SharedGpu {
                        at,
                        setting,
                        memory_mib: inv.memory_mib,
                        pinned_mib,
                        capacity: None,
                        used: 0,
                        tier: None,
                        locked: false,
                    });
                    // Each holder with its share count: the next pass keeps as many.
                    for (t, h) in holders.map_or(&[][..], |h| h.whole.as_slice()).iter().enumerate() {
                        let count = holders.and_then(|h| h.shares.get(t)).copied().unwrap_or(0);
                        b.hold(pool, h, (unit, count));
                    }
                }
            }
        }
        for ((ded, _numa), mut free) in domains {
            let pool = b.pool((Mode::Exclusive, "", ded), placings, || {
                Pool::Exclusive(ExclusivePool::default())
            });
            let Pool::Exclusive(p) = &b.pools[pool] else {
                continue;
            };
            let domain = p.len();
            if let Some((c, _)) = current.filter(|_| b.sticky[pool]) {
                for &g in &free {
                    for h in &holders_of(c, g).whole {
                        b.hold(pool, h, (domain, g));
                    }
                }
                // Free GPUs first: a new grant hands over no GPU it does not have to.
                free.sort_by_key(|&g| (!holders_of(c, g).whole.is_empty(), g));
            }
            if let Pool::Exclusive(p) = &mut b.pools[pool] {
                p.push(Domain { node: n as u32, free });
            }
        }
        base += on_node.len();
    }
    b.finish()
}
