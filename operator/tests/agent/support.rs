//! A simulated node per test: its own config and state files, the agent binary run as a
//! subprocess against the simulated `libnvidia-ml.so` (the production code path), and direct
//! access to the simulator's state for what a real node does on its own.

use gpu_tenancy::api::GpuNodeStatus;
use nvidia_ml_sim::{ctl, state};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The agent binary cargo built for this test run.
const AGENT_BUILT: &str = env!("CARGO_BIN_EXE_gpu-tenancy");

/// The agent binary and the simulated library as this test process found them at its start.
///
/// Other builds in the same target directory relink both while tests run (the library depends on
/// the operator crate), and a relink removes the file for a moment: a test would then fail with
/// "No such file". Hard links taken once per test process keep the files' contents alive until
/// the process ends; stale links of finished processes are removed on the way.
struct Snapshot {
    agent: PathBuf,
    lib: PathBuf,
}

fn snapshot() -> &'static Snapshot {
    static SNAP: std::sync::OnceLock<Snapshot> = std::sync::OnceLock::new();
    SNAP.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("agent-tests");
        std::fs::create_dir_all(&dir).unwrap();
        remove_stale_links(&dir);
        let pid = std::process::id();
        Snapshot {
            agent: link(Path::new(AGENT_BUILT), &dir.join(format!("{pid}-gpu-tenancy"))),
            lib: link(&sim_lib(), &dir.join(format!("{pid}-libnvidia_ml_sim.so"))),
        }
    })
}

/// Hard-links `from` at `to` (copying where a link is impossible), retrying while a relink
/// has the file missing.
fn link(from: &Path, to: &Path) -> PathBuf {
    let _ = std::fs::remove_file(to);
    for _ in 0..100 {
        if std::fs::hard_link(from, to).is_ok() || std::fs::copy(from, to).is_ok() {
            return to.to_path_buf();
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("cannot link {} at {}", from.display(), to.display());
}

/// Removes links left by test processes that have ended (named `<pid>-...`).
fn remove_stale_links(dir: &Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let alive = name
            .split('-')
            .next()
            .and_then(|p| p.parse::<u32>().ok())
            .is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
        if !alive {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// The agent binary the tests run.
pub fn agent() -> &'static Path {
    &snapshot().agent
}

/// The simulated library, built as a cdylib next to this test (as a dev-dependency, or by
/// `cargo build --workspace`).
fn sim_lib() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps dir");
    let candidates = [
        deps.join("libnvidia_ml_sim.so"),
        deps.parent().expect("profile dir").join("libnvidia_ml_sim.so"),
    ];
    for _ in 0..100 {
        if let Some(p) = candidates
            .iter()
            .filter(|p| p.exists())
            .max_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        {
            return p.clone();
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!(
        "libnvidia_ml_sim.so not found next to {}; run `cargo build --workspace`",
        exe.display()
    )
}

pub struct Sim {
    pub dir: PathBuf,
    pub paths: state::Paths,
    /// Extra directories put first on the agent's PATH (the MPS stand-in).
    pub path_prefix: Option<PathBuf>,
}

impl Drop for Sim {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The outcome of one agent run.
pub struct Run {
    pub out: Output,
    pub status: Option<GpuNodeStatus>,
}

impl Run {
    pub fn code(&self) -> Option<i32> {
        self.out.status.code()
    }

    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }

    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }

    pub fn status(&self) -> &GpuNodeStatus {
        self.status
            .as_ref()
            .unwrap_or_else(|| panic!("no status; stderr: {}", self.stderr()))
    }
}

impl Sim {
    /// A node with these GPU entries (the inventory format), e.g. `{pciDeviceId: "0x20B010DE", count: 2}`.
    pub fn new(name: &str, gpus: &[&str]) -> Sim {
        let dir = std::env::temp_dir().join(format!("gpu-tenancy-agent-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("sim.yaml");
        let body: String = gpus.iter().map(|g| format!("- {g}\n")).collect();
        std::fs::write(&config, format!("gpus:\n{body}")).unwrap();
        let paths = state::Paths {
            state: dir.join("sim.state.json"),
            config,
        };
        Sim {
            dir,
            paths,
            path_prefix: None,
        }
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    pub fn command(&self) -> Command {
        let mut c = Command::new(agent());
        let lib = &snapshot().lib;
        c.env("GPU_TENANCY_SIM_CONFIG", &self.paths.config)
            .env("GPU_TENANCY_SIM_STATE", &self.paths.state)
            .env("GPU_TENANCY_NVML_LIB", lib)
            .env("GPU_TENANCY_CUDA_LIB", lib)
            .env_remove("CUDA_VISIBLE_DEVICES");
        if let Some(p) = &self.path_prefix {
            let old = std::env::var_os("PATH").unwrap_or_default();
            let mut new = p.clone().into_os_string();
            new.push(":");
            new.push(old);
            c.env("PATH", new);
        }
        c
    }

    /// `agent apply` of a GpuNode spec (YAML of `spec`), remembering state in `status.yaml`;
    /// MPS left alone unless `mps` args are given.
    pub fn apply_with(&self, spec_yaml: &str, extra: &[&str]) -> Run {
        let status = self.file("status.yaml");
        let mut args = vec!["--status", status.to_str().unwrap()];
        args.extend(["--write-status", status.to_str().unwrap()]);
        args.extend(extra);
        self.apply_args(spec_yaml, &args)
    }

    /// `agent apply` with exactly these arguments after `-f gpunode.yaml -o json`.
    pub fn apply_args(&self, spec_yaml: &str, args: &[&str]) -> Run {
        let spec = self.file("gpunode.yaml");
        std::fs::write(
            &spec,
            format!("apiVersion: gputenancy.io/v1alpha1\nkind: GpuNode\nmetadata: {{name: n1}}\nspec:\n{spec_yaml}"),
        )
        .unwrap();
        let mut c = self.command();
        c.args(["agent", "apply", "-f"])
            .arg(&spec)
            .args(["-o", "json"])
            .args(args);
        let out = c.output().expect("run agent");
        let status = serde_json::from_slice(&out.stdout).ok();
        Run { out, status }
    }

    pub fn apply(&self, spec_yaml: &str) -> Run {
        self.apply_with(spec_yaml, &["--no-mps"])
    }

    pub fn discover(&self) -> GpuNodeStatus {
        let out = self
            .command()
            .args(["agent", "discover", "-o", "json"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "discover failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    pub fn state(&self) -> state::SimState {
        state::read(&self.paths).unwrap()
    }

    pub fn mutations(&self) -> u64 {
        ctl::mutations(&self.paths).unwrap()
    }

    pub fn log_since(&self, since: u64) -> Vec<state::LogEntry> {
        ctl::log_since(&self.paths, since).unwrap()
    }

    pub fn scrubs(&self) -> Vec<state::ScrubEntry> {
        self.state().scrubs
    }

    /// Starts and stops a workload of `tenant` on a GPU (or the instance at `start`): its data
    /// stays in memory.
    pub fn use_by(&self, gpu: u32, start: Option<u32>, tenant: &str) {
        let pid = 40000 + gpu * 100 + start.unwrap_or(99);
        ctl::attach(
            &self.paths,
            &ctl::Attach {
                gpu,
                placement_start: start,
                pid,
                tenant: Some(tenant.into()),
                used_mib: 512,
                ..Default::default()
            },
        )
        .unwrap();
        ctl::detach(&self.paths, pid).unwrap();
    }

    /// Every GPU or instance holding data of a tenant other than its own (a hand-over without scrub).
    pub fn leaks(&self, status: &GpuNodeStatus) -> Vec<String> {
        let st = self.state();
        let mut out = Vec::new();
        for g in &st.gpus {
            let sg = status.gpus.iter().find(|s| s.index == g.index).unwrap();
            if g.mig_current {
                for gi in &g.gis {
                    let owner = sg
                        .instances
                        .iter()
                        .find(|i| i.placement.start == gi.start)
                        .and_then(|i| i.tenant.clone());
                    for t in g.dirty_tenants(Some(gi.id)) {
                        if Some(&t) != owner.as_ref() {
                            out.push(format!(
                                "GPU {} instance at {} holds {t}'s data, now serves {owner:?}",
                                g.index, gi.start
                            ));
                        }
                    }
                }
            } else {
                for t in g.dirty_tenants(None) {
                    if !sg.applied_tenants.contains(&t) {
                        out.push(format!(
                            "GPU {} holds {t}'s data, now serves {:?}",
                            g.index, sg.applied_tenants
                        ));
                    }
                }
            }
        }
        out
    }
}

/// `(gpu, call)` of each log entry, for readable assertions.
pub fn calls(log: &[state::LogEntry]) -> Vec<(u32, &str)> {
    log.iter().map(|e| (e.gpu, e.call.as_str())).collect()
}

pub fn layout(status: &GpuNodeStatus, gpu: u32) -> Vec<String> {
    status.gpus[gpu as usize]
        .instances
        .iter()
        .map(|i| format!("{}@{}", i.profile, i.placement))
        .collect()
}

pub fn write_exec(path: &Path, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, body).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}
