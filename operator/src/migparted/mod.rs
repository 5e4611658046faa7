//! NVIDIA mig-parted config files (FACTS.md §3) and their conversion to and from GpuPartitionPlans.
//!
//! A mig-parted config holds entries that may differ per GPU model (`device-filter`); a plan has one
//! node selector. So each entry becomes one plan, and annotations remember the config name, the
//! entry's position and its filter so that `export` writes the same file back.

use crate::api::{GpuGroup, GpuPartitionPlan, GpuPartitionPlanSpec, MigSettings, Mode};
use crate::devices::{format_devices, parse_devices};
use crate::labels;
use crate::mig::model_by_pci_id;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement, ObjectMeta};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const ANNOTATION_CONFIG: &str = "gputenancy.io/mig-parted-config";
pub const ANNOTATION_ENTRY: &str = "gputenancy.io/mig-parted-entry";
pub const ANNOTATION_FILTER: &str = "gputenancy.io/mig-parted-device-filter";

mod parse;

pub use parse::mig_profile_format;

/// The only version of the mig-parted file format (`api/spec/v1`).
pub const VERSION: &str = "v1";

/// A whole mig-parted file, as [`MigPartedFile::parse`] accepts it.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct MigPartedFile {
    pub version: String,
    /// Config name → entries. Never empty in a file that has `mig-configs` (mig-parted refuses
    /// `mig-configs: {}`); empty for a file with only `version`, or none at all, which mig-parted accepts.
    #[serde(rename = "mig-configs", skip_serializing_if = "BTreeMap::is_empty")]
    pub mig_configs: BTreeMap<String, Vec<MigPartedEntry>>,
}

/// One entry of a config: which GPUs of which models, MIG on or off, and the instances.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct MigPartedEntry {
    #[serde(rename = "device-filter", skip_serializing_if = "Option::is_none")]
    pub device_filter: Option<DeviceFilter>,
    pub devices: Devices,
    #[serde(rename = "mig-enabled")]
    pub mig_enabled: bool,
    /// Profile → count. `Some(empty)` with MIG on means no instances; mig-parted requires the field
    /// when `mig-enabled` is true.
    #[serde(rename = "mig-devices", skip_serializing_if = "Option::is_none")]
    pub mig_devices: Option<BTreeMap<String, u32>>,
}

/// PCI IDs (`0x233010DE`) of the GPU models an entry applies to. An empty string or list is no
/// filter, as in mig-parted (`MatchesDeviceFilter`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(untagged)]
pub enum DeviceFilter {
    One(String),
    Many(Vec<String>),
}

impl DeviceFilter {
    pub fn ids(&self) -> Vec<String> {
        match self {
            DeviceFilter::One(s) => vec![s.clone()],
            DeviceFilter::Many(v) => v.clone(),
        }
    }
}

/// The GPUs of a node an entry applies to, by index.
#[derive(Clone, Debug, PartialEq)]
pub enum Devices {
    /// `all`.
    All,
    /// GPU indices, in file order.
    List(Vec<u32>),
}

impl Serialize for Devices {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Devices::All => s.serialize_str("all"),
            Devices::List(l) => l.serialize(s),
        }
    }
}

/// Why a mig-parted file is refused: mig-parted's own rules (see [`MigPartedFile::parse`]).
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum MigPartedError {
    #[error("not YAML: {0}")]
    Yaml(String),
    #[error("a mig-parted file is a mapping with `version` and `mig-configs`, not {0}")]
    NotAMapping(String),
    #[error("version: missing; mig-parted files say `version: v1`")]
    MissingVersion,
    #[error("version {0} is not supported; mig-parted files say `version: v1`")]
    Version(String),
    #[error("{0}: unexpected field; a mig-parted file has only `version` and `mig-configs`")]
    UnknownField(String),
    #[error("mig-configs: needs at least one config, or leave the field out")]
    NoConfigs,
    #[error("mig-configs: must map config names to lists of entries, not {0}")]
    ConfigsNotAMapping(String),
    #[error("config {0:?}: needs at least one entry")]
    EmptyConfig(String),
    #[error("config {config:?}: must be a list of entries, not {value}")]
    ConfigNotAList { config: String, value: String },
    #[error(
        "config {config:?} entry {entry}: an entry is a mapping of devices, mig-enabled, mig-devices and device-filter, not {value}"
    )]
    EntryNotAMapping {
        config: String,
        entry: usize,
        value: String,
    },
    #[error("config {config:?} entry {entry}: {field}: {problem}")]
    Entry {
        config: String,
        entry: usize,
        /// The entry's field: `devices`, `devices[2]`, `mig-devices["1g.5gb"]`, ...
        field: String,
        problem: EntryProblem,
    },
    #[error("config {0:?} not found in the file; it has: {1}")]
    NoSuchConfig(String, String),
}

/// What is wrong with one field of an entry.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum EntryProblem {
    #[error("required")]
    Missing,
    #[error("unexpected field; an entry has devices, mig-enabled, mig-devices and device-filter")]
    UnknownField,
    #[error("must be a PCI ID such as \"0x233010DE\" or a list of them, not {0}")]
    DeviceFilter(String),
    #[error("must be `all` or a list of GPU indices, not {0}")]
    Devices(String),
    #[error("{0} is not a GPU index (0-{max})", max = crate::devices::MAX_DEVICE_INDEX)]
    DeviceIndex(String),
    #[error("names GPU {0} twice")]
    DuplicateDevice(u32),
    #[error("an empty list applies to no GPU; name GPUs or remove the entry")]
    NoDevices,
    #[error("must be true or false, not {0}")]
    NotABool(String),
    #[error("must map MIG profiles to counts, e.g. {{1g.10gb: 7}}, not {0}")]
    MigDevices(String),
    #[error("not a MIG profile name: {0}")]
    ProfileFormat(String),
    #[error("count must be a whole number of instances, not {0}")]
    Count(String),
    #[error("count must not be negative, not {0}")]
    NegativeCount(String),
    #[error("every count is 0; write `{{}}` for MIG with no instances")]
    AllCountsZero,
    #[error("required when mig-enabled is true; `{{}}` is MIG on with no instances")]
    MigDevicesRequired,
    #[error("lists MIG devices while mig-enabled is false; remove them or enable MIG")]
    MigDevicesWithoutMig,
}

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
