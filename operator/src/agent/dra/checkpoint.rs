//! What the DRA mode must not forget across a restart: which claims are prepared with which
//! devices, and what each device last held. One JSON file, replaced atomically (written beside,
//! synced, renamed, the directory synced): a kill at any moment leaves the old file or the new
//! one, never half of either.
//!
//! A device's record says who may have left data in it. A device without a record (no file, a
//! file from before the device existed) has an unknown past, and a device whose UUID is not the
//! one recorded (a MIG instance destroyed and created again) too: both are scrubbed before a
//! claim gets them (DESIGN.md §4.3: an unknown previous owner is a change of hands).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// What a device last held, and for whom.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(tag = "state", rename_all = "camelCase")]
pub enum DeviceRecord {
    /// Prepared for `claim` of `tenant`.
    InUse {
        claim: String,
        tenant: String,
        uuid: String,
    },
    /// Released by a claim of `tenant`: its memory may hold that tenant's data.
    Released { tenant: String, uuid: String },
    /// Scrubbed and verified since its last claim (after `tenant`'s, if it had one).
    Clean {
        uuid: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tenant: Option<String>,
    },
}

impl DeviceRecord {
    pub fn uuid(&self) -> &str {
        match self {
            DeviceRecord::InUse { uuid, .. }
            | DeviceRecord::Released { uuid, .. }
            | DeviceRecord::Clean { uuid, .. } => uuid,
        }
    }
}

/// A device of a prepared claim, as Prepare answered for it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PreparedDevice {
    pub request: String,
    pub device: String,
    pub cdi_device_ids: Vec<String>,
}

/// A prepared claim.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PreparedClaim {
    pub namespace: String,
    pub name: String,
    pub tenant: String,
    pub devices: Vec<PreparedDevice>,
}

/// Everything on disk.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Checkpoint {
    /// Prepared claims by UID.
    #[serde(default)]
    pub claims: BTreeMap<String, PreparedClaim>,
    /// Device records by device name.
    #[serde(default)]
    pub devices: BTreeMap<String, DeviceRecord>,
}

impl Checkpoint {
    /// Each device of a prepared claim, with the claim (`namespace/name`) and its tenant, sorted:
    /// what the GpuNode status shows.
    pub fn device_claims(&self) -> Vec<crate::api::DeviceClaim> {
        let mut out: Vec<crate::api::DeviceClaim> = self
            .claims
            .values()
            .flat_map(|c| {
                c.devices.iter().map(|d| crate::api::DeviceClaim {
                    device: d.device.clone(),
                    claim: format!("{}/{}", c.namespace, c.name),
                    tenant: c.tenant.clone(),
                })
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

/// Why the checkpoint could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("reading the checkpoint {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error(
        "the checkpoint {path} is not one this agent wrote ({source}); move it away to start over (every device is then scrubbed before its next claim)"
    )]
    Parse { path: PathBuf, source: serde_json::Error },
    #[error("writing the checkpoint {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
}

/// The checkpoint file.
#[derive(Clone, Debug)]
pub struct CheckpointFile {
    pub path: PathBuf,
}

impl CheckpointFile {
    pub fn new(dir: &Path) -> CheckpointFile {
        CheckpointFile {
            path: dir.join("dra-checkpoint.json"),
        }
    }

    /// The checkpoint as last saved; empty when there is none (every device's past unknown).
    pub fn load(&self) -> Result<Checkpoint, CheckpointError> {
        match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|source| CheckpointError::Parse {
                path: self.path.clone(),
                source,
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Checkpoint::default()),
            Err(source) => Err(CheckpointError::Read {
                path: self.path.clone(),
                source,
            }),
        }
    }

    /// Replaces the file with `cp`, durably, before returning.
    pub fn save(&self, cp: &Checkpoint) -> Result<(), CheckpointError> {
        let err = |source| CheckpointError::Write {
            path: self.path.clone(),
            source,
        };
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(err)?;
        let tmp = self.path.with_extension("json.tmp");
        let mut f = std::fs::File::create(&tmp).map_err(err)?;
        f.write_all(&serde_json::to_vec_pretty(cp).expect("a checkpoint serialises"))
            .map_err(err)?;
        f.sync_all().map_err(err)?;
        drop(f);
        std::fs::rename(&tmp, &self.path).map_err(err)?;
        std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(err)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_checkpoint_reads_back_and_none_is_empty() {
        let dir = std::env::temp_dir().join(format!("gt-checkpoint-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let f = CheckpointFile::new(&dir);
        assert_eq!(f.load().unwrap(), Checkpoint::default());
        let mut cp = Checkpoint::default();
        cp.devices.insert(
            "gpu-0".into(),
            DeviceRecord::Released {
                tenant: "a".into(),
                uuid: "GPU-0".into(),
            },
        );
        f.save(&cp).unwrap();
        assert_eq!(f.load().unwrap(), cp);
        std::fs::write(&f.path, "{not json").unwrap();
        assert!(matches!(f.load(), Err(CheckpointError::Parse { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
