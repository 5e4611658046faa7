//! The agent's discovery against NVIDIA's own `nvidia-smi mig -lgip` / `-lgipp` outputs.
//!
//! The simulated NVML library (e2e/nvml-sim) answers from the operator's MIG tables, so a test
//! that compares discovery with those tables compares them with themselves. These tests compare
//! it with text nvidia-smi printed on real GPUs, copied verbatim into tests/data/nvidia-smi/
//! (the first line of each file names its source): profile names, profile IDs, instance totals,
//! memory (to the two decimals nvidia-smi prints) and placements. The tables themselves
//! (core/src/mig/models.rs, what offline planning uses) are held to the same text.
//!
//! Covered: A100-40GB (lgip, lgipp), H100 NVL (lgip, lgipp), H200 (lgip), B200 (lgip, the first
//! four profiles). Not covered, for want of a published output: A100-80GB, H100-80GB, and the
//! placements of H200 and B200.

#[path = "agent/support.rs"]
#[allow(dead_code)]
mod support;

use gpu_tenancy::api::{GpuStatus, MigProfileStatus, Placement};
use gpu_tenancy::mig::model_by_pci_id;
use std::collections::BTreeMap;
use support::Sim;

/// One profile row of `nvidia-smi mig -lgip` (its first line; the second holds CE/JPEG/OFA).
#[derive(Clone, Debug, PartialEq)]
struct LgipRow {
    gpu: u32,
    /// Without nvidia-smi's `MIG ` prefix, e.g. `1g.5gb+me`.
    name: String,
    id: u32,
    free: u32,
    total: u32,
    /// GiB as printed, e.g. `9.62`.
    memory_gib: String,
}

/// The profile rows of an `nvidia-smi mig -lgip` table. Lines starting with `#` are comments;
/// borders, headers and second row lines are not profile rows and are skipped.
fn parse_lgip(text: &str) -> Vec<LgipRow> {
    let mut rows = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let cells: Vec<&str> = line.trim().trim_matches('|').split_whitespace().collect();
        // | GPU  MIG name  ID  free/total  memory  P2P  SM  DEC  ENC |
        if cells.len() != 10 || cells[1] != "MIG" {
            continue;
        }
        let number = |s: &str| {
            s.parse::<u32>()
                .unwrap_or_else(|_| panic!("not a number: {s:?} in {line:?}"))
        };
        let (free, total) = cells[4]
            .split_once('/')
            .unwrap_or_else(|| panic!("no Free/Total in {line:?}"));
        rows.push(LgipRow {
            gpu: number(cells[0]),
            name: cells[2].to_owned(),
            id: number(cells[3]),
            free: number(free),
            total: number(total),
            memory_gib: cells[5].to_owned(),
        });
    }
    rows
}

/// One line of `nvidia-smi mig -lgipp`:
/// `GPU  0 Profile ID 15 Placements: {0,2,4,6}:2` (or `Placement : {0}:8` when there is one).
#[derive(Clone, Debug, PartialEq)]
struct LgippRow {
    gpu: u32,
    id: u32,
    starts: Vec<u32>,
    size: u32,
}

fn parse_lgipp(text: &str) -> Vec<LgippRow> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|line| parse_lgipp_line(line).unwrap_or_else(|| panic!("not an `nvidia-smi mig -lgipp` line: {line:?}")))
        .collect()
}

fn parse_lgipp_line(line: &str) -> Option<LgippRow> {
    let number = |s: &str| s.trim().parse::<u32>().ok();
    let rest = line.trim().strip_prefix("GPU")?;
    let (gpu, rest) = rest.split_once("Profile ID")?;
    let (id, rest) = rest.split_once("Placement")?;
    let (_, set) = rest.split_once(':')?;
    let (starts, size) = set.trim().strip_prefix('{')?.split_once("}:")?;
    Some(LgippRow {
        gpu: number(gpu)?,
        id: number(id)?,
        starts: starts.split(',').map(number).collect::<Option<_>>()?,
        size: number(size)?,
    })
}

/// What nvidia-smi says of one profile, the same on every GPU of the output.
fn profiles_of(rows: &[LgipRow]) -> BTreeMap<String, LgipRow> {
    let mut by_name: BTreeMap<String, LgipRow> = BTreeMap::new();
    for r in rows {
        assert_eq!(r.free, r.total, "the published output has instances in use: {r:?}");
        match by_name.get(&r.name) {
            Some(seen) => assert!(
                (seen.id, seen.total, &seen.memory_gib) == (r.id, r.total, &r.memory_gib),
                "two GPUs of the published output disagree on {}: {seen:?} and {r:?}",
                r.name
            ),
            None => {
                by_name.insert(r.name.clone(), r.clone());
            }
        }
    }
    by_name
}

/// A published output of one model.
struct Published {
    model: &'static str,
    pci_device_id: &'static str,
    lgip: &'static str,
    lgipp: Option<&'static str>,
    /// The lgip text lists every profile of the GPU (not an excerpt).
    complete: bool,
}

/// The one simulated GPU of `p`'s model, as `agent discover` reports it.
fn discover(p: &Published) -> GpuStatus {
    let sim = Sim::new(
        &format!("nvidia-smi-{}", p.model),
        &[&format!(r#"{{pciDeviceId: "{}", count: 1}}"#, p.pci_device_id)],
    );
    let mut status = sim.discover();
    assert_eq!(status.gpus.len(), 1, "{}", p.model);
    status.gpus.remove(0)
}

/// Every disagreement of `profiles` (as discovery reports them) with the published text.
fn compare(p: &Published, profiles: &[MigProfileStatus]) -> Vec<String> {
    let model = p.model;
    let mut wrong: Vec<String> = Vec::new();
    let published = profiles_of(&parse_lgip(p.lgip));
    assert!(!published.is_empty(), "{model}: no profile rows in the lgip text");
    let names: Vec<(&str, u32)> = profiles.iter().map(|x| (x.name.as_str(), x.id)).collect();

    for (name, row) in &published {
        let Some(got) = profiles.iter().find(|x| x.name == *name) else {
            wrong.push(format!(
                "nvidia-smi lists profile {name}, discovery does not: {names:?}"
            ));
            continue;
        };
        if got.id != row.id {
            wrong.push(format!("{name}: profile ID {}, nvidia-smi prints {}", got.id, row.id));
        }
        if got.max_instances != row.total {
            wrong.push(format!(
                "{name}: {} instances, nvidia-smi prints {}",
                got.max_instances, row.total
            ));
        }
        // nvidia-smi prints GiB with two decimals: the discovered MiB must round to that figure.
        let printed: f64 = row.memory_gib.parse().unwrap();
        let gib = got.memory_mib as f64 / 1024.0;
        if (gib - printed).abs() > 0.005 + 1e-9 {
            wrong.push(format!(
                "{name}: {} MiB ({gib:.3} GiB), nvidia-smi prints {} GiB",
                got.memory_mib, row.memory_gib
            ));
        }
    }
    if p.complete {
        let listed: Vec<(&str, u32)> = published.iter().map(|(n, r)| (n.as_str(), r.id)).collect();
        let mut discovered = names.clone();
        discovered.sort();
        if discovered != listed {
            wrong.push(format!("profiles {discovered:?}, nvidia-smi lists {listed:?}"));
        }
    }

    if let Some(lgipp) = p.lgipp {
        let rows = parse_lgipp(lgipp);
        assert!(!rows.is_empty(), "{model}: no lines in the lgipp text");
        for r in &rows {
            assert_eq!(r.gpu, rows[0].gpu, "{model}: one GPU per lgipp file");
            let Some(got) = profiles.iter().find(|x| x.id == r.id) else {
                wrong.push(format!(
                    "nvidia-smi lists profile ID {}, discovery does not: {names:?}",
                    r.id
                ));
                continue;
            };
            let mut starts: Vec<u32> = got.placements.iter().map(|x| x.start).collect();
            starts.sort();
            if starts != r.starts || got.placements.iter().any(|x| x.size != r.size) {
                wrong.push(format!(
                    "{} (ID {}): placements {:?}, nvidia-smi prints {:?}:{}",
                    got.name, r.id, got.placements, r.starts, r.size
                ));
            }
        }
        if rows.len() != profiles.len() {
            wrong.push(format!("{} lgipp lines, {} profiles", rows.len(), profiles.len()));
        }
    }
    wrong
}

/// `agent discover` on a simulated GPU of the model agrees with nvidia-smi.
fn check(p: &Published) {
    let gpu = discover(p);
    let wrong = compare(p, &gpu.profiles);
    assert!(
        wrong.is_empty(),
        "{} ({}): discovery disagrees with nvidia-smi:\n  {}",
        p.model,
        p.pci_device_id,
        wrong.join("\n  ")
    );
}

/// The model's profiles as the operator's tables (core/src/mig/models.rs) give them, in discovery's shape.
fn from_tables(p: &Published) -> Vec<MigProfileStatus> {
    let model = model_by_pci_id(p.pci_device_id).unwrap_or_else(|| panic!("{}: no model", p.pci_device_id));
    assert_eq!(model.key, p.model);
    model
        .profiles()
        .map(|x| {
            let info = x.info();
            MigProfileStatus {
                id: info.profile_id,
                name: x.name.to_owned(),
                compute_slices: info.compute_slices,
                memory_slices: info.memory_slices,
                memory_mib: x.memory_mib(),
                max_instances: info.max_instances,
                placements: info
                    .starts
                    .iter()
                    .map(|&start| Placement {
                        start,
                        size: info.memory_slices,
                    })
                    .collect(),
            }
        })
        .collect()
}

const A100_40GB: Published = Published {
    model: "A100-40GB",
    pci_device_id: "0x20B010DE",
    lgip: include_str!("data/nvidia-smi/a100-40gb-lgip.txt"),
    lgipp: Some(include_str!("data/nvidia-smi/a100-40gb-lgipp.txt")),
    complete: true,
};

const H100_NVL: Published = Published {
    model: "H100-NVL",
    pci_device_id: "0x232110DE",
    lgip: include_str!("data/nvidia-smi/h100-nvl-lgip.txt"),
    lgipp: Some(include_str!("data/nvidia-smi/h100-nvl-lgipp.txt")),
    complete: true,
};

const H200: Published = Published {
    model: "H200",
    pci_device_id: "0x233510DE",
    lgip: include_str!("data/nvidia-smi/h200-lgip.txt"),
    lgipp: None,
    complete: true,
};

const B200: Published = Published {
    model: "B200",
    pci_device_id: "0x290110DE",
    lgip: include_str!("data/nvidia-smi/b200-lgip.txt"),
    lgipp: None,
    complete: false,
};

#[test]
fn a100_40gb_discovery_matches_the_mig_user_guide() {
    check(&A100_40GB);
}

#[test]
fn h100_nvl_discovery_matches_nvidia_smi() {
    check(&H100_NVL);
}

#[test]
fn h200_discovery_matches_nvidia_smi_in_mig_parted_120() {
    check(&H200);
}

#[test]
fn b200_discovery_matches_nvidia_smi_in_mig_parted_187() {
    check(&B200);
}

/// The tables offline planning and validation use (core/src/mig/models.rs) agree with nvidia-smi too.
#[test]
fn the_mig_tables_match_nvidia_smi() {
    let wrong: Vec<String> = [A100_40GB, H100_NVL, H200, B200]
        .iter()
        .flat_map(|p| {
            compare(p, &from_tables(p))
                .into_iter()
                .map(|w| format!("{}: {w}", p.model))
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "core/src/mig/models.rs disagrees with nvidia-smi:\n  {}",
        wrong.join("\n  ")
    );
}

#[test]
fn the_parsers_read_nvidia_smi_tables() {
    let lgip = "\
|   0  MIG 1g.5gb+me     20     1/1        4.75       No     14     1     0   |
|                                                             1     1     1   |
+-----------------------------------------------------------------------------+
|   3  MIG 7g.141gb       0     0/1        139.75     No     132    7     0   |
";
    assert_eq!(
        parse_lgip(lgip),
        [
            LgipRow {
                gpu: 0,
                name: "1g.5gb+me".into(),
                id: 20,
                free: 1,
                total: 1,
                memory_gib: "4.75".into()
            },
            LgipRow {
                gpu: 3,
                name: "7g.141gb".into(),
                id: 0,
                free: 0,
                total: 1,
                memory_gib: "139.75".into()
            },
        ]
    );
    let lgipp = "GPU  0 Profile ID 15 Placements: {0,2,4,6}:2\nGPU  1 Profile ID  0 Placement : {0}:8\n";
    assert_eq!(
        parse_lgipp(lgipp),
        [
            LgippRow {
                gpu: 0,
                id: 15,
                starts: vec![0, 2, 4, 6],
                size: 2
            },
            LgippRow {
                gpu: 1,
                id: 0,
                starts: vec![0],
                size: 8
            },
        ]
    );
    // Every published file parses, one profile row per profile and GPU.
    assert_eq!(parse_lgip(include_str!("data/nvidia-smi/a100-40gb-lgip.txt")).len(), 7);
    assert_eq!(parse_lgip(include_str!("data/nvidia-smi/h100-nvl-lgip.txt")).len(), 7);
    assert_eq!(parse_lgip(include_str!("data/nvidia-smi/h200-lgip.txt")).len(), 12);
    assert_eq!(parse_lgip(include_str!("data/nvidia-smi/b200-lgip.txt")).len(), 4);
    assert_eq!(
        parse_lgipp(include_str!("data/nvidia-smi/a100-40gb-lgipp.txt")).len(),
        7
    );
    assert_eq!(parse_lgipp(include_str!("data/nvidia-smi/h100-nvl-lgipp.txt")).len(), 7);
}
