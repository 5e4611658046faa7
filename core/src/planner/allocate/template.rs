//! A cell's pools as its nodes' layouts make them, once per cell, and each pass's copy of them.
//!
//! A cell is placed by two passes or more (the blind pass, then placings from the current
//! bindings), over the same layouts: the pools are made from the nodes once per cell
//! ([`Template`]) and each pass takes a copy, with the holders of its own current bindings.

use super::cell_nodes::CellNodes;
use super::holders::{Current, Placing, Placings};
use super::pools::{Domain, ExclusivePool, MigPool, Pool, SharedGpu};
use super::scope::Scope;
use super::units::{Family, GpuRef, PoolKey};
use crate::api::{GpuSpec, MigInstanceSpec, Mode, MpsSettings, quantity_to_mib};
use crate::inventory::NodeGpu;
use foldhash::{HashMap, HashMapExt};
use std::collections::BTreeMap;

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

impl<'x> Builder<'x> {
    /// The cell's instances of MIG GPU `gpu` (the `j`th of the cell, at `at`), each to its
    /// profile's pool dedicated to `ded`.
    fn add_instances(
        &mut self,
        scope: &Scope,
        (at, j): (GpuRef, u32),
        gpu: &'x GpuSpec,
        inv: &NodeGpu,
        ded: &'x [String],
    ) {
        // One instance's memory per profile of the GPU: its instances repeat profiles.
        let mut memory_of: Option<(&str, u64)> = None;
        for (i, inst) in gpu.mig_instances.iter().enumerate() {
            if !scope.has_mig(&inst.profile) {
                continue;
            }
            let memory = match memory_of {
                Some((profile, mib)) if profile == inst.profile => mib,
                _ => {
                    let mib = instance_memory_mib(inv, inst);
                    memory_of = Some((&inst.profile, mib));
                    mib
                }
            };
            let made = self.pool((Mode::Mig, &inst.profile, ded), || {
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

    /// Shared GPU `gpu` to the pool of its mode dedicated to `ded`; `left`: the cell's GPUs from
    /// this one on.
    fn add_shared(&mut self, mode: Mode, ded: &'x [String], left: usize, gpu: SharedGpu) {
        // An open pool sized for the cell's GPUs still to come: the MPS cell's holds 12,000 GPUs
        // at 5,000 nodes, and a list grown by doubling copies them again. (Not a dedicated one:
        // a cell may have one per tenant.)
        let left = if ded.is_empty() { left } else { 0 };
        let new = || Made::Shared(Vec::with_capacity(left), Vec::with_capacity(left));
        if let Made::Shared(gpus, holders_at) = self.pool((mode, "", ded), new) {
            holders_at.push(gpu.position);
            gpus.push(gpu);
        }
    }
}

/// Memory of one MIG instance: as the driver reports its profile, else from the model's table,
/// else the profile name's nominal size.
fn instance_memory_mib(inv: &NodeGpu, inst: &MigInstanceSpec) -> u64 {
    inv.profile_memory_mib
        .get(&inst.profile)
        .copied()
        .or_else(|| inv.model.and_then(|m| m.profile_memory_mib(&inst.profile)))
        .or_else(|| crate::mig::nominal_memory_mib(&inst.profile))
        .unwrap_or(0)
}

/// Shared GPU `gpu` (of the node's `inv`), the `j`th of the cell at `at`, nobody on it yet.
/// `pinned`: each pinned memory limit seen as MiB, parsed once per distinct value (one per plan group).
fn shared_gpu<'x>(
    mode: Mode,
    (at, j): (GpuRef, u32),
    gpu: &'x GpuSpec,
    inv: &NodeGpu,
    pinned: &mut Vec<(&'x str, Option<u64>)>,
) -> SharedGpu {
    let (setting, pinned_mib) = match mode {
        Mode::Mps => {
            let mps = MpsSettings::in_effect(gpu.mps.as_ref());
            let mib =
                mps.pinned_memory_limit
                    .as_deref()
                    .and_then(|q| match pinned.iter().find(|(seen, _)| *seen == q) {
                        Some(&(_, mib)) => mib,
                        None => {
                            let mib = quantity_to_mib(q);
                            pinned.push((q, mib));
                            mib
                        }
                    });
            (mps.max_clients, mib)
        }
        _ => (gpu.time_slicing.as_ref().map_or(1, |t| t.replicas), None),
    };
    SharedGpu {
        at,
        position: j,
        setting,
        memory_mib: inv.memory_mib,
        pinned_mib,
        capacity: None,
        used: 0,
        opener: None,
        locked: false,
    }
}

impl Template {
    /// The pools of `scope`'s families over its GPUs, as `nodes` lay them out.
    pub fn of(nodes: &CellNodes, scope: &Scope) -> Template {
        let mut b = Builder::default();
        let mut pinned: Vec<(&str, Option<u64>)> = Vec::new();
        let mut position = 0u32;
        for on_node in scope.gpus.chunk_by(|a, b| a.0 == b.0) {
            let n = on_node[0].0 as usize;
            let node = &nodes[n];
            // Per (dedication, NUMA node): the GPUs with their positions.
            let mut domains: BTreeMap<(&[String], i32), Vec<GpuAt>> = BTreeMap::new();
            for &(_, g) in on_node {
                let at = ((n as u32, g), position);
                position += 1;
                let gpu = &node.gpus[g as usize];
                // Sorted when the node's layout was resolved (`planner::nodes`).
                let ded = node.dedicated[g as usize].as_slice();
                let inv = &node.inventory.gpus[gpu.index as usize];
                match gpu.mode {
                    Mode::Mig => b.add_instances(scope, at, gpu, inv, ded),
                    Mode::Exclusive => domains.entry((ded, inv.numa_node)).or_default().push((g, at.1)),
                    mode => {
                        let left = scope.gpus.len() - at.1 as usize;
                        b.add_shared(mode, ded, left, shared_gpu(mode, at, gpu, inv, &mut pinned));
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
                Made::Mig(p, at) => mig_pool(p, at, now, &mut holders),
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
                Made::Exclusive(domains) => Pool::Exclusive(exclusive_pool(domains, now, &mut holders)),
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

/// A pass's copy of MIG pool `p`, whose slots' holders are read at `at` in `now`.
fn mig_pool<'c>(
    p: &MigPool,
    at: &[(u32, u32)],
    now: Option<&'c Current>,
    holders: &mut HashMap<&'c str, Vec<(usize, u32)>>,
) -> Pool {
    let mut busy = vec![false; at.len()];
    for (s, &(j, i)) in at.iter().enumerate() {
        if let Some(h) = now.and_then(|c| c.instance(j, i)) {
            holders.entry(h).or_default().push((s, 0));
            busy[s] = true;
        }
    }
    // Instances nobody holds now first, each part in slot order: a new grant takes no instance
    // it need not.
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

/// A pass's exclusive pool over `domains`, whose GPUs' holders are read in `now`.
fn exclusive_pool<'c>(
    domains: &[(u32, Vec<GpuAt>)],
    now: Option<&'c Current>,
    holders: &mut HashMap<&'c str, Vec<(usize, u32)>>,
) -> ExclusivePool {
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
            let mut order: Vec<(bool, u32)> = gpus.iter().map(|&(g, j)| (!whole(j).is_empty(), g)).collect();
            order.sort();
            free = order.into_iter().map(|(_, g)| g).collect();
        }
        p.add_domain(Domain { node: *node, free });
    }
    p
}
