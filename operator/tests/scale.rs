//! The isolation invariants (docs/design.md#invariants: no overcommit, tier isolation) on generated fleets,
//! and on the 1000-node fleet the grants checked against the GpuNode specs and memory figures the
//! test computes itself (not through the planner's accounting).

#[path = "support/fleet.rs"]
mod support;

use gpu_tenancy::api::{CoLocation, GpuSpec, Mode, TenantLimits};
use gpu_tenancy::inventory::NodeInventory;
use gpu_tenancy::planner::PlanOutput;
use kube::ResourceExt;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use support::run;

/// Grants on one GPU: (tenant, mode, units).
type GpuGrants = Vec<(String, Mode, u32)>;

fn check_invariants(f: &support::Fleet, out: &PlanOutput) {
    let policy = &f.policies[0].spec;
    let tier_of: HashMap<String, String> = f.tenants.iter().map(|t| (t.name_any(), t.spec.tier.clone())).collect();
    // Units granted per GPU (node, gpu) and per MIG instance (node, gpu, placement).
    let mut per_gpu: BTreeMap<(String, u32), GpuGrants> = BTreeMap::new();
    let mut per_instance: BTreeMap<(String, u32, String), u32> = BTreeMap::new();
    for t in &out.tenants {
        let name = t.name_any();
        let tier = policy.tier(&tier_of[&name]).unwrap();
        let s = t.status.as_ref().unwrap();
        for a in &s.allocation {
            assert!(a.granted <= a.requested, "{name} granted more than requested");
        }
        for g in &s.grants {
            assert!(tier.modes.contains(&g.mode), "{name} ({}) got {}", tier.name, g.mode);
            per_gpu
                .entry((g.node.clone(), g.gpu))
                .or_default()
                .push((name.clone(), g.mode, g.count));
            if let Some(p) = &g.placement {
                *per_instance.entry((g.node.clone(), g.gpu, p.clone())).or_default() += 1;
            }
        }
    }
    assert!(per_instance.values().all(|&n| n == 1), "a MIG instance granted twice");
    for node in &out.nodes {
        for gpu in &node.spec.gpus {
            let grants = per_gpu.get(&(node.name_any(), gpu.index)).cloned().unwrap_or_default();
            match gpu.mode {
                Mode::Mig => assert!(grants.len() <= gpu.mig_instances.len()),
                Mode::Exclusive => assert!(grants.len() <= 1, "exclusive GPU shared: {grants:?}"),
                Mode::Mps | Mode::TimeSlicing => {
                    let units: u32 = grants.iter().map(|g| g.2).sum();
                    let cap = gpu
                        .mps
                        .as_ref()
                        .map(|m| m.max_clients)
                        .or(gpu.time_slicing.as_ref().map(|t| t.replicas))
                        .unwrap();
                    assert!(
                        units <= cap,
                        "{} GPU {}: {units} shares > {cap}",
                        node.name_any(),
                        gpu.index
                    );
                    let tenants: Vec<&String> = grants.iter().map(|g| &g.0).collect();
                    for (t, _, _) in &grants {
                        let tier = policy.tier(&tier_of[t]).unwrap();
                        if tier.co_location == CoLocation::Forbidden {
                            assert_eq!(tenants, [t], "forbidden tenant {t} shares a GPU");
                        } else {
                            assert!(
                                grants.iter().all(|g| tier_of[&g.0] == tier.name),
                                "tiers mixed on a GPU: {grants:?}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn a_thousand_nodes_keep_the_invariants_and_plan_deterministically() {
    let f = support::fleet(1000, 8, 400, 7);
    let out = run(&f);
    assert!(
        out.problems.is_empty(),
        "{:?}",
        &out.problems[..out.problems.len().min(3)]
    );
    check_invariants(&f, &out);
    let seen = check_grants_against_specs(&f, &out);
    assert!(
        seen.mig_grants > 0 && seen.exclusive_grants > 0 && seen.mps_gpus > 0 && seen.time_sliced_gpus > 0,
        "the fleet exercises every kind of grant: {seen:?}"
    );
    assert_eq!(out, run(&f));
}

/// The same fleet with a memory limit on every third tenant (`limits.memory`, from 40Gi up):
/// the limits bind, and the grants stay within them.
#[test]
fn a_thousand_nodes_with_memory_limits_keep_the_invariants() {
    let mut f = support::fleet(1000, 8, 400, 7);
    for (i, t) in f.tenants.iter_mut().enumerate().filter(|(i, _)| i % 3 == 0) {
        std::sync::Arc::make_mut(t).spec.limits = Some(TenantLimits {
            max_gpus_per_pod: None,
            memory: Some(format!("{}Gi", 40 + (i % 7) * 30)),
        });
    }
    let out = run(&f);
    assert!(
        out.problems.is_empty(),
        "{:?}",
        &out.problems[..out.problems.len().min(3)]
    );
    check_invariants(&f, &out);
    let seen = check_grants_against_specs(&f, &out);
    assert!(
        seen.at_memory_limit > 0,
        "no memory limit binds, the check above proves nothing about limits: {seen:?}"
    );
}

/// Nominal memory of a MIG profile name, computed here: `3g.40gb` → 40 GiB, in MiB.
fn profile_name_mib(profile: &str) -> u64 {
    let gb = profile
        .split('.')
        .nth(1)
        .and_then(|s| s.split("gb").next())
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("not a MIG profile name: {profile}"));
    gb * 1024
}

/// `limits.memory` as the tests above write it (`NGi`), in MiB.
fn gi_mib(q: &str) -> u64 {
    let gi: u64 = q
        .strip_suffix("Gi")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("expected NGi, got {q}"));
    gi * 1024
}

/// `start:size` of a grant.
fn placement_of(s: &str) -> (u32, u32) {
    let (a, b) = s.split_once(':').unwrap_or_else(|| panic!("placement {s:?}"));
    (a.parse().unwrap(), b.parse().unwrap())
}

/// Grants against the GpuNode specs and the inventory, per tenant memory and per GPU sharing:
/// (a) every grant names a GPU (and MIG instance) of its node's spec, bound to that tenant, and
///     every tenant bound in a spec holds a grant there;
/// (b) `grantedMemoryMiB` is the sum of the grants' memory (MIG: the profile name's GB × 1024;
///     a whole GPU: its inventory memory; a share: GPU memory / maxClients or replicas), within
///     `limits.memory` when set;
/// (c) an MPS GPU hands out at most floor(memory × (100 − headroom)% / (memory / maxClients))
///     shares, and at most maxClients;
/// (d) no non-MIG GPU serves tenants of two tiers, nor a `Forbidden`-tier tenant and anyone else.
///
/// What [`check_grants_against_specs`] looked at, so a test can tell that it checked something.
#[derive(Debug, Default)]
struct Seen {
    mig_grants: usize,
    exclusive_grants: usize,
    /// GPUs with shares granted, per mode.
    mps_gpus: usize,
    time_sliced_gpus: usize,
    /// Most shares granted on one MPS GPU.
    most_mps_shares: u64,
    /// Tenants with a memory limit that are within 10 GiB (the smallest unit they ask for) of it.
    at_memory_limit: usize,
}

fn check_grants_against_specs(f: &support::Fleet, out: &PlanOutput) -> Seen {
    let policy = &f.policies[0].spec;
    let headroom = u64::from(policy.headroom_percent());
    let tenant_spec: HashMap<String, &gpu_tenancy::api::GpuTenantSpec> =
        f.tenants.iter().map(|t| (t.name_any(), &t.spec)).collect();
    let inventory: HashMap<&str, &NodeInventory> = f.nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    let specs: HashMap<String, &[GpuSpec]> = out
        .nodes
        .iter()
        .map(|n| (n.name_any(), n.spec.gpus.as_slice()))
        .collect();
    let gpu_memory = |node: &str, gpu: u32| -> u64 {
        let inv = inventory[node];
        inv.gpus.iter().find(|g| g.index == gpu).unwrap().memory_mib
    };
    // An instance counts at its memory as NVIDIA publishes it for the GPU's model (the tables are
    // held to nvidia-smi's output in tests/nvidia_smi_outputs.rs).
    let instance_memory = |node: &str, gpu: u32, profile: &str| -> u64 {
        let inv = inventory[node];
        let g = inv.gpus.iter().find(|g| g.index == gpu).unwrap();
        g.model
            .and_then(|m| m.profile_memory_mib(profile))
            .unwrap_or_else(|| profile_name_mib(profile))
    };
    let setting = |g: &GpuSpec| -> u64 {
        let s = match g.mode {
            Mode::Mps => g.mps.as_ref().map(|m| m.max_clients),
            Mode::TimeSlicing => g.time_slicing.as_ref().map(|t| t.replicas),
            _ => None,
        };
        u64::from(s.unwrap_or_else(|| panic!("{} GPU {} without its setting", g.mode, g.index)))
    };

    // (a) and (b), per tenant.
    let mut holders: BTreeMap<(String, u32), Vec<String>> = BTreeMap::new();
    let mut instance_grants: BTreeMap<(String, u32, (u32, u32)), Vec<String>> = BTreeMap::new();
    let mut shares: BTreeMap<(String, u32), u32> = BTreeMap::new();
    let mut seen = Seen::default();
    for t in &out.tenants {
        let name = t.name_any();
        let s = t.status.as_ref().unwrap();
        let mut memory = 0u64;
        for g in &s.grants {
            let gpus = specs
                .get(&g.node)
                .unwrap_or_else(|| panic!("{name}: grant on node {} which has no GpuNode", g.node));
            let spec = gpus
                .iter()
                .find(|x| x.index == g.gpu)
                .unwrap_or_else(|| panic!("{name}: grant on {} GPU {}, not in its GpuNode spec", g.node, g.gpu));
            let inv_gpu = inventory[g.node.as_str()].gpus.iter().find(|x| x.index == g.gpu);
            assert_eq!(
                g.gpu_uuid,
                inv_gpu.and_then(|x| x.uuid.clone()),
                "{name}: grant on {} GPU {} names another GPU's UUID",
                g.node,
                g.gpu
            );
            assert_eq!(
                spec.mode, g.mode,
                "{name}: {} grant on {} GPU {} ({})",
                g.mode, g.node, g.gpu, spec.mode
            );
            match g.mode {
                Mode::Mig => {
                    let profile = g.profile.as_deref().expect("MIG grant without profile");
                    let at = placement_of(g.placement.as_deref().expect("MIG grant without placement"));
                    let inst = spec
                        .mig_instances
                        .iter()
                        .find(|i| (i.placement.start, i.placement.size) == at)
                        .unwrap_or_else(|| {
                            panic!(
                                "{name}: {profile} at {at:?} on {} GPU {}: no such instance in the spec {:?}",
                                g.node, g.gpu, spec.mig_instances
                            )
                        });
                    assert_eq!(inst.profile, profile, "{name}: {} GPU {} at {at:?}", g.node, g.gpu);
                    assert_eq!(
                        inst.tenant.as_deref(),
                        Some(name.as_str()),
                        "{name}: granted {profile} at {at:?} on {} GPU {}, the spec binds it to another",
                        g.node,
                        g.gpu
                    );
                    assert_eq!(g.count, 1, "{name}: a MIG grant is one instance");
                    instance_grants
                        .entry((g.node.clone(), g.gpu, at))
                        .or_default()
                        .push(name.clone());
                    memory += instance_memory(&g.node, g.gpu, profile);
                    seen.mig_grants += 1;
                }
                Mode::Exclusive => {
                    assert_eq!(g.count, 1, "{name}: an exclusive grant is one GPU");
                    memory += gpu_memory(&g.node, g.gpu);
                    seen.exclusive_grants += 1;
                }
                Mode::Mps | Mode::TimeSlicing => {
                    assert!(g.count >= 1, "{name}: empty grant");
                    memory += gpu_memory(&g.node, g.gpu) / setting(spec) * u64::from(g.count);
                    *shares.entry((g.node.clone(), g.gpu)).or_default() += g.count;
                }
            }
            if g.mode != Mode::Mig {
                assert!(
                    spec.tenants.contains(&name),
                    "{name}: granted {} GPU {} but not among its spec's tenants {:?}",
                    g.node,
                    g.gpu,
                    spec.tenants
                );
                holders.entry((g.node.clone(), g.gpu)).or_default().push(name.clone());
            }
        }
        assert_eq!(
            s.granted_memory_mib,
            Some(memory),
            "{name}: grantedMemoryMiB vs the sum of its {} grants",
            s.grants.len()
        );
        if let Some(limit) = tenant_spec[&name].limits.as_ref().and_then(|l| l.memory.as_deref()) {
            let limit = gi_mib(limit);
            assert!(
                memory <= limit,
                "{name}: {memory} MiB granted, limits.memory is {limit} MiB"
            );
            if limit - memory < 10 * 1024 {
                seen.at_memory_limit += 1;
            }
        }
    }

    // (a) the other way: every binding in a spec is some tenant's grant.
    for (node, gpus) in &specs {
        for g in gpus.iter() {
            for i in &g.mig_instances {
                let at = (i.placement.start, i.placement.size);
                let granted = instance_grants.get(&(node.clone(), g.index, at));
                match &i.tenant {
                    Some(t) => assert_eq!(
                        granted.map(Vec::as_slice),
                        Some(std::slice::from_ref(t)),
                        "{node} GPU {} {} at {at:?}: bound to {t} in the spec",
                        g.index,
                        i.profile
                    ),
                    None => assert!(granted.is_none(), "{node} GPU {} at {at:?}: granted, unbound", g.index),
                }
            }
            if g.mode != Mode::Mig {
                let mut held = holders.get(&(node.clone(), g.index)).cloned().unwrap_or_default();
                held.sort();
                let mut bound = g.tenants.clone();
                bound.sort();
                assert_eq!(held, bound, "{node} GPU {}: tenants in the spec vs grants", g.index);
            }
        }
    }

    for (node, gpus) in &specs {
        for g in gpus.iter().filter(|g| g.mode != Mode::Mig) {
            // (c) MPS shares within memory less headroom, at the device plugin's per-client memory.
            if g.mode == Mode::Mps {
                let n = u64::from(shares.get(&(node.clone(), g.index)).copied().unwrap_or(0));
                seen.mps_gpus += usize::from(n > 0);
                seen.most_mps_shares = seen.most_mps_shares.max(n);
                let memory = gpu_memory(node, g.index);
                let max_clients = setting(g);
                let per_client = memory / max_clients;
                let fits = memory * (100 - headroom) / 100 / per_client;
                assert!(
                    n <= fits && n <= max_clients,
                    "{node} GPU {}: {n} MPS shares; memory {memory} MiB less {headroom}% holds {fits} of \
                     {per_client} MiB, maxClients {max_clients}",
                    g.index
                );
            }
            if g.mode == Mode::TimeSlicing && shares.contains_key(&(node.clone(), g.index)) {
                seen.time_sliced_gpus += 1;
            }
            // (d) tiers never mix on a GPU, and a Forbidden tenant has its GPU alone.
            let held = holders.get(&(node.clone(), g.index)).cloned().unwrap_or_default();
            let tiers: BTreeSet<&str> = held.iter().map(|t| tenant_spec[t].tier.as_str()).collect();
            assert!(
                tiers.len() <= 1,
                "{node} GPU {} serves tiers {tiers:?}: {held:?}",
                g.index
            );
            for t in &held {
                let tier = policy.tier(&tenant_spec[t].tier).unwrap();
                if tier.co_location == CoLocation::Forbidden {
                    assert_eq!(
                        held.as_slice(),
                        std::slice::from_ref(t),
                        "{node} GPU {}: {t} ({}) shares it",
                        g.index,
                        tier.name
                    );
                }
            }
        }
    }
    seen
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn invariants_hold_on_random_fleets(nodes in 1usize..40, gpus in prop::sample::select(vec![2u32, 4, 8]), tenants in 0usize..60, seed in any::<u64>()) {
        let f = support::fleet(nodes, gpus, tenants, seed);
        let out = run(&f);
        check_invariants(&f, &out);
        check_grants_against_specs(&f, &out);
    }
}
