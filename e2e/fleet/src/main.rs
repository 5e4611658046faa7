//! `gpu-tenancy-fleet`: a fleet of simulated GPU nodes in one process against a real control
//! plane (KUBECONFIG), each node running the agent's own loop on in-memory GPUs; and the fleet
//! benchmark that `make bench-fleet` runs.

mod backend;
mod bench;
mod cluster;
mod fleet;
mod generate;
mod probe;
mod rng;
mod templates;
mod write_cost;

#[cfg(test)]
mod tests;

use clap::{Args, Parser, Subcommand};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(
    name = "gpu-tenancy-fleet",
    about = "A fleet of simulated GPU nodes running the gpu-tenancy agent, in one process"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create the fleet's Nodes, apply its tenants and plans, and run its agents until Ctrl-C.
    Run {
        #[command(flatten)]
        fleet: FleetArgs,
        /// Nodes to run.
        #[arg(long, default_value_t = 1000)]
        nodes: usize,
    },
    /// The benchmark of `make bench-fleet` (the controller must be running; see its --help).
    Bench(BenchArgs),
    /// Write the generated objects (objects.yaml) and an inventory (inventory.yaml) for
    /// `gpu-tenancy plan` to a directory.
    Generate {
        #[arg(long, default_value_t = 1000)]
        nodes: usize,
        /// Tenants (default: a third of the nodes, at least 10).
        #[arg(long)]
        tenants: Option<usize>,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
}

#[derive(Args, Clone)]
struct FleetArgs {
    /// Seconds between an agent's polls when nothing changes (spec changes wake it at once).
    #[arg(long, default_value_t = 30)]
    poll: u64,
    /// Seconds over which new nodes' agents start.
    #[arg(long, default_value_t = 20)]
    ramp: u64,
    /// Share of NVML mutations that fail (NVML_ERROR_UNKNOWN), 0 to 1.
    #[arg(long, default_value_t = 0.01)]
    fail_rate: f64,
    /// Busy processes started per node and hour (the benchmark turns them on for its rollout).
    #[arg(long, default_value_t = 6)]
    busy_per_node_hour: u32,
    /// Seconds each busy process runs.
    #[arg(long, default_value_t = 20)]
    busy_seconds: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The gpu-tenancy binary (for one discovery of the simulated GPU models).
    #[arg(long, value_name = "PATH", default_value = "target/release/gpu-tenancy")]
    gpu_tenancy: PathBuf,
    /// The simulated NVML library that discovery reads.
    #[arg(long, value_name = "PATH", default_value = "target/release/libnvidia_ml_sim.so")]
    nvml_sim: PathBuf,
    /// Scratch directory (the simulator's config and state for that discovery).
    #[arg(long, value_name = "DIR", default_value = "target/bench-fleet")]
    work_dir: PathBuf,
}

#[derive(Args)]
struct BenchArgs {
    #[command(flatten)]
    fleet: FleetArgs,
    /// PID of the running `gpu-tenancy controller` (its RSS and CPU are read from /proc).
    #[arg(long)]
    controller_pid: u32,
    /// Its --metrics-addr, as HOST:PORT.
    #[arg(long, value_name = "HOST:PORT")]
    metrics_addr: String,
    /// Its log (--log-format json), for the planner's time per pass.
    #[arg(long, value_name = "FILE")]
    controller_log: Option<PathBuf>,
    /// PID of the control plane (`e2e/controlplane`: etcd and the API server in one process),
    /// whose CPU until each phase's last write is reported too.
    #[arg(long)]
    control_plane_pid: Option<u32>,
    /// Nodes of the first measurement; the fleet then grows to --nodes.
    #[arg(long, env = "BENCH_FLEET_START_NODES", default_value_t = 100)]
    start_nodes: usize,
    #[arg(long, env = "BENCH_FLEET_NODES", default_value_t = 1000)]
    nodes: usize,
    /// Seconds of the idle period (target: no writes).
    #[arg(long, env = "BENCH_FLEET_IDLE", default_value_t = 300)]
    idle: u64,
    /// A phase has converged when nothing was written for this many seconds.
    #[arg(long, default_value_t = 10)]
    quiet: u64,
    /// Give up on a phase after this many seconds.
    #[arg(long, default_value_t = 600)]
    converge_timeout: u64,
    /// Rounds of the write-cost comparison at the end (a GpuNode's status against the same
    /// bytes in a ConfigMap, control plane CPU per write; needs --control-plane-pid; 0: skip).
    #[arg(long, default_value_t = 5)]
    write_cost_rounds: usize,
    /// Writes of each kind a round.
    #[arg(long, default_value_t = 100)]
    write_cost_writes: usize,
    /// Also time `gpu-tenancy plan` on a generated inventory of this many nodes (0: skip).
    #[arg(long, env = "BENCH_FLEET_PLAN_NODES", default_value_t = 50000)]
    plan_nodes: usize,
    /// The JSON report.
    #[arg(long, value_name = "FILE", default_value = "target/bench-fleet.json")]
    out: PathBuf,
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Generate {
            nodes,
            tenants,
            seed,
            out,
        } => report(write_generated(
            nodes,
            tenants.unwrap_or(generate::tenant_count(nodes)),
            seed,
            &out,
        )),
        Command::Run { fleet, nodes } => runtime().block_on(run(fleet, nodes)),
        Command::Bench(args) => runtime().block_on(bench_main(args)),
    };
    std::process::exit(code);
}

fn report(r: Result<(), String>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            2
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(2);
        }
    }
}

/// objects.yaml and inventory.yaml (JSON documents, which YAML reads).
fn write_generated(nodes: usize, tenants: usize, seed: u64, out: &Path) -> Result<(), String> {
    std::fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let docs: Vec<String> = generate::objects(tenants, seed).iter().map(|o| o.to_string()).collect();
    let objects = out.join("objects.yaml");
    std::fs::write(&objects, docs.join("\n---\n")).map_err(|e| format!("cannot write {}: {e}", objects.display()))?;
    let inventory = out.join("inventory.yaml");
    std::fs::write(&inventory, generate::inventory(nodes).to_string())
        .map_err(|e| format!("cannot write {}: {e}", inventory.display()))
}

/// `gpu-tenancy plan -o json` on the files [`write_generated`] wrote into `dir`.
fn plan_command(gpu_tenancy: &Path, dir: &Path) -> std::process::Command {
    let mut cmd = std::process::Command::new(gpu_tenancy);
    cmd.arg("plan")
        .arg("-f")
        .arg(dir.join("objects.yaml"))
        .arg("--inventory")
        .arg(dir.join("inventory.yaml"))
        .args(["-o", "json"]);
    cmd
}

async fn start_fleet(args: &FleetArgs) -> Result<fleet::Fleet, String> {
    if !(0.0..=1.0).contains(&args.fail_rate) {
        return Err(format!("--fail-rate {}: give a share between 0 and 1", args.fail_rate));
    }
    let templates = templates::discover(&args.gpu_tenancy, &args.nvml_sim, &args.work_dir)?;
    fleet::Fleet::new(
        templates,
        (args.fail_rate * 1e6) as u32,
        fleet::FleetOptions {
            poll: Duration::from_secs(args.poll.max(1)),
            ramp: Duration::from_secs(args.ramp),
            seed: args.seed,
            busy_per_node_hour: args.busy_per_node_hour,
            busy_for: Duration::from_secs(args.busy_seconds),
        },
    )
    .await
}

async fn run(args: FleetArgs, nodes: usize) -> i32 {
    let result = async {
        let fleet = start_fleet(&args).await?;
        let harness = fleet::counting_client(Default::default()).await?;
        cluster::ensure_namespace(&harness, "nvidia-device-plugin").await?;
        cluster::apply_objects(&harness, &generate::objects(generate::tenant_count(nodes), args.seed)).await?;
        fleet.grow(0, nodes).await?;
        eprintln!("fleet: {nodes} nodes running; Ctrl-C stops");
        tokio::signal::ctrl_c().await.map_err(|e| e.to_string())?;
        fleet.stop();
        Ok::<(), String>(())
    }
    .await;
    report(result)
}

async fn bench_main(args: BenchArgs) -> i32 {
    let result = async {
        if args.start_nodes == 0 || args.nodes < args.start_nodes {
            return Err(format!(
                "--start-nodes {} and --nodes {}: give 0 < start-nodes <= nodes",
                args.start_nodes, args.nodes
            ));
        }
        let fleet = start_fleet(&args.fleet).await?;
        let harness = fleet::counting_client(Default::default()).await?;
        let mut ctl = probe::Controller::new(args.controller_pid, &args.metrics_addr, args.controller_log.clone());
        ctl.control_plane_pid = args.control_plane_pid;
        ctl.metrics().await?;
        let opts = bench::BenchOptions {
            start_nodes: args.start_nodes,
            nodes: args.nodes,
            tenants: generate::tenant_count(args.nodes),
            seed: args.fleet.seed,
            idle: Duration::from_secs(args.idle),
            quiet: Duration::from_secs(args.quiet),
            converge_timeout: Duration::from_secs(args.converge_timeout),
        };
        let r = bench::run(&fleet, &harness, &ctl, &opts).await?;
        let cost = match (args.control_plane_pid, args.write_cost_rounds) {
            (Some(_), rounds) if rounds > 0 => {
                eprintln!(
                    "bench-fleet: control plane CPU per write: a GpuNode's status as its agent sends it, with the server's default field validation, and its bytes in a ConfigMap ({rounds} rounds of {} each) ...",
                    args.write_cost_writes
                );
                // A side measurement: its failure is reported, and the run's report still written.
                match write_cost::measure(&harness, &ctl, rounds, args.write_cost_writes.max(1)).await {
                    Ok(c) => Some(c),
                    Err(e) => {
                        eprintln!("bench-fleet: warning: the write-cost comparison did not finish: {e}");
                        None
                    }
                }
            }
            _ => None,
        };
        fleet.stop();
        let plan = if args.plan_nodes > 0 {
            Some(time_plan(&args.fleet, args.plan_nodes)?)
        } else {
            None
        };
        let mut json = serde_json::to_value(&r).map_err(|e| e.to_string())?;
        json["write_cost"] = serde_json::to_value(&cost).map_err(|e| e.to_string())?;
        json["plan_wall_seconds"] =
            serde_json::json!(plan.map(|(n, t, s)| serde_json::json!({"nodes": n, "tenants": t, "seconds": s})));
        std::fs::write(
            &args.out,
            serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?,
        )
        .map_err(|e| format!("cannot write {}: {e}", args.out.display()))?;
        println!("\n{}", bench::table(&r));
        if let Some(c) = &cost {
            println!(
                "{:<58} {:.1} ms ({:.1}-{:.1})",
                format!("control plane CPU a write: GpuNode status, {} B", c.status_bytes),
                c.gpunode_status_ms,
                c.gpunode_status_ms_range.0,
                c.gpunode_status_ms_range.1
            );
            println!(
                "{:<58} {:.1} ms ({:.1}-{:.1})",
                "control plane CPU a write: same, default validation (Warn)",
                c.gpunode_status_default_validation_ms,
                c.gpunode_status_default_validation_ms_range.0,
                c.gpunode_status_default_validation_ms_range.1
            );
            println!(
                "{:<58} {:.1} ms ({:.1}-{:.1})",
                "control plane CPU a write: the same bytes in a ConfigMap",
                c.config_map_ms,
                c.config_map_ms_range.0,
                c.config_map_ms_range.1
            );
        }
        if let Some((n, t, s)) = plan {
            println!(
                "{:<58} {s:.2} s",
                format!("gpu-tenancy plan, {n} nodes, {t} tenants (release)")
            );
        }
        println!("{:<58} {}", "report", args.out.display());
        Ok(r.failures)
    }
    .await;
    match result {
        Ok(failures) if failures.is_empty() => {
            println!("bench-fleet: every invariant target held");
            0
        }
        Ok(failures) => {
            for f in failures {
                println!("bench-fleet: FAILED: {f}");
            }
            1
        }
        Err(e) => {
            eprintln!("error: {e}");
            2
        }
    }
}

/// Wall time of `gpu-tenancy plan -o json` on a generated fleet of `nodes` nodes.
fn time_plan(args: &FleetArgs, nodes: usize) -> Result<(usize, usize, f64), String> {
    let tenants = generate::tenant_count(nodes);
    eprintln!(
        "bench-fleet: timing gpu-tenancy plan on a generated inventory of {nodes} nodes and {tenants} tenants ..."
    );
    let dir = args.work_dir.join(format!("plan-{nodes}"));
    write_generated(nodes, tenants, args.seed, &dir)?;
    let start = Instant::now();
    let out = plan_command(&args.gpu_tenancy, &dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", args.gpu_tenancy.display()))?;
    let seconds = start.elapsed().as_secs_f64();
    // Exit 1 means the plan has problems (tenants short of capacity are not problems); 2 is an error.
    if out.status.code() == Some(2) {
        return Err(format!(
            "gpu-tenancy plan failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok((nodes, tenants, seconds))
}
