//! The isolation invariants (DESIGN.md §4: no overcommit, tier isolation) on generated fleets.

#[path = "support/fleet.rs"]
mod support;

use gpu_tenancy::api::{CoLocation, Mode};
use gpu_tenancy::planner::{PlanInput, PlanOutput, plan};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use proptest::prelude::*;
use std::collections::{BTreeMap, HashMap};

fn run(f: &support::Fleet) -> PlanOutput {
    let now = Time(jiff::Timestamp::from_second(0).unwrap());
    plan(
        &PlanInput {
            policies: &f.policies,
            tenants: &f.tenants,
            plans: &f.plans,
            nodes: &f.nodes,
        },
        &now,
    )
}

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
    assert_eq!(out, run(&f));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn invariants_hold_on_random_fleets(nodes in 1usize..40, gpus in prop::sample::select(vec![2u32, 4, 8]), tenants in 0usize..60, seed in any::<u64>()) {
        let f = support::fleet(nodes, gpus, tenants, seed);
        let out = run(&f);
        check_invariants(&f, &out);
    }
}
