//! Exclusive GPUs: which NUMA domain a grant comes from (topology policy, best fit), and, when
//! placing from current bindings, GPUs added to a grant join the domain of those it kept.

use super::{Allocator, Pool, PoolKey, Shortfall};
use crate::api::{Mode, TopologyPolicy};

impl Allocator<'_, '_> {
    pub(super) fn take_exclusive(&mut self, t: usize, r: usize, key: &PoolKey, want: u32) -> u32 {
        let Some(picks) = self.pick_domains(t, r, key, want) else {
            return 0;
        };
        let mut granted = 0;
        for (d, n) in picks {
            for _ in 0..n {
                let Some(Pool::Exclusive(domains)) = self.pools.get(key) else {
                    return granted;
                };
                let Some(&gpu) = domains[d].free.first() else {
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
        let Some(Pool::Exclusive(domains)) = self.pools.get(key) else {
            return None;
        };
        // Placing from current bindings: GPUs added to a grant join the domain of those it kept.
        if self.sticky(key) && topology != TopologyPolicy::Ignore {
            let mut mine: Vec<(usize, usize)> = (0..domains.len())
                .map(|i| (domains[i].users.iter().filter(|&&u| u == t).count(), i))
                .filter(|&(c, _)| c > 0)
                .collect();
            mine.sort_by_key(|&(c, i)| (std::cmp::Reverse(c), i));
            if let Some(&(_, d)) = mine.iter().find(|&&(_, i)| domains[i].free.len() as u32 >= want) {
                return Some(vec![(d, want as usize)]);
            }
            if topology == TopologyPolicy::Required && !mine.is_empty() {
                return None;
            }
        }
        // Best fit: the fullest domain that still holds the whole request keeps big domains free.
        let fits = domains
            .iter()
            .enumerate()
            .filter(|(_, d)| d.free.len() as u32 >= want)
            .min_by_key(|(i, d)| (d.free.len(), *i))
            .map(|(i, _)| i);
        match (fits, topology) {
            (Some(d), _) if want > 1 && topology != TopologyPolicy::Ignore => Some(vec![(d, want as usize)]),
            (None, TopologyPolicy::Required) if want > 1 => {
                self.state[t].why[r] = Some(Shortfall::Topology { count: want });
                None
            }
            _ => {
                // Largest domains first: the fewest domains for what is left.
                let mut order: Vec<usize> = (0..domains.len()).filter(|&i| !domains[i].free.is_empty()).collect();
                if want == 1 {
                    order.sort_by_key(|&i| (domains[i].free.len(), i));
                } else {
                    order.sort_by_key(|&i| (std::cmp::Reverse(domains[i].free.len()), i));
                }
                let mut picks = Vec::new();
                let mut left = want as usize;
                for i in order {
                    if left == 0 {
                        break;
                    }
                    let n = left.min(domains[i].free.len());
                    picks.push((i, n));
                    left -= n;
                }
                Some(picks)
            }
        }
    }

    /// Grants free GPU `gpu` (position on its node) of domain `d` of pool `key`, if the memory limit allows.
    pub(super) fn take_gpu(&mut self, t: usize, r: usize, key: &PoolKey, d: usize, gpu: u32) -> bool {
        let Some(Pool::Exclusive(domains)) = self.pools.get(key) else {
            return false;
        };
        let node = domains[d].node;
        let nd = &self.nodes[node as usize];
        let unit = nd.inventory.gpus[nd.gpus[gpu as usize].index as usize].memory_mib;
        if self.memory_allows(t, r, unit, 1) == 0 {
            return false;
        }
        if let Some(Pool::Exclusive(domains)) = self.pools.get_mut(key) {
            domains[d].free.retain(|&g| g != gpu);
            domains[d].users.push(t);
        }
        self.bind_whole(t, (node, gpu), Mode::Exclusive, 1);
        self.record(t, r, 1, unit);
        true
    }
}
