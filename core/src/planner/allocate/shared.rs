//! Shared GPUs (MPS, time-slicing): which GPU's shares a tenant takes, under its tier's
//! co-location rule, its policy's caps and the memory headroom.

use super::allocator::Allocator;
use super::pools::Pool;
use super::units::{Family, PoolKey, Shortfall};
use crate::api::{CoLocation, Mode};

impl Allocator<'_, '_, '_> {
    pub(super) fn take_shared(&mut self, t: usize, r: usize, key: &PoolKey, want: u32) -> u32 {
        let tenants = self.tenants;
        let forbidden = tenants[t].co_location == CoLocation::Forbidden;
        let tier = tenants[t].tier.as_str();
        let mut left = want;
        let mut eligible = false;
        // Own GPUs first, then partly used GPUs of the same tier, then empty ones in order.
        let own: Vec<usize> = match self.shared_id(key) {
            Some(id) => self.shared_gpus_of(t, id).collect(),
            None => vec![],
        };
        for i in own {
            if left == 0 {
                break;
            }
            left -= self.try_gpu(t, r, key, i, left, &mut eligible);
        }
        if !forbidden && left > 0 {
            let partial: Vec<usize> = match self.pools.get(key) {
                Some(Pool::Shared { partial, .. }) => partial.get(tier).cloned().unwrap_or_default(),
                _ => vec![],
            };
            for i in partial {
                if left == 0 {
                    break;
                }
                left -= self.try_gpu(t, r, key, i, left, &mut eligible);
            }
        }
        let mut i = match self.pools.get(key) {
            Some(Pool::Shared { next_empty, .. }) => *next_empty,
            _ => return 0,
        };
        while left > 0 {
            let Some(Pool::Shared { gpus, .. }) = self.pools.get(key) else {
                break;
            };
            if i >= gpus.len() {
                break;
            }
            if gpus[i].capacity.is_none() {
                left -= self.try_gpu(t, r, key, i, left, &mut eligible);
            }
            i += 1;
        }
        if !eligible && left > 0 {
            self.state[t].why[r].get_or_insert(Shortfall::Rules);
        }
        want - left
    }

    /// Grants up to `want` shares of shared GPU `i` of pool `key` to tenant `t`, if its rules allow.
    pub(super) fn try_gpu(
        &mut self,
        t: usize,
        r: usize,
        key: &PoolKey,
        i: usize,
        want: u32,
        eligible: &mut bool,
    ) -> u32 {
        let Some(allowed) = self.shares_allowed(t, r, key, i, want, eligible) else {
            return 0;
        };
        let tenants = self.tenants;
        let tenant = &tenants[t];
        let forbidden = tenant.co_location == CoLocation::Forbidden;
        let tier = tenant.tier.as_str();
        let Some(Pool::Shared {
            gpus,
            next_empty,
            partial,
            ..
        }) = self.pools.get_mut(key)
        else {
            return 0;
        };
        let n = allowed.shares;
        let capacity = allowed.capacity;
        let g = &mut gpus[i];
        let first = g.capacity.is_none();
        g.capacity = Some(capacity);
        g.used += n;
        let position = g.position as usize;
        if first {
            g.opener = Some(t);
            g.locked = forbidden;
            if !forbidden && g.used < capacity {
                // A tier's name copied once, for its first GPU.
                match partial.get_mut(tier) {
                    Some(list) => list.push(i),
                    None => {
                        partial.insert(tier.to_string(), vec![i]);
                    }
                }
            }
        } else if g.used >= capacity
            && let Some(list) = partial.get_mut(g.tier(tenants).unwrap_or_default())
        {
            list.retain(|&j| j != i);
        }
        while *next_empty < gpus.len() && gpus[*next_empty].capacity.is_some() {
            *next_empty += 1;
        }
        self.state[t].shares.add(allowed.id, i, n);
        if let Some(bound) = &mut self.bound {
            bound.whole_at(position, allowed.mode, t, n);
        }
        self.record(t, r, n, allowed.share_mib);
        n
    }

    /// How many of `want` shares of shared GPU `i` of pool `key` tenant `t`'s request `r` may take:
    /// its tier's co-location rule, its policy's caps, the GPU's capacity under its headroom and its
    /// memory limit allow. `eligible`: set where the rules let it onto the GPU. `None`: no share.
    fn shares_allowed(
        &mut self,
        t: usize,
        r: usize,
        key: &PoolKey,
        i: usize,
        want: u32,
        eligible: &mut bool,
    ) -> Option<Allowed> {
        let tenants = self.tenants;
        let tenant = &tenants[t];
        let forbidden = tenant.co_location == CoLocation::Forbidden;
        let headroom = u64::from(tenant.headroom_percent.min(100));
        let (mode, cap_setting) = match key.0 {
            Family::Shared(Mode::Mps) => (Mode::Mps, tenant.max_mps_clients),
            _ => (Mode::TimeSlicing, tenant.max_time_slicing_replicas),
        };
        let Some(Pool::Shared { id, gpus, .. }) = self.pools.get(key) else {
            return None;
        };
        let id = *id;
        let g = &gpus[i];
        let joins_others = g.used > 0 && !self.state[t].shares.holds(id, i);
        if g.setting > cap_setting
            || (joins_others && (forbidden || g.locked || g.tier(tenants) != Some(tenant.tier.as_str())))
        {
            return None;
        }
        *eligible = true;
        let share_mib = g.share_mib();
        let capacity = g.capacity.unwrap_or_else(|| g.capacity_under(&key.0, headroom as u32));
        let n = want.min(capacity.saturating_sub(g.used));
        let shares = if n == 0 {
            0
        } else {
            self.memory_allows(t, r, share_mib, n)
        };
        (shares > 0).then_some(Allowed {
            id,
            mode,
            shares,
            capacity,
            share_mib,
        })
    }
}

/// Shares a tenant may take on one shared GPU, and what taking them sets.
struct Allowed {
    /// The pool's position among the pass's pools.
    id: usize,
    mode: Mode,
    shares: u32,
    /// The GPU's share count, fixed by its first tenant.
    capacity: u32,
    share_mib: u64,
}
