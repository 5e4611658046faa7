//! `gpu-tenancy validate -f PATH...`

use super::load::{FileProblem, Loaded, load};
use crate::inventory::NodeInventory;
use crate::policy::{check_plan, check_policies, check_tenants, models_of_selected_nodes};
use crate::problem::Problem;
use kube::ResourceExt;
use std::collections::BTreeSet;
use std::path::PathBuf;

/// All problems of the manifests under `paths`: schema and CEL, policy references, MIG feasibility.
pub fn problems(loaded: &Loaded, inventory: &[NodeInventory]) -> Vec<FileProblem> {
    let mut out: Vec<FileProblem> = loaded.problems.clone();
    let mut found: Vec<Problem> = check_policies(&loaded.policies);
    // References are only judged when the files hold what they refer to; a lone tenant file is fine.
    if !loaded.policies.is_empty() {
        found.extend(
            // Offline, the namespaces the controller exempts by default (its flags may add more).
            check_tenants(
                &loaded.policies,
                &loaded.tenants,
                &crate::desired::Settings::default().exempt(),
            )
            .invalid
            .into_values()
            .flatten(),
        );
    }
    let tenant_names: BTreeSet<String> = loaded.tenants.iter().map(|t| t.name_any()).collect();
    for plan in &loaded.plans {
        let models = models_of_selected_nodes(plan, inventory);
        let check = check_plan(plan, &tenant_names, &models);
        found.extend(check.problems.into_iter().filter(|p| {
            // Without tenants in the files, a dedication cannot be checked.
            !(tenant_names.is_empty() && p.field.contains(".tenants["))
        }));
    }
    for p in found {
        let file = loaded.origin.get(&p.object).cloned().unwrap_or_else(|| "-".into());
        out.push(FileProblem {
            file,
            object: p.object,
            field: p.field,
            message: p.message,
        });
    }
    out.sort();
    out.dedup();
    out
}

/// Resolves the inventories in the files; their problems become file problems.
pub fn inventories(loaded: &Loaded, problems: &mut Vec<FileProblem>) -> Vec<NodeInventory> {
    let mut nodes = Vec::new();
    for (file, inv) in &loaded.inventories {
        match inv.resolve() {
            Ok(n) => nodes.extend(n),
            Err(errors) => problems.extend(errors.into_iter().map(|e| {
                let (field, message) = e
                    .split_once(": ")
                    .map_or((e.clone(), String::new()), |(f, m)| (f.into(), m.into()));
                FileProblem {
                    file: file.clone(),
                    object: "inventory".into(),
                    field,
                    message,
                }
            })),
        }
    }
    nodes
}

pub fn run(paths: &[PathBuf]) -> i32 {
    let loaded = match load(paths) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    let mut inv_problems = Vec::new();
    let nodes = inventories(&loaded, &mut inv_problems);
    let mut all = problems(&loaded, &nodes);
    all.extend(inv_problems);
    all.sort();
    for p in &all {
        println!("{p}");
    }
    let objects = loaded.policies.len() + loaded.tenants.len() + loaded.plans.len() + loaded.nodes.len();
    if all.is_empty() {
        eprintln!(
            "valid: {objects} objects ({} policies, {} tenants, {} plans, {} nodes), {} inventory nodes",
            loaded.policies.len(),
            loaded.tenants.len(),
            loaded.plans.len(),
            loaded.nodes.len(),
            nodes.len()
        );
        0
    } else {
        eprintln!("{} problem{} found", all.len(), if all.len() == 1 { "" } else { "s" });
        1
    }
}
