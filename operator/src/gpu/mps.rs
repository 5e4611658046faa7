//! Supervision of the node's one `nvidia-cuda-mps-control` daemon (docs/nvidia.md#mps-control).
//!
//! The daemon serves the GPUs in MPS mode, selected by UUID through `CUDA_VISIBLE_DEVICES` (which
//! only counts at start, so a different GPU set means a restart). Commands go to its stdin
//! protocol: `echo CMD | nvidia-cuda-mps-control`. Each call of [`ensure`] is one supervision
//! step: a health check (`get_server_list` must answer), a restart after a crash, new defaults sent
//! to the running daemon (they apply to servers started later, so no restart), a restart when the
//! GPU set changes, a clean `quit` when no GPU needs it. A restart or a quit ends the service of
//! every client of every GPU the daemon serves, so neither happens while any of them has
//! processes: the change waits (busyGpuPolicy Wait) and the GPUs it concerns are not ready
//! ([`not_ready`]). What it remembers between steps (GPU set, defaults, restarts) lives in the
//! published `MpsDaemonStatus`.

use super::actions::unreadable;
use crate::api::{GpuNodeSpec, GpuNodeStatus, Mode, MpsDaemonStatus};
use gpu_tenancy_core::memory_caps;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
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

/// Why a command to the daemon, its start or its stop did not go through.
#[derive(Debug, thiserror::Error)]
pub enum MpsError {
    #[error("cannot run {}: {source}", .control.display())]
    Run { control: PathBuf, source: std::io::Error },
    #[error("`{command}` could not be written to {}: {source}", .control.display())]
    Write {
        command: String,
        control: PathBuf,
        source: std::io::Error,
    },
    #[error("`{command}` got no answer within {timeout:?}")]
    NoAnswer { command: String, timeout: Duration },
    #[error("`{command}`: {source}")]
    Wait { command: String, source: std::io::Error },
    /// `output`: what the control binary said (its error output, else its answer).
    #[error("`{command}` failed: {output}")]
    Failed { command: String, output: String },
    #[error("the MPS daemon did not quit within {timeout:?}")]
    DidNotQuit { timeout: Duration },
    #[error("cannot create {}: {source}", .dir.display())]
    CreateDir { dir: PathBuf, source: std::io::Error },
    #[error("cannot run {} -d: {source}", .control.display())]
    Start { control: PathBuf, source: std::io::Error },
    #[error("{} -d exited with {status}; see {}", .control.display(), .log_dir.display())]
    Exited {
        control: PathBuf,
        status: ExitStatus,
        log_dir: PathBuf,
    },
    #[error("the MPS daemon started but does not answer on {}", .pipe_dir.display())]
    Silent { pipe_dir: PathBuf },
}

/// What the daemon should serve: GPU UUIDs in device order, and the commands that set its
/// defaults (each sent once after a start; defaults only apply to servers started later).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Desired {
    pub gpus: Vec<String>,
    pub settings: Vec<String>,
    /// Things the spec asked for that one daemon cannot do exactly.
    pub notes: Vec<String>,
    /// Leave the daemon as it is: an MPS GPU cannot be read, so the set it should serve is not
    /// known (say why).
    pub hold: Option<String>,
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
        if unreadable(o) {
            d.hold = Some(format!(
                "GPU {} cannot be read, so the MPS daemon is left as it is",
                g.index
            ));
            continue;
        }
        let ready = !o.mig_mode.is_some_and(|m| m.current) && o.compute_mode.as_deref() == Some("ExclusiveProcess");
        if !ready {
            continue;
        }
        let dev = d.gpus.len();
        d.gpus.push(o.uuid.clone());
        // Every client pinned to one share's memory: the client's own CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
        // is its environment, which it may change; the daemon's default binds.
        let mib = memory_caps::share_mib(g, o.memory_mib);
        if mib > 0 {
            d.settings
                .push(format!("set_default_device_pinned_mem_limit {dev} {mib}M"));
        }
        if let Some(p) = g.mps.as_ref().and_then(|s| s.active_thread_percentage) {
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
    }
    if let Some((p, _)) = pct {
        d.settings
            .insert(0, format!("set_default_active_thread_percentage {p}"));
    }
    d
}

/// Sends one command on the daemon's stdin protocol; returns its answer.
pub fn send(cfg: &MpsConfig, command: &str) -> Result<String, MpsError> {
    let mut child = Command::new(&cfg.control)
        .env("CUDA_MPS_PIPE_DIRECTORY", &cfg.pipe_dir)
        .env("CUDA_MPS_LOG_DIRECTORY", &cfg.log_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| MpsError::Run {
            control: cfg.control.clone(),
            source,
        })?;
    if let Some(mut stdin) = child.stdin.take()
        && let Err(e) = writeln!(stdin, "{command}")
    {
        // Not sent is not applied: the caller keeps the setting as still to do.
        let _ = child.kill();
        let _ = child.wait();
        return Err(MpsError::Write {
            command: command.to_string(),
            control: cfg.control.clone(),
            source: e,
        });
    }
    let deadline = Instant::now() + cfg.timeout;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(MpsError::NoAnswer {
                    command: command.to_string(),
                    timeout: cfg.timeout,
                });
            }
            Err(source) => {
                return Err(MpsError::Wait {
                    command: command.to_string(),
                    source,
                });
            }
        }
    }
    let out = child.wait_with_output().map_err(|source| MpsError::Wait {
        command: command.to_string(),
        source,
    })?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if out.status.success() {
        Ok(text)
    } else {
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        Err(MpsError::Failed {
            command: command.to_string(),
            output: if err.is_empty() { text } else { err },
        })
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

fn stop(cfg: &MpsConfig) -> Result<(), MpsError> {
    send(cfg, "quit")?;
    if wait_until(cfg, false) {
        Ok(())
    } else {
        Err(MpsError::DidNotQuit { timeout: cfg.timeout })
    }
}

/// Starts a daemon for `d.gpus`; returns its pid where it writes one.
fn start(cfg: &MpsConfig, d: &Desired) -> Result<Option<u32>, MpsError> {
    for dir in [&cfg.pipe_dir, &cfg.log_dir] {
        std::fs::create_dir_all(dir).map_err(|source| MpsError::CreateDir {
            dir: dir.clone(),
            source,
        })?;
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
        .map_err(|source| MpsError::Start {
            control: cfg.control.clone(),
            source,
        })?;
    if !status.success() {
        return Err(MpsError::Exited {
            control: cfg.control.clone(),
            status,
            log_dir: cfg.log_dir.clone(),
        });
    }
    if !wait_until(cfg, true) {
        return Err(MpsError::Silent {
            pipe_dir: cfg.pipe_dir.clone(),
        });
    }
    // Best effort: the daemon's pid file, where it writes one.
    let pid = std::fs::read_to_string(cfg.pipe_dir.join("nvidia-cuda-mps-control.pid"))
        .ok()
        .and_then(|s| s.trim().parse().ok());
    Ok(pid)
}

/// What a setting command sets: the command without its value (`set_default_device_pinned_mem_limit 0`).
fn setting_key(command: &str) -> &str {
    command.rsplit_once(' ').map_or(command, |(k, _)| k)
}

/// Sends `wanted` to a running daemon on top of what it had (`had`). Returns the settings in effect
/// afterwards (`wanted` in order when all went through) and the first failure: a setting not sent
/// is not in effect.
fn send_settings(cfg: &MpsConfig, had: &[String], wanted: &[String]) -> (Vec<String>, Option<String>) {
    let mut now: Vec<String> = had.to_vec();
    for s in wanted {
        if let Err(e) = send(cfg, s) {
            return (now, Some(format!("the MPS daemon did not take `{s}`: {e}")));
        }
        match now.iter_mut().find(|x| setting_key(x) == setting_key(s)) {
            Some(x) => *x = s.clone(),
            None => now.push(s.clone()),
        }
    }
    (wanted.to_vec(), None)
}

/// GPUs with processes among `uuids`, as `GPU 0 (pids 1, 2)`: the clients a restart would cut off.
fn clients(observed: &GpuNodeStatus, uuids: &[String]) -> Vec<String> {
    observed
        .gpus
        .iter()
        .filter(|g| !g.processes.is_empty() && uuids.contains(&g.uuid))
        .map(|g| {
            let pids: Vec<String> = g.processes.iter().map(|p| p.pid.to_string()).collect();
            format!("GPU {} (pids {})", g.index, pids.join(", "))
        })
        .collect()
}

/// One supervision step. `prev` is the daemon state last published (None when unknown);
/// `observed` gives the processes a restart would disturb.
pub fn ensure(
    cfg: &MpsConfig,
    d: &Desired,
    prev: Option<&MpsDaemonStatus>,
    observed: &GpuNodeStatus,
) -> MpsDaemonStatus {
    let was_running = prev.is_none_or(|p| p.running);
    // Probe only when the daemon may matter: no daemon binary is fine when nobody needs MPS.
    let alive = (!d.gpus.is_empty() || was_running) && healthy(cfg);
    let st = MpsDaemonStatus {
        running: alive,
        pid: prev.and_then(|p| p.pid),
        gpus: Vec::new(),
        restarts: prev.map(|p| p.restarts).unwrap_or(0),
        settings: Vec::new(),
        message: None,
    };
    if let Some(why) = &d.hold {
        return keep(st, prev, why.clone());
    }
    // Whom a restart or a quit would cut off: processes on the GPUs the daemon serves (when that
    // is not known, on every GPU it is to serve).
    let mut affected: Vec<String> = prev.map(|p| p.gpus.clone()).unwrap_or_default();
    affected.extend(
        d.gpus
            .iter()
            .filter(|g| !affected.contains(g))
            .cloned()
            .collect::<Vec<_>>(),
    );
    let busy = clients(observed, &affected);
    if d.gpus.is_empty() {
        return quit(cfg, st, prev, &busy);
    }
    if alive && prev.is_some_and(|p| p.gpus == d.gpus) {
        let had = prev.map(|p| p.settings.clone()).unwrap_or_default();
        if had == d.settings {
            return keep(st, prev, prev.and_then(|p| p.message.clone()).unwrap_or_default());
        }
        // New defaults reach a running daemon without a restart; only taking one back needs one.
        let wanted: Vec<&str> = d.settings.iter().map(|s| setting_key(s)).collect();
        if had.iter().all(|s| wanted.contains(&setting_key(s))) {
            let (now, err) = send_settings(cfg, &had, &d.settings);
            let sent = note(d, "new defaults sent (servers started from now on use them)".into());
            return MpsDaemonStatus {
                gpus: d.gpus.clone(),
                settings: now,
                message: Some(err.unwrap_or(sent)),
                ..st
            };
        }
    }
    restart(cfg, d, st, prev, &busy)
}

/// The daemon as it is, with why it is left so.
fn keep(st: MpsDaemonStatus, prev: Option<&MpsDaemonStatus>, why: String) -> MpsDaemonStatus {
    MpsDaemonStatus {
        gpus: prev.map(|p| p.gpus.clone()).unwrap_or_default(),
        settings: prev.map(|p| p.settings.clone()).unwrap_or_default(),
        message: (!why.is_empty()).then_some(why),
        ..st
    }
}

fn note(d: &Desired, m: String) -> String {
    if d.notes.is_empty() {
        m
    } else {
        format!("{m}; {}", d.notes.join("; "))
    }
}

fn waiting(what: &str, busy: &[String]) -> String {
    format!(
        "{what}, which would cut off the clients running on {}: it waits until they end",
        busy.join(", ")
    )
}

/// No GPU needs the daemon: a clean quit, once no client is left.
fn quit(cfg: &MpsConfig, st: MpsDaemonStatus, prev: Option<&MpsDaemonStatus>, busy: &[String]) -> MpsDaemonStatus {
    if !st.running {
        return MpsDaemonStatus { pid: None, ..st };
    }
    if !busy.is_empty() {
        return keep(
            st,
            prev,
            waiting("no GPU needs MPS any more; the daemon is to quit", busy),
        );
    }
    match stop(cfg) {
        Ok(()) => MpsDaemonStatus {
            running: false,
            pid: None,
            message: Some("stopped: no GPU is in MPS mode".into()),
            ..st
        },
        Err(e) => MpsDaemonStatus {
            pid: None,
            message: Some(e.to_string()),
            ..st
        },
    }
}

/// A (re)start for `d`: after a crash, or, once no client is left, for a new GPU set, a default
/// to take back, or a daemon of unknown configuration.
fn restart(
    cfg: &MpsConfig,
    d: &Desired,
    mut st: MpsDaemonStatus,
    prev: Option<&MpsDaemonStatus>,
    busy: &[String],
) -> MpsDaemonStatus {
    let why = if st.running {
        let what = match prev {
            None => "an MPS daemon of unknown configuration answers and must restart for this spec",
            Some(p) if p.gpus == d.gpus => "the MPS daemon must restart to drop a default",
            Some(_) => "the MPS daemon must restart for the new GPU set",
        };
        if !busy.is_empty() {
            return keep(st, prev, waiting(what, busy));
        }
        if let Err(e) = stop(cfg) {
            return keep(st, prev, format!("cannot restart the MPS daemon: {e}"));
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
            let (now, err) = send_settings(cfg, &[], &d.settings);
            MpsDaemonStatus {
                running: true,
                pid,
                gpus: d.gpus.clone(),
                settings: now,
                message: Some(err.unwrap_or_else(|| note(d, why))),
                ..st
            }
        }
        Err(e) => MpsDaemonStatus {
            running: false,
            pid: None,
            gpus: Vec::new(),
            settings: Vec::new(),
            message: Some(e.to_string()),
            ..st
        },
    }
}

/// The defaults that concern GPU `uuid` in `settings` of a daemon serving `gpus`: the daemon-wide
/// ones, and its own pinned limit with the device number (its place in `gpus`) left out.
fn defaults_of(settings: &[String], gpus: &[String], uuid: &str) -> Vec<String> {
    const PINNED: &str = "set_default_device_pinned_mem_limit ";
    let dev = gpus.iter().position(|g| g == uuid).map(|d| format!("{PINNED}{d} "));
    settings
        .iter()
        .filter_map(|s| match (s.strip_prefix(PINNED), &dev) {
            (None, _) => Some(s.clone()),
            (Some(_), Some(own)) => s.strip_prefix(own.as_str()).map(|v| format!("{PINNED}{v}")),
            (Some(_), None) => None,
        })
        .collect()
}

/// Whether the running daemon has every default the desired state gives GPU `uuid`: a default
/// still to send for another GPU (one that waits for a restart) leaves this one ready.
fn same_defaults(st: &MpsDaemonStatus, d: &Desired, uuid: &str) -> bool {
    defaults_of(&st.settings, &st.gpus, uuid) == defaults_of(&d.settings, &d.gpus, uuid)
}

/// Spec GPUs the daemon does not serve as the spec asks, with why (pure): an MPS GPU the running
/// daemon does not serve yet or whose defaults were not all taken, and a GPU that left MPS but is
/// still served. Their hand-over is not done: not applied, reason `MpsPending`.
pub fn not_ready(
    spec: &GpuNodeSpec,
    observed: &GpuNodeStatus,
    d: &Desired,
    st: &MpsDaemonStatus,
) -> BTreeMap<u32, String> {
    let mut out = BTreeMap::new();
    let why = || {
        st.message
            .clone()
            .unwrap_or_else(|| "the MPS daemon is not running".into())
    };
    for g in &spec.gpus {
        let Some(o) = observed.gpus.iter().find(|o| o.index == g.index && !unreadable(o)) else {
            continue;
        };
        let served = st.running && st.gpus.contains(&o.uuid);
        if g.mode == Mode::Mps && d.gpus.contains(&o.uuid) {
            if !served {
                out.insert(
                    g.index,
                    format!("the MPS daemon does not serve GPU {} yet: {}", g.index, why()),
                );
            } else if !same_defaults(st, d, &o.uuid) {
                out.insert(
                    g.index,
                    format!(
                        "the MPS daemon runs without all its defaults for GPU {}: {}",
                        g.index,
                        why()
                    ),
                );
            }
        } else if g.mode != Mode::Mps && served {
            out.insert(
                g.index,
                format!("the MPS daemon still serves GPU {}: {}", g.index, why()),
            );
        }
    }
    out
}
