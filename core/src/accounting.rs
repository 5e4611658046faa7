//! Showback: which share of each GPU of a node each tenant holds, by the node's GpuNode spec, and
//! the GPU-seconds that adds up to over time. Pure: the agent's metrics feed it the spec, the GPUs
//! it found, how busy they were and the time that passed.
//!
//! A whole GPU is 1. A MIG instance is its compute slices out of [`COMPUTE_SLICES`] (a `3g.40gb` is
//! 3/7), an MPS or time-slicing share its fraction of the GPU's replicas (one of four shares is
//! 1/4). What no tenant holds (free MIG slices, shares no one was granted, GPUs no plan covers) is
//! held by [`UNALLOCATED`], so on every node the holdings add up to its GPU count and allocated
//! GPU-seconds to GPUs × wall time.
//!
//! "Allocated" is what the plan grants (the GpuNode spec), not what pods happen to hold: showback
//! charges a tenant for what it keeps from others.

use crate::api::{GpuNodeSpec, GpuSpec, Mode};
use crate::mig::COMPUTE_SLICES;
use std::collections::BTreeMap;

/// The holder of what no tenant is granted. A GpuTenant cannot take this name (the policy check refuses it).
pub const UNALLOCATED: &str = "unallocated";
/// The `tenant` of a device row (memory, processes, utilization) on a GPU whose shares several
/// tenants hold: the row cannot be split between them. A GpuTenant cannot take this name either.
pub const SHARED: &str = "shared";
/// The `tenant` of busy time on an MPS or time-sliced GPU spent by processes whose pod or tenant
/// could not be told (a host process, a pod this node's agent does not know, a namespace no
/// tenant lists alone: [`crate::attribution`]). A GpuTenant cannot take this name either.
pub const UNATTRIBUTED: &str = "unattributed";

/// The names the showback gives what is no tenant's, which GpuTenants may not take.
pub const RESERVED: [&str; 3] = [UNALLOCATED, SHARED, UNATTRIBUTED];

/// The `mode` of a GPU no GpuNode spec covers.
pub const UNPLANNED: &str = "Unplanned";

/// A share of one GPU held by one tenant (or [`UNALLOCATED`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Holding {
    pub gpu: u32,
    /// The MIG instance, by its first memory slice and profile; `None` for (a share of) the GPU.
    pub instance: Option<(u32, String)>,
    /// `MIG`, `MPS`, `TimeSlicing`, `Exclusive` or [`UNPLANNED`].
    pub mode: &'static str,
    pub tenant: String,
    /// Fraction of the whole GPU, 0 to 1.
    pub weight: f64,
}

/// Compute slices of a MIG profile, from NVIDIA's naming (`<compute slices>g.<memory>gb[+me]`):
/// `1g.10gb` → 1, `3g.40gb` → 3, `7g.80gb` → 7. `None` for a name not of that form.
pub fn profile_compute_slices(profile: &str) -> Option<u32> {
    let (slices, rest) = profile.split_once('g')?;
    let n: u32 = slices.parse().ok()?;
    (rest.starts_with('.') && (1..=COMPUTE_SLICES).contains(&n)).then_some(n)
}

/// What each tenant holds of the GPUs `gpus` (the indices found on the node) under `spec`. Per
/// GPU the weights add up to 1: what the spec grants no one is [`UNALLOCATED`]'s.
pub fn holdings(spec: &GpuNodeSpec, gpus: &[u32]) -> Vec<Holding> {
    let mut out = Vec::new();
    for &gpu in gpus {
        let rest = match spec.gpus.iter().find(|g| g.index == gpu) {
            None => Some((UNPLANNED, 1.0)),
            Some(g) => {
                let granted = granted(g);
                let sum: f64 = granted.iter().map(|h| h.weight).sum();
                out.extend(granted);
                Some((g.mode.as_str(), (1.0 - sum).max(0.0)))
            }
        };
        if let Some((mode, weight)) = rest.filter(|(_, w)| *w > 1e-12) {
            out.push(Holding {
                gpu,
                instance: None,
                mode,
                tenant: UNALLOCATED.into(),
                weight,
            });
        }
    }
    out
}

/// The tenants' holdings of one planned GPU (never more than 1 in all).
fn granted(g: &GpuSpec) -> Vec<Holding> {
    let holding = |instance, tenant: &str, weight| Holding {
        gpu: g.index,
        instance,
        mode: g.mode.as_str(),
        tenant: tenant.into(),
        weight,
    };
    let mut out = Vec::new();
    match g.mode {
        Mode::Mig => {
            let mut left = COMPUTE_SLICES;
            for i in &g.mig_instances {
                // An unknown profile name or slices past the GPU's are nobody's: they stay with
                // `unallocated` rather than be charged twice.
                let slices = profile_compute_slices(&i.profile).unwrap_or(0).min(left);
                left -= slices;
                let tenant = i.tenant.as_deref().unwrap_or(UNALLOCATED);
                let weight = f64::from(slices) / f64::from(COMPUTE_SLICES);
                out.push(holding(Some((i.placement.start, i.profile.clone())), tenant, weight));
            }
        }
        Mode::Mps | Mode::TimeSlicing => {
            let replicas = match g.mode {
                Mode::Mps => g.mps.as_ref().map(|m| m.max_clients),
                _ => g.time_slicing.as_ref().map(|t| t.replicas),
            }
            .unwrap_or(1)
            .max(1);
            if g.shares.is_empty() {
                // A spec without share counts: the GPU's tenants hold it in equal parts.
                out.extend(equal_parts(g));
            } else {
                let mut left = replicas;
                for s in &g.shares {
                    let count = s.count.min(left);
                    left -= count;
                    out.push(holding(None, &s.tenant, f64::from(count) / f64::from(replicas)));
                }
            }
        }
        Mode::Exclusive => out.extend(equal_parts(g)),
    }
    out
}

/// The GPU's tenants hold it in equal parts.
fn equal_parts(g: &GpuSpec) -> Vec<Holding> {
    let n = g.tenants.len() as f64;
    g.tenants
        .iter()
        .map(|t| Holding {
            gpu: g.index,
            instance: None,
            mode: g.mode.as_str(),
            tenant: t.clone(),
            weight: 1.0 / n,
        })
        .collect()
}

/// The `tenant` of a row about a whole GPU (memory, processes, utilization): its one tenant,
/// [`SHARED`] when several hold shares of it, [`UNALLOCATED`] when none.
pub fn gpu_tenant(holdings: &[Holding], gpu: u32) -> &str {
    let mut tenants = holdings
        .iter()
        .filter(|h| h.gpu == gpu && h.instance.is_none() && h.tenant != UNALLOCATED)
        .map(|h| h.tenant.as_str());
    match (tenants.next(), tenants.next()) {
        (None, _) => UNALLOCATED,
        (Some(t), None) => t,
        (Some(_), Some(_)) => SHARED,
    }
}

/// How busy a node's devices were at the last reading, where NVML tells.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Busy {
    /// Whole GPUs (not in MIG mode): utilization, 0 to 1 (`nvmlDeviceGetUtilizationRates`).
    pub gpus: BTreeMap<u32, f64>,
    /// MIG instances by (GPU, first memory slice): the instance's utilization, 0 to 1 (GPM, on
    /// GPUs that have it).
    pub instances: BTreeMap<(u32, u32), f64>,
    /// MPS and time-sliced GPUs whose processes' samples say whose the busy time was: each
    /// tenant's fraction of it (adding up to 1; [`UNATTRIBUTED`] for what no tenant's).
    pub split: BTreeMap<u32, BTreeMap<String, f64>>,
}

/// Allocated and used GPU-seconds by (tenant, mode), added up over time, and the allocated ones
/// of each tenant's namespaces.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Ledger {
    pub allocated: BTreeMap<(String, &'static str), f64>,
    pub used: BTreeMap<(String, &'static str), f64>,
    /// (tenant, namespace): the part of the tenant's allocation its pods in that namespace hold.
    pub namespaces: BTreeMap<(String, String), f64>,
}

impl Ledger {
    /// Adds `seconds` of `holdings` to the allocated GPU-seconds.
    pub fn allocate(&mut self, holdings: &[Holding], seconds: f64) {
        for h in holdings {
            *self.allocated.entry((h.tenant.clone(), h.mode)).or_default() += h.weight * seconds;
        }
    }

    /// Adds `seconds` of the namespaces' holdings ([`crate::attribution::namespace_holdings`]).
    pub fn allocate_namespaces(&mut self, held: &BTreeMap<(String, String), f64>, seconds: f64) {
        for (k, w) in held {
            *self.namespaces.entry(k.clone()).or_default() += w * seconds;
        }
    }

    /// Adds `seconds` of use, where `busy` knows it. A whole GPU's busy time goes to its one
    /// tenant, or divides by `busy.split` where its processes' samples say whose it was; else, on
    /// a GPU several tenants share, to [`SHARED`] (NVML's device utilization does not say whose
    /// it was). A MIG instance's busy time, weighted by its part of the GPU, to its tenant.
    pub fn use_busy(&mut self, holdings: &[Holding], busy: &Busy, seconds: f64) {
        for (&gpu, &ratio) in &busy.gpus {
            let Some(mode) = holdings.iter().find(|h| h.gpu == gpu).map(|h| h.mode) else {
                continue;
            };
            let gpu_seconds = ratio.clamp(0.0, 1.0) * seconds;
            match busy.split.get(&gpu) {
                Some(split) => {
                    for (tenant, part) in split {
                        *self.used.entry((tenant.clone(), mode)).or_default() += part * gpu_seconds;
                    }
                }
                None => {
                    let tenant = gpu_tenant(holdings, gpu).to_string();
                    *self.used.entry((tenant, mode)).or_default() += gpu_seconds;
                }
            }
        }
        for (&(gpu, start), &ratio) in &busy.instances {
            let Some(h) = holdings
                .iter()
                .find(|h| h.gpu == gpu && h.instance.as_ref().is_some_and(|(s, _)| *s == start))
            else {
                continue;
            };
            let gpu_seconds = ratio.clamp(0.0, 1.0) * h.weight * seconds;
            *self.used.entry((h.tenant.clone(), h.mode)).or_default() += gpu_seconds;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{MigInstanceSpec, MpsSettings, Placement, TenantShares, TimeSlicingSettings};
    use proptest::prelude::*;

    fn gpu(index: u32, mode: Mode) -> GpuSpec {
        GpuSpec::new(index, mode)
    }

    fn mig(index: u32, instances: &[(&str, u32, Option<&str>)]) -> GpuSpec {
        let instance = |&(p, start, t): &(&str, u32, Option<&str>)| {
            let i = MigInstanceSpec::new(p, start, 1);
            match t {
                Some(t) => i.for_tenant(t),
                None => i,
            }
        };
        GpuSpec::mig(index, instances.iter().map(instance).collect())
    }

    fn spec(gpus: Vec<GpuSpec>) -> GpuNodeSpec {
        GpuNodeSpec {
            gpus: gpus.into(),
            ..Default::default()
        }
    }

    fn weight_of(h: &[Holding], tenant: &str) -> f64 {
        h.iter().filter(|x| x.tenant == tenant).map(|x| x.weight).sum()
    }

    /// The API server refuses every reserved name as a GpuTenant's (the CRD's root rule).
    #[test]
    fn the_crd_refuses_every_reserved_name() {
        for name in RESERVED {
            assert!(
                crate::api::RESERVED_TENANT_NAMES_RULE.contains(&format!("'{name}'")),
                "{name} is not in the GpuTenant CRD's rule"
            );
        }
    }

    #[test]
    fn compute_slices_follow_nvidias_profile_names() {
        assert_eq!(profile_compute_slices("1g.10gb"), Some(1));
        assert_eq!(profile_compute_slices("1g.10gb+me"), Some(1));
        assert_eq!(profile_compute_slices("3g.40gb"), Some(3));
        assert_eq!(profile_compute_slices("7g.141gb"), Some(7));
        assert_eq!(profile_compute_slices("8g.80gb"), None);
        assert_eq!(profile_compute_slices("gpu"), None);
        assert_eq!(profile_compute_slices("1gb"), None);
    }

    #[test]
    fn mig_instances_weigh_their_compute_slices_and_free_slices_are_unallocated() {
        let s = spec(vec![mig(
            0,
            &[
                ("3g.40gb", 4, Some("acme")),
                ("2g.20gb", 0, Some("beta")),
                ("2g.20gb", 2, None),
            ],
        )]);
        let h = holdings(&s, &[0]);
        assert!((weight_of(&h, "acme") - 3.0 / 7.0).abs() < 1e-12);
        assert!((weight_of(&h, "beta") - 2.0 / 7.0).abs() < 1e-12);
        assert!((weight_of(&h, UNALLOCATED) - 2.0 / 7.0).abs() < 1e-12);
        assert!(h.iter().all(|x| x.mode == "MIG"));
    }

    #[test]
    fn shares_weigh_their_fraction_of_the_replicas() {
        let mps = GpuSpec::mps(0, 4).with_shares(&[("beta", 3), ("delta", 1)]);
        let ts = GpuSpec::time_sliced(1, 4).with_shares(&[("research", 1)]);
        let h = holdings(&spec(vec![mps, ts]), &[0, 1]);
        assert_eq!(weight_of(&h, "beta"), 0.75);
        assert_eq!(weight_of(&h, "delta"), 0.25);
        assert_eq!(weight_of(&h, "research"), 0.25);
        assert_eq!(weight_of(&h, UNALLOCATED), 0.75);
        assert_eq!(gpu_tenant(&h, 0), SHARED);
        assert_eq!(gpu_tenant(&h, 1), "research");
    }

    #[test]
    fn gpus_no_spec_covers_are_unallocated_and_unplanned() {
        let ex = GpuSpec::exclusive(0, "gamma");
        let h = holdings(&spec(vec![ex, gpu(1, Mode::Exclusive)]), &[0, 1, 2]);
        assert_eq!(weight_of(&h, "gamma"), 1.0);
        assert_eq!(
            h.iter()
                .filter(|x| x.tenant == UNALLOCATED)
                .map(|x| (x.gpu, x.mode))
                .collect::<Vec<_>>(),
            [(1, "Exclusive"), (2, UNPLANNED)]
        );
        assert_eq!(gpu_tenant(&h, 1), UNALLOCATED);
    }

    #[test]
    fn use_goes_to_the_one_tenant_or_to_shared() {
        let ex = GpuSpec::exclusive(0, "gamma");
        let ts = gpu(1, Mode::TimeSlicing).with_tenants(&["a", "b"]);
        let h = holdings(&spec(vec![ex, ts, mig(2, &[("7g.80gb", 0, Some("c"))])]), &[0, 1, 2]);
        let mut l = Ledger::default();
        let busy = Busy {
            gpus: BTreeMap::from([(0, 0.5), (1, 1.0)]),
            ..Default::default()
        };
        l.use_busy(&h, &busy, 10.0);
        assert_eq!(l.used.get(&("gamma".into(), "Exclusive")), Some(&5.0));
        assert_eq!(l.used.get(&(SHARED.into(), "TimeSlicing")), Some(&10.0));
        assert_eq!(l.used.len(), 2, "nothing known of the MIG GPU: {:?}", l.used);
    }

    #[test]
    fn samples_split_a_shared_gpu_and_an_instance_counts_its_part_of_the_gpu() {
        let ts = gpu(1, Mode::TimeSlicing).with_tenants(&["a", "b"]);
        let s = spec(vec![
            ts,
            mig(2, &[("3g.40gb", 4, Some("c")), ("2g.20gb", 0, Some("d"))]),
        ]);
        let h = holdings(&s, &[1, 2]);
        let busy = Busy {
            gpus: BTreeMap::from([(1, 0.8)]),
            instances: BTreeMap::from([((2, 4), 0.7)]),
            split: BTreeMap::from([(
                1,
                BTreeMap::from([("a".to_string(), 0.75), (UNATTRIBUTED.to_string(), 0.25)]),
            )]),
        };
        let mut l = Ledger::default();
        l.use_busy(&h, &busy, 10.0);
        let used = |t: &str, m: &'static str| l.used.get(&(t.to_string(), m)).copied();
        assert_eq!(used("a", "TimeSlicing"), Some(6.0));
        assert_eq!(used(UNATTRIBUTED, "TimeSlicing"), Some(2.0));
        assert_eq!(used(SHARED, "TimeSlicing"), None, "the samples said whose it was");
        // 70% of a 3g instance for 10 s: 0.7 × 3/7 × 10 GPU-seconds; d's instance unknown.
        assert!((used("c", "MIG").unwrap() - 3.0).abs() < 1e-12, "{:?}", l.used);
        assert_eq!(used("d", "MIG"), None);
    }

    fn arb_gpu(index: u32) -> impl Strategy<Value = GpuSpec> {
        let tenant = prop::sample::select(vec!["a", "b", "c"]);
        let profiles = prop::sample::select(vec!["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "odd"]);
        (
            0..4u32,
            prop::collection::vec((profiles, prop::option::of(tenant.clone())), 0..8),
            prop::collection::vec((tenant.clone(), 0..6u32), 0..4),
            1..9u32,
            prop::collection::vec(tenant, 0..3),
        )
            .prop_map(move |(mode, instances, shares, replicas, tenants)| {
                let mode = Mode::ALL[mode as usize];
                let mut g = gpu(index, mode);
                match mode {
                    Mode::Mig => {
                        g.mig_instances = instances
                            .into_iter()
                            .enumerate()
                            .map(|(i, (p, t))| MigInstanceSpec {
                                profile: p.into(),
                                placement: Placement {
                                    start: i as u32,
                                    size: 1,
                                },
                                tenant: t.map(Into::into),
                            })
                            .collect()
                    }
                    Mode::Mps | Mode::TimeSlicing => {
                        g.mps = Some(MpsSettings {
                            max_clients: replicas,
                            ..Default::default()
                        });
                        g.time_slicing = Some(TimeSlicingSettings { replicas });
                        let mut seen = std::collections::BTreeSet::new();
                        g.shares = shares
                            .into_iter()
                            .filter(|(t, _)| seen.insert(*t))
                            .map(|(t, count)| TenantShares {
                                tenant: t.into(),
                                count,
                            })
                            .collect();
                        g.tenants = tenants.into_iter().map(Into::into).collect();
                    }
                    Mode::Exclusive => g.tenants = tenants.into_iter().map(Into::into).collect(),
                }
                g
            })
    }

    proptest! {
        /// Whatever the spec (free slices, unknown profiles, more shares than replicas, GPUs no
        /// spec names), each GPU's holdings add up to 1, so a node's allocated GPU-seconds are
        /// its GPUs × wall time.
        #[test]
        fn every_gpu_is_held_exactly_once(
            specs in prop::collection::vec(prop::bool::ANY, 1..6)
                .prop_flat_map(|planned| {
                    let gpus: Vec<_> = planned
                        .iter()
                        .enumerate()
                        .filter(|(_, p)| **p)
                        .map(|(i, _)| arb_gpu(i as u32).boxed())
                        .collect();
                    (Just(planned.len() as u32), gpus)
                }),
            seconds in 0.5..1000.0f64,
        ) {
            let (count, gpus) = specs;
            let found: Vec<u32> = (0..count).collect();
            let h = holdings(&spec(gpus), &found);
            for g in &found {
                let sum: f64 = h.iter().filter(|x| x.gpu == *g).map(|x| x.weight).sum();
                prop_assert!((sum - 1.0).abs() < 1e-9, "GPU {g}: {sum} in {h:?}");
            }
            prop_assert!(h.iter().all(|x| (0.0..=1.0).contains(&x.weight)));
            let mut l = Ledger::default();
            l.allocate(&h, seconds);
            let total: f64 = l.allocated.values().sum();
            prop_assert!((total - f64::from(count) * seconds).abs() < 1e-6 * seconds);
        }
    }
}
