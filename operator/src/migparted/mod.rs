//! NVIDIA mig-parted config files (docs/nvidia.md#the-device-plugin-and-mig-parted) and their conversion to and from GpuPartitionPlans.
//!
//! A mig-parted config holds entries that may differ per GPU model (`device-filter`); a plan has one
//! node selector. So each entry becomes one plan, and annotations remember the config name, the
//! entry's position and its filter so that `export` writes the same file back.

use crate::api::{GpuGroup, GpuPartitionPlan, GpuPartitionPlanSpec, MigSettings, Mode};
use crate::devices::{format_devices, parse_devices};
use crate::labels;
use crate::mig::model_by_pci_id;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement, ObjectMeta};
use std::collections::BTreeMap;

pub const ANNOTATION_CONFIG: &str = "gputenancy.io/mig-parted-config";
pub const ANNOTATION_ENTRY: &str = "gputenancy.io/mig-parted-entry";
pub const ANNOTATION_FILTER: &str = "gputenancy.io/mig-parted-device-filter";

mod file;
mod parse;

pub use file::{
    DeviceFilter, Devices, EntryProblem, MigPartedEntry, MigPartedError, MigPartedFile, ProfileFormatError, VERSION,
};
pub use parse::mig_profile_format;

impl MigPartedFile {
    /// Reads a mig-parted file, refusing what `nvidia-mig-parted` refuses when it loads one, with
    /// the config name, entry index and field of the first problem (rules in `parse.rs`).
    pub fn parse(yaml: &str) -> Result<MigPartedFile, MigPartedError> {
        parse::parse(yaml)
    }
}

/// The profiles of an entry as a list, in profile-name order (each repeated `count` times).
pub fn expand_mig_devices(devices: &BTreeMap<String, u32>) -> Vec<String> {
    devices
        .iter()
        .flat_map(|(p, n)| std::iter::repeat_n(p.clone(), *n as usize))
        .collect()
}

/// Turns the configs of a file (all, or the one named) into plans: one per entry.
pub fn import(file: &MigPartedFile, only: Option<&str>) -> Result<Vec<GpuPartitionPlan>, MigPartedError> {
    if let Some(name) = only
        && !file.mig_configs.contains_key(name)
    {
        let names: Vec<&str> = file.mig_configs.keys().map(String::as_str).collect();
        return Err(MigPartedError::NoSuchConfig(name.to_string(), names.join(", ")));
    }
    let mut plans = Vec::new();
    for (config, entries) in &file.mig_configs {
        if only.is_some_and(|o| o != config) {
            continue;
        }
        for (i, entry) in entries.iter().enumerate() {
            let name = if entries.len() == 1 {
                plan_name(config)
            } else {
                format!("{}-{i}", plan_name(config))
            };
            plans.push(entry_to_plan(config, i, &name, entry));
        }
    }
    Ok(plans)
}

/// A Kubernetes object name from a config name (lowercase; anything else becomes `-`).
fn plan_name(config: &str) -> String {
    let s: String = config
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    s.trim_matches(|c| c == '-' || c == '.').to_string()
}

fn entry_to_plan(config: &str, index: usize, name: &str, entry: &MigPartedEntry) -> GpuPartitionPlan {
    let devices = match &entry.devices {
        Devices::All => "all".to_string(),
        Devices::List(l) => format_devices(l),
    };
    let group = if entry.mig_enabled {
        GpuGroup {
            devices,
            mode: Mode::Mig,
            mig: Some(MigSettings {
                profiles: entry.mig_devices.as_ref().map(expand_mig_devices).unwrap_or_default(),
            }),
            mps: None,
            time_slicing: None,
            tenants: vec![],
        }
    } else {
        GpuGroup {
            devices,
            mode: Mode::Exclusive,
            mig: None,
            mps: None,
            time_slicing: None,
            tenants: vec![],
        }
    };
    let mut annotations = BTreeMap::from([
        (ANNOTATION_CONFIG.to_string(), config.to_string()),
        (ANNOTATION_ENTRY.to_string(), index.to_string()),
    ]);
    if let Some(filter) = &entry.device_filter {
        // JSON keeps the file's own form (a string or a list) for the round trip.
        annotations.insert(
            ANNOTATION_FILTER.to_string(),
            serde_json::to_string(filter).unwrap_or_default(),
        );
    }
    GpuPartitionPlan {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: GpuPartitionPlanSpec {
            node_selector: selector_for(entry.device_filter.as_ref()),
            priority: 0,
            gpus: vec![group],
            rollout: None,
            device_access: Default::default(),
        },
        status: None,
    }
}

/// Nodes a device filter applies to: by product label when every PCI ID is a known model,
/// otherwise by the PCI device ID label; every GPU node when there is no filter.
fn selector_for(filter: Option<&DeviceFilter>) -> LabelSelector {
    // mig-parted skips empty IDs, and no ID at all is no filter (`MatchesDeviceFilter`).
    let ids: Vec<String> = filter
        .map(DeviceFilter::ids)
        .unwrap_or_default()
        .into_iter()
        .filter(|id| !id.is_empty())
        .collect();
    if ids.is_empty() {
        return LabelSelector {
            match_labels: Some(BTreeMap::from([(labels::GPU_PRESENT.to_string(), "true".to_string())])),
            match_expressions: None,
        };
    }
    let models: Option<Vec<_>> = ids.iter().map(|id| model_by_pci_id(id)).collect();
    let (key, mut values): (&str, Vec<String>) = match models {
        Some(models) => (
            labels::GPU_PRODUCT,
            models
                .iter()
                .zip(&ids)
                .filter_map(|(m, id)| {
                    let dev = crate::mig::parse_pci_id(id)?;
                    m.variants
                        .iter()
                        .find(|v| v.device_id == dev)
                        .map(|v| v.name.replace(' ', "-"))
                })
                .collect(),
        ),
        None => (labels::PCI_DEVICE_ID, ids.clone()),
    };
    values.sort();
    values.dedup();
    LabelSelector {
        match_labels: None,
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: key.to_string(),
            operator: "In".to_string(),
            values: Some(values),
        }]),
    }
}

/// Turns plans back into a mig-parted file. Plans imported from mig-parted keep their config name
/// and entry order; others become a config named after the plan. Modes mig-parted cannot express
/// (MPS, TimeSlicing) export as `mig-enabled: false`, which is their MIG state; they are listed in
/// the returned notes.
pub fn export(plans: &[GpuPartitionPlan]) -> (MigPartedFile, Vec<String>) {
    let mut notes = Vec::new();
    let mut configs: BTreeMap<String, Vec<(usize, usize, MigPartedEntry)>> = BTreeMap::new();
    for plan in plans {
        let name = plan.metadata.name.clone().unwrap_or_default();
        let ann = plan.metadata.annotations.clone().unwrap_or_default();
        let config = ann.get(ANNOTATION_CONFIG).cloned().unwrap_or_else(|| name.clone());
        let entry_index = ann
            .get(ANNOTATION_ENTRY)
            .and_then(|s| s.parse().ok())
            .unwrap_or(usize::MAX);
        let filter = ann.get(ANNOTATION_FILTER).map(|f| {
            serde_json::from_str(f).unwrap_or_else(|_| DeviceFilter::Many(f.split(',').map(str::to_string).collect()))
        });
        for (g, group) in plan.spec.gpus.iter().enumerate() {
            let devices = if group.devices == "all" {
                Devices::All
            } else {
                Devices::List(parse_devices(&group.devices).unwrap_or_default())
            };
            let mig_devices = group.mig.as_ref().map(|m| {
                let mut counts = BTreeMap::new();
                for p in &m.profiles {
                    *counts.entry(p.clone()).or_insert(0) += 1;
                }
                counts
            });
            if group.mode.is_shared() {
                notes.push(format!(
                    "GpuPartitionPlan/{name}: spec.gpus[{g}]: mode {} has no mig-parted form; exported as mig-enabled: false",
                    group.mode
                ));
            }
            configs.entry(config.clone()).or_default().push((
                entry_index,
                g,
                MigPartedEntry {
                    device_filter: filter.clone(),
                    devices,
                    mig_enabled: group.mode == Mode::Mig,
                    mig_devices,
                },
            ));
        }
    }
    let mig_configs = configs
        .into_iter()
        .map(|(k, mut v)| {
            v.sort_by_key(|(e, g, _)| (*e, *g));
            (k, v.into_iter().map(|(_, _, e)| e).collect())
        })
        .collect();
    (
        MigPartedFile {
            version: "v1".into(),
            mig_configs,
        },
        notes,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT: &str = include_str!("../../tests/data/mig-parted-config-default.yaml");
    const EXAMPLE: &str = include_str!("../../tests/data/mig-parted-example-config.yaml");

    #[test]
    fn nvidia_files_round_trip() {
        for text in [DEFAULT, EXAMPLE] {
            let file = MigPartedFile::parse(text).unwrap();
            let plans = import(&file, None).unwrap();
            let (back, _) = export(&plans);
            assert_eq!(back, file);
        }
    }

    #[test]
    fn one_config_by_name() {
        let file = MigPartedFile::parse(DEFAULT).unwrap();
        let plans = import(&file, Some("all-balanced")).unwrap();
        assert!(plans.len() > 5);
        assert!(
            plans
                .iter()
                .all(|p| p.metadata.name.as_deref().unwrap().starts_with("all-balanced-"))
        );
        let err = import(&file, Some("nope")).unwrap_err().to_string();
        assert!(
            err.starts_with("config \"nope\" not found in the file; it has: all-1g.10gb"),
            "{err}"
        );
    }

    #[test]
    fn h100_entry_selects_by_product_label() {
        let file = MigPartedFile::parse(DEFAULT).unwrap();
        let plans = import(&file, Some("all-3g.40gb")).unwrap();
        assert_eq!(plans.len(), 1);
        let sel = &plans[0].spec.node_selector;
        assert_eq!(sel.match_labels.as_ref().unwrap()[labels::GPU_PRESENT], "true");
    }

    /// mig-parted's `MatchesDeviceFilter`: an empty string or list is no filter, every GPU.
    #[test]
    fn empty_device_filter_is_no_filter() {
        for filter in ["\"\"", "[]"] {
            let text = format!(
                "version: v1\nmig-configs:\n  c:\n  - {{device-filter: {filter}, devices: all, mig-enabled: false}}\n"
            );
            let file = MigPartedFile::parse(&text).unwrap();
            let plans = import(&file, None).unwrap();
            let sel = &plans[0].spec.node_selector;
            assert_eq!(
                sel.match_labels.as_ref().unwrap()[labels::GPU_PRESENT],
                "true",
                "{filter}"
            );
            assert_eq!(export(&plans).0, file, "{filter} round-trips");
        }
    }

    #[test]
    fn unknown_fields_and_versions_are_refused() {
        let bad = "version: v1\nmig-configs:\n  x:\n  - devices: all\n    mig-enabled: true\n    mig-devicez: {}\n";
        assert!(
            MigPartedFile::parse(bad)
                .unwrap_err()
                .to_string()
                .contains("mig-devicez")
        );
        let v2 = "version: v2\nmig-configs: {}\n";
        assert!(
            MigPartedFile::parse(v2)
                .unwrap_err()
                .to_string()
                .contains("version \"v2\"")
        );
    }
}
