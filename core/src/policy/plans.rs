//! Checks on a GpuPartitionPlan alone (no nodes): device ranges, MIG feasibility for the GPU
//! models its selector names, dedicated tenants, and the device plugin's one-sharing-per-node rule.

use crate::api::{GpuGroup, GpuPartitionPlan, Mode};
use crate::device_plugin::{NodeConfig, Sharing};
use crate::devices::parse_devices;
use crate::labels::GPU_PRODUCT as LABEL_GPU_PRODUCT;
use crate::mig::{GpuModel, model_by_name, solve_named};
use crate::problem::Problem;
use crate::selectors::selector_problems;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;
use std::collections::BTreeSet;

/// The outcome of checking one plan.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PlanCheck {
    pub problems: Vec<Problem>,
}

impl PlanCheck {
    pub fn is_valid(&self) -> bool {
        self.problems.is_empty()
    }
}

const KIND: &str = "GpuPartitionPlan";

/// GPU models a selector names through `nvidia.com/gpu.product` (matchLabels or `In`).
pub fn models_selected_by(selector: &LabelSelector) -> Vec<&'static GpuModel> {
    let mut names: Vec<&str> = Vec::new();
    if let Some(v) = selector.match_labels.as_ref().and_then(|l| l.get(LABEL_GPU_PRODUCT)) {
        names.push(v);
    }
    for req in selector.match_expressions.iter().flatten() {
        if req.key == LABEL_GPU_PRODUCT && req.operator == "In" {
            names.extend(req.values.iter().flatten().map(String::as_str));
        }
    }
    let mut models: Vec<&'static GpuModel> = names.into_iter().filter_map(model_by_name).collect();
    models.sort_by_key(|m| m.key);
    models.dedup_by_key(|m| m.key);
    models
}

/// GPU models of the nodes a plan's selector selects: a plan must fit these too (one list of
/// problems for `validate`, `plan` and the controller).
pub fn models_of_selected_nodes(
    plan: &GpuPartitionPlan,
    nodes: &[crate::inventory::NodeInventory],
) -> Vec<&'static GpuModel> {
    let selector = crate::selectors::ParsedSelector::of(&plan.spec.node_selector);
    // A fleet has a few models over thousands of GPUs: each kept once as it is met.
    let mut models: Vec<&'static GpuModel> = Vec::new();
    for model in nodes
        .iter()
        .filter(|n| selector.matches(&n.labels))
        .flat_map(|n| n.gpus.iter().filter_map(|g| g.model))
    {
        if !models.iter().any(|m| m.key == model.key) {
            models.push(model);
        }
    }
    models.sort_by_key(|m| m.key);
    models
}

/// MPS settings the device plugin's MPS daemon cannot honour. The plugin runs the one MPS daemon of a
/// node (docs/concepts/isolation.md#mps): it gives every client `100 / replicas` percent of the threads and
/// `memory / replicas` of pinned memory (`cmd/mps-control-daemon/mps/daemon.go`). Pinned memory
/// depends on the GPU's memory, so it is checked per node by the planner ([`mps_pinned_problem`]).
fn mps_problems(g: &crate::api::GpuGroup) -> Vec<(&'static str, String)> {
    let Some(mps) = &g.mps else { return vec![] };
    let mut out = Vec::new();
    let equal = 100 / mps.max_clients.max(1);
    if let Some(p) = mps.active_thread_percentage
        && p != equal
    {
        out.push((
            "activeThreadPercentage",
            format!(
                "the device plugin's MPS daemon gives each of {} clients {equal}% of the threads (100 / maxClients); set {equal} or remove activeThreadPercentage",
                mps.max_clients
            ),
        ));
    }
    out
}

/// The pinned memory the device plugin's MPS daemon gives each client on a GPU with `memory_mib`,
/// and a problem when the plan asks for another value.
pub fn mps_pinned_problem(mps: &crate::api::MpsSettings, gpu_name: &str, memory_mib: u64) -> Option<String> {
    let asked = mps.pinned_memory_limit.as_deref()?;
    let per_client = memory_mib / u64::from(mps.max_clients.max(1));
    match crate::api::quantity_to_mib(asked) {
        Some(mib) if mib == per_client => None,
        _ => Some(format!(
            "the device plugin's MPS daemon pins each client to GPU memory / maxClients, {per_client}Mi on {gpu_name} with {} clients; set {per_client}Mi or remove pinnedMemoryLimit",
            mps.max_clients
        )),
    }
}

/// The most MPS clients NVIDIA's MPS control daemon serves on one GPU: 48 from compute capability
/// 7.5, 16 below (`cmd/mps-control-daemon/mps/device.go` `maxClients`; it refuses the config
/// with "invalid device maximum allowed replicas exceeded"). A GPU of unknown capability gets 16.
pub fn mps_clients_problem(
    mps: &crate::api::MpsSettings,
    gpu_name: &str,
    compute_capability: Option<(u32, u32)>,
) -> Option<String> {
    let most = match compute_capability {
        Some(cc) if cc >= (7, 5) => 48,
        _ => 16,
    };
    (mps.max_clients > most).then(|| {
        let of = match compute_capability {
            Some((major, minor)) => format!("{gpu_name} has compute capability {major}.{minor}"),
            None => format!(
                "the compute capability of {gpu_name} is not known (its agent reports it; offline, give computeCapability in the inventory)"
            ),
        };
        format!(
            "NVIDIA's MPS daemon serves at most 16 clients per GPU below compute capability 7.5 and 48 from it; {of}, so set maxClients to at most {most}"
        )
    })
}

/// Checks a plan on its own. `tenants` are the names of all tenants (valid or not).
/// `extra_models` are GPU models the plan must fit besides those its selector names (e.g. the
/// models of inventory nodes it selects).
pub fn check_plan(
    plan: &GpuPartitionPlan,
    tenants: &BTreeSet<String>,
    extra_models: &[&'static GpuModel],
) -> PlanCheck {
    let name = plan.name_any();
    let mut problems = node_selector_problems(plan, &name);
    problems.extend(group_problems(plan, &name, tenants));
    problems.extend(mig_problems(plan, &name, extra_models));

    // The plan's groups land on the same nodes, so they must make one device-plugin config.
    if let Err((i, conflict)) = NodeConfig::fold(plan.spec.gpus.iter().map(|g| (g.mode, Sharing::of_group(g)))) {
        problems.push(problem(&name, format!("spec.gpus[{i}].mode"), conflict.to_string()));
    }
    for (i, g) in plan.spec.gpus.iter().enumerate() {
        problems.extend(
            mps_problems(g)
                .into_iter()
                .map(|(f, m)| problem(&name, format!("spec.gpus[{i}].mps.{f}"), m)),
        );
    }
    PlanCheck { problems }
}

fn problem(name: &str, field: impl Into<String>, message: impl Into<String>) -> Problem {
    Problem::new(KIND, name, field, message)
}

/// The selector parses and selects something narrower than every node.
fn node_selector_problems(plan: &GpuPartitionPlan, name: &str) -> Vec<Problem> {
    let mut problems = Vec::new();
    for p in selector_problems(&plan.spec.node_selector) {
        let (field, msg) = p.split_once(": ").unwrap_or(("", &p));
        problems.push(problem(name, format!("spec.nodeSelector.{field}"), msg));
    }
    let selector = &plan.spec.node_selector;
    if selector.match_labels.as_ref().is_none_or(|l| l.is_empty())
        && selector.match_expressions.as_ref().is_none_or(|e| e.is_empty())
    {
        problems.push(problem(
            name,
            "spec.nodeSelector",
            "an empty selector would take every node; select the GPU nodes, e.g. matchLabels nvidia.com/gpu.present: \"true\"",
        ));
    }
    problems
}

/// Each GPU group: its devices parse and belong to no other group, its tenants exist, its
/// settings suit its mode; `all` devices make the plan's only group.
fn group_problems(plan: &GpuPartitionPlan, name: &str, tenants: &BTreeSet<String>) -> Vec<Problem> {
    let mut problems = Vec::new();
    let mut claimed: Vec<(u32, usize)> = Vec::new();
    let mut has_all = false;
    for (i, g) in plan.spec.gpus.iter().enumerate() {
        if g.devices == "all" {
            has_all = true;
        } else {
            problems.extend(device_problems(g, i, name, &mut claimed));
        }
        for (k, t) in g.tenants.iter().enumerate() {
            if !tenants.contains(t) {
                problems.push(problem(
                    name,
                    format!("spec.gpus[{i}].tenants[{k}]"),
                    format!(
                        "GpuTenant {t:?} not found; dedicated GPUs would sit idle. Create the tenant or fix the name"
                    ),
                ));
            }
        }
        problems.extend(settings_problem(g, i, name));
    }
    if has_all && plan.spec.gpus.len() > 1 {
        problems.push(problem(
            name,
            "spec.gpus",
            "devices 'all' must be the only GPU group of a plan",
        ));
    }
    problems
}

/// The `i`th group's device list parses and names no GPU an earlier group `claimed`.
fn device_problems(g: &GpuGroup, i: usize, name: &str, claimed: &mut Vec<(u32, usize)>) -> Vec<Problem> {
    let list = match parse_devices(&g.devices) {
        Err(e) => return vec![problem(name, format!("spec.gpus[{i}].devices"), e.to_string())],
        Ok(list) => list,
    };
    let mut problems = Vec::new();
    for d in list {
        if let Some(&(_, j)) = claimed.iter().find(|(c, _)| *c == d) {
            problems.push(problem(
                name,
                format!("spec.gpus[{i}].devices"),
                format!("GPU {d} is also in spec.gpus[{j}].devices; each GPU belongs to one group"),
            ));
        } else {
            claimed.push((d, i));
        }
    }
    problems
}

/// The schema says the same; repeated here for files that never meet the API server.
fn settings_problem(g: &GpuGroup, i: usize, name: &str) -> Option<Problem> {
    let settings_ok = match g.mode {
        Mode::Mig => g.mig.is_some() && g.mps.is_none() && g.time_slicing.is_none(),
        Mode::Mps => g.mig.is_none() && g.time_slicing.is_none(),
        Mode::TimeSlicing => g.time_slicing.is_some() && g.mig.is_none() && g.mps.is_none(),
        Mode::Exclusive => g.mig.is_none() && g.mps.is_none() && g.time_slicing.is_none(),
    };
    (!settings_ok).then(|| {
        problem(
            name,
            format!("spec.gpus[{i}]"),
            format!(
                "mode {} takes {}",
                g.mode,
                match g.mode {
                    Mode::Mig => "mig settings only",
                    Mode::Mps => "no settings but mps",
                    Mode::TimeSlicing => "timeSlicing settings only",
                    Mode::Exclusive => "no mig, mps or timeSlicing settings",
                }
            ),
        )
    })
}

/// Each group's MIG layout fits every model the plan may land on: those its selector names and
/// the `extra_models`.
fn mig_problems(plan: &GpuPartitionPlan, name: &str, extra_models: &[&'static GpuModel]) -> Vec<Problem> {
    let mut models = models_selected_by(&plan.spec.node_selector);
    models.extend_from_slice(extra_models);
    models.sort_by_key(|m| m.key);
    models.dedup_by_key(|m| m.key);
    let mut problems = Vec::new();
    for (i, g) in plan.spec.gpus.iter().enumerate() {
        let Some(mig) = &g.mig else { continue };
        for model in &models {
            if let Err(e) = solve_named(model, &mig.profiles) {
                problems.push(problem(
                    name,
                    format!("spec.gpus[{i}].mig.profiles"),
                    format!("on {}: {e}", model.key),
                ));
            }
        }
    }
    problems
}
