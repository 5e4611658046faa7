//! The rollout step, pure: from each node's desired GpuNode spec and its GpuNode as it is in the
//! cluster now, the spec to write now, so that per plan at most `spec.rollout.maxUnavailable` nodes
//! reconfigure at once.
//!
//! Definitions:
//! - A node is *in service* when its current GpuNode spec lists GPUs: the controller has given it a
//!   layout, and workloads run under it. A node without a GpuNode, or whose spec lists no GPUs, is
//!   not: a spec without GPUs asks the agent to change nothing ("GPUs not listed are left as they
//!   are").
//! - A node is *changing* from the write of a spec until its agent reports that generation applied
//!   or failed: in service, and `metadata.generation` ≠ `status.observedGeneration` or no verdict
//!   yet ([`AppliedState::Pending`]). A failed node is done: it holds no budget, and is reported.
//! - A node *starts* changing when the spec to write differs from its current spec.
//! - A plan's budget is `maxUnavailable` nodes changing at once: a number, or a percentage of the
//!   nodes the plan governs (those whose desired spec names it) rounded down; at least 1, and 1
//!   when unset. A node counts against the plan its desired spec names.
//!
//! Decisions:
//! - Starting a change takes budget only where it can disrupt something: a node in service that is
//!   not changing already, with a new spec that lists GPUs. A node not in service takes its first
//!   spec at once (otherwise a new 1,000-node pool would converge one node at a time, with nothing
//!   of ours running there yet to protect); so does a new spec without GPUs (a node leaving every
//!   plan, or one its plan cannot apply to), which changes nothing on the GPUs. From the next pass on,
//!   a node applying its first spec is in service and changing, and holds budget like any other.
//! - A node already changing may take a newer spec without more budget: its GPUs are out of service
//!   anyway, and finishing an outdated spec first would only lengthen the disruption.
//! - Budget goes to nodes in name order, so the same input gives the same output.
//! - A node held back gets its current spec back unchanged, so the writer sees no difference and
//!   writes nothing; it is reported as waiting for the rollout.
//! - A node without a current GpuNode (offline planning, where the CLI has no cluster, or a node
//!   seen for the first time) gets its desired spec.
//! - Busy GPUs are not this step's concern: the agent follows the spec's `busyGpuPolicy` on each.

use crate::api::{GpuNode, GpuPartitionPlan};
use crate::inventory::{AppliedState, CurrentNode, NodeInventory};
use foldhash::HashMap;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use std::collections::BTreeMap;

/// Where a node stands against its desired spec after this step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Progress {
    /// The desired spec is the current one and the agent reported it applied.
    Applied,
    /// The desired spec is written (now or before); the agent has not reported on it yet.
    Pending,
    /// Waiting for the rollout: the node keeps its current spec until its plan has budget.
    HeldBack,
    /// The agent gave up on the desired spec; carries its message.
    Failed(String),
}

impl std::fmt::Display for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Progress::Applied => "Applied",
            Progress::Pending => "Pending",
            Progress::HeldBack => "HeldBack",
            Progress::Failed(_) => "Failed",
        })
    }
}

/// One node after the rollout step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRollout {
    /// The plan its desired spec names, whose budget it counts against.
    pub plan: Option<String>,
    pub progress: Progress,
    /// Changing after this step (already changing, or starting now while in service).
    pub changing: bool,
}

#[cfg(test)]
impl NodeRollout {
    fn is_held_back(&self) -> bool {
        self.progress == Progress::HeldBack
    }
}

/// One plan after the rollout step; counts cover the nodes it governs (whose desired spec names it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlanRollout {
    /// `maxUnavailable` resolved to a number of nodes.
    pub max_unavailable: u32,
    pub selected: u32,
    /// Nodes whose spec to write is the desired one.
    pub updated: u32,
    /// Updated, and the agent reported that generation applied.
    pub applied: u32,
    /// Nodes changing after this step, by name.
    pub changing: Vec<String>,
    /// Nodes waiting for the rollout, by name.
    pub held_back: Vec<String>,
    /// Nodes whose agent gave up on the desired spec, by name.
    pub failed: Vec<String>,
}

/// What the rollout step decided.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rollout {
    /// The GpuNodes to write now, sorted by name: the desired spec, or the current one when held back.
    pub nodes: Vec<GpuNode>,
    /// Per node, in the order of `nodes` (the pass's: by name), so read by position, not
    /// looked up by name for every node ([`Rollout::node_rollout`] finds one by name).
    pub node_rollouts: Vec<NodeRollout>,
    /// Per plan name, every plan given (and any other plan a desired spec names).
    pub plans: BTreeMap<String, PlanRollout>,
}

impl Rollout {
    /// The rollout of the node named `name` (`nodes` are sorted by name).
    pub fn node_rollout(&self, name: &str) -> Option<&NodeRollout> {
        let at = self
            .nodes
            .binary_search_by(|n| n.metadata.name.as_deref().unwrap_or_default().cmp(name))
            .ok()?;
        self.node_rollouts.get(at)
    }

    /// The rollout of the `i`th node, which the caller expects to be named `name`: found by
    /// position (the pass's nodes and these are in one order), by name where it is not there.
    pub fn node_rollout_at(&self, i: usize, name: &str) -> Option<&NodeRollout> {
        match self.nodes.get(i) {
            Some(n) if n.metadata.name.as_deref() == Some(name) => self.node_rollouts.get(i),
            _ => self.node_rollout(name),
        }
    }
}

/// `maxUnavailable` as a number of nodes, for a plan governing `selected` nodes: a percentage is
/// rounded down; at least 1; 1 when unset (the schema's CEL rule refuses anything else).
pub fn max_unavailable(plan: &GpuPartitionPlan, selected: u32) -> u32 {
    let n = match plan.spec.rollout.as_ref().and_then(|r| r.max_unavailable.as_ref()) {
        None => 1,
        Some(IntOrString::Int(n)) => u32::try_from(*n).unwrap_or(1),
        Some(IntOrString::String(s)) => match s.trim().strip_suffix('%') {
            Some(percent) => percent.parse::<u64>().map_or(1, |p| {
                u32::try_from(u64::from(selected) * p.min(100) / 100).unwrap_or(u32::MAX)
            }),
            None => s.trim().parse().unwrap_or(1),
        },
    };
    n.max(1)
}

fn in_service(current: &CurrentNode) -> bool {
    !current.spec.gpus.is_empty()
}

fn is_changing(current: &CurrentNode) -> bool {
    in_service(current)
        && (current.generation != current.observed_generation || current.applied == AppliedState::Pending)
}

/// The specs to write now: see the module documentation for the rules.
pub fn rollout(mut desired: Vec<GpuNode>, nodes: &[NodeInventory], plans: &[&GpuPartitionPlan]) -> Rollout {
    desired.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let current: HashMap<&str, &CurrentNode> = nodes
        .iter()
        .filter_map(|n| n.current.as_ref().map(|c| (n.name.as_str(), c)))
        .collect();
    let current_of = |node: &GpuNode| node.metadata.name.as_deref().and_then(|n| current.get(n).copied());

    let mut budget = Budget::of(&desired, plans, current_of);
    // In name order, as `desired` is sorted: the map is built from the list in one go.
    let mut node_rollouts = Vec::with_capacity(desired.len());
    // Each node is written in place, not moved into a second list: at 50,000 nodes a copy of the
    // list is tens of megabytes of fresh pages the kernel faults in and zeroes.
    for node in &mut desired {
        let plan = node.spec.plan.clone();
        let cur = current_of(node);
        // Compared once: on a converged fleet every node's spec is equal, and comparing GPU by
        // GPU is most of this step.
        let same_spec = cur.is_some_and(|c| c.spec == node.spec);
        let (write_desired, changing) = budget.decide(cur, same_spec, node.spec.gpus.is_empty(), plan.as_deref());
        let progress = progress(cur, same_spec, write_desired);
        if let Some(s) = plan.as_ref().and_then(|p| budget.summary.get_mut(p)) {
            // Copied only where a list names the node.
            s.count(&progress, write_desired, changing, || node.name_any());
        }
        if let Some(c) = cur.filter(|_| !write_desired) {
            *node = GpuNode::new(&node.name_any(), c.spec.clone());
        }
        node_rollouts.push(NodeRollout {
            plan,
            progress,
            changing,
        });
    }
    Rollout {
        nodes: desired,
        node_rollouts,
        plans: budget.summary,
    }
}

/// Each plan's budget: its summary so far, and how many of its nodes change now.
struct Budget {
    summary: BTreeMap<String, PlanRollout>,
    in_flight: BTreeMap<String, u32>,
}

impl Budget {
    /// Nodes governed per plan, and those changing before this step.
    fn of<'c>(
        desired: &[GpuNode],
        plans: &[&GpuPartitionPlan],
        current_of: impl Fn(&GpuNode) -> Option<&'c CurrentNode>,
    ) -> Budget {
        let mut summary: BTreeMap<String, PlanRollout> =
            plans.iter().map(|p| (p.name_any(), PlanRollout::default())).collect();
        let mut in_flight: BTreeMap<String, u32> = BTreeMap::new();
        for node in desired {
            if let Some(plan) = &node.spec.plan {
                // A plan's name is copied once, not once per node.
                match summary.get_mut(plan) {
                    Some(s) => s.selected += 1,
                    None => summary.entry(plan.clone()).or_default().selected += 1,
                }
                if current_of(node).is_some_and(is_changing) {
                    match in_flight.get_mut(plan) {
                        Some(n) => *n += 1,
                        None => drop(in_flight.insert(plan.clone(), 1)),
                    }
                }
            }
        }
        let by_name: HashMap<String, &GpuPartitionPlan> = plans.iter().map(|p| (p.name_any(), *p)).collect();
        for (name, s) in &mut summary {
            s.max_unavailable = by_name.get(name).map_or(1, |p| max_unavailable(p, s.selected));
        }
        Budget { summary, in_flight }
    }

    /// Whether the node gets its desired spec now, and whether it is changing after this step;
    /// a change that can disrupt something takes one of its plan's budget.
    fn decide(
        &mut self,
        cur: Option<&CurrentNode>,
        same_spec: bool,
        desired_empty: bool,
        plan: Option<&str>,
    ) -> (bool, bool) {
        match cur {
            None => (true, false),
            Some(c) if is_changing(c) => (true, true),
            Some(_) if same_spec => (true, false),
            Some(c) if !in_service(c) || desired_empty => (true, false),
            Some(_) => match plan {
                None => (true, true),
                Some(p) => {
                    let most = self.summary.get(p).map_or(1, |s| s.max_unavailable);
                    let used = match self.in_flight.get_mut(p) {
                        Some(n) => n,
                        None => self.in_flight.entry(p.to_string()).or_default(),
                    };
                    if *used < most {
                        *used += 1;
                        (true, true)
                    } else {
                        (false, false)
                    }
                }
            },
        }
    }
}

/// Where the node stands after this step.
fn progress(cur: Option<&CurrentNode>, same_spec: bool, write_desired: bool) -> Progress {
    match cur {
        _ if !write_desired => Progress::HeldBack,
        Some(c) if same_spec && c.generation == c.observed_generation => match &c.applied {
            AppliedState::Applied => Progress::Applied,
            AppliedState::Failed(m) => Progress::Failed(m.clone()),
            AppliedState::Pending => Progress::Pending,
        },
        _ => Progress::Pending,
    }
}

impl PlanRollout {
    /// Counts one node of this plan, named by `name`.
    fn count(&mut self, progress: &Progress, write_desired: bool, changing: bool, name: impl Fn() -> String) {
        self.updated += u32::from(write_desired);
        self.applied += u32::from(*progress == Progress::Applied);
        let list = match progress {
            Progress::HeldBack => Some(&mut self.held_back),
            Progress::Failed(_) => Some(&mut self.failed),
            _ => None,
        };
        list.into_iter().for_each(|l| l.push(name()));
        if changing {
            self.changing.push(name());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{GpuNodeSpec, GpuSpec, Mode, Rollout as RolloutSpec};
    use crate::planner::fixtures::{group, plan_for};

    /// A spec of `gpus` GPUs in `mode` under plan `p`.
    fn spec(mode: Mode, gpus: u32) -> GpuNodeSpec {
        GpuNodeSpec {
            plan: Some("p".into()),
            gpus: (0..gpus).map(|index| GpuSpec::new(index, mode)).collect(),
            ..GpuNodeSpec::default()
        }
    }

    fn plan_with(max: Option<IntOrString>) -> GpuPartitionPlan {
        let mut plan = plan_for("p", "x", vec![group("all", Mode::Exclusive)]);
        plan.spec.rollout = Some(RolloutSpec {
            max_unavailable: max,
            busy_gpu_policy: Default::default(),
        });
        plan
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("n{i:02}")).collect()
    }

    /// `n` nodes in service with `spec`, applied.
    fn fleet(n: usize, spec: &GpuNodeSpec) -> Vec<NodeInventory> {
        names(n)
            .into_iter()
            .map(|name| NodeInventory {
                name,
                reported: true,
                current: Some(CurrentNode {
                    spec: spec.clone(),
                    generation: Some(1),
                    observed_generation: Some(1),
                    applied: AppliedState::Applied,
                    handover_pending: false,
                    memory_caps: vec![],
                }),
                ..NodeInventory::default()
            })
            .collect()
    }

    fn desired(n: usize, spec: &GpuNodeSpec) -> Vec<GpuNode> {
        names(n).iter().map(|name| GpuNode::new(name, spec.clone())).collect()
    }

    /// What the writer does: a changed spec bumps the generation; the agent has not reported yet.
    fn write(nodes: &mut [NodeInventory], written: &[GpuNode]) {
        for (n, w) in nodes.iter_mut().zip(written) {
            assert_eq!(n.name, w.name_any());
            let c = n.current.get_or_insert_with(CurrentNode::default);
            if c.spec != w.spec {
                c.spec = w.spec.clone();
                c.generation = Some(c.generation.unwrap_or(0) + 1);
                c.applied = AppliedState::Pending;
            }
        }
    }

    /// The agent reports on the current generation of `node`.
    fn report(nodes: &mut [NodeInventory], node: &str, applied: AppliedState) {
        let c = nodes
            .iter_mut()
            .find(|n| n.name == node)
            .unwrap()
            .current
            .as_mut()
            .unwrap();
        c.observed_generation = c.generation;
        c.applied = applied;
    }

    fn with_spec(r: &Rollout, s: &GpuNodeSpec) -> Vec<String> {
        r.nodes.iter().filter(|n| &n.spec == s).map(|n| n.name_any()).collect()
    }

    #[test]
    fn max_unavailable_resolves_numbers_and_percentages() {
        let resolve = |m: Option<IntOrString>, selected| max_unavailable(&plan_with(m), selected);
        let pct = |s: &str| Some(IntOrString::String(s.into()));
        assert_eq!(resolve(None, 10), 1);
        assert_eq!(max_unavailable(&plan_for("p", "x", vec![]), 10), 1);
        assert_eq!(resolve(Some(IntOrString::Int(3)), 10), 3);
        assert_eq!(resolve(pct("25%"), 10), 2);
        assert_eq!(resolve(pct("1%"), 10), 1);
        assert_eq!(resolve(pct("100%"), 10), 10);
        assert_eq!(resolve(pct("50%"), 0), 1);
        assert_eq!(resolve(pct("4"), 10), 4);
    }

    #[test]
    fn a_plan_change_rolls_max_unavailable_nodes_at_a_time() {
        let old = spec(Mode::Exclusive, 2);
        let new = spec(Mode::Mps, 2);
        let plan = plan_with(Some(IntOrString::Int(2)));
        let mut nodes = fleet(10, &old);

        let first = rollout(desired(10, &new), &nodes, &[&plan]);
        assert_eq!(with_spec(&first, &new), ["n00", "n01"]);
        assert_eq!(with_spec(&first, &old).len(), 8);
        let p = &first.plans["p"];
        assert_eq!((p.selected, p.updated, p.applied, p.max_unavailable), (10, 2, 0, 2));
        assert_eq!(p.changing, ["n00", "n01"]);
        assert_eq!(p.held_back, names(10)[2..]);
        assert!(first.node_rollout("n05").unwrap().is_held_back());
        assert_eq!(first.node_rollout("n00").unwrap().progress, Progress::Pending);
        // Found by position, and by name where the position holds another node.
        assert!(first.node_rollout_at(5, "n05").unwrap().is_held_back());
        assert!(first.node_rollout_at(0, "n05").unwrap().is_held_back());
        assert_eq!(first.node_rollout_at(5, "n00").unwrap().progress, Progress::Pending);
        assert_eq!(first.node_rollout("n99"), None);

        // Written, not yet applied: the same two keep the budget, the same specs are written.
        write(&mut nodes, &first.nodes);
        let again = rollout(desired(10, &new), &nodes, &[&plan]);
        assert_eq!(again.nodes, first.nodes);
        assert_eq!(again.plans, first.plans);

        // One applies: one more starts.
        report(&mut nodes, "n00", AppliedState::Applied);
        let next = rollout(desired(10, &new), &nodes, &[&plan]);
        assert_eq!(with_spec(&next, &new), ["n00", "n01", "n02"]);
        assert_eq!(next.node_rollout("n00").unwrap().progress, Progress::Applied);

        // Both apply: the next two.
        report(&mut nodes, "n01", AppliedState::Applied);
        let next = rollout(desired(10, &new), &nodes, &[&plan]);
        assert_eq!(with_spec(&next, &new), ["n00", "n01", "n02", "n03"]);
        assert_eq!(next.plans["p"].changing, ["n02", "n03"]);
        assert_eq!(next.plans["p"].applied, 2);

        // To the end: every node applied, nothing held back.
        let mut passes = 0;
        loop {
            let r = rollout(desired(10, &new), &nodes, &[&plan]);
            write(&mut nodes, &r.nodes);
            if r.plans["p"].applied == 10 {
                assert!(r.plans["p"].changing.is_empty() && r.plans["p"].held_back.is_empty());
                break;
            }
            for n in r.plans["p"].changing.clone() {
                report(&mut nodes, &n, AppliedState::Applied);
            }
            passes += 1;
            assert!(passes < 10, "the rollout does not finish");
        }
    }

    #[test]
    fn a_held_back_node_gets_back_exactly_its_current_spec() {
        let old = spec(Mode::TimeSlicing, 4);
        let mut new = spec(Mode::Exclusive, 4);
        new.busy_gpu_policy = crate::api::BusyGpuPolicy::Evict;
        let nodes = fleet(3, &old);
        let r = rollout(desired(3, &new), &nodes, &[&plan_with(None)]);
        let held = &r.nodes[2];
        assert!(r.node_rollout("n02").unwrap().is_held_back());
        let current = &nodes[2].current.as_ref().unwrap().spec;
        assert_eq!(&held.spec, current);
        assert_eq!(
            serde_json::to_string(&held.spec).unwrap(),
            serde_json::to_string(current).unwrap()
        );
        assert_eq!(held.metadata, GpuNode::new("n02", old.clone()).metadata);
    }

    #[test]
    fn a_failed_node_is_done_and_reported() {
        let old = spec(Mode::Exclusive, 1);
        let new = spec(Mode::Mps, 1);
        let plan = plan_with(Some(IntOrString::Int(1)));
        let mut nodes = fleet(3, &old);
        let r = rollout(desired(3, &new), &nodes, &[&plan]);
        write(&mut nodes, &r.nodes);
        report(&mut nodes, "n00", AppliedState::Failed("GPU 0: ResetRequired".into()));
        let r = rollout(desired(3, &new), &nodes, &[&plan]);
        assert_eq!(
            r.node_rollout("n00").unwrap().progress,
            Progress::Failed("GPU 0: ResetRequired".into())
        );
        assert!(!r.node_rollout("n00").unwrap().changing);
        assert_eq!(r.plans["p"].failed, ["n00"]);
        assert_eq!(r.plans["p"].changing, ["n01"]);
        assert_eq!(with_spec(&r, &new), ["n00", "n01"]);
    }

    #[test]
    fn percentages_round_down_to_at_least_one() {
        let old = spec(Mode::Exclusive, 1);
        let new = spec(Mode::Mps, 1);
        for (pct, started) in [("25%", 2), ("1%", 1), ("100%", 10)] {
            let plan = plan_with(Some(IntOrString::String(pct.into())));
            let r = rollout(desired(10, &new), &fleet(10, &old), &[&plan]);
            assert_eq!(with_spec(&r, &new).len(), started, "{pct}");
        }
    }

    #[test]
    fn nodes_not_in_service_take_their_first_spec_at_once() {
        let new = spec(Mode::Mps, 2);
        let plan = plan_with(None);
        // Offline: no GpuNode at all.
        let offline: Vec<NodeInventory> = names(5)
            .into_iter()
            .map(|name| NodeInventory {
                name,
                ..NodeInventory::default()
            })
            .collect();
        let r = rollout(desired(5, &new), &offline, &[&plan]);
        assert_eq!(with_spec(&r, &new).len(), 5);
        assert!(r.plans["p"].changing.is_empty());
        assert!(r.node_rollouts.iter().all(|n| n.progress == Progress::Pending));
        // A GpuNode whose spec lists no GPUs (created by the agent, or left by a plan that went).
        let mut nodes = fleet(5, &GpuNodeSpec::default());
        let r = rollout(desired(5, &new), &nodes, &[&plan]);
        assert_eq!(with_spec(&r, &new).len(), 5);
        // While they apply their first spec they are changing and hold the budget.
        write(&mut nodes, &r.nodes);
        let again = rollout(desired(5, &new), &nodes, &[&plan]);
        assert_eq!(again.nodes, r.nodes);
        assert_eq!(again.plans["p"].changing.len(), 5);
    }

    #[test]
    fn a_changing_node_takes_a_newer_spec_without_more_budget() {
        let old = spec(Mode::Exclusive, 1);
        let new = spec(Mode::Mps, 1);
        let newer = spec(Mode::TimeSlicing, 1);
        let plan = plan_with(None);
        let mut nodes = fleet(3, &old);
        let r = rollout(desired(3, &new), &nodes, &[&plan]);
        write(&mut nodes, &r.nodes);
        let r = rollout(desired(3, &newer), &nodes, &[&plan]);
        assert_eq!(with_spec(&r, &newer), ["n00"]);
        assert_eq!(with_spec(&r, &old), ["n01", "n02"]);
        assert_eq!(r.plans["p"].changing, ["n00"]);
    }

    #[test]
    fn nothing_changed_writes_the_current_specs() {
        let s = spec(Mode::Mps, 2);
        let nodes = fleet(4, &s);
        let r = rollout(desired(4, &s), &nodes, &[&plan_with(None)]);
        assert_eq!(r.nodes, desired(4, &s));
        assert_eq!(r.plans["p"].applied, 4);
        assert!(r.plans["p"].changing.is_empty() && r.plans["p"].held_back.is_empty());
    }

    #[test]
    fn budgets_are_per_plan() {
        let old = spec(Mode::Exclusive, 1);
        let mut new = spec(Mode::Mps, 1);
        let nodes = fleet(4, &old);
        let p = plan_with(None);
        let mut q = plan_with(None);
        q.metadata.name = Some("q".into());
        let mut want = desired(2, &new);
        new.plan = Some("q".into());
        want.extend(names(4)[2..].iter().map(|n| GpuNode::new(n, new.clone())));
        let r = rollout(want, &nodes, &[&p, &q]);
        assert_eq!(r.plans["p"].changing, ["n00"]);
        assert_eq!(r.plans["q"].changing, ["n02"]);
        assert_eq!(r.plans["q"].held_back, ["n03"]);
    }
}
