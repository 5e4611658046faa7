//! `gpu-tenancy plan -f PATH... --inventory FILE`: what the controller would write, offline.

use super::load::{FileProblem, Limits, LoadError, load};
use super::output::{print_table, print_table_within, wrap};
use super::validate::inventories;
use crate::api::{ConditionSet, GpuSpec, GpuTenant, Mode};
use crate::desired::{Desired, Settings, desired};
use crate::inventory::InventoryFile;
use crate::planner::PlanInput;
use crate::problem::Problem;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// `plan -o`: like [`Output`], with `wide` for the table with every MIG instance's placement and
/// tenant (the default table counts instances by profile, as `kubectl get gpunodes` does, so it
/// fits 120 columns).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum PlanOutput {
    /// Aligned columns for people, one line per GPU, at most 120 columns on the examples.
    #[default]
    Table,
    /// The table with each MIG instance as `profile@start=tenant`.
    Wide,
    /// YAML: the manifests the controller applies.
    Yaml,
    /// JSON: the whole desired state, with problems.
    Json,
    /// Kueue's Configuration fragment that counts the tenants' ResourceClaims
    /// (`resources.deviceClassMappings`), to merge into Kueue's own (implies `--kueue`).
    KueueConfig,
}

/// What `plan -o json` prints: the desired state with problems as `FILE: Kind/name: field: message`
/// (in place of the planner's own, which name no file).
#[derive(Serialize)]
struct JsonReport<'a> {
    #[serde(flatten)]
    desired: &'a Desired,
    problems: &'a [String],
}

pub fn run(paths: &[PathBuf], inventory: Option<&Path>, output: PlanOutput, kueue: bool) -> i32 {
    let settings = Settings {
        kueue: kueue || output == PlanOutput::KueueConfig,
        ..Settings::default()
    };
    let (mut desired, problem_lines) = match compute_with(paths, inventory, Time(jiff::Timestamp::now()), &settings) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    match output {
        PlanOutput::Table => print_tables(&desired, &problem_lines, false),
        PlanOutput::Wide => print_tables(&desired, &problem_lines, true),
        PlanOutput::Json => {
            // Streamed: at 50,000 nodes the document is most of a gigabyte, and a copy of it as
            // a JSON value took more memory and time than planning it.
            desired.problems.clear();
            let report = JsonReport {
                desired: &desired,
                problems: &problem_lines,
            };
            let mut out = std::io::BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
            let written = serde_json::to_writer_pretty(&mut out, &report)
                .map_err(std::io::Error::from)
                .and_then(|()| writeln!(out))
                .and_then(|()| out.flush());
            if let Err(e) = written {
                eprintln!("error: cannot write the plan to standard output: {e}");
                return 2;
            }
        }
        PlanOutput::KueueConfig => {
            for line in &problem_lines {
                println!("# problem: {line}");
            }
            let fragment = crate::kueue::configuration_fragment(&desired.kueue_device_class_mappings);
            print!(
                "{}",
                serde_saphyr::to_string(&fragment).expect("the fragment serialises")
            );
        }
        PlanOutput::Yaml => {
            for line in &problem_lines {
                println!("# problem: {line}");
            }
            print!("{}", manifests_yaml(&desired));
        }
    }
    // Freed on another thread: at 50,000 nodes the plan is millions of small allocations, and the
    // process is about to end (which does not wait for that thread).
    std::thread::spawn(move || drop(desired));
    if problem_lines.is_empty() { 0 } else { 1 }
}

/// Why `plan` cannot plan (exit 2): input it cannot read, or a fleet it cannot tell.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("inventory: {0}")]
    InventoryRead(LoadError),
    /// `why`: the parser's first line, or which YAML limit the file is over.
    #[error("{}: not an inventory file: {why}", .path.display())]
    NotInventory { path: PathBuf, why: String },
    #[error("inventory: the reader panicked")]
    InventoryReaderPanicked,
    #[error(
        "{gpu_nodes} GpuNode objects and no Nodes given: a GpuNode is a node's running state, planned with its Node; give the cluster's Nodes too (kubectl get nodes,gpunodes,gputenancy -o yaml, without --inventory), or leave the GpuNodes out to plan the inventory file"
    )]
    GpuNodesWithoutNodes { gpu_nodes: usize },
    #[error(
        "--inventory {} and {nodes} Node objects given: plan either an inventory file or a cluster's Nodes and GpuNodes, not both",
        .inventory.display()
    )]
    InventoryAndNodes { inventory: PathBuf, nodes: usize },
    #[error(
        "no nodes to plan: give --inventory FILE, or a cluster's Nodes and GpuNodes (kubectl get nodes,gpunodes,gputenancy -o yaml | gpu-tenancy plan -f -)"
    )]
    NoNodes,
    #[error("an inventory file and Node objects given: plan either, not both")]
    InventoryFileAndNodes,
}

/// Loads the manifests and the inventory and computes the desired state, as the controller would:
/// the one function [`desired`]. Problems come back as lines naming file, object and field.
///
/// The fleet is the `--inventory` file, or a live cluster's Nodes and GpuNodes among the
/// manifests (`kubectl get nodes,gpunodes,gputenancy -o yaml`), read as the controller reads
/// them ([`crate::inventory::cluster_inventories`]), running state and share counts included.
pub fn compute(paths: &[PathBuf], inventory: Option<&Path>, now: Time) -> Result<(Desired, Vec<String>), PlanError> {
    compute_with(paths, inventory, now, &Settings::default())
}

/// [`compute`] with the controller's settings (`plan --kueue`: [`Settings::kueue`]).
pub fn compute_with(
    paths: &[PathBuf],
    inventory: Option<&Path>,
    now: Time,
    settings: &Settings,
) -> Result<(Desired, Vec<String>), PlanError> {
    let limits = Limits::from_env()?;
    // The inventory is parsed on a second thread while the manifests load: at 50,000 nodes each is
    // about a second and a half of YAML.
    let (loaded, inventory_file) = std::thread::scope(|s| {
        let inventory_file = inventory.map(|path| (path, s.spawn(move || read_inventory(path, &limits))));
        let loaded = load(paths);
        let inventory_file = inventory_file.map(|(path, h)| {
            let read = h.join();
            (path, read.unwrap_or(Err(PlanError::InventoryReaderPanicked)))
        });
        (loaded, inventory_file)
    });
    let mut loaded = loaded?;
    match (inventory_file, loaded.cluster_nodes.is_empty()) {
        (Some(_), true) if !loaded.nodes.is_empty() => {
            return Err(PlanError::GpuNodesWithoutNodes {
                gpu_nodes: loaded.nodes.len(),
            });
        }
        (Some((_, inv)), true) => {
            // The inventory named by --inventory counts once, even when it also sits in a -f folder.
            loaded.inventories.clear();
            loaded.inventories.push(inv?);
        }
        (Some((path, _)), false) => {
            return Err(PlanError::InventoryAndNodes {
                inventory: path.to_path_buf(),
                nodes: loaded.cluster_nodes.len(),
            });
        }
        (None, true) if loaded.inventories.is_empty() => {
            return Err(PlanError::NoNodes);
        }
        (None, _) if !loaded.inventories.is_empty() && !loaded.cluster_nodes.is_empty() => {
            return Err(PlanError::InventoryFileAndNodes);
        }
        (None, _) => {}
    }
    // Schema and CEL problems of the files; objects that failed them never reach the planner.
    let mut found: Vec<FileProblem> = loaded.problems.clone();
    let nodes = if loaded.cluster_nodes.is_empty() {
        inventories(&loaded, &mut found)
    } else {
        crate::inventory::cluster_inventories(&loaded.cluster_nodes, &loaded.nodes)
    };
    let tenants: Vec<Arc<GpuTenant>> = loaded.tenants.iter().cloned().map(Arc::new).collect();
    let out = desired(
        &PlanInput {
            policies: &loaded.policies,
            tenants: &tenants,
            plans: &loaded.plans,
            nodes: &nodes,
        },
        settings,
        &now,
    );
    for p in &out.problems {
        let Problem { object, field, message } = p.clone();
        let file = loaded.origin.get(&object).cloned().unwrap_or_else(|| "-".into());
        found.push(FileProblem {
            file,
            object,
            field,
            message,
        });
    }
    found.sort();
    found.dedup();
    // The parsed input, freed on another thread while this one prints the plan.
    std::thread::spawn(move || drop((loaded, nodes)));
    Ok((out, found.iter().map(ToString::to_string).collect()))
}

/// The `--inventory` file, read and parsed, with the name its problems will carry.
fn read_inventory(path: &Path, limits: &Limits) -> Result<(String, InventoryFile), PlanError> {
    let text = limits.read(path).map_err(PlanError::InventoryRead)?;
    let inv = serde_saphyr::from_str_with_options::<InventoryFile>(&text, limits.yaml_options()).map_err(|e| {
        let why = limits
            .breach(&e)
            .unwrap_or_else(|| e.to_string().lines().next().unwrap_or("").to_string());
        PlanError::NotInventory {
            path: path.to_path_buf(),
            why,
        }
    })?;
    Ok((path.display().to_string(), inv))
}

/// The objects the controller writes, as one multi-document YAML stream for `kubectl apply -f -`,
/// kind by kind in the order the controller writes them: every row of the controller's table of
/// kinds but those of which it writes only a status ([`crate::controller::kinds::manifests`]).
/// (Statuses are not applyable; `-o json` has them.)
pub fn manifests_yaml(desired: &Desired) -> String {
    struct Docs(Vec<String>);
    impl crate::controller::kinds::Manifests for Docs {
        fn object<T: Serialize>(&mut self, _: crate::controller::kinds::Kind, object: &T) {
            self.0
                .push(serde_saphyr::to_string(object).expect("a Kubernetes object serialises"));
        }
    }
    let mut docs = Docs(Vec::new());
    crate::controller::kinds::manifests(desired, &mut docs);
    docs.0.join("---\n")
}

fn print_tables(desired: &Desired, problems: &[String], wide: bool) {
    let (nodes, tenants) = (&desired.nodes, &desired.tenants);
    let mut rows = Vec::new();
    for node in nodes {
        if node.spec.gpus.is_empty() {
            rows.push(vec![
                node.name_any(),
                node.spec.plan.clone().unwrap_or("-".into()),
                "-".into(),
                "-".into(),
                "unchanged".into(),
                "-".into(),
                "-".into(),
            ]);
        }
        for g in &node.spec.gpus {
            let (layout, tenants) = gpu_cells(g, wide);
            rows.push(vec![
                node.name_any(),
                node.spec.plan.clone().unwrap_or("-".into()),
                g.index.to_string(),
                g.mode.to_string(),
                layout,
                tenants,
                format!("{:?}", g.scrub),
            ]);
        }
    }
    // The default output fits a terminal of this many columns; `-o wide` is as wide as it needs.
    let width = if wide { usize::MAX } else { TABLE_WIDTH };
    println!("NODES");
    let layout = if wide {
        "LAYOUT (profile@start=tenant)"
    } else {
        "LAYOUT"
    };
    print_table_within(
        &["NODE", "PLAN", "GPU", "MODE", layout, "TENANTS", "SCRUB"],
        &rows,
        width,
    );

    let rows: Vec<Vec<String>> = tenants
        .iter()
        .map(|t| {
            let s = t.status.clone().unwrap_or_default();
            let ready = s.conditions.iter().find(|c| c.type_ == ConditionSet::READY);
            vec![
                t.name_any(),
                t.spec.tier.clone(),
                t.spec.priority.to_string(),
                s.summary.unwrap_or_default(),
                s.granted_memory_mib
                    .map(|m| format!("{}Gi", m / 1024))
                    .unwrap_or("-".into()),
                ready.map(|c| c.status.clone()).unwrap_or("-".into()),
                ready.map(|c| c.message.clone()).unwrap_or_default(),
            ]
        })
        .collect();
    println!("\nTENANTS");
    print_table_within(
        &["TENANT", "TIER", "PRIORITY", "GRANTED", "MEMORY", "READY", "MESSAGE"],
        &rows,
        width,
    );

    print_enforcement(desired, width);

    if !problems.is_empty() {
        println!("\nPROBLEMS");
        for p in problems {
            println!("{p}");
        }
    }
}

/// What enforces the grants: quotas per namespace, node labels and taints, admission, changes.
fn print_enforcement(desired: &Desired, width: usize) {
    let rows: Vec<Vec<String>> = desired
        .resource_quotas
        .iter()
        .map(|q| {
            let hard = q.spec.as_ref().and_then(|s| s.hard.clone()).unwrap_or_default();
            let nonzero: Vec<String> = hard
                .iter()
                .filter(|(_, v)| v.0 != "0")
                .map(|(k, v)| format!("{}={}", k.trim_start_matches("requests."), v.0))
                .collect();
            vec![
                q.namespace().unwrap_or_default(),
                q.labels().get(crate::labels::TENANT).cloned().unwrap_or("-".into()),
                if nonzero.is_empty() {
                    "no GPUs".into()
                } else {
                    nonzero.join(" ")
                },
            ]
        })
        .collect();
    println!("\nQUOTAS (every other GPU resource is 0)");
    print_table_within(&["NAMESPACE", "TENANT", "HARD"], &rows, width);

    let rows: Vec<Vec<String>> = desired
        .node_labels
        .iter()
        .map(|n| {
            let taints: Vec<String> = n
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default()
                .iter()
                .map(|t| format!("{}={}:{}", t.key, t.value.clone().unwrap_or_default(), t.effect))
                .collect();
            vec![
                n.name_any(),
                n.labels()
                    .get(crate::labels::DEVICE_PLUGIN_CONFIG)
                    .cloned()
                    .unwrap_or_default(),
                if taints.is_empty() {
                    "-".into()
                } else {
                    taints.join(" ")
                },
            ]
        })
        .collect();
    println!("\nNODE LABELS AND TAINTS");
    print_table_within(&["NODE", "DEVICE PLUGIN CONFIG", "TAINTS"], &rows, width);
    println!(
        "\nADMISSION: {} ValidatingAdmissionPolicies with their bindings",
        desired.admission_policies.len()
    );
    let names: Vec<String> = desired.admission_policies.iter().map(|p| p.name_any()).collect();
    for line in wrap(&names.join(" "), width.saturating_sub(2)) {
        println!("  {line}");
    }

    if !desired.changes.is_empty() {
        let rows: Vec<Vec<String>> = desired.changes.iter().map(change_row).collect();
        println!("\nCHANGES");
        // Not wrapped: a reason on lines of its own would double the list.
        print_table(
            &["NODE", "GPU", "INSTANCE", "FROM", "TO", "WHY", "SCRUB", "EVICT"],
            &rows,
        );
    }
}

/// A GPU's LAYOUT and TENANTS cells. Default: MIG instances counted by profile
/// (`3g.40gb+2×2g.20gb`, the form of `kubectl get gpunodes`), an MPS GPU's clients, and at most
/// three tenants, so a row stays short whatever the GPU holds. Wide: every instance as
/// `profile@start=tenant`, and the MPS limits.
fn gpu_cells(g: &GpuSpec, wide: bool) -> (String, String) {
    let layout = match g.mode {
        Mode::Mig if g.mig_instances.is_empty() => "MIG on, no instances".to_string(),
        Mode::Mig if wide => g
            .mig_instances
            .iter()
            .map(|i| {
                format!(
                    "{}@{}{}",
                    i.profile,
                    i.placement.start,
                    i.tenant.as_ref().map(|t| format!("={t}")).unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join(" "),
        Mode::Mig => crate::gpu::status::counted_profile_names(g.mig_instances.iter().map(|i| i.profile.as_str())),
        Mode::Mps if !wide => format!("{} clients", g.mps.clone().unwrap_or_default().max_clients),
        Mode::Mps => {
            let m = g.mps.clone().unwrap_or_default();
            let mut s = format!("{} clients", m.max_clients);
            if let Some(p) = m.active_thread_percentage {
                s.push_str(&format!(", {p}% threads"));
            }
            if let Some(l) = &m.pinned_memory_limit {
                s.push_str(&format!(", {l} pinned"));
            }
            s
        }
        Mode::TimeSlicing => format!("{} replicas", g.time_slicing.as_ref().map_or(0, |t| t.replicas)),
        Mode::Exclusive => "whole GPU".into(),
    };
    // A MIG GPU's tenants are its instances' (in wide, already in the layout).
    let mut names: Vec<&str> = g.tenants.iter().map(String::as_str).collect();
    if g.mode == Mode::Mig && !wide {
        for t in g.mig_instances.iter().filter_map(|i| i.tenant.as_deref()) {
            if !names.contains(&t) {
                names.push(t);
            }
        }
    }
    let tenants = match names.len() {
        0 => "-".to_string(),
        n if n > MAX_TENANTS_SHOWN && !wide => {
            format!(
                "{} +{} more",
                names[..MAX_TENANTS_SHOWN].join(","),
                n - MAX_TENANTS_SHOWN
            )
        }
        _ => names.join(","),
    };
    (layout, tenants)
}

/// The width the default table keeps to: a terminal's, with room to spare.
pub const TABLE_WIDTH: usize = 120;

/// Tenants named per GPU in the default table; `-o wide` names them all.
const MAX_TENANTS_SHOWN: usize = 3;

fn change_row(c: &crate::planner::BindingChange) -> Vec<String> {
    let list = |t: &[String]| if t.is_empty() { "-".to_string() } else { t.join(",") };
    vec![
        c.node.clone(),
        c.gpu.to_string(),
        match (&c.profile, &c.placement) {
            (Some(p), Some(at)) => format!("{p}@{}", at.start),
            _ => "whole GPU".into(),
        },
        list(&c.old_tenants),
        list(&c.new_tenants),
        c.reason.to_string(),
        if c.scrub { "yes" } else { "no" }.into(),
        if c.may_evict { "may" } else { "no" }.into(),
    ]
}
