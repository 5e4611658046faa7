//! Statuses the controller publishes, computed from the planner's results.

use super::allocate::TenantGrants;
use super::nodes::{Fleet, NodeState};
use crate::api::{
    ConditionSet, GpuPartitionPlan, GpuPartitionPlanStatus, GpuTenant, PlanNodeCounts, PlanNodeDetail, SharingPolicy,
    set_condition,
};
use crate::policy::{PlanCheck, TenantCheck};
use crate::problem::Problem;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use std::collections::BTreeMap;

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
        let generation = t.metadata.generation;
        let mut status = t.status.take().unwrap_or_default();
        status.observed_generation = generation;
        let c = &mut status.conditions;
        set_condition(
            c,
            ConditionSet::RECONCILING,
            false,
            "Planned",
            "grants are computed",
            generation,
            now,
        );
        if let Some(problems) = check.invalid.get(&name) {
            let fields = joined(problems.iter().map(|p| p.field.as_str()));
            let msg = joined(problems.iter().map(|p| p.message.as_str()));
            set_condition(
                c,
                ConditionSet::VALID,
                false,
                "Invalid",
                format!("{fields}: {msg}"),
                generation,
                now,
            );
            set_condition(
                c,
                ConditionSet::STALLED,
                true,
                "Invalid",
                "fix the spec; nothing is granted until it is valid",
                generation,
                now,
            );
            set_condition(
                c,
                ConditionSet::READY,
                false,
                "Invalid",
                "the spec is not valid; see the Valid condition",
                generation,
                now,
            );
            status.grants.clear();
            status.allocation.clear();
            status.granted_memory_mib = None;
            let requested: u32 = t.spec.resources.iter().map(|r| r.count).sum();
            status.summary = Some(format!("0/{requested}"));
        } else if let Some(g) = grants.get(&name) {
            set_condition(
                c,
                ConditionSet::VALID,
                true,
                "Valid",
                "the tier allows every request",
                generation,
                now,
            );
            set_condition(c, ConditionSet::STALLED, false, "Valid", "", generation, now);
            let requested: u32 = g.allocation.iter().map(|a| a.requested).sum();
            let granted: u32 = g.allocation.iter().map(|a| a.granted).sum();
            status.summary = Some(format!("{granted}/{requested}"));
            if g.shortfalls.is_empty() {
                set_condition(
                    c,
                    ConditionSet::CAPACITY_SHORT,
                    false,
                    "Granted",
                    "every request is granted",
                    generation,
                    now,
                );
                set_condition(
                    c,
                    ConditionSet::READY,
                    true,
                    "Granted",
                    format!("{granted} of {requested} units granted"),
                    generation,
                    now,
                );
            } else {
                let msg = g.shortfalls.join("; ");
                set_condition(
                    c,
                    ConditionSet::CAPACITY_SHORT,
                    true,
                    "CapacityShort",
                    msg.clone(),
                    generation,
                    now,
                );
                set_condition(c, ConditionSet::READY, false, "CapacityShort", msg, generation, now);
            }
            status.grants = g.grants.clone();
            status.allocation = g.allocation.clone();
            status.granted_memory_mib = Some(g.memory_mib);
        }
        t.status = Some(status);
    }
    out
}

pub fn plan_statuses(
    plans: &[&GpuPartitionPlan],
    checks: &[PlanCheck],
    fleet: &Fleet,
    now: &Time,
) -> Vec<GpuPartitionPlan> {
    let mut counts: BTreeMap<String, (PlanNodeCounts, Vec<PlanNodeDetail>)> = BTreeMap::new();
    for node in &fleet.nodes {
        let entries: Vec<(String, &str, String)> = match (&node.state, &node.plan) {
            (NodeState::Planned, Some(p)) => vec![(p.clone(), "Pending", String::new())],
            (NodeState::Failed(m), Some(p)) => vec![(p.clone(), "Failed", m.clone())],
            (NodeState::Conflict(m), _) => plans
                .iter()
                .map(|p| p.name_any())
                .filter(|n| m.contains(&format!("GpuPartitionPlan/{n}")) || m.contains(n.as_str()))
                .map(|n| (n, "Conflict", m.clone()))
                .collect(),
            _ => vec![],
        };
        for (plan, state, message) in entries {
            let (c, details) = counts.entry(plan).or_default();
            c.selected += 1;
            match state {
                "Pending" => c.pending += 1,
                _ => {
                    c.failed += 1;
                    details.push(PlanNodeDetail {
                        node: node.inventory.name.clone(),
                        state: state.into(),
                        message,
                    });
                }
            }
        }
    }
    plans
        .iter()
        .zip(checks)
        .map(|(plan, check)| {
            let mut plan = (*plan).clone();
            let generation = plan.metadata.generation;
            let (nodes, node_details) = counts.remove(&plan.name_any()).unwrap_or_default();
            let mut status = plan.status.take().unwrap_or_default();
            status.observed_generation = generation;
            let c = &mut status.conditions;
            if check.is_valid() {
                set_condition(
                    c,
                    ConditionSet::VALID,
                    true,
                    "Valid",
                    "the plan fits every GPU model it names",
                    generation,
                    now,
                );
                set_condition(c, ConditionSet::STALLED, false, "Valid", "", generation, now);
            } else {
                let msg = joined(check.problems.iter().map(|p| p.message.as_str()));
                let field = check.problems[0].field.clone();
                set_condition(
                    c,
                    ConditionSet::VALID,
                    false,
                    "Invalid",
                    format!("{field}: {msg}"),
                    generation,
                    now,
                );
                set_condition(
                    c,
                    ConditionSet::STALLED,
                    true,
                    "Invalid",
                    "fix the spec; no node is changed until it is valid",
                    generation,
                    now,
                );
            }
            let ready = check.is_valid() && nodes.failed == 0 && nodes.pending == 0;
            let (reason, message) = if !check.is_valid() {
                ("Invalid", "the plan is not valid".to_string())
            } else if nodes.failed > 0 {
                (
                    "NodesFailed",
                    format!(
                        "{} of {} nodes cannot take the plan; see status.nodeDetails",
                        nodes.failed, nodes.selected
                    ),
                )
            } else if nodes.pending > 0 {
                (
                    "Pending",
                    format!("{} of {} nodes still to apply the plan", nodes.pending, nodes.selected),
                )
            } else {
                ("Applied", format!("{} nodes applied", nodes.applied))
            };
            set_condition(c, ConditionSet::READY, ready, reason, message, generation, now);
            status.nodes = Some(nodes);
            status.node_details = node_details;
            plan.status = Some(GpuPartitionPlanStatus { ..status });
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
        let generation = p.metadata.generation;
        let mut status = p.status.take().unwrap_or_default();
        status.observed_generation = generation;
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
        let c = &mut status.conditions;
        set_condition(c, ConditionSet::RECONCILING, false, "Planned", "", generation, now);
        if own.is_empty() {
            set_condition(c, ConditionSet::VALID, true, "Valid", "", generation, now);
            set_condition(c, ConditionSet::STALLED, false, "Valid", "", generation, now);
            set_condition(
                c,
                ConditionSet::READY,
                true,
                "Valid",
                "the policy is in force",
                generation,
                now,
            );
        } else {
            let msg = joined(own.iter().map(|x| x.message.as_str()));
            let field = own[0].field.clone();
            set_condition(
                c,
                ConditionSet::VALID,
                false,
                "Invalid",
                format!("{field}: {msg}"),
                generation,
                now,
            );
            set_condition(
                c,
                ConditionSet::STALLED,
                true,
                "Invalid",
                "fix the spec",
                generation,
                now,
            );
            set_condition(
                c,
                ConditionSet::READY,
                false,
                "Invalid",
                "the policy is not valid",
                generation,
                now,
            );
        }
        p.status = Some(status);
    }
    out
}
