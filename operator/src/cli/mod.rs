//! The `gpu-tenancy` command line. Each subcommand is a thin shell over the pure modules.
//!
//! Exit codes: 0 success, 1 the input has problems (listed one per line), 2 usage or read errors.

pub mod crd;

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
    /// Print the four CustomResourceDefinitions as YAML (what `crds/` holds).
    Crd {
        /// Write one file per CRD (`<plural>.gputenancy.io.yaml`) into this folder instead of printing.
        #[arg(long, value_name = "DIR")]
        out_dir: Option<std::path::PathBuf>,
    },
}

/// Runs a parsed command line and returns the process exit code.
pub fn run(cli: Cli) -> i32 {
    match cli.command {
        Command::Crd { out_dir } => crd::run(out_dir.as_deref()),
    }
}
