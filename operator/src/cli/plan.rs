//! `gpu-tenancy plan -f PATH... --inventory FILE`: what the controller would write, offline.

use super::load::{FileProblem, load};
use super::output::{Output, print_data, print_table};
use super::validate::{inventories, problems};
use crate::api::{ConditionSet, GpuNode, GpuTenant, Mode};
use crate::inventory::InventoryFile;
use crate::planner::{PlanInput, plan};
use crate::problem::Problem;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use serde::Serialize;
use std::path::{Path, PathBuf};

#[derive(Serialize)]
struct PlanReport<'a> {
    nodes: &'a [GpuNode],
    tenants: &'a [GpuTenant],
    problems: Vec<String>,
}

pub fn run(paths: &[PathBuf], inventory: &Path, output: Output) -> i32 {
    let mut loaded = match load(paths) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    let inv_text = match std::fs::read_to_string(inventory) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: cannot read inventory {}: {e}", inventory.display());
            return 2;
        }
    };
    // The inventory named by --inventory counts once, even when it also sits in a -f folder.
    loaded.inventories.clear();
    match serde_saphyr::from_str::<InventoryFile>(&inv_text) {
        Ok(inv) => loaded.inventories.push((inventory.display().to_string(), inv)),
        Err(e) => {
            eprintln!(
                "error: {}: not an inventory file: {}",
                inventory.display(),
                e.to_string().lines().next().unwrap_or("")
            );
            return 2;
        }
    }
    let mut found: Vec<FileProblem> = Vec::new();
    let nodes = inventories(&loaded, &mut found);
    found.extend(problems(&loaded, &nodes));

    // Only objects that passed the schema reach the planner; the planner's own problems are added.
    let now = Time(jiff::Timestamp::now());
    let out = plan(
        &PlanInput {
            policies: &loaded.policies,
            tenants: &loaded.tenants,
            plans: &loaded.plans,
            nodes: &nodes,
        },
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
    let problem_lines: Vec<String> = found.iter().map(ToString::to_string).collect();

    match output {
        Output::Table => print_tables(&out.nodes, &out.tenants, &problem_lines),
        format => print_data(
            &PlanReport {
                nodes: &out.nodes,
                tenants: &out.tenants,
                problems: problem_lines.clone(),
            },
            format,
        ),
    }
    if problem_lines.is_empty() { 0 } else { 1 }
}

fn print_tables(nodes: &[GpuNode], tenants: &[GpuTenant], problems: &[String]) {
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
            let layout = match g.mode {
                Mode::Mig if g.mig_instances.is_empty() => "MIG on, no instances".to_string(),
                Mode::Mig => g
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
            let tenants = if g.tenants.is_empty() {
                "-".to_string()
            } else {
                g.tenants.join(",")
            };
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
    println!("NODES");
    print_table(
        &[
            "NODE",
            "PLAN",
            "GPU",
            "MODE",
            "LAYOUT (profile@start=tenant)",
            "TENANTS",
            "SCRUB",
        ],
        &rows,
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
    print_table(
        &["TENANT", "TIER", "PRIORITY", "GRANTED", "MEMORY", "READY", "MESSAGE"],
        &rows,
    );

    if !problems.is_empty() {
        println!("\nPROBLEMS");
        for p in problems {
            println!("{p}");
        }
    }
}
