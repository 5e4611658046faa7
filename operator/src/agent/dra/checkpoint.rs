//! What the DRA mode must not forget across a restart: which claims are prepared with which
//! devices, and what each device last held. One JSON file, replaced atomically (written beside,
//! synced, renamed, the directory synced): a kill at any moment leaves the old file or the new
//! one, never half of either.
//!
//! A device's record says who may have left data in it. A device without a record (no file, a
//! file from before the device existed) has an unknown past, and a device whose UUID is not the
//! one recorded (a MIG instance destroyed and created again) too: both are scrubbed before a
//! claim gets them (docs/design.md#scrub-on-change-of-hands: an unknown previous owner is a change of hands).
//!
//! The file decides whether a device is scrubbed, so the agent checks that it wrote it: the file
//! must be the agent's user's and writable by no one else, and it carries an HMAC-SHA256 of its
//! content under a key the agent made on this node ([`KEY_FILE`], 0600). A file that fails any
//! check is set aside and the agent starts from an unknown past: every device is scrubbed before
//! its next claim, and a device some container still uses is refused until it is idle.

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
        /// What that scrub verified: the evidence of the next hand-over. Absent in a record
        /// written before the agent kept it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        verified: Option<Verified>,
    },
}

/// What a scrub verified, and when it finished.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Verified {
    /// Bytes read back as zero (the GPU layer's scrub report).
    pub bytes: u64,
    pub at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
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
    /// What its hand-over to the claim did; a claim recorded before the agent kept it has
    /// nothing known.
    #[serde(default = "crate::handover::HandOverEvidence::unknown")]
    pub evidence: crate::handover::HandOverEvidence,
}

/// A prepared claim.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PreparedClaim {
    pub namespace: String,
    pub name: String,
    pub tenant: String,
    pub devices: Vec<PreparedDevice>,
    /// The CDI spec written for it: what the file must still hold when Prepare answers again.
    #[serde(default)]
    pub cdi_spec: serde_json::Value,
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
                    evidence: Some(d.evidence.clone()),
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
        "the checkpoint {path} is not one this agent wrote ({why}); it is set aside and every device is scrubbed before its next claim"
    )]
    Untrusted { path: PathBuf, why: String },
    #[error("writing the checkpoint {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error(
        "the checkpoint key {path}: {why}; remove it and the checkpoint beside it to start over (every device is then scrubbed before its next claim)"
    )]
    Key { path: PathBuf, why: String },
}

/// The name of the HMAC key beside the checkpoint.
pub const KEY_FILE: &str = "dra-checkpoint.key";
const KEY_LEN: usize = 32;

/// The file on disk: the checkpoint's JSON as written, and its HMAC-SHA256 (hex).
#[derive(Serialize, Deserialize)]
struct Sealed {
    hmac: String,
    data: String,
}

/// The checkpoint file and the key that seals it.
#[derive(Clone, Debug)]
pub struct CheckpointFile {
    pub path: PathBuf,
    key_path: PathBuf,
}

/// Why a file is not this agent's alone.
#[derive(Debug, thiserror::Error)]
pub enum NotOurs {
    #[error("owned by uid {owner}, not this agent's uid {me}")]
    Owner { owner: u32, me: u32 },
    /// `access`: what the mode lets others do (`in`, for a private file; `write`).
    #[error("mode {mode:o} lets others {access}")]
    Mode { mode: u32, access: &'static str },
}

/// Is the file at `meta` owned by this process's user and writable by no one else (and, with
/// `private`, readable by no one else)?
pub fn owned_by_us(meta: &std::fs::Metadata, private: bool) -> Result<(), NotOurs> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    let mode = meta.mode() & 0o777;
    if meta.uid() != me {
        return Err(NotOurs::Owner { owner: meta.uid(), me });
    }
    let others = if private { 0o077 } else { 0o022 };
    if mode & others != 0 {
        return Err(NotOurs::Mode {
            mode,
            access: if private { "in" } else { "write" },
        });
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    s.len()
        .is_multiple_of(2)
        .then(|| {
            (0..s.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
                .collect()
        })
        .flatten()
}

impl CheckpointFile {
    pub fn new(dir: &Path) -> CheckpointFile {
        CheckpointFile {
            path: dir.join("dra-checkpoint.json"),
            key_path: dir.join(KEY_FILE),
        }
    }

    /// The key, made (32 random bytes, 0600) when there is none. A key that is not this agent's
    /// alone is refused: whoever could read or replace it could seal a checkpoint.
    fn key(&self) -> Result<ring::hmac::Key, CheckpointError> {
        let err = |why: String| CheckpointError::Key {
            path: self.key_path.clone(),
            why,
        };
        match std::fs::File::open(&self.key_path) {
            Ok(mut f) => {
                let meta = f.metadata().map_err(|e| err(e.to_string()))?;
                owned_by_us(&meta, true).map_err(|e| err(e.to_string()))?;
                let mut bytes = Vec::new();
                std::io::Read::read_to_end(&mut f, &mut bytes).map_err(|e| err(e.to_string()))?;
                if bytes.len() != KEY_LEN {
                    return Err(err(format!("{} bytes, not {KEY_LEN}", bytes.len())));
                }
                Ok(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &bytes))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                use ring::rand::SecureRandom;
                use std::os::unix::fs::OpenOptionsExt;
                let mut bytes = [0u8; KEY_LEN];
                ring::rand::SystemRandom::new()
                    .fill(&mut bytes)
                    .map_err(|_| err("the system's random source failed".into()))?;
                if let Some(dir) = self.key_path.parent() {
                    std::fs::create_dir_all(dir).map_err(|e| err(e.to_string()))?;
                }
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&self.key_path)
                    .map_err(|e| err(e.to_string()))?;
                f.write_all(&bytes).map_err(|e| err(e.to_string()))?;
                f.sync_all().map_err(|e| err(e.to_string()))?;
                Ok(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &bytes))
            }
            Err(e) => Err(err(e.to_string())),
        }
    }

    /// The checkpoint as last saved; empty when there is none (every device's past unknown).
    /// `Untrusted` when the file is not this agent's, not sealed, or sealed under another key.
    pub fn load(&self) -> Result<Checkpoint, CheckpointError> {
        let key = self.key()?;
        let bytes = match std::fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Checkpoint::default()),
            Err(source) => {
                return Err(CheckpointError::Read {
                    path: self.path.clone(),
                    source,
                });
            }
        };
        let untrusted = |why: String| CheckpointError::Untrusted {
            path: self.path.clone(),
            why,
        };
        let meta = std::fs::metadata(&self.path).map_err(|source| CheckpointError::Read {
            path: self.path.clone(),
            source,
        })?;
        owned_by_us(&meta, false).map_err(|e| untrusted(e.to_string()))?;
        let sealed: Sealed =
            serde_json::from_slice(&bytes).map_err(|e| untrusted(format!("not a sealed checkpoint: {e}")))?;
        let tag = unhex(&sealed.hmac).ok_or_else(|| untrusted("its HMAC is not hex".into()))?;
        ring::hmac::verify(&key, sealed.data.as_bytes(), &tag)
            .map_err(|_| untrusted("its HMAC does not match its content under this node's key".into()))?;
        serde_json::from_str(&sealed.data).map_err(|e| untrusted(format!("its content does not parse: {e}")))
    }

    /// Moves an untrusted file aside (`.untrusted`, for whoever investigates), so the agent
    /// starts from an unknown past.
    pub fn set_aside(&self) -> Result<(), CheckpointError> {
        std::fs::rename(&self.path, self.path.with_extension("json.untrusted")).map_err(|source| {
            CheckpointError::Write {
                path: self.path.clone(),
                source,
            }
        })
    }

    /// Replaces the file with `cp`, sealed, durably, before returning.
    pub fn save(&self, cp: &Checkpoint) -> Result<(), CheckpointError> {
        use std::os::unix::fs::OpenOptionsExt;
        let key = self.key()?;
        let err = |source| CheckpointError::Write {
            path: self.path.clone(),
            source,
        };
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(err)?;
        let data = serde_json::to_string_pretty(cp).expect("a checkpoint serialises");
        let hmac = hex(ring::hmac::sign(&key, data.as_bytes()).as_ref());
        let tmp = self.path.with_extension("json.tmp");
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(err)?;
        f.write_all(&serde_json::to_vec_pretty(&Sealed { hmac, data }).expect("a sealed checkpoint serialises"))
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
    use std::os::unix::fs::PermissionsExt;

    fn record() -> Checkpoint {
        let mut cp = Checkpoint::default();
        cp.devices.insert(
            "gpu-0".into(),
            DeviceRecord::Released {
                tenant: "a".into(),
                uuid: "GPU-0".into(),
            },
        );
        cp
    }

    fn dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("gt-checkpoint-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_saved_checkpoint_reads_back_and_none_is_empty() {
        let dir = dir("back");
        let f = CheckpointFile::new(&dir);
        assert_eq!(f.load().unwrap(), Checkpoint::default());
        f.save(&record()).unwrap();
        assert_eq!(f.load().unwrap(), record());
        let key = std::fs::metadata(dir.join(KEY_FILE)).unwrap();
        assert_eq!(key.permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(&f.path).unwrap().permissions().mode() & 0o777, 0o600);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A device marked clean by someone else's hand, a file from another node (another key), one
    /// others may write, one not sealed at all: each is untrusted, and setting it aside leaves
    /// an unknown past.
    #[test]
    fn a_checkpoint_changed_behind_the_agent_is_untrusted() {
        let dir = dir("forged");
        let f = CheckpointFile::new(&dir);
        f.save(&record()).unwrap();
        let sealed = std::fs::read_to_string(&f.path).unwrap();
        let forged = sealed.replace("released", "clean");
        assert_ne!(forged, sealed);
        std::fs::write(&f.path, &forged).unwrap();
        assert!(matches!(f.load(), Err(CheckpointError::Untrusted { .. })), "{forged}");

        std::fs::write(&f.path, &sealed).unwrap();
        assert_eq!(f.load().unwrap(), record());
        std::fs::set_permissions(&f.path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let got = f.load();
        assert!(
            matches!(&got, Err(CheckpointError::Untrusted { why, .. }) if why.contains("mode 666")),
            "{got:?}"
        );

        std::fs::write(&f.path, serde_json::to_vec(&record()).unwrap()).unwrap();
        std::fs::set_permissions(&f.path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(f.load(), Err(CheckpointError::Untrusted { .. })));

        let other = dir.join("other");
        let g = CheckpointFile::new(&other);
        g.save(&record()).unwrap();
        std::fs::copy(&g.path, &f.path).unwrap();
        assert!(matches!(f.load(), Err(CheckpointError::Untrusted { .. })));
        f.set_aside().unwrap();
        assert_eq!(f.load().unwrap(), Checkpoint::default());

        // A key others can read could seal a forged file: refused, not used.
        std::fs::set_permissions(dir.join(KEY_FILE), std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(f.load(), Err(CheckpointError::Key { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
