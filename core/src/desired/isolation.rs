//! Each tenant's `Isolated` condition: whether Kubernetes enforces which GPUs it gets, from where
//! its grants lie (DRA nodes, nodes dedicated to it, or nodes where only the quota counts).
//!
//! With a memo, a tenant whose grants are the very list of the last pass (the allocation memo
//! hands an unchanged tenant its last list, shared) on nodes whose roles are as then gets the
//! condition found then, rather than walking every tenant's grants and looking up each grant's
//! node on every pass.

use super::nodes::NodeRoles;
use crate::api::{ConditionSet, GpuTenant, Grants, condition_holds, set_condition};
use foldhash::{HashMap, HashSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use std::sync::Arc;

/// The node roles of the last pass, and per tenant the grants it was given then with the
/// condition they made.
#[derive(Debug, Default)]
pub struct IsolationMemo {
    dedicated: HashMap<String, String>,
    dra: HashSet<String>,
    by_tenant: foldhash::HashMap<String, (Grants, Isolation)>,
}

impl IsolationMemo {
    /// Whether `roles` are the last pass's; keeps them for the next where they are not.
    fn same_roles(&mut self, roles: &NodeRoles) -> bool {
        let same = self.dedicated.len() == roles.dedicated.len()
            && self.dra.len() == roles.dra.len()
            && roles
                .dedicated
                .iter()
                .all(|(node, t)| self.dedicated.get(*node).is_some_and(|kept| kept == t))
            && roles.dra.iter().all(|node| self.dra.contains(*node));
        if !same {
            self.dedicated = roles
                .dedicated
                .iter()
                .map(|(n, t)| (n.to_string(), t.to_string()))
                .collect();
            self.dra = roles.dra.iter().map(|n| n.to_string()).collect();
        }
        same
    }
}

/// What the `Isolated` condition says.
#[derive(Clone, Debug)]
struct Isolation {
    ok: bool,
    reason: &'static str,
    message: String,
}

/// Sets each tenant's `Isolated` condition: `True` when Kubernetes enforces every grant, each on a
/// DRA node (the scheduler allocates a claim only the tenant's own devices, and the agent's
/// Prepare refuses any other: reason `DraBound`) or on a node dedicated (and tainted) to it
/// (`DedicatedNodes` when all are); otherwise `False` with reason `CountsOnly`, naming the nodes
/// where the quota enforces how many units the tenant uses but the device plugin chooses which
/// GPU or instance a pod gets.
pub fn isolation_conditions(
    mut tenants: Vec<Arc<GpuTenant>>,
    roles: &NodeRoles,
    now: &Time,
    mut memo: Option<&mut IsolationMemo>,
) -> Vec<Arc<GpuTenant>> {
    let same_roles = memo.as_deref_mut().is_some_and(|m| m.same_roles(roles));
    if let Some(m) = memo.as_deref_mut() {
        if !same_roles {
            m.by_tenant.clear();
        }
        // Tenants gone, or without grants now, are forgotten.
        let live: foldhash::HashSet<&str> = tenants
            .iter()
            .filter(|t| t.status.as_ref().is_some_and(|s| !s.grants.is_empty()))
            .filter_map(|t| t.metadata.name.as_deref())
            .collect();
        m.by_tenant.retain(|name, _| live.contains(name.as_str()));
    }
    // A status is written only where the condition differs: one the planner's memo handed back
    // is shared with it.
    for t in &mut tenants {
        let name = t.name_any();
        let generation = t.metadata.generation;
        let Some(status) = t.status.as_ref() else { continue };
        if status.grants.is_empty() {
            if status.conditions.iter().any(|c| c.type_ == ConditionSet::ISOLATED)
                && let Some(status) = Arc::make_mut(t).status.as_mut()
            {
                status.conditions.retain(|c| c.type_ != ConditionSet::ISOLATED);
            }
            continue;
        }
        let kept = memo
            .as_deref()
            .and_then(|m| m.by_tenant.get(&name))
            .filter(|(grants, _)| grants.same_list(&status.grants))
            .map(|(_, isolation)| isolation.clone());
        let isolation = match kept {
            Some(isolation) => isolation,
            None => {
                let isolation = isolation_of(&name, &status.grants, roles);
                if let Some(m) = memo.as_deref_mut() {
                    m.by_tenant
                        .insert(name.clone(), (status.grants.clone(), isolation.clone()));
                }
                isolation
            }
        };
        if condition_holds(
            &status.conditions,
            ConditionSet::ISOLATED,
            isolation.ok,
            isolation.reason,
            &isolation.message,
            generation,
        ) {
            continue;
        }
        if let Some(status) = Arc::make_mut(t).status.as_mut() {
            set_condition(
                &mut status.conditions,
                ConditionSet::ISOLATED,
                isolation.ok,
                isolation.reason,
                isolation.message,
                generation,
                now,
            );
        }
    }
    tenants
}

/// The condition tenant `name`'s `grants` make on nodes of `roles`.
fn isolation_of(name: &str, grants: &Grants, roles: &NodeRoles) -> Isolation {
    let NodeRoles { dedicated, dra } = roles;
    let on_own = |node: &str| dedicated.get(node) == Some(&name);
    // Grants come sorted by node: a sort of what is sorted, then each node once.
    let mut shared: Vec<&str> = grants
        .iter()
        .filter(|g| !on_own(&g.node) && !dra.contains(g.node.as_str()))
        .map(|g| g.node.as_str())
        .collect();
    shared.sort_unstable();
    shared.dedup();
    let any_dra = grants.iter().any(|g| !on_own(&g.node) && dra.contains(g.node.as_str()));
    if shared.is_empty() && !any_dra {
        return Isolation {
            ok: true,
            reason: "DedicatedNodes",
            message: "every grant is on a node tainted for this tenant alone".to_string(),
        };
    }
    if shared.is_empty() {
        return Isolation {
            ok: true,
            reason: "DraBound",
            message: "every grant is on a DRA node, where the scheduler allocates this tenant's claims only its own devices and the node's agent prepares no other, scrubbed before it changes hands (or on a node tainted for this tenant alone)".to_string(),
        };
    }
    let listed: Vec<&str> = shared.iter().take(5).copied().collect();
    Isolation {
        ok: false,
        reason: "CountsOnly",
        message: format!(
            "on {} node{} ({}{}) the quota enforces how many units this tenant uses, but NVIDIA's device plugin picks which GPU or MIG instance a pod gets, so the per-GPU binding is bookkeeping; run the pool in DRA mode (its plan's spec.deviceAccess: DRA) or dedicate whole nodes to the tenant (a plan's spec.gpus[].tenants on every GPU of a node) to enforce it",
            shared.len(),
            if shared.len() == 1 { "" } else { "s" },
            listed.join(", "),
            if shared.len() > 5 { ", ..." } else { "" }
        ),
    }
}
