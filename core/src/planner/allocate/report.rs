//! The allocator's result per tenant: grants, allocation summary and why requests fell short.

use super::{Allocator, Family, Pool, Shortfall, TenantGrants};
use crate::api::{AllocationSummary, Grant, Mode, ScrubMemory};
use crate::planner::changes::scrub_policies;
use std::collections::{BTreeMap, HashMap};

impl Allocator<'_, '_> {
    pub(super) fn finish(mut self) -> BTreeMap<String, TenantGrants> {
        // Shares become one grant per GPU.
        for t in 0..self.tenants.len() {
            let shares = std::mem::take(&mut self.state[t].shares);
            for ((family, ded, i), count) in shares {
                let Some(Pool::Shared { gpus, .. }) = self.pools.get(&(family.clone(), ded)) else {
                    continue;
                };
                let (node, gpu) = gpus[i].at;
                let nd = &self.nodes[node as usize];
                let spec = &nd.gpus[gpu as usize];
                self.state[t].grants.push(Grant {
                    node: nd.inventory.name.clone(),
                    gpu: spec.index,
                    gpu_uuid: nd.inventory.gpus[spec.index as usize].uuid.clone(),
                    mode: if let Family::Shared(m) = family { m } else { Mode::Mps },
                    profile: None,
                    placement: None,
                    instance_uuid: None,
                    count,
                });
            }
        }
        // Scrub policy per GPU: the strictest of the tenants it serves and of those it is taken
        // from, unknown previous owners counting as `Always` (the rule: `changes::scrub_policies`).
        let scrub_of: HashMap<&str, ScrubMemory> = self.tenants.iter().map(|t| (t.name.as_str(), t.scrub)).collect();
        for node in self.nodes.iter_mut() {
            for gpu in &mut node.gpus {
                gpu.tenants.sort();
            }
            let scrub = scrub_policies(node, &scrub_of);
            for (gpu, s) in node.gpus.iter_mut().zip(scrub) {
                gpu.scrub = s;
            }
        }
        let mut out = BTreeMap::new();
        for (t, tenant) in self.tenants.iter().enumerate() {
            let s = &mut self.state[t];
            let mut grants = std::mem::take(&mut s.grants);
            grants.sort_by(|a, b| (&a.node, a.gpu, &a.placement).cmp(&(&b.node, b.gpu, &b.placement)));
            let allocation = tenant
                .requests
                .iter()
                .zip(&s.granted)
                .map(|(req, &granted)| AllocationSummary {
                    mode: req.mode,
                    profile: req.profile.clone(),
                    requested: req.count,
                    granted,
                })
                .collect();
            let shortfalls = tenant
                .requests
                .iter()
                .enumerate()
                .filter(|(r, req)| s.granted[*r] < req.count)
                .map(|(r, req)| {
                    let family = Family::of(req.mode, req.profile.as_deref()).label();
                    let head = format!("{family}: granted {} of {}", s.granted[r], req.count);
                    match &s.why[r] {
                        Some(Shortfall::Capacity { available, demand, tenants, priority }) => format!(
                            "{head}; capacity short: {available} free for {tenants} tenant{} at priority {priority} asking for {demand}, split by weight ({})",
                            if *tenants == 1 { "" } else { "s" },
                            tenant.weight
                        ),
                        Some(Shortfall::Memory { limit_mib }) => {
                            format!("{head}; the memory limit of {} MiB is reached", limit_mib)
                        }
                        Some(Shortfall::Topology { count }) => format!(
                            "{head}; topology Required and no NUMA domain has {count} free GPUs"
                        ),
                        Some(Shortfall::Rules) => format!(
                            "{head}; no GPU of that kind meets the tier's co-location rule and the policy's limits"
                        ),
                        None => format!("{head}; no capacity of that kind exists on the selected nodes"),
                    }
                })
                .collect();
            out.insert(
                tenant.name.clone(),
                TenantGrants {
                    grants,
                    allocation,
                    memory_mib: s.memory_mib,
                    shortfalls,
                },
            );
        }
        out
    }
}
