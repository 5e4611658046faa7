//! The controller's incremental pass against the full pass: after any sequence
//! of changes (tenants growing, shrinking, arriving and leaving, memory limits that join cells,
//! priorities, tiers, requests listed in another order, nodes relabelled, dropped or given other GPUs,
//! plans changed, added and removed, agents applying the last plan), planning with the memo of the earlier passes gives exactly what planning from
//! nothing gives, and so does the whole desired state rendered with its memo (the tenants'
//! admission policies taken back where their rules are unchanged).

#[path = "support/fleet.rs"]
mod support;

use gpu_tenancy::api::{GpuPartitionPlan, Mode, PodSecurity, TenantLimits};
use gpu_tenancy::desired::{Desired, DesiredMemo};
use gpu_tenancy::planner::{PlanMemo, PlanOutput};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use support::desired_with as desired;
use support::run_with as plan;

#[derive(Clone, Debug)]
enum Change {
    Resize {
        tenant: usize,
        request: usize,
        count: u32,
    },
    Add {
        seed: u64,
    },
    Remove {
        tenant: usize,
    },
    Priority {
        tenant: usize,
        priority: i32,
    },
    MemoryLimit {
        tenant: usize,
        gib: Option<u32>,
    },
    /// The agents applied the last plan: it is what runs now.
    Apply,
    Relabel {
        node: usize,
        pool: usize,
    },
    Drop {
        node: usize,
    },
    /// A GPU of the node was replaced (another UUID).
    Replace {
        node: usize,
    },
    Replicas {
        replicas: u32,
    },
    /// A tenant lists its requests in another order (its allocation summary follows that order).
    Reorder {
        tenant: usize,
    },
    /// A tenant moves to another tier: its `scrubMemory`, co-location and allowed modes change
    /// (it may become invalid).
    Tier {
        tenant: usize,
        tier: usize,
    },
    /// A tenant adds a namespace in front of its own, another tenant's first (then claimed twice)
    /// or a new one (its grant split over one more, its namespaces each in another place), or,
    /// with more than one, drops its first.
    Namespaces {
        tenant: usize,
        other: Option<usize>,
    },
    /// A tier's Pod Security level flips (its tenants' namespaces are labelled anew).
    PodSecurity {
        tier: usize,
    },
    /// A plan's priority (plans selecting the same nodes at one priority tie).
    PlanPriority {
        plan: usize,
        priority: i32,
    },
    /// A plan selects another pool (a MIG plan on A100 or H200 nodes fails there; two plans may
    /// select one pool).
    PlanSelector {
        plan: usize,
        pool: usize,
    },
    /// A plan removed (its nodes are left unplanned or to another plan).
    PlanRemove {
        plan: usize,
    },
    /// A copy of a plan under a new name, selecting a pool at a priority.
    PlanAdd {
        from: usize,
        pool: usize,
        priority: i32,
    },
    /// A plan dedicates its first GPUs to a tenant, or to one that does not exist (the plan is
    /// then not valid).
    PlanDedicate {
        plan: usize,
        tenant: Option<usize>,
    },
    /// The controller's status writes of the last pass come back through the watch, but for one
    /// tenant's (not written yet): the memo hands back only statuses whose conditions are the
    /// tenant's as read, and stamps a condition that turns with the pass's own time.
    StatusesBack {
        except: usize,
    },
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        (0..64usize, 0..5usize, 0..30u32).prop_map(|(tenant, request, count)| Change::Resize {
            tenant,
            request,
            count
        }),
        any::<u64>().prop_map(|seed| Change::Add { seed }),
        (0..64usize).prop_map(|tenant| Change::Remove { tenant }),
        (0..64usize, 0..3i32).prop_map(|(tenant, priority)| Change::Priority { tenant, priority }),
        (0..64usize, proptest::option::of(20..400u32)).prop_map(|(tenant, gib)| Change::MemoryLimit { tenant, gib }),
        Just(Change::Apply),
        Just(Change::Apply),
        (0..64usize, 0..4usize).prop_map(|(node, pool)| Change::Relabel { node, pool }),
        (0..64usize).prop_map(|node| Change::Drop { node }),
        (0..64usize).prop_map(|node| Change::Replace { node }),
        (1..8u32).prop_map(|replicas| Change::Replicas { replicas }),
        (0..64usize).prop_map(|tenant| Change::Reorder { tenant }),
        (0..64usize, 0..3usize).prop_map(|(tenant, tier)| Change::Tier { tenant, tier }),
    ]
}

/// [`change`], and changes of what a tenant namespace's objects are made of. (A strategy of its
/// own: adding variants to [`change`] would change what the saved regression seeds replay.)
fn namespace_change() -> impl Strategy<Value = Change> {
    prop_oneof![
        2 => change(),
        1 => (0..64usize, proptest::option::of(0..64usize)).prop_map(|(tenant, other)| Change::Namespaces { tenant, other }),
        1 => (0..3usize).prop_map(|tier| Change::PodSecurity { tier }),
    ]
}

/// [`change`], and changes of the plans: their selectors, priorities, validity, plans added and
/// removed. (A strategy of its own, as [`namespace_change`].)
fn plan_change() -> impl Strategy<Value = Change> {
    prop_oneof![
        2 => change(),
        1 => (0..8usize, 0..3i32).prop_map(|(plan, priority)| Change::PlanPriority { plan, priority }),
        1 => (0..8usize, 0..4usize).prop_map(|(plan, pool)| Change::PlanSelector { plan, pool }),
        1 => (0..8usize).prop_map(|plan| Change::PlanRemove { plan }),
        1 => (0..8usize, 0..4usize, 0..3i32).prop_map(|(from, pool, priority)| Change::PlanAdd { from, pool, priority }),
        1 => (0..8usize, proptest::option::of(0..64usize)).prop_map(|(plan, tenant)| Change::PlanDedicate { plan, tenant }),
    ]
}

/// [`change`], and the tenants' statuses written back. (A strategy of its own, as
/// [`namespace_change`].) Namespaces claimed twice change the problems of a tenant that did not
/// change itself.
fn status_change() -> impl Strategy<Value = Change> {
    prop_oneof![
        2 => change(),
        1 => (0..64usize, proptest::option::of(0..64usize)).prop_map(|(tenant, other)| Change::Namespaces { tenant, other }),
        2 => (0..64usize).prop_map(|except| Change::StatusesBack { except }),
    ]
}

/// Each tenant of `f` but the `except`th gets the status `written` gives it (as the watch hands
/// back an object written: a new one where it changed, the same one where it did not).
fn statuses_back(f: &mut support::Fleet, written: &Desired, except: usize) {
    let skip = (!f.tenants.is_empty()).then(|| except % f.tenants.len());
    for (i, t) in f.tenants.iter_mut().enumerate() {
        let Some(w) = written.tenants.iter().find(|w| w.metadata.name == t.metadata.name) else {
            continue;
        };
        if Some(i) != skip && w.status != t.status {
            Arc::make_mut(t).status.clone_from(&w.status);
        }
    }
}

const POOLS: [&str; 4] = ["mig", "mps", "ts", "excl"];

fn apply(f: &mut support::Fleet, last: &PlanOutput, change: &Change, added: &mut usize) {
    let pick = |n: usize, len: usize| (len > 0).then(|| n % len);
    match *change {
        Change::Resize { tenant, request, count } => {
            if let Some(t) = pick(tenant, f.tenants.len()) {
                let resources = &mut Arc::make_mut(&mut f.tenants[t]).spec.resources;
                let r = request % resources.len();
                resources[r].count = count;
            }
        }
        Change::Add { seed } => {
            *added += 1;
            f.tenants.push(Arc::new(support::tenant(1000 + *added, seed)));
        }
        Change::Remove { tenant } => {
            if let Some(t) = pick(tenant, f.tenants.len()) {
                f.tenants.remove(t);
            }
        }
        Change::Priority { tenant, priority } => {
            if let Some(t) = pick(tenant, f.tenants.len()) {
                Arc::make_mut(&mut f.tenants[t]).spec.priority = priority;
            }
        }
        Change::MemoryLimit { tenant, gib } => {
            if let Some(t) = pick(tenant, f.tenants.len()) {
                Arc::make_mut(&mut f.tenants[t]).spec.limits = gib.map(|g| TenantLimits {
                    max_gpus_per_pod: None,
                    memory: Some(format!("{g}Gi")),
                });
            }
        }
        Change::Apply => f.nodes = support::with_current(&f.nodes, &last.nodes),
        Change::Relabel { node, pool } => {
            if let Some(n) = pick(node, f.nodes.len()) {
                f.nodes[n].labels.insert("pool".into(), POOLS[pool].into());
                support::revise(&mut f.nodes[n]);
            }
        }
        Change::Drop { node } => {
            if let Some(n) = pick(node, f.nodes.len()) {
                f.nodes.remove(n);
            }
        }
        Change::Replace { node } => {
            if let Some(n) = pick(node, f.nodes.len()) {
                let gpu = &mut f.nodes[n].gpus[0];
                gpu.uuid = Some(format!("{}-replaced", gpu.uuid.clone().unwrap_or_default()));
                gpu.tenants.clear();
                gpu.shares.clear();
                gpu.instances.clear();
                gpu.instance_tenants.clear();
                gpu.mode = None;
                support::revise(&mut f.nodes[n]);
            }
        }
        Change::Tier { tenant, tier } => {
            if let Some(t) = pick(tenant, f.tenants.len()) {
                Arc::make_mut(&mut f.tenants[t]).spec.tier = ["external", "internal", "experimental"][tier].into();
            }
        }
        Change::Reorder { tenant } => {
            if let Some(t) = pick(tenant, f.tenants.len()) {
                Arc::make_mut(&mut f.tenants[t]).spec.resources.rotate_left(1);
            }
        }
        Change::Namespaces { tenant, other } => {
            let Some(t) = pick(tenant, f.tenants.len()) else { return };
            let theirs = match other.and_then(|o| pick(o, f.tenants.len())) {
                Some(o) => f.tenants[o].spec.namespaces.first().cloned(),
                None => Some(format!("ns-extra-{}", f.tenants[t].spec.namespaces.len())),
            };
            let ns = &mut Arc::make_mut(&mut f.tenants[t]).spec.namespaces;
            match theirs {
                _ if ns.len() > 1 => drop(ns.remove(0)),
                Some(n) if !ns.contains(&n) => ns.insert(0, n),
                _ => {}
            }
        }
        Change::PodSecurity { tier } => {
            let tier = &mut f.policies[0].spec.tiers[tier % 3];
            tier.pod_security = match tier.pod_security {
                PodSecurity::Baseline => PodSecurity::Restricted,
                PodSecurity::Restricted => PodSecurity::Baseline,
            };
        }
        Change::PlanPriority { .. }
        | Change::PlanSelector { .. }
        | Change::PlanRemove { .. }
        | Change::PlanAdd { .. }
        | Change::PlanDedicate { .. } => apply_plan_change(f, change, added),
        Change::StatusesBack { .. } => unreachable!("the statuses come back from the desired state"),
        Change::Replicas { replicas } => {
            let ts = f.plans.iter_mut().find(|p| p.metadata.name.as_deref() == Some("ts"));
            if let Some(ts) = ts {
                ts.spec.gpus[0]
                    .time_slicing
                    .as_mut()
                    .expect("the ts plan time-slices")
                    .replicas = replicas;
            }
        }
    }
}

/// Applies a change of the plans (the variants [`plan_change`] adds).
fn apply_plan_change(f: &mut support::Fleet, change: &Change, added: &mut usize) {
    let pick = |n: usize, len: usize| (len > 0).then(|| n % len);
    let selecting = |pool: usize| LabelSelector {
        match_labels: Some(BTreeMap::from([("pool".to_string(), POOLS[pool].to_string())])),
        match_expressions: None,
    };
    match *change {
        Change::PlanPriority { plan, priority } => {
            if let Some(p) = pick(plan, f.plans.len()) {
                f.plans[p].spec.priority = priority;
            }
        }
        Change::PlanSelector { plan, pool } => {
            if let Some(p) = pick(plan, f.plans.len()) {
                f.plans[p].spec.node_selector = selecting(pool);
            }
        }
        Change::PlanRemove { plan } => {
            if let Some(p) = pick(plan, f.plans.len()) {
                f.plans.remove(p);
            }
        }
        Change::PlanAdd { from, pool, priority } => {
            if let Some(p) = pick(from, f.plans.len()) {
                *added += 1;
                let mut spec = f.plans[p].spec.clone();
                spec.node_selector = selecting(pool);
                spec.priority = priority;
                f.plans.push(GpuPartitionPlan::new(&format!("extra-{added}"), spec));
            }
        }
        Change::PlanDedicate { plan, tenant } => {
            if let Some(p) = pick(plan, f.plans.len()) {
                let name = match tenant.and_then(|t| pick(t, f.tenants.len())) {
                    Some(t) => f.tenants[t].metadata.name.clone().unwrap_or_default(),
                    None => "nobody".to_string(),
                };
                f.plans[p].spec.gpus[0].tenants = vec![name];
            }
        }
        _ => unreachable!("{change:?} is not a change of the plans"),
    }
}

/// Plans and renders `f` after each of `changes`, with the memos and from nothing: equal at every
/// step. Each step renders at a time of its own (a condition that turns is stamped with it).
fn check_memo_equals_full(mut f: support::Fleet, changes: &[Change]) -> Result<(), TestCaseError> {
    let mut memo = PlanMemo::default();
    let mut desired_memo = DesiredMemo::default();
    let mut last = plan(&f, Some(&mut memo));
    prop_assert_eq!(&last, &plan(&f, None));
    let mut written = desired(&f, None);
    prop_assert!(desired(&f, Some(&mut desired_memo)) == written);
    let mut added = 0;
    for (step, c) in changes.iter().enumerate() {
        match *c {
            Change::StatusesBack { except } => statuses_back(&mut f, &written, except),
            _ => apply(&mut f, &last, c, &mut added),
        }
        let second = step as i64 + 1;
        let incremental = support::run_at(&f, Some(&mut memo), second);
        let full = support::run_at(&f, None, second);
        prop_assert!(
            incremental == full,
            "step {step} ({c:?}): the memo's plan differs from the full pass"
        );
        written = support::desired_at(&f, None, second);
        prop_assert!(
            support::desired_at(&f, Some(&mut desired_memo), second) == written,
            "step {step} ({c:?}): the desired state rendered with the memo differs from the full pass"
        );
        last = full;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn planning_with_the_memo_equals_planning_from_nothing(
        seed in any::<u64>(),
        changes in proptest::collection::vec(change(), 1..10),
    ) {
        check_memo_equals_full(support::fleet(16, 4, 10, seed), &changes)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// The tenants' statuses taken back from the memo once their writes come back, and computed
    /// again where a write has not (its conditions are not the tenant's as read).
    #[test]
    fn statuses_rendered_with_the_memo_equal_those_from_nothing(
        seed in any::<u64>(),
        changes in proptest::collection::vec(status_change(), 1..10),
    ) {
        check_memo_equals_full(support::fleet(16, 4, 10, seed), &changes)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// The namespaces and quotas taken back from the memo, under changes of their tenants'
    /// namespaces and tiers' Pod Security levels too.
    #[test]
    fn namespaces_rendered_with_the_memo_equal_those_from_nothing(
        seed in any::<u64>(),
        changes in proptest::collection::vec(namespace_change(), 1..10),
    ) {
        check_memo_equals_full(support::fleet(16, 4, 10, seed), &changes)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The nodes taken back from the memo when plans change: only those a changed plan selected
    /// or selects are resolved again.
    #[test]
    fn planning_with_the_memo_equals_planning_from_nothing_when_plans_change(
        seed in any::<u64>(),
        changes in proptest::collection::vec(plan_change(), 1..10),
    ) {
        check_memo_equals_full(support::fleet(16, 4, 10, seed), &changes)?;
    }
}

/// The memo is used: one tenant asking for one more MPS share places the MPS cell again and takes
/// the other five (three MIG profiles, exclusive, time-slicing) from the memo; the same plan.
#[test]
fn one_more_mps_share_places_only_the_mps_cell() {
    let mut f = support::fleet(40, 8, 16, 7);
    let mut memo = PlanMemo::default();
    let first = plan(&f, Some(&mut memo));
    assert_eq!((memo.allocation.placed, memo.allocation.reused), (6, 0));
    f.nodes = support::with_current(&f.nodes, &first.nodes);
    let again = plan(&f, Some(&mut memo));
    assert_eq!(again, plan(&f, None));
    let t = f
        .tenants
        .iter_mut()
        .find(|t| t.spec.resources.iter().any(|r| r.mode == Mode::Mps))
        .expect("the fleet has an MPS tenant");
    Arc::make_mut(t)
        .spec
        .resources
        .iter_mut()
        .find(|r| r.mode == Mode::Mps)
        .expect("found above")
        .count += 1;
    let incremental = plan(&f, Some(&mut memo));
    assert_eq!((memo.allocation.placed, memo.allocation.reused), (1, 5));
    assert_eq!(incremental, plan(&f, None));
    // A node with no MPS GPU is taken back whole: its GPU list is the last pass's, shared, not a
    // copy. The node given the new share has a list of its own.
    let mut own = 0;
    for (now, before) in incremental.nodes.iter().zip(&again.nodes) {
        let shared = now.spec.gpus.same_list(&before.spec.gpus);
        if now.spec.gpus.iter().all(|g| g.mode != Mode::Mps) {
            assert!(
                shared,
                "node {}: its GPU list was copied",
                kube::ResourceExt::name_any(now)
            );
        }
        own += usize::from(!shared);
    }
    assert!(own >= 1, "no node's GPU list changed");
}

/// A plan's change resolves again only the nodes it selected or selects: the exclusive plan's
/// priority changed, every other node is taken back whole (its GPU list shared with the last
/// pass's output, not built again); the same plan as a pass from nothing.
#[test]
fn a_plans_change_resolves_only_its_nodes_again() {
    let mut f = support::fleet(40, 8, 16, 7);
    let mut memo = PlanMemo::default();
    let first = plan(&f, Some(&mut memo));
    f.nodes = support::with_current(&f.nodes, &first.nodes);
    let again = plan(&f, Some(&mut memo));
    let excl = f
        .plans
        .iter_mut()
        .find(|p| p.metadata.name.as_deref() == Some("excl"))
        .expect("the fleet has an exclusive plan");
    excl.spec.priority += 1;
    let incremental = plan(&f, Some(&mut memo));
    assert_eq!(incremental, plan(&f, None));
    let mut resolved = 0;
    for (now, before) in incremental.nodes.iter().zip(&again.nodes) {
        let shared = now.spec.gpus.same_list(&before.spec.gpus);
        let excl = now.spec.plan.as_deref() == Some("excl");
        assert!(
            shared || excl,
            "node {} (plan {:?}): resolved again for another plan's change",
            kube::ResourceExt::name_any(now),
            now.spec.plan
        );
        resolved += usize::from(!shared);
    }
    assert!(resolved > 0, "the exclusive plan's nodes were taken back");
}
