//! Exclusive GPUs: which NUMA domain a grant comes from (topology policy, best fit), and, when
//! placing from current bindings, GPUs added to a grant join the domain of those it kept.
//!
//! A pool holds every NUMA domain of its kind across the fleet (100,000 at 50,000 nodes), so no
//! grant may look at every domain: the pool keeps its domains indexed by free GPU count and by
//! the tenants that took from them, and a grant looks only at the counts (a handful) and at its
//! own tenant's domains ([`super::pools::ExclusivePool`]). The choices are those of a scan in
//! (count, domain) order.

use super::allocator::Allocator;
use super::pools::Pool;
use super::units::{PoolKey, Shortfall};
use crate::api::TopologyPolicy;

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
                .taken_by(t)
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
        self.bind_gpu(t, (node, gpu));
        self.record(t, r, 1, unit);
        true
    }
}
