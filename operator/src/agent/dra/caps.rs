//! What the node offers for capping shares' memory: the container toolkit's version
//! (`nvidia-ctk --version`) and whether cgroup v2 is mounted; the driver's version comes from NVML
//! with the rest of the status. [`gpu_tenancy_core::memory_caps`] decides from them; a probe that
//! cannot tell counts as the part missing (fail closed).

use crate::api::{GpuNodeSpec, GpuNodeStatus};
use gpu_tenancy_core::memory_caps::{self, Probe};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where the probe looks.
#[derive(Clone, Debug)]
pub struct ProbeOptions {
    /// Where the agent sees the host's filesystem (the toolkit is the host's).
    pub host_root: PathBuf,
    /// The cgroup file system (`/sys/fs/cgroup`).
    pub cgroup_root: PathBuf,
}

impl Default for ProbeOptions {
    fn default() -> Self {
        ProbeOptions {
            host_root: "/".into(),
            cgroup_root: "/sys/fs/cgroup".into(),
        }
    }
}

/// How long `nvidia-ctk --version` may take.
const VERSION_TIMEOUT: Duration = Duration::from_secs(5);

/// `nvidia-ctk` (a host path) as the agent sees it under `host_root`.
pub fn toolkit_path(host_root: &Path, nvidia_ctk: &Path) -> PathBuf {
    host_root.join(nvidia_ctk.strip_prefix("/").unwrap_or(nvidia_ctk))
}

/// What `<ctk> --version` prints; `None` where it cannot be run (not there, not executable), or
/// does not finish in time, or fails.
pub fn toolkit_output(ctk: &Path) -> Option<String> {
    let mut child = Command::new(ctk)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let deadline = Instant::now() + VERSION_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
    let mut out = String::new();
    child.stdout.take()?.read_to_string(&mut out).ok()?;
    Some(out)
}

/// Whether `cgroup_root` is a cgroup v2 mount (only v2 has `cgroup.controllers` at its root).
pub fn cgroup_v2(cgroup_root: &Path) -> bool {
    cgroup_root.join("cgroup.controllers").is_file()
}

/// Probes the node; `driver` is the version NVML reported.
pub fn probe(opts: &ProbeOptions, nvidia_ctk: &Path, driver: Option<&str>) -> Probe {
    Probe {
        driver: driver.map(String::from),
        toolkit: toolkit_output(&toolkit_path(&opts.host_root, nvidia_ctk)),
        cgroup_v2: cgroup_v2(&opts.cgroup_root),
    }
}

/// Sets `status.memoryCaps` for `spec`'s shared GPUs from `probe`.
pub fn report(spec: &GpuNodeSpec, probe: &Probe, status: &mut GpuNodeStatus) {
    let driver = memory_caps::driver_cap(probe);
    status.memory_caps = memory_caps::statuses(spec.gpus.iter(), &driver);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A toolkit found under the host root and asked its version; a missing one, none; a cgroup
    /// root with `cgroup.controllers` is v2.
    #[test]
    fn probes_the_toolkit_and_cgroup_v2_under_their_roots() {
        let root = std::env::temp_dir().join(format!("gt-caps-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("usr/bin")).unwrap();
        std::fs::create_dir_all(root.join("cg")).unwrap();
        let ctk = root.join("usr/bin/nvidia-ctk");
        std::fs::write(
            &ctk,
            "#!/bin/sh\necho 'NVIDIA Container Toolkit CLI version 1.20.1'\necho 'commit: abc'\n",
        )
        .unwrap();
        std::fs::set_permissions(&ctk, std::fs::Permissions::from_mode(0o755)).unwrap();
        let opts = ProbeOptions {
            host_root: root.clone(),
            cgroup_root: root.join("cg"),
        };
        let p = probe(&opts, Path::new("/usr/bin/nvidia-ctk"), Some("615.20.01"));
        assert_eq!(
            p.toolkit.as_deref(),
            Some("NVIDIA Container Toolkit CLI version 1.20.1\ncommit: abc\n")
        );
        assert!(!p.cgroup_v2);
        std::fs::write(root.join("cg/cgroup.controllers"), "cpu memory\n").unwrap();
        let p = probe(&opts, Path::new("/usr/bin/nvidia-ctk"), Some("615.20.01"));
        assert!(p.cgroup_v2);
        assert!(memory_caps::driver_cap(&p).is_ok());
        let missing = probe(&opts, Path::new("/usr/local/bin/nvidia-ctk"), Some("615.20.01"));
        assert_eq!(missing.toolkit, None);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
