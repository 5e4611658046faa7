//! Which plan governs each node, and the node's desired GPU layout under it.

use crate::api::{GpuGroup, GpuPartitionPlan, GpuSpec, MigInstanceSpec, MigSettings, Mode, MpsSettings};
use crate::devices::expand_devices;
use crate::inventory::{NodeGpu, NodeInventory};
use crate::mig::{ExistingInstance, diff_layout, solve_named};
use crate::policy::{PlanCheck, mps_clients_problem, mps_pinned_problem};
use crate::problem::Problem;
use crate::selectors::ParsedSelector;
use foldhash::HashMap;
use kube::ResourceExt;
use std::collections::BTreeMap;

mod kept;
mod node;
pub use kept::{NodesMemo, PlansChange};
pub use node::{Fleet, NodeDesired, NodeState};

/// Per (plan, group, GPU model): the layout solved for a GPU with no instances, and the layout
/// kept from each set of instances found (a fleet has a few such sets, over thousands of GPUs).
#[derive(Default)]
struct LayoutMemo {
    solved: HashMap<GroupOnModel, Layout>,
    kept: HashMap<GroupOnModel, HashMap<Vec<ExistingInstance>, Layout>>,
}

/// (plan, group of the plan, GPU model).
type GroupOnModel = (usize, usize, &'static str);
type Layout = Result<Vec<MigInstanceSpec>, String>;

/// Picks each node's plan and resolves its layout. Plans come sorted by name, with their checks.
/// A node `kept` has as the last pass left it (same revision, same plans) is taken back from it.
pub fn build_fleet<'a>(
    nodes: &'a [NodeInventory],
    plans: &[&GpuPartitionPlan],
    checks: &[PlanCheck],
    kept: Option<&NodesMemo>,
) -> Fleet<'a> {
    let mut memo = LayoutMemo::default();
    let mut sorted: Vec<&NodeInventory> = nodes.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let selectors: Vec<ParsedSelector> = plans
        .iter()
        .map(|p| ParsedSelector::of(&p.spec.node_selector))
        .collect();
    let mut last = kept.map(NodesMemo::reader);
    let out: Vec<NodeDesired> = sorted
        .into_iter()
        .map(|inv| match last.as_mut().and_then(|r| r.kept(inv)) {
            Some(k) => k,
            None => plan_node(inv, plans, checks, &selectors, &mut memo),
        })
        .collect();
    let problems = fleet_problems(&out, plans);
    Fleet { nodes: out, problems }
}

/// One node's plan and layout.
fn plan_node<'a>(
    inv: &'a NodeInventory,
    plans: &[&GpuPartitionPlan],
    checks: &[PlanCheck],
    selectors: &[ParsedSelector],
    memo: &mut LayoutMemo,
) -> NodeDesired<'a> {
    let mut candidates: Vec<usize> = (0..plans.len())
        .filter(|&i| selectors[i].matches(&inv.labels))
        .collect();
    candidates.sort_by_key(|&i| std::cmp::Reverse(plans[i].spec.priority));
    let mut node = NodeDesired::unplanned(inv);
    if !inv.reported {
        node.state = NodeState::Waiting;
        if let [winner, ..] = candidates.as_slice() {
            node.plan = Some(plans[*winner].name_any());
        }
        return node;
    }
    match candidates.as_slice() {
        [] => {}
        [first, second, ..] if plans[*first].spec.priority == plans[*second].spec.priority => {
            tie(&mut node, &candidates, plans);
        }
        [winner, ..] => apply_plan(&mut node, *winner, plans[*winner], &checks[*winner], memo),
    }
    node
}

/// Plans of equal priority select the node, the first candidates: none applies.
fn tie(node: &mut NodeDesired, candidates: &[usize], plans: &[&GpuPartitionPlan]) {
    let priority = plans[candidates[0]].spec.priority;
    let tied: Vec<usize> = candidates
        .iter()
        .copied()
        .filter(|&i| plans[i].spec.priority == priority)
        .collect();
    let names: Vec<String> = tied.iter().map(|&i| plans[i].name_any()).collect();
    node.state = NodeState::Conflict {
        message: format!("selected by {} at the same priority {priority}", names.join(" and ")),
        plans: names,
    };
    node.decided.tied = tied;
}

/// The node takes `plan` (the `winner`th of the pass): its settings, and its layout where the plan
/// is valid and fits the node.
fn apply_plan(
    node: &mut NodeDesired,
    winner: usize,
    plan: &GpuPartitionPlan,
    check: &PlanCheck,
    memo: &mut LayoutMemo,
) {
    node.plan = Some(plan.name_any());
    node.device_access = plan.spec.device_access;
    node.busy_gpu_policy = plan
        .spec
        .rollout
        .as_ref()
        .map(|r| r.busy_gpu_policy)
        .unwrap_or_default();
    if !check.is_valid() {
        node.state = NodeState::Failed("the plan is not valid; see its Valid condition".into());
        return;
    }
    match resolve_layout(winner, plan, node.inventory, memo) {
        Ok((gpus, dedicated)) => {
            node.gpus = gpus.into();
            node.dedicated = dedicated.into();
            node.state = NodeState::Planned;
        }
        Err((field, message)) => {
            node.decided.problem = Some(Problem::new(
                "GpuPartitionPlan",
                &plan.name_any(),
                field,
                format!("node {}: {message}", node.inventory.name),
            ));
            node.state = NodeState::Failed(message);
        }
    }
}

/// The problems the nodes' plans have, in node order: each node's, then each conflict once per
/// plan pair, with the nodes it covers counted.
fn fleet_problems(nodes: &[NodeDesired], plans: &[&GpuPartitionPlan]) -> Vec<Problem> {
    let mut problems: Vec<Problem> = nodes.iter().filter_map(|n| n.decided.problem.clone()).collect();
    let mut conflicts: BTreeMap<(usize, usize), Vec<&str>> = BTreeMap::new();
    for node in nodes {
        let tied = &node.decided.tied;
        for (a, &i) in tied.iter().enumerate() {
            for &j in &tied[a + 1..] {
                conflicts
                    .entry((i.min(j), i.max(j)))
                    .or_default()
                    .push(&node.inventory.name);
            }
        }
    }
    for ((i, j), nodes) in conflicts {
        for (me, other) in [(i, j), (j, i)] {
            problems.push(Problem::new(
                "GpuPartitionPlan",
                &plans[me].name_any(),
                "spec.nodeSelector",
                format!(
                    "selects {} node{} ({}{}) that GpuPartitionPlan/{} also selects at the same priority {}; neither applies there. Raise one plan's priority or narrow a selector",
                    nodes.len(),
                    if nodes.len() == 1 { "" } else { "s" },
                    nodes.iter().take(3).copied().collect::<Vec<_>>().join(", "),
                    if nodes.len() > 3 { ", ..." } else { "" },
                    plans[other].name_any(),
                    plans[me].spec.priority
                ),
            ));
        }
    }
    problems
}

type Resolved = (Vec<GpuSpec>, Vec<Vec<String>>);

/// A plan field and a message about it.
type FieldError = (String, String);

/// The plan's groups on this node's GPUs. Errors carry the plan field and a message.
fn resolve_layout(
    plan_idx: usize,
    plan: &GpuPartitionPlan,
    inv: &NodeInventory,
    memo: &mut LayoutMemo,
) -> Result<Resolved, FieldError> {
    let count = inv.gpus.len() as u32;
    let mut gpus = Vec::with_capacity(inv.gpus.len());
    let mut dedicated = Vec::with_capacity(inv.gpus.len());
    for (g, group) in plan.spec.gpus.iter().enumerate() {
        // Field names are written only for an error: this runs for every group of every node.
        let devices_field = || format!("spec.gpus[{g}].devices");
        let indices = expand_devices(&group.devices, count).map_err(|e| (devices_field(), e.to_string()))?;
        for index in indices {
            let Some(gpu) = inv.gpus.get(index as usize) else {
                return Err((
                    devices_field(),
                    format!("has {count} GPUs, so GPU {index} does not exist"),
                ));
            };
            let mut spec = group_spec(g, group, index, gpu)?;
            if let Some(mig) = &group.mig {
                spec.mig_instances = mig_layout((plan_idx, g), mig, index, gpu, memo)?;
            }
            gpus.push(spec);
            // Sorted: the allocation's pools are keyed by it (`allocate::pools`).
            let mut tenants = group.tenants.clone();
            tenants.sort();
            dedicated.push(tenants);
        }
    }
    Ok((gpus, dedicated))
}

/// The `g`th group's spec for `gpu` (the node's `index`th), its MIG instances still to lay out;
/// an MPS group without settings has the defaults, and its settings must suit the GPU.
fn group_spec(g: usize, group: &GpuGroup, index: u32, gpu: &NodeGpu) -> Result<GpuSpec, FieldError> {
    let mps = match group.mode {
        Mode::Mps => Some(MpsSettings::in_effect(group.mps.as_ref()).clone()),
        _ => group.mps.clone(),
    };
    let spec = GpuSpec {
        mps,
        time_slicing: group.time_slicing.clone(),
        ..GpuSpec::new(index, group.mode)
    };
    if let Some(mps) = &spec.mps {
        if let Some(message) = mps_clients_problem(mps, &gpu.name, gpu.compute_capability) {
            return Err((
                format!("spec.gpus[{g}].mps.maxClients"),
                format!("GPU {index}: {message}"),
            ));
        }
        if let Some(message) = mps_pinned_problem(mps, &gpu.name, gpu.memory_mib) {
            return Err((format!("spec.gpus[{g}].mps.pinnedMemoryLimit"), message));
        }
    }
    Ok(spec)
}

/// The MIG instances of the `g`th group of the `plan_idx`th plan on `gpu` (the node's `index`th): solved for an empty
/// GPU, else keeping the instances that can stay (minimal disruption).
fn mig_layout(
    (plan_idx, g): (usize, usize),
    mig: &MigSettings,
    index: u32,
    gpu: &NodeGpu,
    memo: &mut LayoutMemo,
) -> Result<Vec<MigInstanceSpec>, FieldError> {
    let field = || format!("spec.gpus[{g}].mig.profiles");
    let Some(model) = gpu.model else {
        return Err((
            field(),
            format!("GPU {index} ({}) is not a MIG-capable model known here", gpu.name),
        ));
    };
    let key = (plan_idx, g, model.key);
    let layout = if gpu.instances.is_empty() {
        memo.solved
            .entry(key)
            .or_insert_with(|| solve_named(model, &mig.profiles).map_err(|e| e.to_string()))
            .clone()
    } else {
        // One look-up where the set was seen before: nearly every GPU of a group has one of a few sets.
        let kept = memo.kept.entry(key).or_default();
        match kept.get(gpu.instances.as_slice()) {
            Some(layout) => layout.clone(),
            None => {
                let layout = diff_layout(model, &gpu.instances, &mig.profiles)
                    .map(|d| d.result())
                    .map_err(|e| e.to_string());
                kept.insert(gpu.instances.clone(), layout.clone());
                layout
            }
        }
    };
    layout.map_err(|e| (field(), format!("GPU {index} ({}): {e}", model.key)))
}
