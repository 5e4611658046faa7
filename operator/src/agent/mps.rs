//! Supervision of the node's one `nvidia-cuda-mps-control` daemon (FACTS.md §4).
//!
//! The daemon serves the GPUs in MPS mode, selected by UUID through `CUDA_VISIBLE_DEVICES` (which
//! only counts at start, so a different GPU set means a restart). Commands go to its stdin
//! protocol: `echo CMD | nvidia-cuda-mps-control`. Each call of [`ensure`] is one supervision
//! step: a health check (`get_server_list` must answer), a restart after a crash, a restart when
//! the GPU set or defaults change, a clean `quit` when no GPU needs it. What it remembers between
//! steps (GPU set, defaults, restarts) lives in the published `MpsDaemonStatus`.

use crate::api::{GpuNodeSpec, GpuNodeStatus, Mode, MpsDaemonStatus, quantity_to_mib};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub const DEFAULT_PIPE_DIR: &str = "/run/gpu-tenancy/mps";
pub const DEFAULT_LOG_DIR: &str = "/var/log/gpu-tenancy/mps";

/// How to reach the daemon.
#[derive(Clone, Debug)]
pub struct MpsConfig {
    /// The control binary (looked up on PATH when not a path).
    pub control: PathBuf,
    pub pipe_dir: PathBuf,
    pub log_dir: PathBuf,
    /// How long a command or a start may take.
    pub timeout: Duration,
}

impl Default for MpsConfig {
    fn default() -> Self {
        MpsConfig {
            control: "nvidia-cuda-mps-control".into(),
            pipe_dir: DEFAULT_PIPE_DIR.into(),
            log_dir: DEFAULT_LOG_DIR.into(),
            timeout: Duration::from_secs(10),
        }
    }
}

/// What the daemon should serve: GPU UUIDs in device order, and the commands that set its
/// defaults (each sent once after a start; defaults only apply to servers started later).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Desired {
    pub gpus: Vec<String>,
    pub settings: Vec<String>,
    /// Things the spec asked for that one daemon cannot do exactly.
    pub notes: Vec<String>,
}

/// The daemon's desired state from the spec and the GPUs ready for MPS (MIG off, compute mode
/// EXCLUSIVE_PROCESS). Pure.
pub fn desired(spec: &GpuNodeSpec, observed: &GpuNodeStatus) -> Desired {
    let mut d = Desired::default();
    let mut pct: Option<(u32, u32)> = None;
    for g in spec.gpus.iter().filter(|g| g.mode == Mode::Mps) {
        let Some(o) = observed.gpus.iter().find(|o| o.index == g.index) else {
            continue;
        };
        let ready = !o.mig_mode.is_some_and(|m| m.current) && o.compute_mode.as_deref() == Some("ExclusiveProcess");
        if !ready {
            continue;
        }
        let dev = d.gpus.len();
        d.gpus.push(o.uuid.clone());
        let Some(s) = &g.mps else { continue };
        if let Some(p) = s.active_thread_percentage {
            if pct.is_some_and(|(q, _)| q != p) {
                d.notes.push(format!(
                    "GPUs ask for different active thread percentages; the daemon-wide default is the lowest, {}%",
                    p.min(pct.unwrap().0)
                ));
            }
            pct = Some(match pct {
                Some((q, i)) if q <= p => (q, i),
                _ => (p, g.index),
            });
        }
        if let Some(mib) = s.pinned_memory_limit.as_deref().and_then(quantity_to_mib) {
            d.settings
                .push(format!("set_default_device_pinned_mem_limit {dev} {mib}M"));
        }
    }
    if let Some((p, _)) = pct {
        d.settings
            .insert(0, format!("set_default_active_thread_percentage {p}"));
    }
    d
}

/// Sends one command on the daemon's stdin protocol; returns its answer.
pub fn send(cfg: &MpsConfig, command: &str) -> Result<String, String> {
    let mut child = Command::new(&cfg.control)
        .env("CUDA_MPS_PIPE_DIRECTORY", &cfg.pipe_dir)
        .env("CUDA_MPS_LOG_DIRECTORY", &cfg.log_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", cfg.control.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = writeln!(stdin, "{command}");
    }
    let deadline = Instant::now() + cfg.timeout;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("`{command}` got no answer within {:?}", cfg.timeout));
            }
            Err(e) => return Err(format!("`{command}`: {e}")),
        }
    }
    let out = child.wait_with_output().map_err(|e| format!("`{command}`: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if out.status.success() {
        Ok(text)
    } else {
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        Err(format!(
            "`{command}` failed: {}",
            if err.is_empty() { text } else { err }
        ))
    }
}

/// Whether a daemon answers on the pipe directory.
pub fn healthy(cfg: &MpsConfig) -> bool {
    send(cfg, "get_server_list").is_ok()
}

fn wait_until(cfg: &MpsConfig, up: bool) -> bool {
    let deadline = Instant::now() + cfg.timeout;
    while Instant::now() < deadline {
        if healthy(cfg) == up {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

fn stop(cfg: &MpsConfig) -> Result<(), String> {
    send(cfg, "quit")?;
    if wait_until(cfg, false) {
        Ok(())
    } else {
        Err(format!("the MPS daemon did not quit within {:?}", cfg.timeout))
    }
}

fn start(cfg: &MpsConfig, d: &Desired) -> Result<Option<u32>, String> {
    for dir in [&cfg.pipe_dir, &cfg.log_dir] {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let status = Command::new(&cfg.control)
        .arg("-d")
        .env("CUDA_VISIBLE_DEVICES", d.gpus.join(","))
        .env("CUDA_MPS_PIPE_DIRECTORY", &cfg.pipe_dir)
        .env("CUDA_MPS_LOG_DIRECTORY", &cfg.log_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run {} -d: {e}", cfg.control.display()))?;
    if !status.success() {
        return Err(format!(
            "{} -d exited with {status}; see {}",
            cfg.control.display(),
            cfg.log_dir.display()
        ));
    }
    if !wait_until(cfg, true) {
        return Err(format!(
            "the MPS daemon started but does not answer on {}",
            cfg.pipe_dir.display()
        ));
    }
    for s in &d.settings {
        send(cfg, s)?;
    }
    // Best effort: the daemon's pid file, where it writes one.
    let pid = std::fs::read_to_string(cfg.pipe_dir.join("nvidia-cuda-mps-control.pid"))
        .ok()
        .and_then(|s| s.trim().parse().ok());
    Ok(pid)
}

/// One supervision step. `prev` is the daemon state last published (None when unknown).
pub fn ensure(cfg: &MpsConfig, d: &Desired, prev: Option<&MpsDaemonStatus>) -> MpsDaemonStatus {
    let restarts = prev.map(|p| p.restarts).unwrap_or(0);
    let was_running = prev.is_none_or(|p| p.running);
    // Probe only when the daemon may matter: no daemon binary is fine when nobody needs MPS.
    let alive = (!d.gpus.is_empty() || was_running) && healthy(cfg);
    let mut st = MpsDaemonStatus {
        running: alive,
        pid: prev.and_then(|p| p.pid),
        gpus: Vec::new(),
        restarts,
        settings: Vec::new(),
        message: None,
    };
    let note = |m: String| {
        if d.notes.is_empty() {
            m
        } else {
            format!("{m}; {}", d.notes.join("; "))
        }
    };
    if d.gpus.is_empty() {
        st.pid = None;
        if alive {
            st.running = false;
            st.message = Some(match stop(cfg) {
                Ok(()) => "stopped: no GPU is in MPS mode".into(),
                Err(e) => {
                    st.running = true;
                    e
                }
            });
        }
        return st;
    }
    let same = prev.is_some_and(|p| p.gpus == d.gpus && p.settings == d.settings);
    if alive && same {
        st.gpus = d.gpus.clone();
        st.settings = d.settings.clone();
        st.message = prev.and_then(|p| p.message.clone());
        return st;
    }
    let why = if alive {
        if let Err(e) = stop(cfg) {
            st.message = Some(format!("cannot restart the MPS daemon for a new GPU set: {e}"));
            st.gpus = prev.map(|p| p.gpus.clone()).unwrap_or_default();
            return st;
        }
        "restarted: GPU set or defaults changed".to_string()
    } else if prev.is_some_and(|p| p.running && !p.gpus.is_empty()) {
        st.restarts += 1;
        "restarted: the daemon had stopped answering".to_string()
    } else {
        "started".to_string()
    };
    match start(cfg, d) {
        Ok(pid) => {
            st.running = true;
            st.pid = pid;
            st.gpus = d.gpus.clone();
            st.settings = d.settings.clone();
            st.message = Some(note(why));
        }
        Err(e) => {
            st.running = false;
            st.pid = None;
            st.message = Some(e);
        }
    }
    st
}
