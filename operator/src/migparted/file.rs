//! A mig-parted file as read: its configs and entries, the device filters and the refusals with
//! where they are (the rules that produce them are in `parse.rs`).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

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
    ProfileFormat(ProfileFormatError),
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

/// Why a name is not a MIG profile name as mig-parted reads them (go-nvlib's `parseMigProfile`).
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProfileFormatError {
    #[error("the name is empty")]
    Empty,
    #[error("{profile:?} has both + and - attributes")]
    BothAttributeSigns { profile: String },
    #[error("{profile:?} is not <g>g.<gb>gb or <c>c.<g>g.<gb>gb")]
    Fields { profile: String },
    /// `part`: the dot-separated field; `unit`: the letters it should end in.
    #[error("{profile:?}: {part:?} should be a number followed by {unit:?}")]
    Number {
        profile: String,
        part: String,
        unit: &'static str,
    },
    /// `problem`: what is wrong with one of its attributes (`an attribute twice`).
    #[error("{profile:?} has {problem}")]
    Attribute { profile: String, problem: &'static str },
}
