//! Grants: which tenant gets which MIG instance, whole GPU or GPU share.
//!
//! Priority first; within a priority, capacity dedicated to a tenant goes to it, then open capacity
//! is split by weighted fair share, then anything a rule (co-location, topology, policy caps, memory
//! limit) kept from one tenant goes to the others. Every loop walks capacity in node-name, GPU and
//! placement order, so the result is deterministic.

mod report;
mod shared;

use super::fairshare::weighted_fair_share;
use super::nodes::NodeDesired;
use crate::api::{AllocationSummary, Grant, Mode, TopologyPolicy, quantity_to_mib};
use crate::mig::nominal_memory_mib;
use crate::policy::TenantProfile;
use std::collections::{BTreeMap, HashMap};

/// What one tenant received.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TenantGrants {
    pub grants: Vec<Grant>,
    /// One entry per request, in request order.
    pub allocation: Vec<AllocationSummary>,
    pub memory_mib: u64,
    /// Why requests fell short, one sentence each.
    pub shortfalls: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Family {
    Mig(String),
    Exclusive,
    Shared(Mode),
}

impl Family {
    fn of(mode: Mode, profile: Option<&str>) -> Family {
        match mode {
            Mode::Mig => Family::Mig(profile.unwrap_or_default().to_string()),
            Mode::Exclusive => Family::Exclusive,
            m => Family::Shared(m),
        }
    }

    fn label(&self) -> String {
        match self {
            Family::Mig(p) => format!("MIG {p}"),
            Family::Exclusive => "Exclusive GPUs".into(),
            Family::Shared(m) => format!("{m} shares"),
        }
    }
}

/// (node position, GPU position in the node's spec list).
type GpuRef = (u32, u32);

struct MigPool {
    slots: Vec<(GpuRef, u32)>,
    next: usize,
}

struct Domain {
    node: u32,
    free: Vec<u32>,
}

struct SharedGpu {
    at: GpuRef,
    /// maxClients or replicas of the plan.
    setting: u32,
    memory_mib: u64,
    pinned_mib: Option<u64>,
    /// Shares this GPU offers, fixed by its first tenant's policy (memory headroom).
    capacity: Option<u32>,
    used: u32,
    tier: Option<String>,
    /// Taken by a `coLocation: Forbidden` tenant: nobody else may join.
    locked: bool,
}

enum Pool {
    Mig(MigPool),
    Exclusive(Vec<Domain>),
    Shared {
        gpus: Vec<SharedGpu>,
        /// GPUs before this index are all in use.
        next_empty: usize,
        /// In-use GPUs with free shares, by the tier using them.
        partial: HashMap<String, Vec<usize>>,
    },
}

impl Pool {
    /// Units still free, for the fair-share split (shared GPUs count at their nominal setting).
    fn free(&self) -> u64 {
        match self {
            Pool::Mig(p) => (p.slots.len() - p.next) as u64,
            Pool::Exclusive(d) => d.iter().map(|d| d.free.len() as u64).sum(),
            Pool::Shared { gpus, .. } => gpus
                .iter()
                .filter(|g| !g.locked)
                .map(|g| u64::from(g.capacity.unwrap_or(g.setting).saturating_sub(g.used)))
                .sum(),
        }
    }
}

/// Why a tenant got less than it asked.
#[derive(Clone, Debug, PartialEq)]
enum Shortfall {
    Capacity {
        available: u64,
        demand: u64,
        tenants: usize,
        priority: i32,
    },
    Memory {
        limit_mib: u64,
    },
    Topology {
        count: u32,
    },
    Rules,
}

struct TenantState {
    remaining: Vec<u32>,
    granted: Vec<u32>,
    memory_mib: u64,
    grants: Vec<Grant>,
    /// Shares per shared GPU, merged into one grant each at the end.
    shares: BTreeMap<(Family, Vec<String>, usize), u32>,
    /// Per request: the reason it is short, if it is.
    why: Vec<Option<Shortfall>>,
}

struct Allocator<'n, 'a> {
    tenants: &'n [TenantProfile],
    nodes: &'n mut [NodeDesired<'a>],
    pools: BTreeMap<(Family, Vec<String>), Pool>,
    state: Vec<TenantState>,
}

pub fn allocate(tenants: &[TenantProfile], nodes: &mut [NodeDesired]) -> BTreeMap<String, TenantGrants> {
    let pools = build_pools(nodes);
    let state = tenants
        .iter()
        .map(|t| TenantState {
            remaining: t.requests.iter().map(|r| r.count).collect(),
            granted: vec![0; t.requests.len()],
            memory_mib: 0,
            grants: vec![],
            shares: BTreeMap::new(),
            why: vec![None; t.requests.len()],
        })
        .collect();
    let mut a = Allocator {
        tenants,
        nodes,
        pools,
        state,
    };

    let mut order: Vec<usize> = (0..tenants.len()).collect();
    order.sort_by(|&x, &y| {
        tenants[y]
            .priority
            .cmp(&tenants[x].priority)
            .then(tenants[x].name.cmp(&tenants[y].name))
    });
    for level in order.chunk_by(|&x, &y| tenants[x].priority == tenants[y].priority) {
        a.serve_level(level);
    }
    a.finish()
}

fn build_pools(nodes: &[NodeDesired]) -> BTreeMap<(Family, Vec<String>), Pool> {
    let mut pools: BTreeMap<(Family, Vec<String>), Pool> = BTreeMap::new();
    for (n, node) in nodes.iter().enumerate() {
        let mut domains: BTreeMap<(Vec<String>, i32), Vec<u32>> = BTreeMap::new();
        for (g, gpu) in node.gpus.iter().enumerate() {
            let mut ded = node.dedicated[g].clone();
            ded.sort();
            let at = (n as u32, g as u32);
            let inv = &node.inventory.gpus[gpu.index as usize];
            match gpu.mode {
                Mode::Mig => {
                    for (i, inst) in gpu.mig_instances.iter().enumerate() {
                        let key = (Family::Mig(inst.profile.clone()), ded.clone());
                        let pool = pools
                            .entry(key)
                            .or_insert_with(|| Pool::Mig(MigPool { slots: vec![], next: 0 }));
                        if let Pool::Mig(p) = pool {
                            p.slots.push((at, i as u32));
                        }
                    }
                }
                Mode::Exclusive => domains.entry((ded, inv.numa_node)).or_default().push(g as u32),
                mode => {
                    let (setting, pinned_mib) = match mode {
                        Mode::Mps => {
                            let mps = gpu.mps.clone().unwrap_or_default();
                            (
                                mps.max_clients,
                                mps.pinned_memory_limit.as_deref().and_then(quantity_to_mib),
                            )
                        }
                        _ => (gpu.time_slicing.as_ref().map_or(1, |t| t.replicas), None),
                    };
                    let pool = pools
                        .entry((Family::Shared(mode), ded))
                        .or_insert_with(|| Pool::Shared {
                            gpus: vec![],
                            next_empty: 0,
                            partial: HashMap::new(),
                        });
                    if let Pool::Shared { gpus, .. } = pool {
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
        for ((ded, _numa), free) in domains {
            let pool = pools
                .entry((Family::Exclusive, ded))
                .or_insert_with(|| Pool::Exclusive(vec![]));
            if let Pool::Exclusive(d) = pool {
                d.push(Domain { node: n as u32, free });
            }
        }
    }
    pools
}

impl Allocator<'_, '_> {
    fn serve_level(&mut self, level: &[usize]) {
        // 1. Capacity dedicated to a tenant goes to it first.
        for &t in level {
            for r in 0..self.tenants[t].requests.len() {
                let want = self.state[t].remaining[r];
                self.take(t, r, want, true);
            }
        }
        // 2. Open capacity: weighted fair share per kind of capacity.
        let mut families: BTreeMap<Family, Vec<(usize, usize)>> = BTreeMap::new();
        for &t in level {
            for (r, req) in self.tenants[t].requests.iter().enumerate() {
                families
                    .entry(Family::of(req.mode, req.profile.as_deref()))
                    .or_default()
                    .push((t, r));
            }
        }
        for (family, claims) in &families {
            let available: u64 = self
                .pools
                .iter()
                .filter(|((f, d), _)| f == family && d.is_empty())
                .map(|(_, p)| p.free())
                .sum();
            let demands: Vec<(u64, u64)> = claims
                .iter()
                .map(|&(t, r)| (u64::from(self.state[t].remaining[r]), u64::from(self.tenants[t].weight)))
                .collect();
            let demand: u64 = demands.iter().map(|d| d.0).sum();
            let shares = weighted_fair_share(available, &demands);
            for (&(t, r), share) in claims.iter().zip(shares) {
                if demand > available && u64::from(self.state[t].remaining[r]) > share {
                    self.state[t].why[r] = Some(Shortfall::Capacity {
                        available,
                        demand,
                        tenants: claims.len(),
                        priority: self.tenants[t].priority,
                    });
                }
                self.take(t, r, share as u32, false);
            }
        }
        // 3. What rules kept from some tenants goes to the others (work-conserving).
        for claims in families.values() {
            for &(t, r) in claims {
                let want = self.state[t].remaining[r];
                if want > 0 {
                    self.take(t, r, want, false);
                }
            }
        }
    }

    /// Grants up to `want` units of request `r` to tenant `t`, from dedicated or open pools.
    fn take(&mut self, t: usize, r: usize, want: u32, dedicated: bool) {
        if want == 0 {
            return;
        }
        let req = &self.tenants[t].requests[r];
        let family = Family::of(req.mode, req.profile.as_deref());
        let name = &self.tenants[t].name;
        let keys: Vec<(Family, Vec<String>)> = self
            .pools
            .keys()
            .filter(|(f, d)| *f == family && if dedicated { d.contains(name) } else { d.is_empty() })
            .cloned()
            .collect();
        let mut left = want;
        for key in keys {
            if left == 0 {
                break;
            }
            let got = match &key.0 {
                Family::Mig(p) => self.take_mig(t, r, &key, left, p),
                Family::Exclusive => self.take_exclusive(t, r, &key, left),
                Family::Shared(_) => self.take_shared(t, r, &key, left),
            };
            left -= got;
        }
    }

    /// How many units of `unit_mib` the tenant's memory limit still allows (up to `want`).
    fn memory_allows(&mut self, t: usize, r: usize, unit_mib: u64, want: u32) -> u32 {
        let Some(limit) = self.tenants[t].memory_limit_mib else {
            return want;
        };
        if unit_mib == 0 {
            return want;
        }
        let room = limit.saturating_sub(self.state[t].memory_mib) / unit_mib;
        if room < u64::from(want) {
            self.state[t].why[r] = Some(Shortfall::Memory { limit_mib: limit });
        }
        room.min(u64::from(want)) as u32
    }

    fn record(&mut self, t: usize, r: usize, units: u32, unit_mib: u64) {
        let s = &mut self.state[t];
        s.remaining[r] -= units;
        s.granted[r] += units;
        s.memory_mib += unit_mib * u64::from(units);
    }

    fn take_mig(&mut self, t: usize, r: usize, key: &(Family, Vec<String>), want: u32, profile: &str) -> u32 {
        let unit = nominal_memory_mib(profile).unwrap_or(0);
        let want = self.memory_allows(t, r, unit, want);
        let Some(Pool::Mig(pool)) = self.pools.get_mut(key) else {
            return 0;
        };
        let n = want.min((pool.slots.len() - pool.next) as u32);
        let taken: Vec<(GpuRef, u32)> = pool.slots[pool.next..pool.next + n as usize].to_vec();
        pool.next += n as usize;
        let name = self.tenants[t].name.clone();
        for ((node, gpu), inst) in taken {
            let nd = &mut self.nodes[node as usize];
            let spec = &mut nd.gpus[gpu as usize];
            let instance = &mut spec.mig_instances[inst as usize];
            instance.tenant = Some(name.clone());
            self.state[t].grants.push(Grant {
                node: nd.inventory.name.clone(),
                gpu: spec.index,
                gpu_uuid: nd.inventory.gpus[spec.index as usize].uuid.clone(),
                mode: Mode::Mig,
                profile: Some(instance.profile.clone()),
                placement: Some(instance.placement.to_string()),
                instance_uuid: None,
                count: 1,
            });
        }
        self.record(t, r, n, unit);
        n
    }

    fn take_exclusive(&mut self, t: usize, r: usize, key: &(Family, Vec<String>), want: u32) -> u32 {
        let topology = self.tenants[t].topology;
        let Some(Pool::Exclusive(domains)) = self.pools.get(key) else {
            return 0;
        };
        // Best fit: the fullest domain that still holds the whole request keeps big domains free.
        let fits = domains
            .iter()
            .enumerate()
            .filter(|(_, d)| d.free.len() as u32 >= want)
            .min_by_key(|(i, d)| (d.free.len(), *i))
            .map(|(i, _)| i);
        let mut picks: Vec<(usize, usize)> = Vec::new(); // (domain, count)
        match (fits, topology) {
            (Some(d), _) if want > 1 && topology != TopologyPolicy::Ignore => picks.push((d, want as usize)),
            (None, TopologyPolicy::Required) if want > 1 => {
                self.state[t].why[r] = Some(Shortfall::Topology { count: want });
                return 0;
            }
            _ => {
                // Largest domains first: the fewest domains for what is left.
                let mut order: Vec<usize> = (0..domains.len()).filter(|&i| !domains[i].free.is_empty()).collect();
                if want == 1 {
                    order.sort_by_key(|&i| (domains[i].free.len(), i));
                } else {
                    order.sort_by_key(|&i| (std::cmp::Reverse(domains[i].free.len()), i));
                }
                let mut left = want as usize;
                for i in order {
                    if left == 0 {
                        break;
                    }
                    let n = left.min(domains[i].free.len());
                    picks.push((i, n));
                    left -= n;
                }
            }
        }
        let mut granted = 0;
        for (d, n) in picks {
            for _ in 0..n {
                let (node, gpu_pos) = {
                    let Some(Pool::Exclusive(domains)) = self.pools.get(key) else {
                        break;
                    };
                    (domains[d].node, domains[d].free[0])
                };
                let unit = self.nodes[node as usize].inventory.gpus
                    [self.nodes[node as usize].gpus[gpu_pos as usize].index as usize]
                    .memory_mib;
                if self.memory_allows(t, r, unit, 1) == 0 {
                    return granted;
                }
                if let Some(Pool::Exclusive(domains)) = self.pools.get_mut(key) {
                    domains[d].free.remove(0);
                }
                self.bind_whole(t, (node, gpu_pos), Mode::Exclusive, 1);
                self.record(t, r, 1, unit);
                granted += 1;
            }
        }
        granted
    }

    fn bind_whole(&mut self, t: usize, (node, gpu): GpuRef, mode: Mode, count: u32) {
        let name = self.tenants[t].name.clone();
        let nd = &mut self.nodes[node as usize];
        let spec = &mut nd.gpus[gpu as usize];
        if !spec.tenants.contains(&name) {
            spec.tenants.push(name);
        }
        if mode == Mode::Exclusive {
            self.state[t].grants.push(Grant {
                node: nd.inventory.name.clone(),
                gpu: spec.index,
                gpu_uuid: nd.inventory.gpus[spec.index as usize].uuid.clone(),
                mode,
                profile: None,
                placement: None,
                instance_uuid: None,
                count,
            });
        }
    }
}
