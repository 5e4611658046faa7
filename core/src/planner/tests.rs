//! Planner scenarios, built with the fixture helpers of [`super::fixtures`].

use super::fixtures::*;
use super::*;
use crate::api::*;
use crate::inventory::NodeInventory;

fn run(tenants: &[GpuTenant], plans: &[GpuPartitionPlan], nodes: &[NodeInventory]) -> PlanOutput {
    let policies = [policy()];
    plan(
        &PlanInput {
            policies: &policies,
            tenants: &crate::planner::fixtures::shared(tenants),
            plans,
            nodes,
        },
        &Default::default(),
        &now(),
    )
}

fn tenant<'a>(out: &'a PlanOutput, name: &str) -> &'a GpuTenantStatus {
    out.tenants
        .iter()
        .find(|t| t.name_any() == name)
        .unwrap()
        .status
        .as_ref()
        .unwrap()
}

fn granted(out: &PlanOutput, name: &str) -> Vec<u32> {
    tenant(out, name).allocation.iter().map(|a| a.granted).collect()
}

fn condition<'a>(s: &'a GpuTenantStatus, t: &str) -> &'a Condition {
    s.conditions.iter().find(|c| c.type_ == t).unwrap()
}

#[test]
fn mig_instances_go_to_tenants_with_placements() {
    let nodes = [node("n1", "mig", "H100-80GB", 2, false)];
    let plans = [plan_for(
        "p",
        "mig",
        vec![mig_group("all", &["3g.40gb", "2g.20gb", "2g.20gb"])],
    )];
    let tenants = [TenantBuilder::new("a", "external")
        .mig("3g.40gb", 1)
        .mig("2g.20gb", 4)
        .build()];
    let out = run(&tenants, &plans, &nodes);
    assert!(out.problems.is_empty(), "{:?}", out.problems);
    assert_eq!(granted(&out, "a"), [1, 4]);
    let gpu0 = &out.nodes[0].spec.gpus[0];
    assert_eq!(gpu0.mig_instances[2].profile, "3g.40gb");
    assert_eq!(gpu0.mig_instances[2].placement, Placement { start: 4, size: 4 });
    assert_eq!(gpu0.mig_instances[2].tenant.as_deref(), Some("a"));
    assert_eq!(gpu0.scrub, ScrubMemory::Always);
    assert_eq!(tenant(&out, "a").summary.as_deref(), Some("5/5"));
    let policy = out.policies[0].status.as_ref().unwrap();
    assert_eq!(
        (policy.tiers.as_deref(), policy.tenants),
        (Some("external,internal,experimental"), Some(1))
    );
    assert_eq!(condition(tenant(&out, "a"), "Ready").status, "True");
}

#[test]
fn priority_first_then_weighted_fair_share() {
    let nodes = [node("n1", "mps", "A100-40GB", 4, false)];
    let mut g = group("all", Mode::Mps);
    g.mps = Some(MpsSettings {
        max_clients: 4,
        ..Default::default()
    });
    let plans = [plan_for("p", "mps", vec![g])];
    let tenants = [
        TenantBuilder::new("vip", "internal")
            .want(Mode::Mps, 3)
            .priority(5)
            .build(),
        TenantBuilder::new("heavy", "internal")
            .want(Mode::Mps, 20)
            .weight(2)
            .build(),
        TenantBuilder::new("light", "internal").want(Mode::Mps, 20).build(),
    ];
    let out = run(&tenants, &plans, &nodes);
    // 12 shares: 3 to the high-priority tenant, then 9 split 2:1.
    assert_eq!(granted(&out, "vip"), [3]);
    assert_eq!(granted(&out, "heavy"), [6]);
    assert_eq!(granted(&out, "light"), [3]);
    let short = condition(tenant(&out, "light"), "CapacityShort");
    assert_eq!(short.status, "True");
    assert_eq!(
        short.message,
        "MPS shares: granted 3 of 20; capacity short: 9 free for 2 tenants at priority 0 asking for 40, split by weight (1)"
    );
    assert_eq!(condition(tenant(&out, "light"), "Ready").status, "False");
}

#[test]
fn tiers_only_get_allowed_modes_and_invalid_tenants_get_nothing() {
    let nodes = [node("n1", "ts", "H200", 2, false)];
    let plans = [plan_for("p", "ts", vec![group("all", Mode::TimeSlicing)])];
    let tenants = [TenantBuilder::new("ext", "external").want(Mode::TimeSlicing, 2).build()];
    let out = run(&tenants, &plans, &nodes);
    let s = tenant(&out, "ext");
    assert!(s.grants.is_empty());
    assert_eq!(condition(s, "Valid").status, "False");
    assert_eq!(condition(s, "Stalled").status, "True");
    assert_eq!(out.problems[0].field, "spec.resources[0].mode");
    assert!(out.nodes[0].spec.gpus.iter().all(|g| g.tenants.is_empty()));
}

#[test]
fn forbidden_tenants_never_share_a_non_mig_gpu() {
    let nodes = [node("n1", "mps", "H100-80GB", 2, false)];
    let plans = [plan_for("p", "mps", vec![group("all", Mode::Mps)])];
    let tenants = [
        TenantBuilder::new("ext-a", "external").want(Mode::Mps, 1).build(),
        TenantBuilder::new("ext-b", "external").want(Mode::Mps, 1).build(),
        TenantBuilder::new("int", "internal").want(Mode::Mps, 4).build(),
    ];
    let out = run(&tenants, &plans, &nodes);
    for gpu in &out.nodes[0].spec.gpus {
        assert!(
            gpu.tenants.len() <= 1 || !gpu.tenants.iter().any(|t| t.starts_with("ext")),
            "{:?}",
            gpu.tenants
        );
    }
    assert_eq!(granted(&out, "ext-a"), [1]);
    assert_eq!(granted(&out, "ext-b"), [1]);
    assert_eq!(granted(&out, "int"), [0], "both GPUs are locked by external tenants");
}

#[test]
fn dedicated_gpus_serve_only_their_tenants() {
    let nodes = [node("n1", "x", "H200", 4, false)];
    let mut dedicated = group("0,1", Mode::Exclusive);
    dedicated.tenants = vec!["gamma".into()];
    let plans = [plan_for("p", "x", vec![dedicated, group("2,3", Mode::Exclusive)])];
    let tenants = [
        TenantBuilder::new("alpha", "internal")
            .want(Mode::Exclusive, 4)
            .priority(9)
            .build(),
        TenantBuilder::new("gamma", "internal").want(Mode::Exclusive, 2).build(),
    ];
    let out = run(&tenants, &plans, &nodes);
    assert_eq!(granted(&out, "alpha"), [2]);
    assert_eq!(granted(&out, "gamma"), [2]);
    let gpus = &out.nodes[0].spec.gpus;
    assert_eq!(gpus[0].tenants, ["gamma"]);
    assert_eq!(gpus[3].tenants, ["alpha"]);
}

#[test]
fn multi_gpu_grants_stay_on_one_numa_domain() {
    let nodes = [
        node("a", "x", "H100-80GB", 8, true),
        node("b", "x", "H100-80GB", 8, true),
    ];
    let plans = [plan_for("p", "x", vec![group("all", Mode::Exclusive)])];
    let tenants = [
        TenantBuilder::new("one", "internal")
            .want(Mode::Exclusive, 1)
            .priority(2)
            .build(),
        TenantBuilder::new("four", "internal")
            .want(Mode::Exclusive, 4)
            .priority(1)
            .build(),
    ];
    let out = run(&tenants, &plans, &nodes);
    let grants = &tenant(&out, "four").grants;
    assert_eq!(grants.len(), 4);
    let domains: std::collections::BTreeSet<(String, bool)> =
        grants.iter().map(|g| (g.node.clone(), g.gpu >= 4)).collect();
    assert_eq!(domains.len(), 1, "{grants:?}");
    // The single GPU went to a domain that then could not hold four.
    let one = &tenant(&out, "one").grants[0];
    assert!(!domains.contains(&(one.node.clone(), one.gpu >= 4)));
}

#[test]
fn plans_of_equal_priority_conflict_and_neither_applies() {
    let nodes = [node("n1", "x", "H100-80GB", 2, false)];
    let plans = [
        plan_for("p1", "x", vec![group("all", Mode::Exclusive)]),
        plan_for("p2", "x", vec![group("all", Mode::Exclusive)]),
    ];
    let out = run(&[], &plans, &nodes);
    assert!(out.nodes[0].spec.gpus.is_empty());
    assert_eq!(out.problems.len(), 2);
    assert!(
        out.problems[0]
            .message
            .starts_with("selects 1 node (n1) that GpuPartitionPlan/p2 also selects at the same priority 0")
    );
    let status = out.plans[0].status.as_ref().unwrap();
    assert_eq!(status.nodes.as_ref().unwrap().failed, 1);
    let mut higher = plans[1].clone();
    higher.spec.priority = 1;
    let out = run(&[], &[plans[0].clone(), higher], &nodes);
    assert!(out.problems.is_empty());
    assert_eq!(out.nodes[0].spec.plan.as_deref(), Some("p2"));
}

#[test]
fn mixed_sharing_on_one_node_is_refused() {
    let plans = [plan_for(
        "p",
        "x",
        vec![group("0-3", Mode::Mps), group("4-7", Mode::TimeSlicing)],
    )];
    let nodes = [node("n1", "x", "H100-80GB", 8, false)];
    let out = run(&[], &plans, &nodes);
    assert_eq!(out.problems.len(), 1);
    assert_eq!(out.problems[0].field, "spec.gpus[1].mode");
    assert!(
        out.problems[0]
            .message
            .contains("the device plugin gives every non-MIG GPU of a node the same sharing")
    );
    assert!(out.nodes[0].spec.gpus.is_empty(), "an invalid plan changes nothing");
}

#[test]
fn nodes_with_too_few_gpus_or_no_mig_fail_with_the_reason() {
    let plans = [plan_for("p", "x", vec![mig_group("4-7", &["7g.80gb"])])];
    let out = run(&[], &plans, &[node("small", "x", "H100-80GB", 4, false)]);
    assert_eq!(
        out.problems[0].to_string(),
        "GpuPartitionPlan/p: spec.gpus[0].devices: node small: has 4 GPUs, so GPU 4 does not exist"
    );
    let plans = [plan_for("p", "x", vec![mig_group("all", &["7g.80gb"])])];
    let out = run(&[], &plans, &[node("a100", "x", "A100-40GB", 1, false)]);
    assert!(
        out.problems[0]
            .message
            .contains("unknown MIG profile \"7g.80gb\" for A100-40GB"),
        "{:?}",
        out.problems
    );
}

#[test]
fn mps_pinned_memory_respects_headroom() {
    // 40 GiB less 10% headroom is 36 GiB: one 20 GiB client fits, not two. (The device plugin's
    // daemon pins memory / maxClients, so 20Gi goes with 2 clients on a 40 GiB GPU.)
    let mut g = group("all", Mode::Mps);
    g.mps = Some(MpsSettings {
        max_clients: 2,
        active_thread_percentage: None,
        pinned_memory_limit: Some("20Gi".into()),
    });
    let plans = [plan_for("p", "x", vec![g])];
    let tenants = [TenantBuilder::new("t", "internal").want(Mode::Mps, 2).build()];
    let out = run(&tenants, &plans, &[node("n", "x", "A100-40GB", 1, false)]);
    assert_eq!(out.problems, []);
    assert_eq!(granted(&out, "t"), [1]);
}

#[test]
fn memory_limit_caps_grants() {
    let plans = [plan_for("p", "x", vec![mig_group("all", &["3g.40gb", "3g.40gb"])])];
    let tenants = [TenantBuilder::new("t", "internal")
        .mig("3g.40gb", 4)
        .memory("100Gi")
        .build()];
    let out = run(&tenants, &plans, &[node("n", "x", "H100-80GB", 2, false)]);
    assert_eq!(granted(&out, "t"), [2]);
    assert!(
        condition(tenant(&out, "t"), "CapacityShort")
            .message
            .contains("memory limit of 102400 MiB")
    );
}

#[test]
fn planning_is_deterministic_and_stable() {
    let nodes = [
        node("b", "mig", "H100-80GB", 2, false),
        node("a", "mig", "H100-80GB", 2, false),
    ];
    let plans = [plan_for(
        "p",
        "mig",
        vec![mig_group("all", &["3g.40gb", "2g.20gb", "2g.20gb"])],
    )];
    let tenants = [
        TenantBuilder::new("x", "internal").mig("2g.20gb", 3).build(),
        TenantBuilder::new("y", "internal")
            .mig("2g.20gb", 3)
            .mig("3g.40gb", 1)
            .build(),
    ];
    let first = run(&tenants, &plans, &nodes);
    let second = run(&tenants, &plans, &nodes);
    assert_eq!(first, second);
    assert_eq!(first.nodes[0].metadata.name.as_deref(), Some("a"));
    // Feed the layout back as what the GPUs have now: nothing moves.
    let mut current = nodes.to_vec();
    for n in &mut current {
        let spec = &first.nodes.iter().find(|g| g.name_any() == n.name).unwrap().spec;
        for g in &spec.gpus {
            n.gpus[g.index as usize].instances = g
                .mig_instances
                .iter()
                .map(|i| crate::mig::ExistingInstance {
                    profile: i.profile.clone(),
                    placement: i.placement,
                    gpu_instance_id: None,
                })
                .collect();
        }
    }
    let again = run(&tenants, &plans, &current);
    assert_eq!(again.nodes, first.nodes);
}

// Rollout and plan statuses.

fn plan_status(out: &PlanOutput, name: &str) -> GpuPartitionPlanStatus {
    out.plans
        .iter()
        .find(|p| p.name_any() == name)
        .and_then(|p| p.status.clone())
        .unwrap()
}

fn plan_condition(s: &GpuPartitionPlanStatus, t: &str) -> Condition {
    s.conditions.iter().find(|c| c.type_ == t).cloned().unwrap()
}

/// The cluster after the writer wrote `out`: a changed spec bumps the GpuNode's generation, and its
/// agent has not reported on it yet.
fn write_nodes(nodes: &mut [NodeInventory], out: &[GpuNode]) {
    for gn in out {
        let n = nodes.iter_mut().find(|n| n.name == gn.name_any()).unwrap();
        let c = n.current.get_or_insert_with(Default::default);
        if c.spec != gn.spec {
            c.spec = gn.spec.clone();
            c.generation = Some(c.generation.unwrap_or(0) + 1);
            c.applied = crate::inventory::AppliedState::Pending;
        }
    }
}

/// The agents of `names` report their current generation with `state`.
fn report_nodes(nodes: &mut [NodeInventory], names: &[String], state: crate::inventory::AppliedState) {
    for n in nodes.iter_mut().filter(|n| names.contains(&n.name)) {
        let c = n.current.as_mut().unwrap();
        c.observed_generation = c.generation;
        c.applied = state.clone();
    }
}

fn plan_at(plans: &[GpuPartitionPlan], nodes: &[NodeInventory], secs: i64) -> PlanOutput {
    let policies = [policy()];
    plan(
        &PlanInput {
            policies: &policies,
            tenants: &[],
            plans,
            nodes,
        },
        &Default::default(),
        &Time(jiff::Timestamp::from_second(secs).unwrap()),
    )
}

/// The statuses of `out` fed back as the plans' current state, as the controller reads them.
fn with_statuses(plans: &[GpuPartitionPlan], out: &PlanOutput) -> Vec<GpuPartitionPlan> {
    plans
        .iter()
        .map(|p| {
            let mut p = p.clone();
            p.status = out
                .plans
                .iter()
                .find(|o| o.name_any() == p.name_any())
                .unwrap()
                .status
                .clone();
            p
        })
        .collect()
}

/// Ten nodes in service: each applied plan `p`'s exclusive layout. Their specs then.
fn ten_exclusive_nodes_in_service() -> (Vec<NodeInventory>, Vec<GpuNodeSpec>) {
    let mut nodes: Vec<NodeInventory> = (0..10)
        .map(|i| node(&format!("n{i}"), "x", "H100-80GB", 2, false))
        .collect();
    let exclusive = plan_for("p", "x", vec![group("all", Mode::Exclusive)]);
    let start = plan_at(std::slice::from_ref(&exclusive), &nodes, 1);
    write_nodes(&mut nodes, &start.nodes);
    let all: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
    report_nodes(&mut nodes, &all, crate::inventory::AppliedState::Applied);
    (nodes, start.nodes.iter().map(|n| n.spec.clone()).collect())
}

/// Plan `p` turned to MPS, rolled out two nodes at a time.
fn mps_two_at_a_time() -> GpuPartitionPlan {
    let mut mps = plan_for("p", "x", vec![group("all", Mode::Mps)]);
    mps.spec.rollout = Some(Rollout {
        max_unavailable: Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(2)),
        busy_gpu_policy: BusyGpuPolicy::Wait,
    });
    mps
}

fn is_mps(n: &GpuNode) -> bool {
    n.spec.gpus.iter().all(|g| g.mode == Mode::Mps) && !n.spec.gpus.is_empty()
}

/// The nodes `out` turns to MPS.
fn moved_to_mps(out: &PlanOutput) -> Vec<String> {
    out.nodes.iter().filter(|n| is_mps(n)).map(|n| n.name_any()).collect()
}

/// Plan `p`'s node counts: selected, updated, applied, pending.
fn node_counts(out: &PlanOutput) -> (u32, u32, u32, u32) {
    let c = plan_status(out, "p").nodes.unwrap();
    (c.selected, c.updated, c.applied, c.pending)
}

/// Writes `out` and has the agents apply what changes, pass after pass, never more than two nodes
/// changing at once, until plan `p` is Ready: its last output.
fn roll_out(plans: &mut Vec<GpuPartitionPlan>, nodes: &mut [NodeInventory], mut out: PlanOutput) -> PlanOutput {
    use crate::inventory::AppliedState;
    for pass in 0.. {
        assert!(pass < 10, "the rollout does not finish");
        write_nodes(nodes, &out.nodes);
        *plans = with_statuses(plans, &out);
        let changing: Vec<String> = nodes
            .iter()
            .filter(|n| n.current.as_ref().unwrap().applied == AppliedState::Pending)
            .map(|n| n.name.clone())
            .collect();
        assert!(changing.len() <= 2, "{changing:?}");
        report_nodes(nodes, &changing, AppliedState::Applied);
        out = plan_at(plans, nodes, 10 + pass);
        if plan_condition(&plan_status(&out, "p"), "Ready").status == "True" {
            return out;
        }
    }
    unreachable!()
}

#[test]
fn a_plan_change_rolls_two_nodes_at_a_time_and_the_plan_becomes_ready() {
    let (mut nodes, old_specs) = ten_exclusive_nodes_in_service();
    let mut plans = vec![mps_two_at_a_time()];
    let out = plan_at(&plans, &nodes, 2);
    let moved = moved_to_mps(&out);
    assert_eq!(moved, ["n0", "n1"]);
    for (n, old) in out.nodes.iter().zip(&old_specs).skip(2) {
        assert_eq!(&n.spec, old, "{} keeps its spec", n.name_any());
    }
    let s = plan_status(&out, "p");
    assert_eq!(node_counts(&out), (10, 2, 0, 10));
    assert_eq!(plan_condition(&s, "Reconciling").status, "True");
    assert_eq!(
        plan_condition(&s, "Reconciling").message,
        "10 of 10 nodes still to apply the plan: 2 changing at once (maxUnavailable 2), 8 waiting for the rollout"
    );
    assert_eq!(plan_condition(&s, "Stalled").status, "False");
    assert_eq!(plan_condition(&s, "Ready").reason, "Pending");
    assert_eq!(s.node_details.iter().filter(|d| d.state == "HeldBack").count(), 8);

    // Written, nothing reported: the same specs again.
    write_nodes(&mut nodes, &out.nodes);
    plans = with_statuses(&plans, &out);
    let again = plan_at(&plans, &nodes, 3);
    assert_eq!(again.nodes, out.nodes);

    // The two apply: the next two move.
    report_nodes(&mut nodes, &moved, crate::inventory::AppliedState::Applied);
    let out = plan_at(&plans, &nodes, 4);
    assert_eq!(moved_to_mps(&out), ["n0", "n1", "n2", "n3"]);
    let (_, updated, applied, pending) = node_counts(&out);
    assert_eq!((updated, applied, pending), (4, 2, 8));

    // Apply everything, two at a time.
    let out = roll_out(&mut plans, &mut nodes, out);
    let s = plan_status(&out, "p");
    assert_eq!(node_counts(&out), (10, 10, 10, 0));
    assert!(out.nodes.iter().all(is_mps));
    assert!(s.node_details.is_empty());
    assert_eq!(plan_condition(&s, "Reconciling").status, "False");
    let ready = plan_condition(&s, "Ready");
    assert_eq!(
        (ready.reason.as_str(), ready.message.as_str()),
        ("Applied", "10 of 10 nodes applied")
    );

    // Nothing changed: the same specs, and Ready keeps its transition time.
    plans = with_statuses(&plans, &out);
    let again = plan_at(&plans, &nodes, 1_000);
    assert_eq!(again.nodes, out.nodes);
    assert_eq!(plan_condition(&plan_status(&again, "p"), "Ready"), ready);
    assert_eq!(again.plans, out.plans);
}

#[test]
fn offline_plans_are_pending_until_agents_apply() {
    let nodes: Vec<NodeInventory> = (0..3)
        .map(|i| node(&format!("n{i}"), "x", "H100-80GB", 2, false))
        .collect();
    let plans = [plan_for("p", "x", vec![group("all", Mode::Exclusive)])];
    let out = run(&[], &plans, &nodes);
    assert!(
        out.nodes.iter().all(|n| n.spec.gpus.len() == 2),
        "everything is written"
    );
    let s = plan_status(&out, "p");
    let counts = s.nodes.clone().unwrap();
    assert_eq!(
        (counts.selected, counts.updated, counts.applied, counts.pending),
        (3, 3, 0, 3)
    );
    let ready = plan_condition(&s, "Ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str(), ready.message.as_str()),
        ("False", "Pending", "3 of 3 nodes still to apply the plan")
    );
    assert_eq!(
        plan_condition(&s, "Reconciling").message,
        "3 of 3 nodes still to apply the plan"
    );
    assert_eq!(plan_condition(&s, "Stalled").status, "False");
}

#[test]
fn nodes_whose_agent_failed_or_has_not_reported_are_counted_apart() {
    use crate::inventory::AppliedState;
    let mut nodes: Vec<NodeInventory> = (0..3)
        .map(|i| node(&format!("n{i}"), "x", "H100-80GB", 2, false))
        .collect();
    let plans = [plan_for("p", "x", vec![group("all", Mode::Exclusive)])];
    let out = run(&[], &plans, &nodes);
    write_nodes(&mut nodes, &out.nodes);
    report_nodes(&mut nodes, &["n0".into()], AppliedState::Applied);
    report_nodes(
        &mut nodes,
        &["n1".into()],
        AppliedState::Failed("GPU 1: Busy (pids 7)".into()),
    );
    nodes[2].reported = false;
    let s = plan_status(&run(&[], &plans, &nodes), "p");
    let counts = s.nodes.clone().unwrap();
    assert_eq!(
        (
            counts.selected,
            counts.updated,
            counts.applied,
            counts.pending,
            counts.waiting,
            counts.failed
        ),
        (3, 2, 1, 0, 1, 1)
    );
    let details: Vec<(&str, &str)> = s
        .node_details
        .iter()
        .map(|d| (d.node.as_str(), d.state.as_str()))
        .collect();
    assert_eq!(details, [("n1", "Failed"), ("n2", "Waiting")]);
    assert!(s.node_details[0].message.ends_with("GPU 1: Busy (pids 7)"));
    let stalled = plan_condition(&s, "Stalled");
    assert_eq!(
        (stalled.status.as_str(), stalled.reason.as_str()),
        ("True", "NodesFailed")
    );
    assert_eq!(plan_condition(&s, "Reconciling").reason, "WaitingForAgents");
    assert_eq!(plan_condition(&s, "Ready").reason, "NodesFailed");
}

/// The inventory file's `current:` is what runs now: a tenant keeps the instance it holds (here at
/// memory slice 4) instead of taking the first free one.
#[test]
fn the_inventory_files_current_bindings_are_kept() {
    let text = r#"
nodes:
- name: n1
  labels: {pool: mig}
  gpus:
  - {pciDeviceId: "0x233010DE", count: 1}
  current:
  - {gpu: 0, mode: MIG, instances: [{profile: 3g.40gb, placement: "4:4", tenant: t}]}
"#;
    let file: crate::inventory::InventoryFile = serde_saphyr::from_str(text).unwrap();
    let nodes = file.resolve().unwrap();
    let plans = [plan_for("p", "mig", vec![mig_group("all", &["3g.40gb", "3g.40gb"])])];
    let tenants = [TenantBuilder::new("t", "internal").mig("3g.40gb", 1).build()];
    let out = run(&tenants, &plans, &nodes);
    let grants = &tenant(&out, "t").grants;
    assert_eq!(grants.len(), 1);
    assert_eq!(grants[0].placement.as_deref(), Some("4:4"), "{grants:?}");
    // Without it, the first free instance is taken.
    let mut fresh = nodes.clone();
    fresh[0].gpus[0] = crate::inventory::NodeGpu {
        instances: vec![],
        instance_tenants: Default::default(),
        mode: None,
        ..fresh[0].gpus[0].clone()
    };
    let out = run(&tenants, &plans, &fresh);
    assert_eq!(tenant(&out, "t").grants[0].placement.as_deref(), Some("0:4"));
    // A placement that is not one is refused with the field.
    let bad: crate::inventory::InventoryFile = serde_saphyr::from_str(&text.replace("\"4:4\"", "\"9:4\"")).unwrap();
    let err = bad.resolve().unwrap_err();
    assert!(
        err[0].starts_with("nodes[0].current[0].instances[0].placement:"),
        "{err:?}"
    );
}

/// Two tenants of tier `internal` on one node's two MPS GPUs (4 clients of 10 GiB): `a` under
/// policy `tight` (60% headroom: one share a GPU), `b` (`b_wants` shares) under the default
/// policy (10%: three). `b_now` shares of `b` run on GPU 0 now. The planner's output, and its
/// output when that output is fed back as what runs now.
fn two_headrooms(a_wants: u32, b_wants: u32, b_now: u32) -> (Vec<Vec<TenantShares>>, Vec<Vec<TenantShares>>) {
    let mut tight = policy();
    tight.metadata.name = Some("tight".into());
    tight.spec.memory_headroom_percent = Some(60);
    let policies = [policy(), tight];
    let mut g = group("all", Mode::Mps);
    g.mps = Some(MpsSettings {
        max_clients: 4,
        active_thread_percentage: None,
        pinned_memory_limit: None,
    });
    let plans = [plan_for("p", "x", vec![g])];
    let mut a = TenantBuilder::new("a", "internal").want(Mode::Mps, a_wants).build();
    a.spec.policy_ref = "tight".into();
    let tenants = shared(&[a, TenantBuilder::new("b", "internal").want(Mode::Mps, b_wants).build()]);
    let mut nodes = [node("n", "x", "A100-40GB", 2, false)];
    if b_now > 0 {
        for gpu in &mut nodes[0].gpus {
            gpu.mode = Some(Mode::Mps);
        }
        nodes[0].gpus[0].tenants = vec!["b".into()];
        nodes[0].gpus[0].shares = std::collections::BTreeMap::from([("b".to_string(), b_now)]);
    }
    let run = |nodes: &[NodeInventory]| {
        let input = PlanInput {
            policies: &policies,
            tenants: &tenants,
            plans: &plans,
            nodes,
        };
        let out = plan(&input, &Default::default(), &now());
        assert_eq!(out.problems, []);
        out
    };
    let shares = |out: &PlanOutput| -> Vec<Vec<TenantShares>> {
        out.nodes[0].spec.gpus.iter().map(|g| g.shares.clone()).collect()
    };
    let out = run(&nodes);
    for (gpu, spec) in nodes[0].gpus.iter_mut().zip(&out.nodes[0].spec.gpus) {
        gpu.mode = Some(spec.mode);
        gpu.tenants = spec.tenants.clone();
        gpu.shares = spec.shares.iter().map(|s| (s.tenant.clone(), s.count)).collect();
    }
    (shares(&out), shares(&run(&nodes)))
}

fn share(tenant: &str, count: u32) -> TenantShares {
    TenantShares {
        tenant: tenant.into(),
        count,
    }
}

/// A shared GPU's share count is fixed by the headroom of the tenant that opens it. `a` joins the
/// GPU `b` runs two shares on; placed again from that, `a` opens it first (priority, then name)
/// and leaves room for none of `b`'s. So the pass that places again from the first result must
/// run (`allocate::stable` says so), and the output is one that feeding back moves nothing.
/// (Placing once only, the debug builds' comparison fails this test, tried.)
#[test]
fn a_gpu_opened_under_another_headroom_is_placed_again() {
    let (out, again) = two_headrooms(1, 2, 2);
    assert_eq!(out, [vec![share("a", 1)], vec![share("b", 2)]]);
    assert_eq!(again, out);
}

/// The same from nothing running: the blind pass gives `a` and `b` one share each (the strictest
/// headroom counts the free shares), `a` a GPU to itself; then `a`'s second share joins the GPU
/// `b` opened under its own headroom. That placement is not taken as stable (`allocate::stable`):
/// placed again, `a` would open that GPU with room for one share and `b`'s would not fit, so the
/// planner places again, finds that, and keeps the blind pass's placement; fed back, it stays.
/// (Kept without that check, the debug builds' comparison fails this test, tried.)
#[test]
fn a_blind_placement_under_two_headrooms_is_placed_again() {
    let (out, again) = two_headrooms(2, 2, 0);
    assert_eq!(out, [vec![share("a", 1)], vec![share("a", 1), share("b", 2)]]);
    assert_eq!(again, out);
}

/// The memo takes a cell's last result back when only what runs on its GPUs changed, and only
/// where every GPU of the cell then runs that result (the planner's fixed point): where the agents
/// run something else (here the two tenants' exclusive GPUs swapped) the cell is placed again, as
/// a pass from nothing places it.
#[test]
fn the_memo_places_a_cell_again_where_its_gpus_run_something_else() {
    let policies = [policy()];
    let plans = [plan_for("excl", "pool", vec![group("all", Mode::Exclusive)])];
    let t = [
        TenantBuilder::new("a", "internal").want(Mode::Exclusive, 1).build(),
        TenantBuilder::new("b", "internal").want(Mode::Exclusive, 1).build(),
    ];
    let tenants = shared(&t);
    let run = |nodes: &[NodeInventory], memo: Option<&mut PlanMemo>| {
        let input = PlanInput {
            policies: &policies,
            tenants: &tenants,
            plans: &plans,
            nodes,
        };
        plan_with(&input, &Default::default(), &now(), memo)
    };
    let holders =
        |out: &PlanOutput| -> Vec<Vec<String>> { out.nodes[0].spec.gpus.iter().map(|g| g.tenants.clone()).collect() };
    let mut nodes = vec![node("n1", "pool", "H100-80GB", 2, false)];
    let mut memo = PlanMemo::default();
    let first = run(&nodes, Some(&mut memo));
    assert_eq!(holders(&first), [["a"], ["b"]]);
    let runs = |nodes: &mut [NodeInventory], holders: &[Vec<String>]| {
        for (gpu, tenants) in nodes[0].gpus.iter_mut().zip(holders) {
            gpu.mode = Some(Mode::Exclusive);
            gpu.tenants = tenants.clone();
        }
    };
    // The agent runs the plan with the GPUs swapped: a pass from nothing keeps what runs.
    runs(&mut nodes, &[vec!["b".into()], vec!["a".into()]]);
    let fresh = run(&nodes, None);
    assert_eq!(holders(&fresh), [["b"], ["a"]]);
    assert_eq!(run(&nodes, Some(&mut memo)), fresh);
    // Then it runs that result: the memo's cell stands, as a pass from nothing gives it.
    runs(&mut nodes, &holders(&fresh));
    assert_eq!(run(&nodes, Some(&mut memo)), run(&nodes, None));
}

/// What runs now has two `external` tenants (co-location forbidden) on MPS GPU 0: `a`, first by
/// name, and `b`, first by priority. The GPU goes to `b`, which keeps its share first and locks
/// it, and is counted as `b`'s by every pass (the placing from what runs now, and the check that
/// placing again gives the result back); `a` takes the other GPU, and fed back, nothing moves.
#[test]
fn a_gpu_two_forbidden_tenants_run_on_goes_to_the_first_by_priority() {
    let plans = [plan_for("p", "mps", vec![group("all", Mode::Mps)])];
    let tenants = [
        TenantBuilder::new("a", "external").want(Mode::Mps, 1).build(),
        TenantBuilder::new("b", "external")
            .priority(5)
            .want(Mode::Mps, 1)
            .build(),
    ];
    let mut nodes = [node("n1", "mps", "H100-80GB", 2, false)];
    let gpu = &mut nodes[0].gpus[0];
    gpu.mode = Some(Mode::Mps);
    gpu.tenants = vec!["a".into(), "b".into()];
    gpu.shares = std::collections::BTreeMap::from([("a".to_string(), 1), ("b".to_string(), 1)]);
    let users =
        |out: &PlanOutput| -> Vec<Vec<String>> { out.nodes[0].spec.gpus.iter().map(|g| g.tenants.clone()).collect() };
    let out = run(&tenants, &plans, &nodes);
    assert_eq!(users(&out), [vec!["b"], vec!["a"]]);
    for (gpu, spec) in nodes[0].gpus.iter_mut().zip(&out.nodes[0].spec.gpus) {
        gpu.tenants = spec.tenants.clone();
        gpu.shares = spec.shares.iter().map(|s| (s.tenant.clone(), s.count)).collect();
        gpu.mode = Some(spec.mode);
    }
    assert_eq!(users(&run(&tenants, &plans, &nodes)), users(&out));
}

/// An MPS group that gives no settings runs with the defaults (4 clients): its GPUs are planned
/// with them, and the device plugin is told as many clients.
#[test]
fn an_mps_group_without_settings_runs_with_the_defaults() {
    let mut g = group("all", Mode::Mps);
    g.mps = None;
    assert_eq!(
        crate::device_plugin::Sharing::of_group(&g),
        Some(crate::device_plugin::Sharing::Mps { replicas: 4 })
    );
    let plans = [plan_for("p", "mps", vec![g])];
    let out = run(&[], &plans, &[node("n1", "mps", "H100-80GB", 1, false)]);
    let planned = out.nodes[0].spec.gpus[0].mps.as_ref().map(|m| m.max_clients);
    assert_eq!(planned, Some(4));
    assert_eq!(MpsSettings::in_effect(None), &MpsSettings::default());
}
