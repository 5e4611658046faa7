//! Statuses the controller publishes, computed from the planner's results.

use super::allocate::{GrantsByTenant, TenantGrants};
use super::nodes::{Fleet, NodeState};
use super::rollout::{PlanRollout, Progress, Rollout};
use crate::api::{
    Condition, ConditionSet, GpuPartitionPlan, GpuTenant, GpuTenantStatus, Grants, PlanNodeCounts, PlanNodeDetail,
    SharingPolicy, set_condition,
};
use crate::policy::{PlanCheck, TenantCheck};
use crate::problem::Problem;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Sets conditions of one object, all stamped with its generation and the same time.
struct Conditions<'a> {
    list: &'a mut Vec<Condition>,
    generation: Option<i64>,
    now: &'a Time,
}

impl<'a> Conditions<'a> {
    fn new(list: &'a mut Vec<Condition>, generation: Option<i64>, now: &'a Time) -> Self {
        Conditions { list, generation, now }
    }
}

impl Conditions<'_> {
    fn set(&mut self, type_: &str, status: bool, reason: &str, message: impl Into<String> + AsRef<str>) {
        set_condition(self.list, type_, status, reason, message, self.generation, self.now);
    }

    /// `Valid` and `Stalled` from the object's own problems: problems need a person, so they stall it.
    fn validity(&mut self, problems: &[&Problem], valid: &str, stalled: &str) -> bool {
        if self.valid(problems, valid) {
            self.set(ConditionSet::STALLED, false, "Valid", "");
            return true;
        }
        self.set(ConditionSet::STALLED, true, "Invalid", stalled);
        false
    }

    /// `Valid` alone, for objects that can stall for other reasons too.
    fn valid(&mut self, problems: &[&Problem], valid: &str) -> bool {
        if problems.is_empty() {
            self.set(ConditionSet::VALID, true, "Valid", valid);
            return true;
        }
        let fields = joined(problems.iter().map(|p| p.field.as_str()));
        let messages = joined(problems.iter().map(|p| p.message.as_str()));
        self.set(ConditionSet::VALID, false, "Invalid", format!("{fields}: {messages}"));
        false
    }
}

/// Joins problem messages into one condition message.
fn joined<'a>(messages: impl Iterator<Item = &'a str>) -> String {
    let all: Vec<&str> = messages.collect();
    let shown = all.iter().take(3).copied().collect::<Vec<_>>().join("; ");
    if all.len() > 3 {
        format!("{shown}; and {} more", all.len() - 3)
    } else {
        shown
    }
}

/// A copy of `t` whose status lacks its grants and allocation, which every pass computes anew
/// (a cluster's tenants hold hundreds of thousands of grants: no copy only to be replaced).
fn without_grants(t: &GpuTenant) -> GpuTenant {
    let status = t.status.as_ref().map(|s| {
        let GpuTenantStatus {
            observed_generation,
            summary,
            grants: _,
            allocation: _,
            granted_memory_mib,
            namespaces,
            conditions,
            admission: _,
            queue,
        } = s;
        GpuTenantStatus {
            observed_generation: *observed_generation,
            summary: summary.clone(),
            grants: Grants::default(),
            allocation: Vec::new(),
            granted_memory_mib: *granted_memory_mib,
            namespaces: namespaces.clone(),
            conditions: conditions.clone(),
            // Rendered anew with the admission policies (`desired::admission`).
            admission: None,
            // Named anew with the queues (`desired::kueue`); kept meanwhile, so it is not written
            // away and back.
            queue: queue.clone(),
        }
    });
    GpuTenant {
        metadata: t.metadata.clone(),
        spec: t.spec.clone(),
        status,
    }
}

/// Each tenant's finished status from the last pass, with what the planner computed it from. A
/// tenant read as the very object of the last pass (the watch hands an unchanged object back,
/// shared), with the same problems and grants, gets it back, shared, instead of a copy of its
/// metadata, spec, namespaces and conditions made on every pass (at 5,000 nodes and 1,666
/// tenants, 7% of a tenant's change).
///
/// Finished: the steps after the planner (the admission policies, the `Isolated` condition) write
/// into the statuses, so they hand them back when done ([`StatusMemo::keep`]), and write into a
/// status taken back only where their result differs; where nothing hands them back (the planner
/// alone), the planner's own are kept. A status is kept only while its conditions are the
/// tenant's as read: a condition that turned was stamped with that pass's time, where a pass from
/// nothing would stamp this pass's.
#[derive(Default)]
pub struct StatusMemo {
    by_tenant: foldhash::HashMap<String, KeptStatus>,
    /// Whether the statuses are handed back finished ([`StatusMemo::keep`]) after each pass.
    pub(super) handed_back: bool,
}

struct KeptStatus {
    /// The tenant as read: compared by address (the memo holds it, so the address stays its own).
    read: Arc<GpuTenant>,
    problems: Vec<Problem>,
    /// `None`: the tenant was not valid (so got nothing).
    grants: Option<Arc<TenantGrants>>,
    /// The finished status, if every condition in it is as read.
    finished: Option<Arc<GpuTenant>>,
}

impl KeptStatus {
    /// `status` if its conditions are `read`'s.
    fn timeless(read: &GpuTenant, status: &Arc<GpuTenant>) -> Option<Arc<GpuTenant>> {
        let same = status.status.as_ref().map(|s| &s.conditions) == read.status.as_ref().map(|s| &s.conditions);
        same.then(|| status.clone())
    }
}

impl StatusMemo {
    /// Keeps the pass's `tenants` as the steps after the planner finished them: what the next
    /// pass takes back.
    pub fn keep(&mut self, tenants: &[Arc<GpuTenant>]) {
        for t in tenants {
            let Some(k) = t.metadata.name.as_deref().and_then(|n| self.by_tenant.get_mut(n)) else {
                continue;
            };
            if !k.finished.as_ref().is_some_and(|f| Arc::ptr_eq(f, t)) {
                k.finished = KeptStatus::timeless(&k.read, t);
            }
        }
    }
}

pub fn tenant_statuses(
    tenants: &[Arc<GpuTenant>],
    check: &TenantCheck,
    mut grants: GrantsByTenant,
    now: &Time,
    mut memo: Option<&mut StatusMemo>,
) -> Vec<Arc<GpuTenant>> {
    let mut sorted: Vec<&Arc<GpuTenant>> = tenants.iter().collect();
    sorted.sort_by(|a, b| crate::api::name_of(a.as_ref()).cmp(crate::api::name_of(b.as_ref())));
    // Statuses the steps after will hand back are not kept before: they would copy them to write.
    let planner_keeps = memo.as_deref().is_some_and(|m| !m.handed_back);
    let mut last = memo
        .as_deref_mut()
        .map(|m| std::mem::take(&mut m.by_tenant))
        .unwrap_or_default();
    sorted
        .into_iter()
        .map(|read| {
            let name = crate::api::name_of(read.as_ref());
            let problems: &[Problem] = check.invalid.get(name).map_or(&[], Vec::as_slice);
            let g = grants.remove(name).filter(|_| problems.is_empty());
            let Some(memo) = memo.as_deref_mut() else {
                return Arc::new(tenant_status(read, problems, g.as_deref(), now));
            };
            match last.remove_entry(name) {
                Some((key, k))
                    if Arc::ptr_eq(&k.read, read)
                        && k.problems == problems
                        && k.grants == g
                        && k.finished.is_some() =>
                {
                    let status = k.finished.clone().expect("checked above");
                    memo.by_tenant.insert(key, k);
                    status
                }
                _ => {
                    let status = Arc::new(tenant_status(read, problems, g.as_deref(), now));
                    let k = KeptStatus {
                        read: read.clone(),
                        problems: problems.to_vec(),
                        grants: g,
                        finished: planner_keeps.then(|| KeptStatus::timeless(read, &status)).flatten(),
                    };
                    memo.by_tenant.insert(name.to_string(), k);
                    status
                }
            }
        })
        .collect()
}

/// Tenant `t`'s status from its `problems` and (valid) its `grants`.
fn tenant_status(t: &GpuTenant, problems: &[Problem], grants: Option<&TenantGrants>, now: &Time) -> GpuTenant {
    let mut t = without_grants(t);
    let mut status = t.status.take().unwrap_or_default();
    status.observed_generation = t.metadata.generation;
    let mut c = Conditions::new(&mut status.conditions, t.metadata.generation, now);
    c.set(ConditionSet::RECONCILING, false, "Planned", "grants are computed");
    let problems: Vec<&Problem> = problems.iter().collect();
    let valid = c.validity(
        &problems,
        "the tier allows every request",
        "fix the spec; nothing is granted until it is valid",
    );
    match grants {
        Some(g) if valid => {
            let requested: u32 = g.allocation.iter().map(|a| a.requested).sum();
            let granted: u32 = g.allocation.iter().map(|a| a.granted).sum();
            if g.shortfalls.is_empty() {
                c.set(
                    ConditionSet::CAPACITY_SHORT,
                    false,
                    "Granted",
                    "every request is granted",
                );
                c.set(
                    ConditionSet::READY,
                    true,
                    "Granted",
                    format!("{granted} of {requested} units granted"),
                );
            } else {
                let msg = g.shortfalls.join("; ");
                c.set(ConditionSet::CAPACITY_SHORT, true, "CapacityShort", msg.clone());
                c.set(ConditionSet::READY, false, "CapacityShort", msg);
            }
            status.summary = Some(format!("{granted}/{requested}"));
            status.grants = g.grants.clone();
            status.allocation = g.allocation.clone();
            status.granted_memory_mib = Some(g.memory_mib);
        }
        _ => {
            c.set(
                ConditionSet::READY,
                false,
                "Invalid",
                "the spec is not valid; see the Valid condition",
            );
            let requested: u32 = t.spec.resources.iter().map(|r| r.count).sum();
            status.summary = Some(format!("0/{requested}"));
            status.grants = Grants::default();
            status.allocation.clear();
            status.granted_memory_mib = None;
        }
    }
    t.status = Some(status);
    t
}

/// Where a node stands for a plan's status.
enum Standing {
    Applied,
    /// Its spec is the plan's; the agent has not reported it applied yet.
    Updated,
    /// Its spec is the plan's; the agent gave up on it.
    AgentFailed(String),
    HeldBack,
    Waiting,
    /// The plan cannot apply there (`Failed`) or conflicts with another (`Conflict`).
    Failed(&'static str, String),
}

/// Per plan: nodes selected, updated, applied, pending (updated and not yet applied, or held back
/// by the rollout), waiting for their agent, failed; with details of the nodes held back, waiting
/// or failed. `selected` = `applied` + `pending` + `waiting` + `failed`.
fn node_counts<'f>(fleet: &'f Fleet, rollout: &Rollout) -> BTreeMap<&'f str, (PlanNodeCounts, Vec<PlanNodeDetail>)> {
    // Borrowed plan names and no list per node: this runs for every node on every pass.
    let mut counts: BTreeMap<&str, (PlanNodeCounts, Vec<PlanNodeDetail>)> = BTreeMap::new();
    for (i, node) in fleet.nodes.iter().enumerate() {
        let name = &node.inventory.name;
        let mut count = |plan: &'f str, standing: Standing| {
            let (c, details) = counts.entry(plan).or_default();
            c.selected += 1;
            let (state, message) = match standing {
                Standing::Applied => {
                    c.updated += 1;
                    c.applied += 1;
                    return;
                }
                Standing::Updated => {
                    c.updated += 1;
                    c.pending += 1;
                    return;
                }
                Standing::AgentFailed(m) => {
                    c.updated += 1;
                    c.failed += 1;
                    ("Failed", format!("the node's agent could not apply the plan: {m}"))
                }
                Standing::HeldBack => {
                    c.pending += 1;
                    let max = rollout.plans.get(plan).map_or(1, |b| b.max_unavailable);
                    (
                        "HeldBack",
                        format!("waiting for the rollout: {max} nodes change at once (maxUnavailable)"),
                    )
                }
                Standing::Waiting => {
                    c.waiting += 1;
                    ("Waiting", "the node's agent has not reported its GPUs yet".to_string())
                }
                Standing::Failed(state, m) => {
                    c.failed += 1;
                    (state, m)
                }
            };
            details.push(PlanNodeDetail {
                node: name.clone(),
                state: state.into(),
                message,
            });
        };
        match (&node.state, &node.plan) {
            (NodeState::Planned, Some(p)) => {
                let standing = match rollout.node_rollout_at(i, name).map(|r| &r.progress) {
                    Some(Progress::Applied) => Standing::Applied,
                    Some(Progress::HeldBack) => Standing::HeldBack,
                    Some(Progress::Failed(m)) => Standing::AgentFailed(m.clone()),
                    Some(Progress::Pending) | None => Standing::Updated,
                };
                count(p, standing);
            }
            (NodeState::Waiting, Some(p)) => count(p, Standing::Waiting),
            (NodeState::Failed(m), Some(p)) => count(p, Standing::Failed("Failed", m.clone())),
            (NodeState::Conflict { plans, message }, _) => {
                for p in plans {
                    count(p, Standing::Failed("Conflict", message.clone()));
                }
            }
            _ => {}
        }
    }
    counts
}

/// Plan statuses (kstatus, docs/nvidia.md#kubernetes-conventions): `Reconciling=True` while nodes are still to apply the plan
/// or wait for their agents, `Stalled=True` only when a person must act (the plan is invalid, or a
/// node cannot take it), `Ready=True` when every selected node has the plan's spec applied.
pub fn plan_statuses(
    plans: &[&GpuPartitionPlan],
    checks: &[PlanCheck],
    fleet: &Fleet,
    rollout: &Rollout,
    now: &Time,
) -> Vec<GpuPartitionPlan> {
    let mut counts = node_counts(fleet, rollout);
    plans
        .iter()
        .zip(checks)
        .map(|(plan, check)| {
            let mut plan = (*plan).clone();
            let name = plan.name_any();
            let (nodes, node_details) = counts.remove(name.as_str()).unwrap_or_default();
            let mut status = plan.status.take().unwrap_or_default();
            status.observed_generation = plan.metadata.generation;
            let mut c = Conditions::new(&mut status.conditions, plan.metadata.generation, now);
            let problems: Vec<&Problem> = check.problems.iter().collect();
            let valid = c.valid(&problems, "the plan fits every GPU model it names");
            let messages = PlanMessages::of(&nodes);
            c.plan_stalled(valid, &nodes, &messages);
            let held = node_details.iter().filter(|d| d.state == "HeldBack").count();
            c.plan_reconciling(valid, &nodes, &messages, held, rollout.plans.get(&name));
            c.plan_ready(valid, &nodes, messages);
            status.nodes = Some(nodes);
            status.node_details = node_details;
            plan.status = Some(status);
            plan
        })
        .collect()
}

/// The messages a plan's conditions share, from its node counts.
struct PlanMessages {
    failed: String,
    pending: String,
    waiting: String,
}

impl PlanMessages {
    fn of(n: &PlanNodeCounts) -> PlanMessages {
        PlanMessages {
            failed: format!(
                "{} of {} nodes cannot take the plan; see status.nodeDetails",
                n.failed, n.selected
            ),
            pending: format!("{} of {} nodes still to apply the plan", n.pending, n.selected),
            waiting: format!(
                "{} of {} nodes wait for their agent to report GPUs",
                n.waiting, n.selected
            ),
        }
    }
}

impl Conditions<'_> {
    /// `Stalled` only when a person must act: the plan is invalid, or a node cannot take it.
    fn plan_stalled(&mut self, valid: bool, n: &PlanNodeCounts, m: &PlanMessages) {
        if !valid {
            self.set(
                ConditionSet::STALLED,
                true,
                "Invalid",
                "fix the spec; no node is changed until it is valid",
            );
        } else if n.failed > 0 {
            self.set(ConditionSet::STALLED, true, "NodesFailed", m.failed.clone());
        } else {
            self.set(ConditionSet::STALLED, false, "Valid", "");
        }
    }

    /// `Reconciling` while nodes are still to apply the plan (`held` of them waiting for the
    /// rollout) or wait for their agents.
    fn plan_reconciling(
        &mut self,
        valid: bool,
        n: &PlanNodeCounts,
        m: &PlanMessages,
        held: usize,
        rollout: Option<&PlanRollout>,
    ) {
        if valid && n.pending > 0 {
            let message = match rollout {
                Some(r) if held > 0 => format!(
                    "{}: {} changing at once (maxUnavailable {}), {held} waiting for the rollout",
                    m.pending,
                    r.changing.len(),
                    r.max_unavailable
                ),
                _ => m.pending.clone(),
            };
            self.set(ConditionSet::RECONCILING, true, "RollingOut", message);
        } else if valid && n.waiting > 0 {
            self.set(ConditionSet::RECONCILING, true, "WaitingForAgents", m.waiting.clone());
        } else {
            let reason = if valid { "Settled" } else { "Invalid" };
            self.set(ConditionSet::RECONCILING, false, reason, "");
        }
    }

    /// `Ready` when every selected node has the plan's spec applied.
    fn plan_ready(&mut self, valid: bool, n: &PlanNodeCounts, m: PlanMessages) {
        let (ready, reason, message) = if !valid {
            (
                false,
                "Invalid",
                "the plan is not valid; see the Valid condition".to_string(),
            )
        } else if n.failed > 0 {
            (false, "NodesFailed", m.failed)
        } else if n.pending > 0 {
            (false, "Pending", m.pending)
        } else if n.waiting > 0 {
            (false, "WaitingForAgents", m.waiting)
        } else if n.selected == 0 {
            (true, "Applied", "the plan selects no node".to_string())
        } else {
            (
                true,
                "Applied",
                format!("{} of {} nodes applied", n.applied, n.selected),
            )
        };
        self.set(ConditionSet::READY, ready, reason, message);
    }
}

/// Policy statuses: the tier names for `kubectl get`, how many tenants refer to each policy, and
/// whether it has problems of its own.
pub fn policy_statuses<T: Borrow<GpuTenant>>(
    policies: &[SharingPolicy],
    tenants: &[T],
    problems: &[Problem],
    now: &Time,
) -> Vec<SharingPolicy> {
    let mut out: Vec<SharingPolicy> = policies.to_vec();
    crate::api::sort_by_name(&mut out);
    for p in &mut out {
        let name = p.name_any();
        let mut status = p.status.take().unwrap_or_default();
        status.observed_generation = p.metadata.generation;
        status.tiers = Some(
            p.spec
                .tiers
                .iter()
                .map(|t| t.name.as_str())
                .collect::<Vec<_>>()
                .join(","),
        );
        status.tenants = Some(
            tenants
                .iter()
                .map(Borrow::borrow)
                .filter(|t: &&GpuTenant| t.spec.policy_ref == name)
                .count() as u32,
        );
        let own: Vec<&Problem> = problems
            .iter()
            .filter(|x| x.object == format!("SharingPolicy/{name}"))
            .collect();
        let mut c = Conditions::new(&mut status.conditions, p.metadata.generation, now);
        c.set(ConditionSet::RECONCILING, false, "Planned", "");
        if c.validity(&own, "", "fix the spec") {
            c.set(ConditionSet::READY, true, "Valid", "the policy is in force");
        } else {
            c.set(ConditionSet::READY, false, "Invalid", "the policy is not valid");
        }
        p.status = Some(status);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{AllocationSummary, Mode};
    use crate::planner::fixtures::{TenantBuilder, now};

    fn grants(granted: u32) -> GrantsByTenant {
        let allocation = vec![AllocationSummary {
            mode: Mode::Mps,
            profile: None,
            requested: 2,
            granted,
        }];
        GrantsByTenant::from_iter([(
            "a".to_string(),
            Arc::new(TenantGrants {
                allocation,
                ..Default::default()
            }),
        )])
    }

    fn problems(message: &str) -> TenantCheck {
        let problem = Problem::new("GpuTenant", "a", "spec.namespaces[0]", message);
        TenantCheck {
            valid: vec![],
            invalid: BTreeMap::from([("a".to_string(), vec![problem])]),
        }
    }

    /// A status is taken back (the same object) only for the very tenant object read before, with
    /// the same problems and the same grants; otherwise it is computed again.
    #[test]
    fn a_status_is_taken_back_only_for_the_same_tenant_problems_and_grants() {
        let mut memo = StatusMemo::default();
        let valid = TenantCheck::default();
        let read = Arc::new(TenantBuilder::new("a", "trusted").want(Mode::Mps, 2).build());
        let first = tenant_statuses(&[read], &valid, grants(1), &now(), Some(&mut memo));
        // Its status written: read back as a new object, whose conditions the next pass keeps.
        let read = first[0].clone();
        let pass = |memo: &mut StatusMemo, read: &Arc<GpuTenant>, check: &TenantCheck, granted: u32| {
            tenant_statuses(std::slice::from_ref(read), check, grants(granted), &now(), Some(memo)).remove(0)
        };
        let kept = pass(&mut memo, &read, &valid, 1);
        assert!(
            Arc::ptr_eq(&pass(&mut memo, &read, &valid, 1), &kept),
            "the same inputs"
        );
        assert!(!Arc::ptr_eq(&pass(&mut memo, &read, &valid, 2), &kept), "other grants");
        let kept = pass(&mut memo, &read, &valid, 1);
        let copy = Arc::new((*read).clone());
        assert!(
            !Arc::ptr_eq(&pass(&mut memo, &copy, &valid, 1), &kept),
            "another object"
        );

        let invalid = pass(&mut memo, &read, &problems("claimed by b"), 1);
        let invalid = pass(&mut memo, &Arc::new((*invalid).clone()), &problems("claimed by b"), 1);
        let read = Arc::new((*invalid).clone());
        let kept = pass(&mut memo, &read, &problems("claimed by b"), 1);
        assert!(Arc::ptr_eq(
            &pass(&mut memo, &read, &problems("claimed by b"), 1),
            &kept
        ));
        let other = pass(&mut memo, &read, &problems("claimed by b and c"), 1);
        assert!(!Arc::ptr_eq(&other, &kept), "other problems");
        let message = |t: &GpuTenant| {
            let conditions = &t.status.as_ref().expect("a status").conditions;
            conditions
                .iter()
                .find(|c| c.type_ == ConditionSet::VALID)
                .map(|c| c.message.clone())
        };
        assert_eq!(
            message(&other).as_deref(),
            Some("spec.namespaces[0]: claimed by b and c")
        );
    }
}
