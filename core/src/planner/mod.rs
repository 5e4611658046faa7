//! The planner, pure: from policies, tenants, plans and node inventories, each node's desired
//! GpuNode spec and each tenant's grants, with conditions. Deterministic: the same input always
//! gives the same output, and feeding its own output back as the current state changes nothing.

mod allocate;
mod changes;
mod fairshare;
mod models;
mod nodes;
pub mod rollout;
mod status;

pub use allocate::AllocationMemo;
pub use changes::{BindingChange, ChangeReason};
pub use fairshare::weighted_fair_share;

use crate::api::{
    GpuNode, GpuPartitionPlan, GpuPartitionPlanSpec, GpuTenant, MemoryCapPolicy, ScrubMemory, SharingPolicy,
};
use crate::inventory::NodeInventory;
use crate::policy::{PlanCheck, TenantProfile, check_plan, check_policies, check_tenants, models_of_selected_nodes};
use crate::problem::Problem;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use models::ModelsMemo;
use serde::Serialize;
use std::collections::BTreeSet;
use std::sync::Arc;

/// Everything the planner looks at.
#[derive(Clone, Copy, Debug)]
pub struct PlanInput<'a> {
    pub policies: &'a [SharingPolicy],
    pub tenants: &'a [Arc<GpuTenant>],
    pub plans: &'a [GpuPartitionPlan],
    pub nodes: &'a [NodeInventory],
}

/// What the controller would write.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct PlanOutput {
    /// One GpuNode per inventory node with the spec to write now, sorted by name: the desired spec,
    /// or the current one where the rollout holds the node back ([`rollout`]).
    pub nodes: Vec<GpuNode>,
    /// Every tenant with its computed status, sorted by name (shared with the memo, which hands
    /// an unchanged tenant's back: [`PlanMemo::keep_statuses`]).
    pub tenants: Vec<Arc<GpuTenant>>,
    /// Every plan with its computed status, sorted by name.
    pub plans: Vec<GpuPartitionPlan>,
    /// Every policy with its computed status, sorted by name.
    pub policies: Vec<SharingPolicy>,
    /// Every problem found, sorted.
    pub problems: Vec<Problem>,
    /// Every GPU or MIG instance whose tenants the desired specs change against what runs now,
    /// with the reason, sorted by node, GPU and placement.
    pub changes: Vec<BindingChange>,
}

/// What a planner run keeps for the next: the inputs and results of the parts of the fleet it
/// placed, so the next run places again only the parts whose inputs changed. The controller keeps
/// one between passes; the output is the same with or without it.
#[derive(Default)]
pub struct PlanMemo {
    pub allocation: AllocationMemo,
    /// The nodes as the last pass left them.
    nodes: nodes::NodesMemo,
    /// The plans the last pass resolved the nodes' layouts under, by name, with whether each was
    /// valid: a node whose revision is unchanged has the same layout only while they are.
    plans: Vec<(String, GpuPartitionPlanSpec, bool)>,
    /// The valid tenants' `scrubMemory` and `memoryCaps` in the last pass, by name: the scrub
    /// and memory cap policies of the nodes taken back hold only while they are the same.
    scrub: Vec<(String, ScrubMemory, MemoryCapPolicy)>,
    /// The GPU models of the nodes each plan selected.
    models: ModelsMemo,
    /// The tenants' statuses, as the steps after the planner finished them.
    statuses: status::StatusMemo,
}

impl PlanMemo {
    /// Says that every pass's statuses will be handed back finished ([`PlanMemo::keep_statuses`]):
    /// the planner then keeps none of its own, which the steps after would copy to write into.
    pub fn statuses_handed_back(&mut self) {
        self.statuses.handed_back = true;
    }

    /// Keeps the tenants of the pass's output as the steps after the planner finished their
    /// statuses (admission, `Isolated`): the next pass hands back those of tenants it reads
    /// unchanged, with the same problems and grants.
    pub fn keep_statuses(&mut self, tenants: &[Arc<GpuTenant>]) {
        self.statuses.keep(tenants);
    }

    /// Keeps this pass's plans; where they differ from the last pass's, the nodes memo learns
    /// which nodes the plans that changed reach (their revisions no longer say their layouts
    /// are unchanged).
    fn read_plans(&mut self, plans: &[&GpuPartitionPlan], checks: &[PlanCheck]) {
        let now: Vec<(&str, &GpuPartitionPlanSpec, bool)> = plans
            .iter()
            .zip(checks)
            .map(|(p, c)| (crate::api::name_of(*p), &p.spec, c.is_valid()))
            .collect();
        let same = self.plans.len() == now.len()
            && self
                .plans
                .iter()
                .zip(&now)
                .all(|((name, spec, valid), (n, s, v))| name == n && spec == *s && valid == v);
        if same {
            self.nodes.plans_changed(nodes::PlansChange::default());
            return;
        }
        if now.windows(2).any(|w| w[0].0 == w[1].0) {
            // Two plans of one name (a CLI input can have them): which is which is unknown.
            self.nodes.clear();
        } else {
            self.nodes.plans_changed(nodes::PlansChange::between(&self.plans, &now));
        }
        self.plans = now
            .into_iter()
            .map(|(name, spec, valid)| (name.to_string(), spec.clone(), valid))
            .collect();
    }

    /// Keeps this pass's tenants' `scrubMemory` and `memoryCaps`; says whether they are the last pass's.
    fn read_scrub(&mut self, valid: &[TenantProfile]) -> bool {
        let same = self.scrub.len() == valid.len()
            && self
                .scrub
                .iter()
                .zip(valid)
                .all(|((name, scrub, caps), t)| *name == t.name && *scrub == t.scrub && *caps == t.memory_caps);
        if !same {
            self.scrub = valid.iter().map(|t| (t.name.clone(), t.scrub, t.memory_caps)).collect();
        }
        same
    }
}

/// Plans a fleet. `exempt` are the namespaces no admission policy judges (no tenant may list
/// them). `now` stamps condition transition times; pass a fixed time for reproducible output.
pub fn plan(input: &PlanInput, exempt: &BTreeSet<String>, now: &Time) -> PlanOutput {
    plan_with(input, exempt, now, None)
}

/// [`plan`], reusing what `memo` kept of the parts of the fleet whose inputs are unchanged, and
/// keeping this run's for the next.
pub fn plan_with(
    input: &PlanInput,
    exempt: &BTreeSet<String>,
    now: &Time,
    mut memo: Option<&mut PlanMemo>,
) -> PlanOutput {
    let mut problems = check_policies(input.policies);
    let tenant_check = check_tenants(input.policies, input.tenants, exempt);
    problems.extend(tenant_check.invalid.values().flatten().cloned());

    let tenant_names: BTreeSet<String> = input.tenants.iter().map(|t| t.name_any()).collect();
    let mut plans: Vec<&GpuPartitionPlan> = input.plans.iter().collect();
    crate::api::sort_refs_by_name(&mut plans);
    let models: Vec<_> = match memo.as_deref_mut() {
        Some(m) => m.models.of(&plans, input.nodes),
        None => plans.iter().map(|p| models_of_selected_nodes(p, input.nodes)).collect(),
    };
    let plan_checks: Vec<_> = plans
        .iter()
        .zip(&models)
        .map(|(p, models)| check_plan(p, &tenant_names, models))
        .collect();
    for c in &plan_checks {
        problems.extend(c.problems.iter().cloned());
    }

    if let Some(m) = memo.as_deref_mut() {
        m.read_plans(&plans, &plan_checks);
    }
    let mut fleet = nodes::build_fleet(input.nodes, &plans, &plan_checks, memo.as_deref().map(|m| &m.nodes));
    problems.extend(fleet.problems.iter().cloned());

    let same_scrub = memo.as_deref_mut().is_some_and(|m| m.read_scrub(&tenant_check.valid));
    let grants = allocate::allocate(
        &tenant_check.valid,
        &mut fleet.nodes,
        memo.as_deref_mut().map(|m| &mut m.allocation),
    );
    let changes = changes::settle(&mut fleet.nodes, input.tenants, &tenant_check.valid, same_scrub);
    let statuses_memo = match memo {
        Some(m) => {
            m.nodes.keep(&mut fleet.nodes);
            Some(&mut m.statuses)
        }
        None => None,
    };

    let desired = fleet.nodes.iter_mut().map(nodes::NodeDesired::take_gpu_node).collect();
    let rollout = rollout::rollout(desired, input.nodes, &plans);
    let tenants = status::tenant_statuses(input.tenants, &tenant_check, grants, now, statuses_memo);
    let plan_statuses = status::plan_statuses(&plans, &plan_checks, &fleet, &rollout, now);
    let policies = status::policy_statuses(input.policies, input.tenants, &problems, now);

    problems.sort();
    problems.dedup();
    PlanOutput {
        nodes: rollout.nodes,
        tenants,
        plans: plan_statuses,
        policies,
        problems,
        changes,
    }
}

#[cfg(any(test, feature = "test-support"))]
pub mod fixtures;
#[cfg(test)]
mod memory_caps_tests;
#[cfg(test)]
mod tests;
