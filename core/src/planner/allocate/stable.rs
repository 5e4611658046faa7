//! Whether a placing pass's result is already what placing again from it would give, known
//! without that pass.
//!
//! A cell's placing from what runs now is followed by one more pass from its own result, every
//! unit kept, so that feeding the output back changes nothing ([`super::place::allocate_cell`]). At
//! 5,000 nodes that second pass over the MPS cell's 12,000 GPUs was 40% of a tenant's change,
//! and nearly always gave the first result back. It does, without being run, when every unit
//! the first result holds is kept in that pass: its amounts are the first pass's (the same blind
//! pass), so it keeps each tenant's units in full and takes nothing more. What could refuse one:
//! - a shared GPU's share count is fixed by the headroom of the tenant that opens it, and the
//!   next pass opens it with its first holder in priority and name order: that headroom must
//!   give the count this pass gave;
//! - a tier (or a `coLocation: Forbidden` tenant) may open more GPUs than the blind pass gave it
//!   only while the GPUs left cover every other tier's (`sticky::may_open`): the pool must be
//!   large enough for every tier's count here or its quota, whichever is more;
//! - a tenant with two requests from one pool keeps its largest holdings for the first, which
//!   can leave another GPU's shares to be taken again (tenant checks refuse such requests);
//! - a tenant under topology `Required` keeps one NUMA domain's exclusive GPUs first: it must
//!   hold one domain's only.
//!
//! Tier, co-location and policy caps need no check: the units were granted under the same rules,
//! by tenant, and a GPU serves one tier. Memory limits neither: the same total is kept. Debug
//! builds run the second pass anyway and compare (`allocate_cell`), in every test.

use super::allocator::Allocator;
use super::pools::{ExclusivePool, GpuUser, Pool, SharedGpu};
use super::sticky::{Amounts, GpuUsers};
use super::units::PoolKey;
use crate::api::TopologyPolicy;
use std::collections::BTreeSet;

impl Allocator<'_, '_, '_> {
    /// Whether placing again from this pass's bindings, every unit kept, in `order` (priority,
    /// then name), under `amounts`, gives them back. `false` where that is not shown.
    pub(super) fn is_stable(&self, amounts: &Amounts, order: &[usize]) -> bool {
        for targets in &amounts.targets {
            let mut pools: BTreeSet<&PoolKey> = BTreeSet::new();
            if !targets.keys().all(|(_, key)| pools.insert(key)) {
                return false;
            }
        }
        self.pools.iter().all(|(key, pool)| match pool {
            Pool::Shared { gpus, .. } => self.shared_stable(key, gpus, amounts, order),
            Pool::Exclusive(pool) => self.exclusive_stable(pool),
            Pool::Mig(_) => true,
        })
    }

    /// One exclusive pool: no tenant under topology `Required` holds GPUs of two NUMA domains
    /// (placed again, it would keep only one domain's and take the rest anew).
    fn exclusive_stable(&self, pool: &ExclusivePool) -> bool {
        self.tenants.iter().enumerate().all(|(t, tenant)| {
            tenant.topology != TopologyPolicy::Required || pool.taken_by(t).is_none_or(|domains| domains.len() <= 1)
        })
    }

    /// One shared pool: every GPU in use opened by its first holder in `order` with the share
    /// count it has, and no tier (or locking tenant) on more GPUs than the blind pass gave it.
    fn shared_stable(&self, key: &PoolKey, gpus: &[SharedGpu], amounts: &Amounts, order: &[usize]) -> bool {
        let mut opener: Vec<Option<usize>> = vec![None; gpus.len()];
        if let Some(id) = self.shared_id(key) {
            for &t in order {
                for i in self.shared_gpus_of(t, id) {
                    opener[i].get_or_insert(t);
                }
            }
        }
        // Borrowed and hashed: counted once per GPU in use, 12,000 of them in a 5,000-node
        // fleet's MPS pool.
        let mut users: foldhash::HashMap<GpuUser, u32> = foldhash::HashMap::default();
        for (g, opener) in gpus.iter().zip(opener) {
            let Some(t) = opener else {
                continue;
            };
            let tenant = &self.tenants[t];
            if g.capacity != Some(g.capacity_under(&key.0, tenant.headroom_percent)) {
                return false;
            }
            if let Some(user) = g.user(self.tenants) {
                *users.entry(user).or_default() += 1;
            }
        }
        // `may_open` lets user u open a GPU past its quota q(u) while the pool's GPUs exceed
        // the sum over every user v of max(opened(v), q(v)). Placing again, opened(v) never
        // passes v's count c(v) here, and u opens past its quota only before reaching c(u), so
        // that sum is then at most Σ max(c(v), q(v)) - 1: a pool of at least Σ max(c(v), q(v))
        // GPUs lets every opening through.
        let none = GpuUsers::new();
        let quota = amounts.shared_gpus.get(key).unwrap_or(&none);
        // Users with a quota count max(c, q); the others c: every user's c, less the c of
        // those with a quota, found by looking each quota up (nothing copied).
        let mut counted_with_quota = 0u64;
        let with_quota: u64 = quota
            .iter()
            .map(|(user, &q)| {
                let count = users.get(user).copied().unwrap_or(0);
                counted_with_quota += u64::from(count);
                u64::from(count.max(q))
            })
            .sum();
        let every_count: u64 = users.values().map(|&n| u64::from(n)).sum();
        let most = with_quota + every_count - counted_with_quota;
        most <= gpus.len() as u64
    }
}
