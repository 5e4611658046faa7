//! The allocator's result per tenant: grants, allocation summary and why requests fell short.

use super::allocator::Allocator;
use super::bound::Bound;
use super::cell_nodes::CellNodes;
use super::pools::{Pool, SharedGpu};
use super::units::{CellGrants, Family, GpuRef, Shortfall, Unit};
use crate::api::{AllocationSummary, Grant, Mode, ResourceRequest};
use crate::policy::TenantProfile;
use std::collections::BTreeMap;

/// What a pass placed, by position: the grants are built ([`Placed::grants`]) only for the pass
/// kept, on the nodes it placed.
pub(super) struct Placed {
    tenants: Vec<PlacedTenant>,
    /// Its bindings, for the nodes if it is kept.
    pub(super) bound: Bound,
    /// Placing again from this result, every unit kept, gives it back ([`super::stable`]);
    /// `false` where that is not shown.
    pub(super) stable: bool,
}

/// What a tenant received in a pass, by position.
pub(super) struct PlacedTenant {
    pub(super) at: Positions,
    pub(super) allocation: Vec<AllocationSummary>,
    pub(super) memory_mib: u64,
    pub(super) shortfalls: Vec<String>,
}

/// The units and shares a tenant received, by their GPUs' positions in the fleet: what its grants
/// name, once the nodes at those positions are read.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Positions {
    pub(super) units: Vec<Unit>,
    /// (GPU, mode, shares) per shared GPU.
    pub(super) shares: Vec<(GpuRef, Mode, u32)>,
}

impl Positions {
    /// Every GPU named, once per unit or share.
    pub(super) fn gpus(&self) -> impl Iterator<Item = GpuRef> + '_ {
        let units = self.units.iter().map(|u| match *u {
            Unit::Instance(at, _) | Unit::Gpu(at) => at,
        });
        units.chain(self.shares.iter().map(|&(at, _, _)| at))
    }
}

/// A placed cell's grants by tenant name, its bindings, and per tenant (as the cell's, in name
/// order) the positions its grants were built from and whether an earlier pass's were handed back.
pub(super) type Built = (BTreeMap<String, CellGrants>, Bound, Vec<Positions>, Vec<bool>);

impl Allocator<'_, '_, '_> {
    pub(super) fn finish(mut self) -> Placed {
        let mut placed = Vec::with_capacity(self.tenants.len());
        // Shared pools by their position in key order, as tenants' shares name them.
        let shared: Vec<(Mode, &[SharedGpu])> = self
            .pools
            .iter()
            .map(|((family, _), pool)| match (family, pool) {
                (Family::Shared(m), Pool::Shared { gpus, .. }) => (*m, gpus.as_slice()),
                _ => (Mode::Mps, &[][..]),
            })
            .collect();
        for t in 0..self.tenants.len() {
            let shares = std::mem::take(&mut self.state[t].shares)
                .into_entries()
                .filter_map(|((id, i), count)| {
                    let (mode, gpus) = shared.get(id)?;
                    Some((gpus.get(i)?.at, *mode, count))
                })
                .collect();
            placed.push(PlacedTenant {
                at: Positions {
                    units: std::mem::take(&mut self.state[t].units),
                    shares,
                },
                allocation: vec![],
                memory_mib: 0,
                shortfalls: vec![],
            });
        }
        // A pass that binds nothing (a blind pass another replaces) is never kept.
        let mut bound = self.bound.take().unwrap_or_else(|| Bound::none(self.nodes, self.scope));
        bound.sort(self.tenants);
        for (t, tenant) in self.tenants.iter().enumerate() {
            let s = &mut self.state[t];
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
                .map(|(r, req)| shortfall(tenant, req, s.granted[r], s.why[r].as_ref()))
                .collect();
            let p = &mut placed[t];
            p.allocation = allocation;
            p.memory_mib = s.memory_mib;
            p.shortfalls = shortfalls;
        }
        Placed {
            tenants: placed,
            bound,
            stable: false,
        }
    }
}

impl Placed {
    /// A placement of no tenant: every unit of the cell bound to nobody.
    pub(super) fn none(bound: Bound) -> Placed {
        Placed {
            tenants: vec![],
            bound,
            stable: false,
        }
    }

    /// The grants of the pass kept, on the nodes it placed, and its bindings.
    pub(super) fn grants(self, tenants: &[TenantProfile], nodes: &CellNodes) -> (BTreeMap<String, CellGrants>, Bound) {
        let (grants, bound, _, _) = self.grants_with(tenants, nodes, |_, _| None);
        (grants, bound)
    }

    /// [`Placed::grants`], where `earlier(t, placed)` may hand back tenant `t`'s grants an
    /// earlier pass built, when they are the ones `placed` gives on these nodes (so are not built
    /// and compared again).
    pub(super) fn grants_with(
        self,
        tenants: &[TenantProfile],
        nodes: &CellNodes,
        mut earlier: impl FnMut(usize, &PlacedTenant) -> Option<CellGrants>,
    ) -> Built {
        // Built in one go from the tenants in name order (a cell's order): inserting them one by one
        // searched the map each time, a name comparison at every level.
        let mut out = Vec::with_capacity(tenants.len());
        let mut positions = Vec::with_capacity(tenants.len());
        let mut handed_back = Vec::with_capacity(tenants.len());
        for (t, (tenant, p)) in tenants.iter().zip(self.tenants).enumerate() {
            if let Some(kept) = earlier(t, &p) {
                out.push((tenant.name.clone(), kept));
                positions.push(p.at);
                handed_back.push(true);
                continue;
            }
            let whole = |(node, gpu): GpuRef, mode: Mode, count: u32| {
                let nd = &nodes[node as usize];
                let spec = &nd.gpus[gpu as usize];
                Grant {
                    node: nd.inventory.name.clone(),
                    gpu: spec.index,
                    gpu_uuid: nd.inventory.gpus[spec.index as usize].uuid.clone(),
                    mode,
                    profile: None,
                    placement: None,
                    instance_uuid: None,
                    count,
                }
            };
            let mut grants: Vec<Grant> =
                p.at.units
                    .iter()
                    .map(|&u| match u {
                        Unit::Gpu(at) => whole(at, Mode::Exclusive, 1),
                        Unit::Instance(at, i) => {
                            let instance = &nodes[at.0 as usize].gpus[at.1 as usize].mig_instances[i as usize];
                            Grant {
                                profile: Some(instance.profile.clone()),
                                placement: Some(instance.placement.to_string()),
                                ..whole(at, Mode::Mig, 1)
                            }
                        }
                    })
                    .chain(p.at.shares.iter().map(|&(at, mode, count)| whole(at, mode, count)))
                    .collect();
            grants.sort_by(|a, b| (&a.node, a.gpu, &a.placement).cmp(&(&b.node, b.gpu, &b.placement)));
            out.push((
                tenant.name.clone(),
                CellGrants {
                    grants,
                    allocation: p.allocation,
                    memory_mib: p.memory_mib,
                    shortfalls: p.shortfalls,
                },
            ));
            positions.push(p.at);
            handed_back.push(false);
        }
        (out.into_iter().collect(), self.bound, positions, handed_back)
    }
}

/// Why `tenant`'s request `req` got only `granted` units, one sentence.
fn shortfall(tenant: &TenantProfile, req: &ResourceRequest, granted: u32, why: Option<&Shortfall>) -> String {
    let family = Family::of(req.mode, req.profile.as_deref()).label();
    let head = format!("{family}: granted {granted} of {}", req.count);
    match why {
        Some(Shortfall::Capacity {
            available,
            demand,
            tenants,
            priority,
        }) => format!(
            "{head}; capacity short: {available} free for {tenants} tenant{} at priority {priority} asking for {demand}, split by weight ({})",
            if *tenants == 1 { "" } else { "s" },
            tenant.weight
        ),
        Some(Shortfall::Memory { limit_mib }) => {
            format!("{head}; the memory limit of {} MiB is reached", limit_mib)
        }
        Some(Shortfall::Topology { count }) => {
            format!("{head}; topology Required and no NUMA domain has {count} free GPUs")
        }
        Some(Shortfall::Rules) => {
            format!("{head}; no GPU of that kind meets the tier's co-location rule and the policy's limits")
        }
        None => format!("{head}; no capacity of that kind exists on the selected nodes"),
    }
}
