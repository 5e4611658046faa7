//! What a plan changes, and why, on small fleets planned, applied and planned again.

use super::*;
use crate::api::*;
use crate::inventory::{CurrentNode, NodeInventory};
use crate::planner::fixtures::{TenantBuilder, group, mig_group, node, now, plan_for, policy};
use crate::planner::nodes::NodeState;
use crate::planner::{PlanInput, PlanOutput, plan};
use kube::ResourceExt;

fn run(tenants: &[GpuTenant], plans: &[GpuPartitionPlan], nodes: &[NodeInventory]) -> PlanOutput {
    let policies = [policy()];
    let input = PlanInput {
        policies: &policies,
        tenants: &crate::planner::fixtures::shared(tenants),
        plans,
        nodes,
    };
    let out = plan(&input, &Default::default(), &now());
    assert_eq!(out, plan(&input, &Default::default(), &now()), "not deterministic");
    out
}

/// The nodes once `out` is applied: modes, tenants and instances from its GpuNode specs.
fn applied(nodes: &[NodeInventory], out: &PlanOutput) -> Vec<NodeInventory> {
    let mut nodes = nodes.to_vec();
    for n in &mut nodes {
        let spec = &out.nodes.iter().find(|g| g.name_any() == n.name).unwrap().spec;
        for g in &mut n.gpus {
            *g = NodeGpu {
                index: g.index,
                model: g.model,
                name: g.name.clone(),
                memory_mib: g.memory_mib,
                numa_node: g.numa_node,
                uuid: g.uuid.clone(),
                ..NodeGpu::default()
            };
        }
        for s in &spec.gpus {
            let g = &mut n.gpus[s.index as usize];
            g.mode = Some(s.mode);
            if s.mode != Mode::Mig {
                g.tenants = s.tenants.clone();
            }
            for i in &s.mig_instances {
                g.instances.push(crate::mig::ExistingInstance {
                    profile: i.profile.clone(),
                    placement: i.placement,
                    gpu_instance_id: None,
                });
                if let Some(t) = &i.tenant {
                    g.instance_tenants.insert(i.placement, t.clone());
                }
            }
        }
    }
    nodes
}

fn granted(out: &PlanOutput, name: &str) -> Vec<u32> {
    let t = out.tenants.iter().find(|t| t.name_any() == name).unwrap();
    t.status
        .as_ref()
        .unwrap()
        .allocation
        .iter()
        .map(|a| a.granted)
        .collect()
}

/// Plans, applies, and checks that planning again changes nothing.
fn settle(tenants: &[GpuTenant], plans: &[GpuPartitionPlan], nodes: &[NodeInventory]) -> Vec<NodeInventory> {
    let out = run(tenants, plans, nodes);
    let now = applied(nodes, &out);
    let again = run(tenants, plans, &now);
    assert!(again.changes.is_empty(), "{:?}", again.changes);
    assert_eq!(again.tenants, out.tenants);
    now
}

#[test]
fn a_new_tenant_takes_free_instances_and_moves_nobody() {
    let nodes = [node("n1", "mig", "H100-80GB", 2, false)];
    let plans = [plan_for(
        "p",
        "mig",
        vec![mig_group("all", &["3g.40gb", "2g.20gb", "2g.20gb"])],
    )];
    let mut tenants = vec![
        TenantBuilder::new("a", "internal").mig("2g.20gb", 2).build(),
        TenantBuilder::new("b", "internal").mig("2g.20gb", 1).build(),
    ];
    let now = settle(&tenants, &plans, &nodes);
    // Of higher priority, so the blind pass would hand it the first instances, a's.
    tenants.push(
        TenantBuilder::new("c", "internal")
            .mig("2g.20gb", 1)
            .priority(5)
            .build(),
    );
    let out = run(&tenants, &plans, &now);
    assert_eq!(granted(&out, "c"), [1]);
    assert_eq!(out.changes.len(), 1, "{:?}", out.changes);
    let c = &out.changes[0];
    assert_eq!(
        (c.old_tenants.len(), c.new_tenants.as_slice()),
        (0, ["c".to_string()].as_slice())
    );
    assert_eq!(c.reason, ChangeReason::TenantAdded);
    assert!(!c.may_evict && c.scrub);
}

#[test]
fn higher_priority_preempts_and_the_stricter_tenant_decides_the_scrub() {
    let nodes = [node("n1", "x", "H200", 2, false)];
    let plans = [plan_for("p", "x", vec![group("all", Mode::Exclusive)])];
    let mut tenants = vec![TenantBuilder::new("ext", "external").want(Mode::Exclusive, 2).build()];
    let now = settle(&tenants, &plans, &nodes);
    tenants.push(
        TenantBuilder::new("vip", "experimental")
            .want(Mode::Exclusive, 1)
            .priority(5)
            .build(),
    );
    let out = run(&tenants, &plans, &now);
    assert_eq!((granted(&out, "ext"), granted(&out, "vip")), (vec![1], vec![1]));
    assert_eq!(out.changes.len(), 1, "{:?}", out.changes);
    let c = &out.changes[0];
    assert_eq!(c.reason, ChangeReason::Preempted { by: "vip".into() });
    assert_eq!(c.reason.to_string(), "preempted by vip, of higher priority");
    assert!(c.may_evict && c.scrub);
    // vip's tier never scrubs, but the GPU comes from an external tenant, whose tier always does.
    let gpu = &out.nodes[0].spec.gpus[c.gpu as usize];
    assert_eq!(
        (gpu.tenants.as_slice(), gpu.scrub),
        (["vip".to_string()].as_slice(), ScrubMemory::Always)
    );
    // Once handed over, vip's own policy applies.
    let again = run(&tenants, &plans, &applied(&now, &out));
    assert!(again.changes.is_empty());
    assert_eq!(again.nodes[0].spec.gpus[c.gpu as usize].scrub, ScrubMemory::Never);
}

#[test]
fn unknown_previous_owners_count_as_always() {
    let mut nodes = vec![node("n1", "mig", "H100-80GB", 1, false)];
    let plans = [plan_for("p", "mig", vec![mig_group("all", &["7g.80gb"])])];
    let tenants = vec![TenantBuilder::new("exp", "experimental").mig("7g.80gb", 1).build()];
    let out = run(&tenants, &plans, &nodes);
    assert_eq!(out.nodes[0].spec.gpus[0].scrub, ScrubMemory::Never);
    nodes = applied(&nodes, &out);
    let gpu = &mut nodes[0].gpus[0];
    let at = gpu.instances[0].placement;
    gpu.instance_tenants.insert(at, "ghost".into());
    let out = run(&tenants, &plans, &nodes);
    assert_eq!(out.nodes[0].spec.gpus[0].scrub, ScrubMemory::Always);
    let c = &out.changes[0];
    assert_eq!(
        (c.reason.clone(), c.may_evict, c.scrub),
        (ChangeReason::TenantRemoved, true, true)
    );
    assert_eq!((c.profile.as_deref(), c.placement), (Some("7g.80gb"), Some(at)));
    // A tenant that exists but is not valid is unknown too.
    let mut bad = TenantBuilder::new("ghost", "nope").mig("7g.80gb", 1).build();
    bad.spec.priority = 9;
    let out = run(&[tenants[0].clone(), bad], &plans, &nodes);
    assert_eq!(out.changes[0].reason, ChangeReason::TenantInvalid);
    assert_eq!(out.nodes[0].spec.gpus[0].scrub, ScrubMemory::Always);
}

#[test]
fn shrinking_frees_only_that_tenants_units() {
    let nodes = [node("n1", "mig", "H100-80GB", 2, false)];
    let plans = [plan_for("p", "mig", vec![mig_group("all", &["1g.10gb"; 7])])];
    let mut tenants = vec![
        TenantBuilder::new("a", "internal").mig("1g.10gb", 5).build(),
        TenantBuilder::new("b", "internal").mig("1g.10gb", 5).build(),
    ];
    let now = settle(&tenants, &plans, &nodes);
    tenants[0].spec.resources[0].count = 2;
    let out = run(&tenants, &plans, &now);
    assert_eq!(out.changes.len(), 3, "{:?}", out.changes);
    for c in &out.changes {
        assert_eq!(
            (c.old_tenants.as_slice(), c.new_tenants.len()),
            (["a".to_string()].as_slice(), 0)
        );
        assert_eq!(c.reason, ChangeReason::GrantShrank);
    }
    // Fair share: a third tenant of the same weight takes from both, as much as fair share says.
    tenants[0].spec.resources[0].count = 5;
    let now = settle(&tenants, &plans, &now);
    tenants.push(TenantBuilder::new("c", "internal").mig("1g.10gb", 14).build());
    let out = run(&tenants, &plans, &now);
    assert_eq!(
        (granted(&out, "a"), granted(&out, "b"), granted(&out, "c")),
        (vec![5], vec![5], vec![4])
    );
    assert!(
        out.changes.iter().all(|c| c.old_tenants.is_empty()),
        "{:?}",
        out.changes
    );
}

#[test]
fn a_plan_change_is_the_reason() {
    let nodes = [node("n1", "x", "H100-80GB", 1, false)];
    let exclusive = [plan_for("p", "x", vec![group("all", Mode::Exclusive)])];
    let tenants = vec![
        TenantBuilder::new("a", "internal")
            .want(Mode::Exclusive, 1)
            .mig("7g.80gb", 1)
            .build(),
    ];
    let now = settle(&tenants, &exclusive, &nodes);
    let mig = [plan_for("p", "x", vec![mig_group("all", &["7g.80gb"])])];
    let out = run(&tenants, &mig, &now);
    let reasons: Vec<(Option<&str>, &ChangeReason, bool)> = out
        .changes
        .iter()
        .map(|c| (c.profile.as_deref(), &c.reason, c.may_evict))
        .collect();
    assert_eq!(
        reasons,
        [
            (None, &ChangeReason::PlanChanged, true),
            (Some("7g.80gb"), &ChangeReason::PlanChanged, false)
        ]
    );
}

#[test]
fn shared_gpus_keep_their_tenants() {
    let nodes = [node("n1", "mps", "A100-40GB", 4, false)];
    let mut g = group("all", Mode::Mps);
    g.mps = Some(MpsSettings {
        max_clients: 4,
        ..Default::default()
    });
    let plans = [plan_for("p", "mps", vec![g])];
    let mut tenants = vec![
        TenantBuilder::new("a", "internal").want(Mode::Mps, 3).build(),
        TenantBuilder::new("b", "internal").want(Mode::Mps, 3).build(),
    ];
    let now = settle(&tenants, &plans, &nodes);
    tenants.push(
        TenantBuilder::new("c", "internal")
            .want(Mode::Mps, 6)
            .priority(9)
            .build(),
    );
    let out = run(&tenants, &plans, &now);
    assert_eq!(granted(&out, "c"), [6]);
    assert!(out.changes.iter().all(|c| !c.may_evict), "{:?}", out.changes);
    // An experimental tenant needs a GPU of its own: the internal tenants make room on fewer
    // GPUs (co-location), and the change says so.
    tenants[2] = TenantBuilder::new("c", "experimental").want(Mode::Mps, 4).build();
    let out = run(&tenants, &plans, &now);
    assert_eq!(granted(&out, "c"), [4]);
    let moved: Vec<&BindingChange> = out.changes.iter().filter(|c| c.may_evict).collect();
    assert!(
        moved.iter().all(|c| c.reason == ChangeReason::Repacked),
        "{:?}",
        out.changes
    );
}

#[test]
fn required_topology_moves_a_lower_priority_tenant_out_of_the_way() {
    let nodes = [node("n1", "x", "H100-80GB", 8, true)];
    let plans = [plan_for("p", "x", vec![group("all", Mode::Exclusive)])];
    let mut policies = [policy()];
    policies[0].spec.topology = Some(TopologyPolicy::Required);
    let run = |tenants: &[GpuTenant], nodes: &[NodeInventory]| {
        let input = PlanInput {
            policies: &policies,
            tenants: &crate::planner::fixtures::shared(tenants),
            plans: &plans,
            nodes,
        };
        plan(&input, &Default::default(), &now())
    };
    let mut tenants = vec![
        TenantBuilder::new("a", "internal")
            .want(Mode::Exclusive, 2)
            .priority(5)
            .build(),
        TenantBuilder::new("b", "internal").want(Mode::Exclusive, 2).build(),
    ];
    let out = run(&tenants, &nodes);
    let now = applied(&nodes, &out);
    let gpus = |out: &PlanOutput, t: &str| -> Vec<u32> {
        let spec = &out.nodes[0].spec.gpus;
        spec.iter()
            .filter(|g| g.tenants.contains(&t.to_string()))
            .map(|g| g.index)
            .collect()
    };
    // Best fit filled the first NUMA domain (GPUs 0-3).
    assert_eq!((gpus(&out, "a"), gpus(&out, "b")), (vec![0, 1], vec![2, 3]));
    // a needs all four in one domain: it keeps its two and b's two join them; b moves.
    tenants[0].spec.resources[0].count = 4;
    let out = run(&tenants, &now);
    assert_eq!((gpus(&out, "a"), gpus(&out, "b")), (vec![0, 1, 2, 3], vec![4, 5]));
    let moved: Vec<(u32, &ChangeReason)> = out
        .changes
        .iter()
        .filter(|c| c.may_evict)
        .map(|c| (c.gpu, &c.reason))
        .collect();
    assert_eq!(moved, [(2, &ChangeReason::Repacked), (3, &ChangeReason::Repacked)]);
}

#[test]
fn a_scrub_not_applied_yet_is_not_relaxed() {
    let nodes = [node("n1", "x", "H200", 1, false)];
    let plans = [plan_for("p", "x", vec![group("all", Mode::Exclusive)])];
    let tenants = vec![
        TenantBuilder::new("exp", "experimental")
            .want(Mode::Exclusive, 1)
            .build(),
    ];
    let out = run(&tenants, &plans, &nodes);
    let mut now = applied(&nodes, &out);
    let mut spec = out.nodes[0].spec.clone();
    spec.gpus[0].scrub = ScrubMemory::Always;
    now[0].current = Some(CurrentNode {
        spec,
        ..CurrentNode::default()
    });
    let mut fleet = crate::planner::nodes::NodeDesired {
        inventory: &now[0],
        plan: Some("p".into()),
        state: NodeState::Planned,
        gpus: out.nodes[0].spec.gpus.clone(),
        dedicated: vec![vec![]].into(),
        busy_gpu_policy: Default::default(),
        device_access: Default::default(),
        decided: Default::default(),
        kept: false,
        recomputed: false,
        changing: false,
        plugin_config: None,
    };
    let scrub_of: HashMap<&str, ScrubMemory> = [("exp", ScrubMemory::Never)].into_iter().collect();
    assert_eq!(scrub_policies(&fleet, &scrub_of), [ScrubMemory::Always]);
    let mut applied_node = now[0].clone();
    applied_node.current.as_mut().unwrap().applied = AppliedState::Applied;
    fleet.inventory = &applied_node;
    assert_eq!(scrub_policies(&fleet, &scrub_of), [ScrubMemory::Never]);
}

#[test]
fn changes_serialize_for_people_and_tools() {
    let c = BindingChange {
        node: "n1".into(),
        gpu: 2,
        profile: None,
        placement: None,
        old_tenants: vec!["a".into()],
        new_tenants: vec!["b".into()],
        reason: ChangeReason::Preempted { by: "b".into() },
        scrub: true,
        may_evict: true,
    };
    assert_eq!(
        serde_json::to_string(&c).unwrap(),
        r#"{"node":"n1","gpu":2,"oldTenants":["a"],"newTenants":["b"],"reason":{"kind":"Preempted","by":"b"},"scrub":true,"mayEvict":true}"#
    );
}
