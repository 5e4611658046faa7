//! Human-readable tables for `agent discover` and `agent apply` (YAML and JSON print the status).

use crate::api::{GpuNodeStatus, GpuStatus};
use std::fmt::Write;

fn mig(g: &GpuStatus) -> String {
    match g.mig_mode {
        None => "n/a".into(),
        Some(m) if m.current == m.pending => if m.current { "on" } else { "off" }.into(),
        Some(m) => format!(
            "{}->{}",
            if m.current { "on" } else { "off" },
            if m.pending { "on" } else { "off" }
        ),
    }
}

fn instances(g: &GpuStatus) -> String {
    if g.instances.is_empty() {
        return "-".into();
    }
    g.instances
        .iter()
        .map(|i| {
            let ci = if i.compute_instance_id.is_none() { "!noCI" } else { "" };
            let t = i.tenant.as_deref().map(|t| format!("({t})")).unwrap_or_default();
            format!("{}@{}{ci}{t}", i.profile, i.placement)
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn table(rows: Vec<Vec<String>>) -> String {
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    out
}

fn header(s: &GpuNodeStatus) -> String {
    match &s.driver {
        Some(d) => format!(
            "driver {}  NVML {}  CUDA {}  GPUs {}\n",
            d.driver_version,
            d.nvml_version,
            d.cuda_version,
            s.gpus.len()
        ),
        None => String::new(),
    }
}

/// `agent discover`: the GPUs, then each MIG GPU's profiles and placements.
pub fn discover_table(s: &GpuNodeStatus) -> String {
    let mut rows = vec![
        [
            "GPU",
            "NAME",
            "UUID",
            "PCI ID",
            "MEMORY",
            "NUMA",
            "COMPUTE",
            "MIG",
            "INSTANCES",
            "PROCESSES",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for g in &s.gpus {
        rows.push(vec![
            g.index.to_string(),
            g.name.clone(),
            g.uuid.clone(),
            g.pci_device_id.clone(),
            format!("{}MiB", g.memory_mib),
            g.numa_node.map(|n| n.to_string()).unwrap_or("-".into()),
            g.compute_mode.clone().unwrap_or("-".into()),
            mig(g),
            instances(g),
            if g.processes.is_empty() {
                "-".into()
            } else {
                g.processes
                    .iter()
                    .map(|p| p.pid.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            },
        ]);
    }
    let mut out = header(s) + &table(rows);
    for (g, profiles) in s
        .gpus
        .iter()
        .map(|g| (g, s.profiles_of(g)))
        .filter(|(_, p)| !p.is_empty())
    {
        let _ = writeln!(
            out,
            "\nGPU {} MIG profiles (ID, compute slices, memory, max instances: placements):",
            g.index
        );
        for p in profiles {
            let pl: Vec<String> = p.placements.iter().map(|x| x.to_string()).collect();
            let _ = writeln!(
                out,
                "  {:<11} ID {:>2}  {}c  {:>6}MiB  max {}: {}",
                p.name,
                p.id,
                p.compute_slices,
                p.memory_mib,
                p.max_instances,
                pl.join(" ")
            );
        }
    }
    for g in s.gpus.iter().filter(|g| g.message.is_some()) {
        let _ = writeln!(out, "GPU {}: {}", g.index, g.message.as_deref().unwrap_or_default());
    }
    out
}

/// `agent apply`: per GPU whether it matches its spec, and why not.
pub fn apply_table(s: &GpuNodeStatus) -> String {
    let mut rows = vec![
        [
            "GPU",
            "MODE",
            "TENANTS",
            "MIG",
            "INSTANCES",
            "LAST SCRUB",
            "APPLIED",
            "REASON",
            "MESSAGE",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for g in &s.gpus {
        let scrub = g
            .last_scrub
            .as_ref()
            .or_else(|| {
                g.instances
                    .iter()
                    .filter_map(|i| i.last_scrub.as_ref())
                    .max_by(|a, b| a.time.cmp(&b.time))
            })
            .map(|r| format!("{:?} {}", r.result, r.time))
            .unwrap_or("-".into());
        rows.push(vec![
            g.index.to_string(),
            g.applied_mode.map(|m| m.to_string()).unwrap_or("-".into()),
            if g.applied_tenants.is_empty() {
                "-".into()
            } else {
                g.applied_tenants.join(",")
            },
            mig(g),
            instances(g),
            scrub,
            match g.applied {
                Some(true) => "yes".into(),
                Some(false) => "NO".into(),
                None => "-".into(),
            },
            g.reason.map_or("-".into(), |r| r.to_string()),
            g.message.clone().unwrap_or_default(),
        ]);
    }
    let mut out = header(s) + &table(rows);
    if let Some(m) = &s.mps {
        let state = if m.running { "running" } else { "not running" };
        let _ = writeln!(
            out,
            "MPS daemon: {state}, GPUs [{}], restarts {}{}",
            m.gpus.join(", "),
            m.restarts,
            m.message.as_deref().map(|x| format!(": {x}")).unwrap_or_default()
        );
    }
    for c in &s.conditions {
        let _ = writeln!(out, "{}={} {}: {}", c.type_, c.status, c.reason, c.message);
    }
    out
}
