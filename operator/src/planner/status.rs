//! Statuses the controller publishes, computed from the planner's results.

use super::allocate::TenantGrants;
use super::nodes::{Fleet, NodeState};
use crate::api::{
    Condition, ConditionSet, GpuPartitionPlan, GpuTenant, PlanNodeCounts, PlanNodeDetail, SharingPolicy, set_condition,
};
use crate::policy::{PlanCheck, TenantCheck};
use crate::problem::Problem;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use std::collections::BTreeMap;

/// Sets conditions of one object, all stamped with its generation and the same time.
struct Conditions<'a> {
    list: &'a mut Vec<Condition>,
    generation: Option<i64>,
    now: &'a Time,
}

impl Conditions<'_> {
    fn set(&mut self, type_: &str, status: bool, reason: &str, message: impl Into<String>) {
        set_condition(self.list, type_, status, reason, message, self.generation, self.now);
    }

    /// `Valid` and `Stalled` from the object's own problems: problems need a person, so they stall it.
    fn validity(&mut self, problems: &[&Problem], valid: &str, stalled: &str) -> bool {
        if problems.is_empty() {
            self.set(ConditionSet::VALID, true, "Valid", valid);
            self.set(ConditionSet::STALLED, false, "Valid", "");
            return true;
        }
        let fields = joined(problems.iter().map(|p| p.field.as_str()));
        let messages = joined(problems.iter().map(|p| p.message.as_str()));
        self.set(ConditionSet::VALID, false, "Invalid", format!("{fields}: {messages}"));
        self.set(ConditionSet::STALLED, true, "Invalid", stalled);
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

pub fn tenant_statuses(
    tenants: &[GpuTenant],
    check: &TenantCheck,
    grants: &BTreeMap<String, TenantGrants>,
    now: &Time,
) -> Vec<GpuTenant> {
    let mut out: Vec<GpuTenant> = tenants.to_vec();
    out.sort_by_key(|t| t.name_any());
    for t in &mut out {
        let name = t.name_any();
        let mut status = t.status.take().unwrap_or_default();
        status.observed_generation = t.metadata.generation;
        let mut c = Conditions {
            list: &mut status.conditions,
            generation: t.metadata.generation,
            now,
        };
        c.set(ConditionSet::RECONCILING, false, "Planned", "grants are computed");
        let problems: Vec<&Problem> = check.invalid.get(&name).map(|p| p.iter().collect()).unwrap_or_default();
        let valid = c.validity(
            &problems,
            "the tier allows every request",
            "fix the spec; nothing is granted until it is valid",
        );
        match grants.get(&name) {
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
                status.grants.clear();
                status.allocation.clear();
                status.granted_memory_mib = None;
            }
        }
        t.status = Some(status);
    }
    out
}

/// Per plan: nodes selected, pending (planned, not yet applied by their agents) and failed
/// (the plan cannot apply there, or plans conflict), with details of the failures.
fn node_counts(fleet: &Fleet) -> BTreeMap<String, (PlanNodeCounts, Vec<PlanNodeDetail>)> {
    let mut counts: BTreeMap<String, (PlanNodeCounts, Vec<PlanNodeDetail>)> = BTreeMap::new();
    for node in &fleet.nodes {
        let entries: Vec<(String, &str, String)> = match (&node.state, &node.plan) {
            (NodeState::Planned, Some(p)) => vec![(p.clone(), "Pending", String::new())],
            (NodeState::Waiting, Some(p)) => vec![(
                p.clone(),
                "Waiting",
                "the node's agent has not reported its GPUs yet".to_string(),
            )],
            (NodeState::Failed(m), Some(p)) => vec![(p.clone(), "Failed", m.clone())],
            (NodeState::Conflict { plans, message }, _) => {
                plans.iter().map(|p| (p.clone(), "Conflict", message.clone())).collect()
            }
            _ => vec![],
        };
        for (plan, state, message) in entries {
            let (c, details) = counts.entry(plan).or_default();
            c.selected += 1;
            if state == "Pending" {
                c.pending += 1;
            } else {
                c.failed += 1;
                details.push(PlanNodeDetail {
                    node: node.inventory.name.clone(),
                    state: state.into(),
                    message,
                });
            }
        }
    }
    counts
}

pub fn plan_statuses(
    plans: &[&GpuPartitionPlan],
    checks: &[PlanCheck],
    fleet: &Fleet,
    now: &Time,
) -> Vec<GpuPartitionPlan> {
    let mut counts = node_counts(fleet);
    plans
        .iter()
        .zip(checks)
        .map(|(plan, check)| {
            let mut plan = (*plan).clone();
            let (nodes, node_details) = counts.remove(&plan.name_any()).unwrap_or_default();
            let mut status = plan.status.take().unwrap_or_default();
            status.observed_generation = plan.metadata.generation;
            let mut c = Conditions {
                list: &mut status.conditions,
                generation: plan.metadata.generation,
                now,
            };
            let problems: Vec<&Problem> = check.problems.iter().collect();
            let valid = c.validity(
                &problems,
                "the plan fits every GPU model it names",
                "fix the spec; no node is changed until it is valid",
            );
            let (ready, reason, message) = if !valid {
                (false, "Invalid", "the plan is not valid".to_string())
            } else if nodes.failed > 0 {
                (
                    false,
                    "NodesFailed",
                    format!(
                        "{} of {} nodes cannot take the plan; see status.nodeDetails",
                        nodes.failed, nodes.selected
                    ),
                )
            } else if nodes.pending > 0 {
                (
                    false,
                    "Pending",
                    format!("{} of {} nodes still to apply the plan", nodes.pending, nodes.selected),
                )
            } else {
                (true, "Applied", format!("{} nodes applied", nodes.applied))
            };
            c.set(ConditionSet::READY, ready, reason, message);
            status.nodes = Some(nodes);
            status.node_details = node_details;
            plan.status = Some(status);
            plan
        })
        .collect()
}

/// Policy statuses: the tier names for `kubectl get`, how many tenants refer to each policy, and
/// whether it has problems of its own.
pub fn policy_statuses(
    policies: &[SharingPolicy],
    tenants: &[GpuTenant],
    problems: &[Problem],
    now: &Time,
) -> Vec<SharingPolicy> {
    let mut out: Vec<SharingPolicy> = policies.to_vec();
    out.sort_by_key(|p| p.name_any());
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
        status.tenants = Some(tenants.iter().filter(|t| t.spec.policy_ref == name).count() as u32);
        let own: Vec<&Problem> = problems
            .iter()
            .filter(|x| x.object == format!("SharingPolicy/{name}"))
            .collect();
        let mut c = Conditions {
            list: &mut status.conditions,
            generation: p.metadata.generation,
            now,
        };
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
