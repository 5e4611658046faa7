//! Exclusive GPUs: which NUMA domain a grant comes from (topology policy, best fit), and, when
//! placing from current bindings, GPUs added to a grant join the domain of those it kept.
//!
//! A pool holds every NUMA domain of its kind across the fleet (100,000 at 50,000 nodes), so no
//! grant may look at every domain: the pool keeps its domains indexed by free GPU count and by
//! the tenants that took from them, and a grant looks only at the counts (a handful) and at its
//! own tenant's domains. The choices are those of a scan in (count, domain) order.

use super::{Allocator, Pool, PoolKey, Shortfall};
use crate::api::{Mode, TopologyPolicy};
use foldhash::HashMap;
use std::collections::{BTreeMap, BTreeSet};

pub(super) struct Domain {
    pub node: u32,
    /// GPU positions still free (nobody holds them now first, when placing from current bindings).
    pub free: Vec<u32>,
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
    pub fn len(&self) -> usize {
        self.domains.len()
    }

    pub fn domain(&self, d: usize) -> &Domain {
        &self.domains[d]
    }

    pub fn free_gpus(&self) -> u64 {
        self.free_gpus
    }

    pub fn push(&mut self, domain: Domain) {
        let d = self.domains.len();
        self.file(d, domain.free.len());
        self.free_gpus += domain.free.len() as u64;
        self.domains.push(domain);
    }

    fn file(&mut self, d: usize, free: usize) {
        if self.by_free.len() <= free {
            self.by_free.resize_with(free + 1, BTreeSet::new);
        }
        self.by_free[free].insert(d);
    }

    /// GPU `gpu` of domain `d` goes to tenant `t`.
    fn take(&mut self, d: usize, gpu: u32, t: usize) {
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
    fn fullest_first(&self, min: usize) -> impl Iterator<Item = usize> + '_ {
        self.by_free.iter().skip(min.max(1)).flat_map(|set| set.iter().copied())
    }

    /// Domains with free GPUs, most free first (then domain order).
    fn emptiest_first(&self) -> impl Iterator<Item = usize> + '_ {
        self.by_free.iter().skip(1).rev().flat_map(|set| set.iter().copied())
    }
}

impl Allocator<'_, '_, '_> {
    pub(super) fn take_exclusive(&mut self, t: usize, r: usize, key: &PoolKey, want: u32) -> u32 {
        let Some(picks) = self.pick_domains(t, r, key, want) else {
            return 0;
        };
        let mut granted = 0;
        for (d, n) in picks {
            for _ in 0..n {
                let Some(Pool::Exclusive(pool)) = self.pools.get(key) else {
                    return granted;
                };
                let Some(&gpu) = pool.domain(d).free.first() else {
                    break;
                };
                if !self.take_gpu(t, r, key, d, gpu) {
                    return granted;
                }
                granted += 1;
            }
        }
        granted
    }

    /// Which NUMA domains of pool `key` a grant of `want` exclusive GPUs comes from: (domain, count).
    /// `None` when topology `Required` finds no domain for it.
    fn pick_domains(&mut self, t: usize, r: usize, key: &PoolKey, want: u32) -> Option<Vec<(usize, usize)>> {
        let topology = self.tenants[t].topology;
        let Some(Pool::Exclusive(pool)) = self.pools.get(key) else {
            return None;
        };
        let want_n = want as usize;
        // Placing from current bindings: GPUs added to a grant join the domain of those it kept.
        if self.sticky(key) && topology != TopologyPolicy::Ignore {
            let mut mine: Vec<(usize, usize)> = pool
                .by_user
                .get(&t)
                .map(|m| m.iter().map(|(&d, &c)| (c, d)).collect())
                .unwrap_or_default();
            mine.sort_by_key(|&(c, d)| (std::cmp::Reverse(c), d));
            if let Some(&(_, d)) = mine.iter().find(|&&(_, d)| pool.domain(d).free.len() >= want_n) {
                return Some(vec![(d, want_n)]);
            }
            if topology == TopologyPolicy::Required && !mine.is_empty() {
                return None;
            }
        }
        // Best fit: the fullest domain that still holds the whole request keeps big domains free.
        let fits = pool.fullest_first(want_n).next();
        match (fits, topology) {
            (Some(d), _) if want > 1 && topology != TopologyPolicy::Ignore => Some(vec![(d, want_n)]),
            (None, TopologyPolicy::Required) if want > 1 => {
                self.state[t].why[r] = Some(Shortfall::Topology { count: want });
                None
            }
            // One GPU: from the fullest domain that has one.
            _ if want == 1 => fits.map(|d| vec![(d, 1)]).or(Some(vec![])),
            _ => {
                // Largest domains first: the fewest domains for what is left.
                let mut picks = Vec::new();
                let mut left = want_n;
                for d in pool.emptiest_first() {
                    if left == 0 {
                        break;
                    }
                    let n = left.min(pool.domain(d).free.len());
                    picks.push((d, n));
                    left -= n;
                }
                Some(picks)
            }
        }
    }

    /// Grants free GPU `gpu` (position on its node) of domain `d` of pool `key`, if the memory limit allows.
    pub(super) fn take_gpu(&mut self, t: usize, r: usize, key: &PoolKey, d: usize, gpu: u32) -> bool {
        let Some(Pool::Exclusive(pool)) = self.pools.get(key) else {
            return false;
        };
        let node = pool.domain(d).node;
        let nd = &self.nodes[node as usize];
        let unit = nd.inventory.gpus[nd.gpus[gpu as usize].index as usize].memory_mib;
        if self.memory_allows(t, r, unit, 1) == 0 {
            return false;
        }
        if let Some(Pool::Exclusive(pool)) = self.pools.get_mut(key) {
            pool.take(d, gpu, t);
        }
        self.bind_whole(t, (node, gpu), Mode::Exclusive, 1);
        self.record(t, r, 1, unit);
        true
    }
}
