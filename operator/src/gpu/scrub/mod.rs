//! Memory scrubbing (docs/design.md#scrub-on-change-of-hands): allocate all free memory of a GPU
//! or MIG instance, zero it, check on the GPU that every word of it reads zero ([`verify`]),
//! release it.
//!
//! CUDA sees one MIG instance per process (selected by `CUDA_VISIBLE_DEVICES` before `cuInit`),
//! so every scrub runs in a child process, `gpu-tenancy agent scrub-worker`, with that variable
//! set to the target's UUID. The child is also where cudarc loads `libcuda` (at run time: nothing
//! needs CUDA to build), so a missing or broken library fails the scrub, not the agent. A chosen
//! library (`--cuda-lib`) reaches cudarc through a private directory on the child's
//! `LD_LIBRARY_PATH` holding `libcuda.so`/`libcuda.so.1` links to it: cudarc opens the library by
//! those names.

mod verify;
mod worker;

pub use worker::worker;

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::Command;

const MIB: u64 = 1024 * 1024;

/// What one scrub did.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ScrubReport {
    /// The `CUDA_VISIBLE_DEVICES` entry scrubbed (a GPU or MIG UUID).
    pub device: String,
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub bytes_cleared: u64,
    /// Bytes the verification kernel read back as zero: all of `bytes_cleared`.
    pub bytes_verified: u64,
    /// Microseconds to allocate and zero the memory (0 from a worker that does not say).
    #[serde(default)]
    pub clear_micros: u64,
    /// Microseconds to verify it, from the first launch to the result on the host.
    #[serde(default)]
    pub verify_micros: u64,
}

/// Why the scrub worker (the child process, on CUDA) did not clear and verify the memory.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(
        "cannot load the CUDA driver library (libcuda.so / libcuda.so.1): install the NVIDIA driver or pass --cuda-lib (GPU_TENANCY_CUDA_LIB)"
    )]
    NoDriverLibrary,
    /// `call`: the CUDA driver call (`cuMemAlloc`); `device`: the `CUDA_VISIBLE_DEVICES` entry.
    #[error("{call} on {device}: {error:?}")]
    Cuda {
        call: &'static str,
        device: String,
        error: cudarc::driver::result::DriverError,
    },
    #[error("CUDA sees no device for CUDA_VISIBLE_DEVICES={device}")]
    NoDevice { device: String },
    /// `allocation`: which of the scrub's allocations, in order; `offset`: of the byte in it;
    /// `words`: the non-zero 8-byte words in all the memory cleared.
    #[error(
        "verification failed on {device}: byte {offset} of allocation {allocation} reads {value:#04x} after zeroing ({words} non-zero 8-byte words in all)"
    )]
    NotZero {
        device: String,
        allocation: usize,
        offset: u64,
        value: u8,
        words: u64,
    },
    /// The kernel found a non-zero word that reads zero when copied back.
    #[error(
        "verification failed on {device}: the kernel found {words} non-zero 8-byte words, the first at byte {offset} of allocation {allocation}, which reads back as zero"
    )]
    Unconfirmed {
        device: String,
        allocation: usize,
        offset: u64,
        words: u64,
    },
    /// The kernel's launch on its probe did not report what the probe holds.
    #[error(
        "the verification kernel failed its self-test on {device}: {words} non-zero words, lowest offset {lowest:#x}, where the probe has 7, the first at byte 80; the scrub cannot be verified"
    )]
    KernelSelfTest { device: String, words: u64, lowest: u64 },
    #[error(
        "the verification kernel's result on {device} is inconsistent ({words} non-zero words, lowest offset {lowest:#x}); the scrub cannot be verified"
    )]
    Inconsistent { device: String, words: u64, lowest: u64 },
}

/// Why a scrub of a device did not run or did not finish clean.
#[derive(Debug, thiserror::Error)]
pub enum ScrubError {
    #[error("cannot find the agent binary to run a scrub: {0}")]
    AgentBinary(std::io::Error),
    #[error("--cuda-lib {}: {source}", .path.display())]
    CudaLib { path: PathBuf, source: std::io::Error },
    #[error("cannot create {}: {source}", .dir.display())]
    LibDir { dir: PathBuf, source: std::io::Error },
    #[error("cannot link {name}: {source}")]
    Link { name: &'static str, source: std::io::Error },
    #[error("cannot start the scrub worker: {0}")]
    Start(std::io::Error),
    /// `why`: the worker's last line of error output.
    #[error("scrub of {device} failed: {why}")]
    Failed { device: String, why: String },
    #[error("scrub of {device}: unreadable worker report: {source}")]
    Report { device: String, source: serde_json::Error },
    /// A backend without a worker refused the device (`why`: its reason, e.g. processes hold it).
    #[error("scrub of {device}: {why}")]
    Refused { device: String, why: String },
    /// The worker's report says less was read back than was cleared.
    #[error("scrub of {device}: {verified} of {cleared} bytes cleared were verified")]
    Unverified {
        device: String,
        cleared: u64,
        verified: u64,
    },
}

/// `--bytes` is not an amount.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("--bytes {given:?}: use a quantity like 64Mi or 1Gi, a number of bytes, or `all`")]
pub struct AmountError {
    pub given: String,
}

/// How much to clear: all free memory, or a fixed amount (a quick check).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Amount {
    AllFree,
    Bytes(u64),
}

/// Where the scrub child gets its CUDA library.
#[derive(Clone, Debug, Default)]
pub struct CudaLib(pub Option<PathBuf>);

/// Runs a scrub of `device` (GPU or MIG UUID) in a child process and returns its report.
pub fn run(device: &str, amount: Amount, lib: &CudaLib) -> Result<ScrubReport, ScrubError> {
    let exe = std::env::current_exe().map_err(ScrubError::AgentBinary)?;
    let mut cmd = Command::new(exe);
    cmd.args(["agent", "scrub-worker"]);
    if let Amount::Bytes(b) = amount {
        cmd.args(["--bytes", &b.to_string()]);
    }
    cmd.env("CUDA_VISIBLE_DEVICES", device);
    let _links = match &lib.0 {
        Some(path) => Some(LibDir::new(path, &mut cmd)?),
        None => None,
    };
    let out = cmd.output().map_err(ScrubError::Start)?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let line = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no output")
            .trim();
        return Err(ScrubError::Failed {
            device: device.to_string(),
            why: line.trim_start_matches("error: ").to_string(),
        });
    }
    let report: ScrubReport = serde_json::from_slice(&out.stdout).map_err(|source| ScrubError::Report {
        device: device.to_string(),
        source,
    })?;
    if report.bytes_verified != report.bytes_cleared {
        return Err(ScrubError::Unverified {
            device: device.to_string(),
            cleared: report.bytes_cleared,
            verified: report.bytes_verified,
        });
    }
    Ok(report)
}

/// A private directory with `libcuda.so` and `libcuda.so.1` pointing at the chosen library,
/// prepended to the child's `LD_LIBRARY_PATH`; removed when dropped.
struct LibDir(PathBuf);

impl LibDir {
    fn new(lib: &Path, cmd: &mut Command) -> Result<LibDir, ScrubError> {
        let lib = std::fs::canonicalize(lib).map_err(|source| ScrubError::CudaLib {
            path: lib.to_path_buf(),
            source,
        })?;
        let dir = std::env::temp_dir().join(format!("gpu-tenancy-cuda-{}-{}", std::process::id(), unique()));
        // A folder of this name is a dead process's (the pid is ours now, the counter this
        // process's own), left by a kill: its links would make ours fail.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|source| ScrubError::LibDir {
            dir: dir.clone(),
            source,
        })?;
        for name in ["libcuda.so", "libcuda.so.1"] {
            std::os::unix::fs::symlink(&lib, dir.join(name)).map_err(|source| ScrubError::Link { name, source })?;
        }
        let mut path = dir.clone().into_os_string();
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
            path.push(":");
            path.push(old);
        }
        cmd.env("LD_LIBRARY_PATH", path);
        Ok(LibDir(dir))
    }
}

impl Drop for LibDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// Parses `64Mi`, `1Gi`, `1000000` or `all`.
pub fn parse_amount(s: &str) -> Result<Amount, AmountError> {
    if s == "all" {
        return Ok(Amount::AllFree);
    }
    if let Ok(b) = s.parse::<u64>() {
        return Ok(Amount::Bytes(b));
    }
    crate::api::quantity_to_mib(s)
        .map(|m| Amount::Bytes(m * MIB))
        .ok_or_else(|| AmountError { given: s.to_string() })
}
