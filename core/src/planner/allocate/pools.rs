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

fn hold(held: &mut Held, key: &PoolKey, holders: &[String], unit: (usize, u32)) {
    for h in holders {
        held.entry(key.clone())
            .or_default()
            .entry(h.clone())
            .or_default()
            .push(unit);
    }
}

pub(super) fn build_pools(
    nodes: &[NodeDesired],
    scope: &Scope,
    current: Option<(&Current, &Placings)>,
) -> (BTreeMap<PoolKey, Pool>, Held) {
    // Current bindings count in the pools placed from them.
    let current_for = |key: &PoolKey| {
        current
            .filter(|(_, p)| p.get(key) != Some(&Placing::Blind))
            .map(|(c, _)| c)
    };
    let mut pools: BTreeMap<PoolKey, Pool> = BTreeMap::new();
    let mut held: Held = HashMap::new();
    let none = Vec::new();
    let default_mps = crate::api::MpsSettings::default();
    // The pinned memory limit as MiB, parsed once per distinct value (one per plan group).
    let mut pinned: Vec<(&str, Option<u64>)> = Vec::new();
    for on_node in scope.gpus.chunk_by(|a, b| a.0 == b.0) {
        let n = on_node[0].0 as usize;
        let node = &nodes[n];
        let mut domains: BTreeMap<(Vec<String>, i32), Vec<u32>> = BTreeMap::new();
        for &(_, g) in on_node {
            let g = g as usize;
            let gpu = &node.gpus[g];
            let mut ded = node.dedicated[g].clone();
            ded.sort();
            let at = (n as u32, g as u32);
            let inv = &node.inventory.gpus[gpu.index as usize];
            match gpu.mode {
                Mode::Mig => {
                    for (i, inst) in gpu.mig_instances.iter().enumerate() {
                        let family = Family::Mig(inst.profile.clone());
                        if !scope.has(&family) {
                            continue;
                        }
                        let key = (family, ded.clone());
                        let holder = current_for(&key).and_then(|c| c.gpus[n][g].instances[i].clone());
                        let pool = pools.entry(key.clone()).or_insert_with(|| {
                            Pool::Mig(MigPool {
                                slots: vec![],
                                unit_mib: 0,
                                order: vec![],
                                taken: vec![],
                                next: 0,
                                free: 0,
                            })
                        });
                        if let Pool::Mig(p) = pool {
                            let memory = inv
                                .profile_memory_mib
                                .get(&inst.profile)
                                .copied()
                                .or_else(|| inv.model.and_then(|m| m.profile_memory_mib(&inst.profile)))
                                .or_else(|| crate::mig::nominal_memory_mib(&inst.profile))
                                .unwrap_or(0);
                            p.unit_mib = p.unit_mib.max(memory);
                            hold(&mut held, &key, holder.as_slice(), (p.slots.len(), 0));
                            p.slots.push((at, i as u32));
                            p.taken.push(false);
                            p.free += 1;
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
                    let key = (Family::Shared(mode), ded);
                    let pool = pools.entry(key.clone()).or_insert_with(|| Pool::Shared {
                        gpus: vec![],
                        next_empty: 0,
                        partial: HashMap::new(),
                    });
                    if let Pool::Shared { gpus, .. } = pool {
                        // Each holder with its share count: the next pass keeps as many.
                        let now = current_for(&key).map(|c| &c.gpus[n][g]);
                        for (t, h) in now.map_or(&none, |h| &h.whole).iter().enumerate() {
                            let count = now.and_then(|h| h.shares.get(t)).copied().unwrap_or(0);
                            hold(&mut held, &key, std::slice::from_ref(h), (gpus.len(), count));
                        }
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
                    }
                }
            }
        }
        for ((ded, _numa), mut free) in domains {
            let key = (Family::Exclusive, ded);
            let pool = pools
                .entry(key.clone())
                .or_insert_with(|| Pool::Exclusive(ExclusivePool::default()));
            if let Pool::Exclusive(p) = pool {
                if let Some(c) = current_for(&key) {
                    for &g in &free {
                        hold(&mut held, &key, &c.gpus[n][g as usize].whole, (p.len(), g));
                    }
                    // Free GPUs first: a new grant hands over no GPU it does not have to.
                    free.sort_by_key(|&g| (!c.gpus[n][g as usize].whole.is_empty(), g));
                }
                p.push(Domain { node: n as u32, free });
            }
        }
    }
    for (key, pool) in &mut pools {
        if let Pool::Mig(p) = pool {
            let mut busy = vec![false; p.slots.len()];
            for units in held.get(key).into_iter().flat_map(BTreeMap::values) {
                for &(s, _) in units {
                    busy[s] = true;
                }
            }
            p.order = (0..p.slots.len()).collect();
            p.order.sort_by_key(|&s| (busy[s], s));
        }
    }
    (pools, held)
}
