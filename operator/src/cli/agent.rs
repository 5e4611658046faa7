//! `gpu-tenancy agent`: the node agent's GPU layer on the command line, usable on its own like
//! `nvidia-mig-parted apply`.

use crate::api::{GpuNodeSpec, GpuNodeStatus};
use crate::cli::gpu_output;
use crate::cli::output::{Output, print_data};
use crate::gpu::apply::{ApplyOptions, apply};
use crate::gpu::mps::{DEFAULT_LOG_DIR, DEFAULT_PIPE_DIR, MpsConfig};
use crate::gpu::nvml::NvmlGpus;
use crate::gpu::scrub::{self, CudaLib};
use clap::{Subcommand, ValueEnum};
use serde::Deserialize;
use std::path::{Path, PathBuf};

#[derive(Subcommand, Debug)]
pub enum AgentCommand {
    /// Print the node's GPUs as NVML reports them (the `status` part of a GpuNode). Read-only.
    Discover {
        /// NVML library to load instead of the system's libnvidia-ml.so.1 (e.g. the simulator).
        #[arg(long, env = "GPU_TENANCY_NVML_LIB", value_name = "PATH")]
        nvml_lib: Option<PathBuf>,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Make the GPUs match a GpuNode spec: MIG mode and instances, compute modes, MPS daemon and
    /// memory scrubs, touching only what differs. Prints the status it would publish. Exit 0 when
    /// every GPU in the spec matches it, 1 when some do not (see REASON), 2 on usage errors.
    Apply(ApplyArgs),
    /// Clear part of one GPU's (or MIG instance's) free memory through CUDA and check it reads
    /// back zeros. Touches only memory it allocates itself.
    ScrubCheck {
        /// GPU or MIG UUID, or a GPU index, as CUDA_VISIBLE_DEVICES takes it.
        #[arg(long, default_value = "0", value_name = "UUID")]
        device: String,
        /// How much to clear: a quantity (64Mi, 1Gi), a number of bytes, or `all` free memory.
        #[arg(long, default_value = "64Mi")]
        bytes: String,
        /// CUDA driver library instead of the system's libcuda.so.1.
        #[arg(long, env = "GPU_TENANCY_CUDA_LIB", value_name = "PATH")]
        cuda_lib: Option<PathBuf>,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Internal: the scrub child process (CUDA device 0 of its CUDA_VISIBLE_DEVICES).
    #[command(hide = true)]
    ScrubWorker {
        /// Bytes to clear (default: all free memory).
        #[arg(long)]
        bytes: Option<u64>,
    },
    /// Run in the cluster (the DaemonSet): create this node's GpuNode, apply its spec to the GPUs
    /// whenever it changes (and every --poll seconds, to repair drift), publish the status.
    Run(Box<RunArgs>),
}

#[derive(clap::Args, Debug)]
pub struct ApplyArgs {
    /// GpuNode manifest, or just its spec, as YAML or JSON.
    #[arg(short = 'f', long = "filename", value_name = "GPUNODE.yaml")]
    file: PathBuf,
    /// Previous status (YAML/JSON, as written by --write-status or a GpuNode with a status): who
    /// had each GPU and instance and when it was scrubbed. Without it (no flag, a missing or
    /// unreadable file, no record of a GPU or instance) the previous owner is unknown: a change
    /// of hands, so memory is scrubbed before a GPU or instance is reported applied (unless its
    /// scrub policy is Never).
    #[arg(long, value_name = "FILE")]
    status: Option<PathBuf>,
    /// Write the resulting status here (may be the same file as --status).
    #[arg(long, value_name = "FILE")]
    write_status: Option<PathBuf>,
    /// NVML library to load instead of the system's libnvidia-ml.so.1.
    #[arg(long, env = "GPU_TENANCY_NVML_LIB", value_name = "PATH")]
    nvml_lib: Option<PathBuf>,
    /// CUDA driver library for memory scrubs instead of the system's libcuda.so.1.
    #[arg(long, env = "GPU_TENANCY_CUDA_LIB", value_name = "PATH")]
    cuda_lib: Option<PathBuf>,
    /// MPS control binary (looked up on PATH).
    #[arg(long, default_value = "nvidia-cuda-mps-control", value_name = "PATH")]
    mps_control: PathBuf,
    /// CUDA_MPS_PIPE_DIRECTORY of the node's MPS daemon; MPS workloads must use the same one.
    #[arg(long, default_value = DEFAULT_PIPE_DIR, value_name = "DIR")]
    mps_pipe_dir: PathBuf,
    /// CUDA_MPS_LOG_DIRECTORY of the node's MPS daemon.
    #[arg(long, default_value = DEFAULT_LOG_DIR, value_name = "DIR")]
    mps_log_dir: PathBuf,
    /// Leave the MPS daemon alone (start, check, restart or stop nothing).
    #[arg(long)]
    no_mps: bool,
    /// Print the plan and the current status; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t)]
    output: Output,
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// This node's name (the GpuNode's name).
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    node_name: String,
    /// NVML library to load instead of the system's libnvidia-ml.so.1.
    #[arg(long, env = "GPU_TENANCY_NVML_LIB", value_name = "PATH")]
    nvml_lib: Option<PathBuf>,
    /// CUDA driver library for memory scrubs instead of the system's libcuda.so.1.
    #[arg(long, env = "GPU_TENANCY_CUDA_LIB", value_name = "PATH")]
    cuda_lib: Option<PathBuf>,
    /// Seconds between reads of the GPUs when nothing changed (drift: a reboot, a manual change).
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    poll: u64,
    /// Namespace of NVIDIA's device plugin (its pod on this node restarts after a MIG change).
    #[arg(long, value_name = "NS", default_value = crate::agent::device_plugin::DEFAULT_NAMESPACE)]
    device_plugin_namespace: String,
    /// Label selector of the device plugin's pods.
    #[arg(
        long,
        value_name = "SELECTOR",
        default_value = crate::agent::device_plugin::DEFAULT_SELECTOR
    )]
    device_plugin_selector: String,
    /// The device plugin's MPS root (its `--mps-root`), mounted read-only: the agent reports
    /// whether the plugin's MPS daemon has started as the GpuNode condition MpsDaemonReady.
    #[arg(long, value_name = "DIR", default_value = crate::agent::device_plugin::mps::DEFAULT_MPS_ROOT)]
    mps_root: PathBuf,
    /// The kubelet's pod-resources socket (the host's /var/lib/kubelet/pod-resources mounted):
    /// which pod holds which device, so that busyGpuPolicy Evict asks only for the pods holding a
    /// busy GPU. Unreadable: the GpuNode condition PodResources says why, and every pod asking
    /// for a busy GPU's resource names is asked for instead.
    #[arg(long, value_name = "PATH", default_value = crate::agent::pod_resources::DEFAULT_SOCKET)]
    pod_resources_socket: PathBuf,
    /// The host's /proc (the agent runs in the host's PID namespace): NVML names host PIDs, and
    /// `<proc root>/<pid>/cgroup` says which pod a process of an MPS or time-sliced GPU is in, so
    /// that its busy time goes to its pod's tenant (or `unattributed` when it cannot be told).
    #[arg(long, value_name = "DIR", default_value = crate::agent::attribution::DEFAULT_PROC_ROOT)]
    proc_root: PathBuf,
    /// How pods reach this node's GPUs: through NVIDIA's device plugin, or through this agent as
    /// a DRA kubelet plugin (driver gpu.gputenancy.io) that binds each device to its tenant.
    #[arg(long, value_enum, default_value_t = AgentModeArg::DevicePlugin)]
    mode: AgentModeArg,
    /// DRA mode: the kubelet's plugin registry directory (its registration socket goes there).
    #[arg(long, value_name = "DIR", default_value = "/var/lib/kubelet/plugins_registry")]
    kubelet_registry_dir: PathBuf,
    /// DRA mode: the kubelet's plugins directory (the DRAPlugin socket goes in gpu.gputenancy.io/).
    #[arg(long, value_name = "DIR", default_value = "/var/lib/kubelet/plugins")]
    kubelet_plugins_dir: PathBuf,
    /// DRA mode: the host directory of the checkpoint of prepared claims and device records.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/gpu-tenancy")]
    state_dir: PathBuf,
    /// DRA mode: the directory of transient CDI specs the container runtime reads.
    #[arg(long, value_name = "DIR", default_value = "/var/run/cdi")]
    cdi_dir: PathBuf,
    /// DRA mode: NVIDIA's CDI kind whose devices are named by UUID (the driver libraries a
    /// container needs); its device is returned beside ours. Empty: none.
    #[arg(long, value_name = "KIND", default_value = "nvidia.com/gpu")]
    nvidia_cdi_kind: String,
    /// DRA mode: the driver's MIG capability minors (device nodes of a MIG instance).
    #[arg(long, value_name = "PATH", default_value = "/proc/driver/nvidia-caps/mig-minors")]
    mig_minors_file: PathBuf,
    /// DRA mode: the pipe directory of the agent's MPS daemon (mounted into MPS claims' containers).
    #[arg(long, value_name = "DIR", default_value = DEFAULT_PIPE_DIR)]
    mps_pipe_dir: PathBuf,
    /// DRA mode: the log directory of the agent's MPS daemon.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_LOG_DIR)]
    mps_log_dir: PathBuf,
    /// DRA mode: the container toolkit's `nvidia-ctk` on the host, which the container runtime
    /// runs as the memory cap's CDI hook; the agent runs `<host-root>/<this> --version` to tell
    /// whether the toolkit can cap (docs/concepts/isolation.md#memory-limits).
    #[arg(long, value_name = "PATH", default_value = crate::agent::dra::cdi::DEFAULT_NVIDIA_CTK)]
    nvidia_ctk: PathBuf,
    /// DRA mode: the driver's root as the container runtime sees it (the hook's `--driver-root`).
    #[arg(long, value_name = "DIR", default_value = "/")]
    driver_root: PathBuf,
    /// DRA mode: where the agent sees the host's filesystem, to find `--nvidia-ctk` there.
    #[arg(long, value_name = "DIR", default_value = "/")]
    host_root: PathBuf,
    /// DRA mode: the cgroup file system; cgroup v2 (its `cgroup.controllers`) is what the driver's
    /// memory cap needs.
    #[arg(long, value_name = "DIR", default_value = "/sys/fs/cgroup")]
    cgroup_root: PathBuf,
    /// Serve /metrics (per GPU, MIG instance and tenant; docs/operations/metrics.md), /healthz and
    /// /readyz here, e.g. 0.0.0.0:9401 (what the DaemonSet in deploy/ sets); `off` serves nothing.
    #[arg(long, value_name = "ADDR", default_value = "off")]
    metrics_addr: MetricsAddr,
    /// Log format: `text` or `json`. `RUST_LOG` sets the level.
    #[arg(long, value_enum, default_value_t = super::logging::LogFormat::Text)]
    log_format: super::logging::LogFormat,
}

/// `--metrics-addr`: an address, or `off`.
#[derive(Clone, Copy, Debug)]
pub struct MetricsAddr(Option<std::net::SocketAddr>);

/// `--metrics-addr` is neither an address nor `off`.
#[derive(Debug, thiserror::Error)]
#[error("{given:?} is not an address like 0.0.0.0:9401 (or off): {source}")]
pub struct MetricsAddrError {
    given: String,
    source: std::net::AddrParseError,
}

impl std::str::FromStr for MetricsAddr {
    type Err = MetricsAddrError;
    fn from_str(s: &str) -> Result<Self, MetricsAddrError> {
        if s == "off" {
            return Ok(MetricsAddr(None));
        }
        s.parse()
            .map(|a| MetricsAddr(Some(a)))
            .map_err(|source| MetricsAddrError {
                given: s.to_string(),
                source,
            })
    }
}

/// Why a file `agent apply` reads or writes (the spec, the previous status) could not be used.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot read {}: {source}", .path.display())]
    Read { path: PathBuf, source: std::io::Error },
    /// `why`: the parser's first line.
    #[error("{}: not YAML or JSON: {why}", .path.display())]
    NotYaml { path: PathBuf, why: String },
    /// `what`: a GpuNode manifest or a bare spec; `why`: the parser's first line.
    #[error("{}: not a valid {what}: {why}", .path.display())]
    NotSpec {
        path: PathBuf,
        what: &'static str,
        why: String,
    },
    #[error("{}: spec.gpus lists GPU {gpu} twice; keep one entry per index", .path.display())]
    DuplicateGpu { path: PathBuf, gpu: u32 },
    #[error("{}: not a GpuNode status: {source}", .path.display())]
    NotStatus { path: PathBuf, source: serde_json::Error },
    #[error("cannot write {}: {source}", .path.display())]
    Write { path: PathBuf, source: std::io::Error },
}

/// The `--mode` of `agent run`.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum AgentModeArg {
    DevicePlugin,
    Dra,
}

fn run_in_cluster(args: RunArgs) -> i32 {
    super::logging::init(args.log_format, "info");
    crate::runtime::client::with_client(|client| async move {
        let metrics = std::sync::Arc::new(crate::agent::metrics::AgentMetrics::new(&args.node_name));
        if let MetricsAddr(Some(addr)) = args.metrics_addr {
            let listener = match crate::runtime::http::bind(addr).await {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("error: {e}");
                    return 2;
                }
            };
            let readiness = metrics.readiness();
            tokio::spawn(crate::runtime::http::serve_on(
                listener,
                metrics.clone(),
                readiness,
                crate::runtime::client::shutdown_signal(),
            ));
        }
        let watches = crate::agent::Watches::start(&client, &args.node_name);
        let attribution = crate::agent::attribution::Attribution::new(args.proc_root.clone(), watches.tenants.clone());
        let opts = crate::agent::Options {
            metrics: Some(metrics),
            attribution: Some(std::sync::Arc::new(attribution)),
            node: args.node_name.clone(),
            nvml_lib: args.nvml_lib.clone().map(PathBuf::into_os_string),
            cuda_lib: args.cuda_lib.clone(),
            poll: std::time::Duration::from_secs(args.poll.max(1)),
            mode: agent_mode(&args),
        };
        match crate::agent::run(client, opts, watches, crate::runtime::client::shutdown_signal()).await {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("error: {e}");
                2
            }
        }
    })
}

/// The mode `--mode` names, with its own flags.
fn agent_mode(args: &RunArgs) -> crate::agent::AgentMode {
    use crate::agent::{AgentMode, device_plugin::DevicePluginOptions, dra};
    match args.mode {
        AgentModeArg::DevicePlugin => AgentMode::DevicePlugin(DevicePluginOptions {
            namespace: args.device_plugin_namespace.clone(),
            selector: args.device_plugin_selector.clone(),
            mps_root: Some(args.mps_root.clone()),
            pod_resources_socket: Some(args.pod_resources_socket.clone()),
        }),
        AgentModeArg::Dra => {
            let mps = MpsConfig {
                pipe_dir: args.mps_pipe_dir.clone(),
                log_dir: args.mps_log_dir.clone(),
                ..MpsConfig::default()
            };
            AgentMode::Dra(Box::new(dra::DraOptions {
                sockets: dra::server::Sockets {
                    registry_dir: args.kubelet_registry_dir.clone(),
                    plugins_dir: args.kubelet_plugins_dir.clone(),
                },
                state_dir: args.state_dir.clone(),
                cdi: dra::cdi::CdiContext {
                    dir: args.cdi_dir.clone(),
                    mps_pipe_dir: Some(mps.pipe_dir.clone()),
                    mig_minors: Default::default(),
                    nvidia_kind: Some(args.nvidia_cdi_kind.clone()).filter(|k| !k.is_empty()),
                    nvidia_ctk: args.nvidia_ctk.clone(),
                    driver_root: args.driver_root.clone(),
                },
                caps_probe: dra::caps::ProbeOptions {
                    host_root: args.host_root.clone(),
                    cgroup_root: args.cgroup_root.clone(),
                },
                mig_minors_file: args.mig_minors_file.clone(),
                mps: Some(mps),
            }))
        }
    }
}

fn print<T: serde::Serialize>(v: &T, format: Output, table: impl FnOnce() -> String) {
    match format {
        Output::Table => print!("{}", table()),
        data => print_data(v, data),
    }
}

pub fn run(cmd: AgentCommand) -> i32 {
    match cmd {
        AgentCommand::Discover { nvml_lib, output } => discover(nvml_lib.as_deref(), output),
        AgentCommand::Apply(args) => apply_spec(args),
        AgentCommand::Run(args) => run_in_cluster(*args),
        AgentCommand::ScrubCheck {
            device,
            bytes,
            cuda_lib,
            output,
        } => scrub_check(&device, &bytes, cuda_lib, output),
        AgentCommand::ScrubWorker { bytes } => scrub_worker(bytes),
    }
}

/// `agent discover`: the GPUs as NVML reports them, with the layout lines a status carries.
fn discover(nvml_lib: Option<&Path>, output: Output) -> i32 {
    let gpus = match NvmlGpus::open(nvml_lib.map(Path::as_os_str)) {
        Ok(g) => g,
        Err(e) => return fail(&e),
    };
    match gpus.discover() {
        Ok(mut s) => {
            s.layout = Some(crate::gpu::status::layout_summary(&s));
            s.gpu_layout = Some(crate::gpu::status::gpu_layout_line(&s));
            print(&s, output, || gpu_output::discover_table(&s));
            0
        }
        Err(e) => fail(&e),
    }
}

/// `agent apply`: the spec applied (or, with `--dry-run`, planned), the status printed and
/// written where asked.
fn apply_spec(args: ApplyArgs) -> i32 {
    let spec = match read_spec(&args.file) {
        Ok(s) => s,
        Err(e) => return fail(&e),
    };
    let prev = previous_status(args.status.as_deref());
    let gpus = match NvmlGpus::open(args.nvml_lib.as_deref().map(Path::as_os_str)) {
        Ok(g) => g.with_cuda(CudaLib(args.cuda_lib)),
        Err(e) => return fail(&e),
    };
    let mps = (!args.no_mps).then(|| MpsConfig {
        control: args.mps_control,
        pipe_dir: args.mps_pipe_dir,
        log_dir: args.mps_log_dir,
        ..Default::default()
    });
    let opts = ApplyOptions {
        mps,
        dry_run: args.dry_run,
    };
    let applied = match apply(&gpus, &spec, prev.as_ref(), &opts) {
        Ok(a) => a,
        Err(e) => return fail(&e),
    };
    if let Some(path) = &args.write_status {
        if args.dry_run {
            eprintln!("--dry-run: not writing {}", path.display());
        } else if let Err(e) = write_atomic(
            path,
            &serde_saphyr::to_string(&applied.status).expect("status serialises"),
        ) {
            return fail(&e);
        }
    }
    print(&applied.status, args.output, || {
        gpu_output::apply_table(&applied.status)
    });
    let all = spec.gpus.iter().all(|g| {
        applied
            .status
            .gpus
            .iter()
            .any(|s| s.index == g.index && s.applied == Some(true))
    });
    if all { 0 } else { 1 }
}

/// The status `--status` names. An unreadable status is no status: every previous owner unknown,
/// every hand-over scrubbed (fails closed, docs/design.md#scrub-on-change-of-hands), rather than
/// no apply at all.
fn previous_status(path: Option<&Path>) -> Option<GpuNodeStatus> {
    match path.map(read_status).transpose() {
        Ok(p) => p.flatten(),
        Err(e) => {
            eprintln!("warning: {e}; every GPU's previous owner is taken as unknown (scrubbed before hand-over)");
            None
        }
    }
}

/// `agent scrub-check`: one scrub of `device`, through the worker, as the agent runs them.
fn scrub_check(device: &str, bytes: &str, cuda_lib: Option<PathBuf>, output: Output) -> i32 {
    let amount = match scrub::parse_amount(bytes) {
        Ok(a) => a,
        Err(e) => return fail(&e),
    };
    match scrub::run(device, amount, &CudaLib(cuda_lib)) {
        Ok(r) => {
            print(&r, output, || {
                format!(
                    "{}: cleared {} of {} free bytes ({} total), {} bytes read back as zero\n",
                    r.device, r.bytes_cleared, r.free_bytes, r.total_bytes, r.bytes_verified
                )
            });
            0
        }
        Err(e) => fail(&e),
    }
}

/// `agent scrub-worker`: the scrub child; its report on standard output, its error as one line.
fn scrub_worker(bytes: Option<u64>) -> i32 {
    // cudarc panics when a symbol is missing; turn that into the one-line error too.
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| info.payload().downcast_ref::<&str>().map(|s| s.to_string()));
        eprintln!(
            "error: CUDA library problem: {}",
            msg.unwrap_or_else(|| "unknown".into())
        );
    }));
    let amount = bytes.map(scrub::Amount::Bytes).unwrap_or(scrub::Amount::AllFree);
    match std::panic::catch_unwind(|| scrub::worker(amount)) {
        Ok(Ok(r)) => {
            println!("{}", serde_json::to_string(&r).expect("report serialises"));
            0
        }
        Ok(Err(e)) => fail(&e),
        Err(_) => 2,
    }
}

fn fail(e: &dyn std::fmt::Display) -> i32 {
    eprintln!("error: {e}");
    2
}

/// A GpuNode manifest (only its spec matters here) or a bare spec.
#[derive(Deserialize)]
struct Manifest {
    spec: GpuNodeSpec,
}

fn read_spec(path: &Path) -> Result<GpuNodeSpec, FileError> {
    let text = std::fs::read_to_string(path).map_err(|source| FileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let value: serde_json::Value = serde_saphyr::from_str(&text).map_err(|e| FileError::NotYaml {
        path: path.to_path_buf(),
        why: first_line(&e.to_string()).to_string(),
    })?;
    let is_manifest = value.get("spec").is_some() || value.get("kind").is_some();
    let parsed = if is_manifest {
        serde_saphyr::from_str::<Manifest>(&text).map(|m| m.spec)
    } else {
        serde_saphyr::from_str::<GpuNodeSpec>(&text)
    };
    let spec = parsed.map_err(|e| FileError::NotSpec {
        path: path.to_path_buf(),
        what: if is_manifest {
            "GpuNode manifest"
        } else {
            "GpuNode spec"
        },
        why: first_line(&e.to_string()).to_string(),
    })?;
    let mut seen = std::collections::BTreeSet::new();
    for g in &spec.gpus {
        if !seen.insert(g.index) {
            return Err(FileError::DuplicateGpu {
                path: path.to_path_buf(),
                gpu: g.index,
            });
        }
    }
    Ok(spec)
}

/// The parser's first line (it adds a source excerpt below), without its own `error:` prefix.
fn first_line(e: &str) -> &str {
    e.lines().next().unwrap_or(e).trim_start_matches("error: ")
}

/// A status file: a bare GpuNode status, or a GpuNode with a `status`. Missing means none.
fn read_status(path: &Path) -> Result<Option<GpuNodeStatus>, FileError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(FileError::Read {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    if text.trim().is_empty() {
        return Ok(None);
    }
    let value: serde_json::Value = serde_saphyr::from_str(&text).map_err(|e| FileError::NotYaml {
        path: path.to_path_buf(),
        why: first_line(&e.to_string()).to_string(),
    })?;
    let inner = value.get("status").cloned().unwrap_or(value);
    serde_json::from_value(inner)
        .map(Some)
        .map_err(|source| FileError::NotStatus {
            path: path.to_path_buf(),
            source,
        })
}

fn write_atomic(path: &Path, text: &str) -> Result<(), FileError> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)
        .and_then(|_| std::fs::rename(&tmp, path))
        .map_err(|source| FileError::Write {
            path: path.to_path_buf(),
            source,
        })
}
