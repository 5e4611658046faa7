//! Memory caps as the planner leaves them: the caps of one GPU's shares stay within its memory
//! less the headroom, and a GPU takes the strictest `memoryCaps` of its tenants' tiers.

use super::fixtures::*;
use super::*;
use crate::api::*;
use crate::inventory::NodeInventory;
use crate::memory_caps::share_mib;

fn run_with(
    policy: SharingPolicy,
    tenants: &[GpuTenant],
    plans: &[GpuPartitionPlan],
    nodes: &[NodeInventory],
) -> PlanOutput {
    let policies = [policy];
    plan(
        &PlanInput {
            policies: &policies,
            tenants: &shared(tenants),
            plans,
            nodes,
        },
        &Default::default(),
        &now(),
    )
}

/// An H100 80GB (81559 MiB) in MPS with 8 clients under 10% headroom, two tenants asking 5
/// shares each. By hand: a share is floor(81559 / 8) = 10194 MiB; the usable memory
/// floor(81559 × 90 / 100) = 73403 MiB holds floor(73403 / 10194) = 7 shares, so 7 are handed
/// out and their caps add up to 71358 MiB, within 73403.
#[test]
fn the_caps_of_a_gpus_shares_stay_within_its_memory_less_the_headroom() {
    let mut g = group("all", Mode::Mps);
    g.mps = Some(MpsSettings {
        max_clients: 8,
        ..MpsSettings::default()
    });
    let plans = [plan_for("p", "x", vec![g])];
    let tenants = [
        TenantBuilder::new("a", "internal").want(Mode::Mps, 5).build(),
        TenantBuilder::new("b", "internal").want(Mode::Mps, 5).build(),
    ];
    let out = run_with(policy(), &tenants, &plans, &[node("n", "x", "H100-80GB", 1, false)]);
    assert_eq!(out.problems, []);
    let spec = &out.nodes[0].spec.gpus[0];
    let shares: u32 = spec.shares.iter().map(|s| s.count).sum();
    assert_eq!(shares, 7);
    assert_eq!(share_mib(spec, 81559), 10194);
    let caps = u64::from(shares) * share_mib(spec, 81559);
    assert_eq!(caps, 71358);
    assert!(caps <= 73403);
}

/// A time-sliced GPU of a `Required` tier's tenants says `Required`; one of a `BestEffort`
/// tier's the default.
#[test]
fn a_gpu_takes_its_tenants_tiers_memory_caps() {
    let mut strict = policy();
    for t in &mut strict.spec.tiers {
        if t.name == "experimental" {
            t.memory_caps = MemoryCapPolicy::Required;
        }
    }
    let plans = [plan_for("p", "x", vec![group("all", Mode::TimeSlicing)])];
    let tenants = [
        TenantBuilder::new("e1", "experimental")
            .want(Mode::TimeSlicing, 2)
            .build(),
        TenantBuilder::new("e2", "experimental")
            .want(Mode::TimeSlicing, 2)
            .build(),
    ];
    let nodes = [node("n", "x", "H100-80GB", 1, false)];
    let out = run_with(strict, &tenants, &plans, &nodes);
    assert_eq!(out.problems, []);
    let gpu = &out.nodes[0].spec.gpus[0];
    assert_eq!(gpu.shares.iter().map(|s| s.count).sum::<u32>(), 4);
    assert_eq!(gpu.memory_caps, MemoryCapPolicy::Required);
    let out = run_with(policy(), &tenants, &plans, &nodes);
    assert_eq!(out.nodes[0].spec.gpus[0].memory_caps, MemoryCapPolicy::BestEffort);
}
