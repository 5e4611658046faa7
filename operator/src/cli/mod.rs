//! The `gpu-tenancy` command line. Each subcommand is a thin shell over the pure modules.
//!
//! Exit codes: 0 success, 1 the input has problems (listed one per line), 2 usage or read errors.

pub mod agent;
mod controller;
pub mod crd;
pub mod docs;
mod gpu_output;
mod load;
pub mod logging;
mod migparted;
mod output;
pub mod plan;
mod report;
mod validate;

pub use output::Output;

use clap::{Parser, Subcommand};

/// Share GPUs between teams on Kubernetes: MIG, MPS, time-slicing and exclusive GPUs by trust tier.
#[derive(Parser, Debug)]
#[command(name = "gpu-tenancy", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// The node agent's GPU layer: discover GPUs through NVML, apply a GpuNode spec to them.
    #[command(subcommand)]
    Agent(agent::AgentCommand),
    /// Keep the cluster equal to the desired state: GpuNode specs, statuses, quotas, admission
    /// policies, node labels and taints, the device plugin's config. Runs in the cluster (a
    /// leader-elected Deployment) or anywhere with a KUBECONFIG.
    Controller(controller::ControllerArgs),
    /// Print the four CustomResourceDefinitions as YAML (what `crds/` holds).
    Crd {
        /// Write one file per CRD (`<plural>.gputenancy.io.yaml`) into this folder instead of printing.
        #[arg(long, value_name = "DIR")]
        out_dir: Option<std::path::PathBuf>,
    },
    /// Write the generated reference pages (CRD fields, this help) into a folder: `make docs`.
    #[command(hide = true)]
    Docs {
        /// The folder (docs/reference).
        #[arg(long, value_name = "DIR")]
        out_dir: std::path::PathBuf,
    },
    /// Check manifests offline: schema, CEL rules, policy references and MIG feasibility.
    ///
    /// Prints one line per problem as `FILE: Kind/name: field.path: message`. Exit 0 when all is
    /// valid, 1 when there are problems, 2 when a path cannot be read.
    Validate {
        /// Files or folders of YAML (multi-document); `-` reads standard input. Folders are read
        /// recursively (*.yaml, *.yml). An inventory file among them adds its GPU models to the MIG checks; a mig-parted file is
        /// checked through its imported plans.
        #[arg(short = 'f', long = "filename", value_name = "PATH", required = true, num_args = 1..)]
        paths: Vec<std::path::PathBuf>,
    },
    /// Show what the controller would write for a described fleet or a cluster's exported objects,
    /// offline: each node's GpuNode spec, each tenant's grants and conditions, what changes hands,
    /// and every problem. Exit 1 when there are problems.
    Plan {
        /// Files or folders of manifests (SharingPolicy, GpuTenant, GpuPartitionPlan); `-` reads
        /// standard input.
        #[arg(short = 'f', long = "filename", value_name = "PATH", required = true, num_args = 1..)]
        paths: Vec<std::path::PathBuf>,
        /// The fleet: nodes, their labels and GPUs (see examples/inventory.yaml). Without it, the
        /// Nodes and GpuNodes among the manifests are the fleet, running state included:
        /// `kubectl get nodes,gpunodes,gputenancy -o yaml | gpu-tenancy plan -f -`.
        #[arg(long, value_name = "FILE")]
        inventory: Option<std::path::PathBuf>,
        /// Output format: `table` for people (`wide`: every MIG instance's placement and tenant),
        /// `yaml` or `json` ({nodes, tenants, problems}) for machines.
        #[arg(short = 'o', long, value_enum, default_value_t = plan::PlanOutput::Table)]
        output: plan::PlanOutput,
        /// Plan as for a cluster with Kueue's CRDs installed (the controller finds them by
        /// discovery): each tenant's ClusterQueue, LocalQueues and WorkloadPriorityClass, a
        /// ResourceFlavor per plan, a Cohort per lending tier, and namespace quotas at the whole
        /// grant.
        #[arg(long)]
        kueue: bool,
    },
    /// Turn an NVIDIA mig-parted config file into GpuPartitionPlans (one per config entry).
    Import {
        /// Source format; only `mig-parted` is supported.
        #[arg(long, value_enum)]
        from: Format,
        /// The mig-parted config file.
        #[arg(value_name = "FILE")]
        file: std::path::PathBuf,
        /// Import only this named config (default: all of them).
        #[arg(long, value_name = "NAME")]
        config: Option<String>,
        /// `yaml` (multi-document, ready for kubectl apply) or `json`.
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Yaml)]
        output: Output,
    },
    /// Turn GpuPartitionPlans back into an NVIDIA mig-parted config file.
    Export {
        /// Target format; only `mig-parted` is supported.
        #[arg(long, value_enum)]
        to: Format,
        /// Files or folders holding the plans.
        #[arg(short = 'f', long = "filename", value_name = "PATH", required = true, num_args = 1..)]
        paths: Vec<std::path::PathBuf>,
    },
    /// Showback from Prometheus: per tenant and mode the GPU-hours allocated and used over a
    /// window, efficiency, units granted and requested; with --plot, allocation and use over
    /// time. Exit 1 when Prometheus cannot answer, 2 on usage errors.
    Report(report::ReportArgs),
}

/// Foreign file formats `import` and `export` understand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// NVIDIA mig-parted (`version: v1`, `mig-configs:`).
    MigParted,
}

/// Runs a parsed command line and returns the process exit code.
pub fn run(cli: Cli) -> i32 {
    match cli.command {
        Command::Agent(cmd) => agent::run(cmd),
        Command::Controller(args) => controller::run_controller(args),
        Command::Crd { out_dir } => crd::run(out_dir.as_deref()),
        Command::Docs { out_dir } => docs::run(&out_dir),
        Command::Validate { paths } => validate::run(&paths),
        Command::Plan {
            paths,
            inventory,
            output,
            kueue,
        } => plan::run(&paths, inventory.as_deref(), output, kueue),
        Command::Import {
            from: Format::MigParted,
            file,
            config,
            output,
        } => migparted::run_import(&file, config.as_deref(), output),
        Command::Export {
            to: Format::MigParted,
            paths,
        } => migparted::run_export(&paths),
        Command::Report(args) => report::run(args),
    }
}
