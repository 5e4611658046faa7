//! The bookkeeping held back while nodes are written: which writes wait, for how long, and that
//! nothing is lost (the cluster settles where passes without a memory of writes settle it).

use super::*;
use crate::api::{ConditionSet, TenantAdmission};
use crate::controller::desired_of;
use crate::controller::diff::tests::{agent_applies, apply, cluster_node, reported, snapshot, writes};
use crate::controller::diff::{Diff, Seen, diff, diff_with};
use crate::desired::Settings;
use crate::planner::fixtures::{TenantBuilder, now};
use k8s_openapi::api::core::v1::ResourceQuotaSpec;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::sync::Arc;

fn quota(labels: &[(&str, &str)], hard: &[(&str, &str)]) -> ResourceQuota {
    ResourceQuota {
        metadata: ObjectMeta {
            name: Some("gpu-tenancy".into()),
            namespace: Some("acme".into()),
            labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            ..ObjectMeta::default()
        },
        spec: Some(ResourceQuotaSpec {
            hard: Some(
                hard.iter()
                    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                    .collect(),
            ),
            ..ResourceQuotaSpec::default()
        }),
        ..ResourceQuota::default()
    }
}

#[test]
fn a_quota_only_widens_when_no_limit_falls_and_nothing_else_it_enforces_changes() {
    let tenant = [("gputenancy.io/tenant", "acme")];
    let have = quota(
        &tenant,
        &[
            ("requests.nvidia.com/gpu", "2"),
            ("requests.nvidia.com/mig-3g.40gb", "4"),
        ],
    );
    let widens = |want: ResourceQuota| quota_only_widens(&want, &have);
    assert!(widens(quota(
        &tenant,
        &[
            ("requests.nvidia.com/gpu", "3"),
            ("requests.nvidia.com/mig-3g.40gb", "4")
        ]
    )));
    assert!(widens(have.clone()), "the same limits");
    assert!(
        !widens(quota(
            &tenant,
            &[
                ("requests.nvidia.com/gpu", "3"),
                ("requests.nvidia.com/mig-3g.40gb", "3")
            ]
        )),
        "one falls"
    );
    assert!(
        !widens(quota(&tenant, &[("requests.nvidia.com/gpu", "3")])),
        "a key is gone: no limit on it"
    );
    assert!(
        !widens(quota(
            &tenant,
            &[
                ("requests.nvidia.com/gpu", "3"),
                ("requests.nvidia.com/mig-3g.40gb", "4"),
                ("requests.nvidia.com/mig-1g.10gb", "9")
            ]
        )),
        "a key is new"
    );
    assert!(
        !widens(quota(
            &[("gputenancy.io/tenant", "other")],
            &[
                ("requests.nvidia.com/gpu", "3"),
                ("requests.nvidia.com/mig-3g.40gb", "4")
            ]
        )),
        "another tenant's"
    );
    assert!(
        !widens(quota(
            &tenant,
            &[
                ("requests.nvidia.com/gpu", "2500m"),
                ("requests.nvidia.com/mig-3g.40gb", "4")
            ]
        )),
        "not a whole number: not read as a widening"
    );
    let mut scoped = quota(
        &tenant,
        &[
            ("requests.nvidia.com/gpu", "3"),
            ("requests.nvidia.com/mig-3g.40gb", "4"),
        ],
    );
    scoped.spec.as_mut().unwrap().scopes = Some(vec!["NotTerminating".into()]);
    assert!(!widens(scoped), "other scopes");
    assert!(!quota_only_widens(&have, &ResourceQuota::default()), "no live spec");
}

#[test]
fn a_status_says_nothing_new_while_admission_generation_and_verdicts_stand() {
    let mut have = GpuTenantStatus {
        observed_generation: Some(3),
        summary: Some("4/12".into()),
        admission: Some(TenantAdmission::default()),
        ..GpuTenantStatus::default()
    };
    crate::api::set_condition(
        &mut have.conditions,
        ConditionSet::READY,
        false,
        "PartlyGranted",
        "4 of 12",
        Some(3),
        &now(),
    );
    let mut counts = have.clone();
    counts.summary = Some("8/12".into());
    crate::api::set_condition(
        &mut counts.conditions,
        ConditionSet::READY,
        false,
        "PartlyGranted",
        "8 of 12",
        Some(3),
        &now(),
    );
    assert!(status_says_nothing_new(&counts, &have));
    let mut admission = counts.clone();
    admission.admission = None;
    assert!(!status_says_nothing_new(&admission, &have), "what admission reads");
    let mut generation = counts.clone();
    generation.observed_generation = Some(4);
    assert!(
        !status_says_nothing_new(&generation, &have),
        "a new generation observed"
    );
    let mut ready = counts.clone();
    crate::api::set_condition(
        &mut ready.conditions,
        ConditionSet::READY,
        true,
        "PartlyGranted",
        "",
        Some(3),
        &now(),
    );
    assert!(!status_says_nothing_new(&ready, &have), "a condition's status");
    let mut reason = counts;
    crate::api::set_condition(
        &mut reason.conditions,
        ConditionSet::READY,
        false,
        "Waiting",
        "",
        Some(3),
        &now(),
    );
    assert!(!status_says_nothing_new(&reason, &have), "a condition's reason");
}

/// acme asks for 12 3g.40gb instances; each node has two H100s cut into two each.
fn fleet_of_one() -> Snapshot {
    let mut s = snapshot();
    s.tenants = vec![Arc::new(
        TenantBuilder::new("acme", "external").mig("3g.40gb", 12).build(),
    )];
    s
}

fn join(s: &mut Snapshot, name: &str) {
    s.nodes.push(Arc::new(cluster_node(name, "h100", false)));
    s.gpu_nodes.push(Arc::new(reported(name)));
}

fn pass_at(s: &Snapshot, seen: &mut Seen, at: Instant) -> Diff {
    diff_with(&desired_of(s, &Settings::default(), &now()), s, seen, at)
}

/// Passes `step` apart from `at` (each written, each spec applied by its agent) until one writes
/// nothing; returns them and the time after the last.
fn settle_with(s: &mut Snapshot, seen: &mut Seen, mut at: Instant, step: Duration) -> (Vec<Diff>, Instant) {
    let mut passes = Vec::new();
    for _ in 0..8 {
        let d = pass_at(s, seen, at);
        at += step;
        if d.writes.is_empty() && d.held.writes == 0 {
            return (passes, at);
        }
        apply(s, &d);
        agent_applies(s);
        passes.push(d);
    }
    panic!("not settled after eight passes");
}

/// `s` settled by passes a second apart, with the memory of their writes.
fn settled(mut s: Snapshot) -> (Snapshot, Seen, Instant) {
    let mut seen = Seen::default();
    let (_, at) = settle_with(&mut s, &mut seen, Instant::now(), Duration::from_secs(1));
    (s, seen, at)
}

const QUOTA: &str = "apply ResourceQuota acme/gpu-tenancy";
const STATUS: &str = "status GpuTenant acme";

const N2_JOINS: &str = "apply GpuNode n2";

fn has(d: &Diff, w: &str) -> bool {
    d.writes.iter().any(|x| x.to_string() == w)
}

#[test]
fn a_widening_quota_waits_while_a_node_joins_then_goes_once() {
    let mut s = fleet_of_one();
    let mut seen = Seen::default();
    let t0 = Instant::now();
    let (first, at) = settle_with(&mut s, &mut seen, t0, Duration::from_secs(1));
    assert!(
        first.iter().all(|d| d.held == Held::default()),
        "nothing written before: nothing held"
    );
    assert!(writes(&first[0]).contains(&QUOTA.to_string()));
    let quota_written = first
        .iter()
        .rposition(|d| writes(d).contains(&QUOTA.to_string()))
        .unwrap();
    let quota_at = t0 + Duration::from_secs(quota_written as u64);

    join(&mut s, "n2");
    let (passes, _) = settle_with(&mut s, &mut seen, at, Duration::from_secs(1));
    let joined = &passes[0];
    assert!(has(joined, N2_JOINS), "{:?}", writes(joined));
    assert!(!has(joined, QUOTA), "{:?}", writes(joined));
    assert!(joined.held.writes >= 1);
    assert_eq!(joined.held.until, Some(quota_at + HOLD_AT_MOST));
    // Held while n2 joins, then written once, by the next pass (in which no node joins).
    let quota_passes: Vec<usize> = (0..passes.len()).filter(|&i| has(&passes[i], QUOTA)).collect();
    assert_eq!(quota_passes, [1], "{:?}", passes.iter().map(writes).collect::<Vec<_>>());
    assert!(!has(&passes[1], N2_JOINS));
    // Nothing lost: a pass with no memory of writes finds nothing left to write.
    let d = desired_of(&s, &Settings::default(), &now());
    assert_eq!(writes(&diff(&d, &s)), Vec::<String>::new());
    let widened = s.quotas.iter().find(|q| q.name_any() == "gpu-tenancy").unwrap();
    assert_eq!(
        widened.spec.as_ref().unwrap().hard.as_ref().unwrap()["requests.nvidia.com/mig-3g.40gb"].0,
        "8"
    );
}

#[test]
fn held_bookkeeping_goes_once_its_time_is_up_even_while_nodes_join() {
    let held_after_n2_joins = || {
        let (mut s, mut seen, at) = settled(fleet_of_one());
        join(&mut s, "n2");
        let until = pass_at(&s, &mut seen, at).held.until.expect("the quota held");
        (s, seen, until)
    };
    // The same pass again at that time (nothing written meanwhile): the quota goes with the node.
    let (s, mut seen, until) = held_after_n2_joins();
    let d = pass_at(&s, &mut seen, until);
    assert!(has(&d, N2_JOINS));
    assert!(has(&d, QUOTA), "{:?}", writes(&d));
    assert_eq!(d.held, Held::default());
    // Just before it, it would still have waited.
    let (s, mut seen, until) = held_after_n2_joins();
    let d = pass_at(&s, &mut seen, until - Duration::from_millis(1));
    assert!(has(&d, N2_JOINS));
    assert!(!has(&d, QUOTA));
}

#[test]
fn a_narrowing_quota_and_a_status_with_news_go_at_once_while_a_node_joins() {
    let (mut s, mut seen, at) = settled(fleet_of_one());
    // acme now asks for 2: its quota falls from 4 to 2 while n2 joins.
    join(&mut s, "n2");
    let t = Arc::make_mut(&mut s.tenants[0]);
    t.spec.resources[0].count = 2;
    t.metadata.generation = Some(2);
    let d = pass_at(&s, &mut seen, at);
    assert!(has(&d, N2_JOINS));
    let w = writes(&d);
    assert!(w.contains(&QUOTA.to_string()), "{w:?}");
    assert!(w.contains(&STATUS.to_string()), "a new generation observed: {w:?}");
    assert_eq!(d.held, Held::default());
}

#[test]
fn a_status_whose_counts_alone_change_waits_with_the_quota() {
    let (mut s, mut seen, at) = settled(fleet_of_one());
    join(&mut s, "n2");
    let d = pass_at(&s, &mut seen, at);
    // 4 of 12 granted before, 8 of 12 now: the same verdicts, other counts.
    let want = desired_of(&s, &Settings::default(), &now());
    let status = |t: &GpuTenant| t.status.clone().unwrap();
    assert_ne!(status(&want.tenants[0]).summary, status(&s.tenants[0]).summary);
    assert!(has(&d, N2_JOINS));
    assert!(!has(&d, STATUS), "{:?}", writes(&d));
    assert_eq!(d.held.writes, 2, "the quota and the status");
}

#[test]
fn a_tenant_change_on_nodes_that_have_joined_holds_nothing_back() {
    let mut s = snapshot();
    s.tenants = vec![Arc::new(
        TenantBuilder::new("acme", "external").mig("3g.40gb", 2).build(),
    )];
    let (mut s, mut seen, at) = settled(s);
    // One more instance on n1, a second after its quota was written: the quota widens, the node's
    // spec is written again, and no node joins.
    let t = Arc::make_mut(&mut s.tenants[0]);
    t.spec.resources[0].count = 3;
    let d = pass_at(&s, &mut seen, at);
    assert!(has(&d, "apply GpuNode n1"), "{:?}", writes(&d));
    assert!(has(&d, QUOTA), "{:?}", writes(&d));
    assert_eq!(d.held, Held::default());
}

/// The requests of a pass in which n2 joins while acme's quota and status only widen: n2's
/// Node patch and first GpuNode spec, the plan's status, and no request for the quota or the
/// tenant's status; the next pass (no node joins) makes those two, and the plan's status once
/// n2's agent has applied its spec.
#[tokio::test]
async fn the_writer_sends_nothing_for_what_is_held_back() {
    use crate::controller::writer::tests::requests;
    let (mut s, mut seen, at) = settled(fleet_of_one());
    join(&mut s, "n2");
    let joined = pass_at(&s, &mut seen, at);
    assert_eq!(joined.held.writes, 2, "the quota and the status");
    let (sent, outcome) = requests(&joined.writes, &[]).await;
    assert!(outcome.failed.is_empty(), "{:?}", outcome.failed);
    let ssa = "?&force=true&fieldManager=gpu-tenancy-controller&fieldValidation=Ignore";
    let lines: Vec<&str> = sent.iter().map(|r| r.line.as_str()).collect();
    assert_eq!(
        lines,
        [
            "PATCH /api/v1/nodes/n2?".to_string(),
            format!("PATCH /apis/gputenancy.io/v1alpha1/gpunodes/n2{ssa}"),
            format!("PATCH /apis/gputenancy.io/v1alpha1/gpupartitionplans/mig/status{ssa}"),
        ]
    );
    apply(&mut s, &joined);
    agent_applies(&mut s);
    let next = pass_at(&s, &mut seen, at + Duration::from_secs(1));
    let (sent, _) = requests(&next.writes, &[]).await;
    let lines: Vec<&str> = sent.iter().map(|r| r.line.as_str()).collect();
    assert_eq!(
        lines,
        [
            format!("PATCH /apis/gputenancy.io/v1alpha1/gputenants/acme/status{ssa}"),
            format!("PATCH /apis/gputenancy.io/v1alpha1/gpupartitionplans/mig/status{ssa}"),
            format!("PATCH /api/v1/namespaces/acme/resourcequotas/gpu-tenancy{ssa}"),
        ]
    );
}
