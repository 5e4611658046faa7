//! A stand-in for the container toolkit's `nvidia-ctk`, as far as per-container memory caps go:
//!
//! ```text
//! nvidia-ctk --version
//! nvidia-ctk hook apply-cuda-memory-limits --driver-root ROOT --gpu-id GPU-UUID   (OCI state on stdin)
//! ```
//!
//! Run by the container runtime as a `createRuntime` hook, it caps the container's memory on the
//! GPU in the simulated driver (`GPU_TENANCY_SIM_CONFIG` / `GPU_TENANCY_SIM_STATE` name it, as for
//! the library). `--version` answers as nvidia-ctk does, with the version in
//! `GPU_TENANCY_SIM_CTK_VERSION` (default 1.20.1, the first toolkit with the hook), so tests can
//! give the agent an older toolkit.

use clap::{Parser, Subcommand};
use nvidia_ml_sim::{hook, state};
use std::io::Read;
use std::path::PathBuf;

/// The toolkit version `--version` reports.
const VERSION_ENV: &str = "GPU_TENANCY_SIM_CTK_VERSION";
const DEFAULT_VERSION: &str = "1.20.1";

#[derive(Parser)]
#[command(name = "nvidia-ctk", disable_version_flag = true)]
struct Cli {
    /// Print the toolkit's version.
    #[arg(long)]
    version: bool,
    #[command(subcommand)]
    cmd: Option<Top>,
}

#[derive(Subcommand)]
enum Top {
    /// OCI hooks.
    Hook {
        #[command(subcommand)]
        hook: HookCmd,
    },
}

#[derive(Subcommand)]
enum HookCmd {
    /// Cap the container's GPU memory from NVIDIA_GPU_MEMORY_REQUEST / NVIDIA_GPU_MEMORY_LIMIT.
    ApplyCudaMemoryLimits {
        #[arg(long)]
        driver_root: PathBuf,
        #[arg(long)]
        gpu_id: String,
    },
}

fn main() {
    let cli = Cli::parse();
    if cli.version {
        let v = std::env::var(VERSION_ENV).unwrap_or_else(|_| DEFAULT_VERSION.to_string());
        println!("NVIDIA Container Toolkit CLI version {v}");
        println!("commit: 0000000000000000000000000000000000000000");
        return;
    }
    let Some(Top::Hook {
        hook: HookCmd::ApplyCudaMemoryLimits { driver_root, gpu_id },
    }) = cli.cmd
    else {
        eprintln!("nvidia-ctk: give --version or `hook apply-cuda-memory-limits --driver-root R --gpu-id U`");
        std::process::exit(2);
    };
    if let Err(e) = run(&driver_root, &gpu_id) {
        eprintln!("nvidia-ctk hook apply-cuda-memory-limits: {e}");
        std::process::exit(1);
    }
}

fn run(driver_root: &std::path::Path, gpu_id: &str) -> Result<(), Box<dyn std::error::Error>> {
    let paths = state::Paths::from_env()?;
    let mut stdin = String::new();
    std::io::stdin().read_to_string(&mut stdin)?;
    match hook::apply_cuda_memory_limits(&paths, &stdin, driver_root, gpu_id)? {
        Some(cap) => eprintln!(
            "nvidia-ctk: capped container {} on {} at {} MiB",
            cap.container, cap.gpu_uuid, cap.limit_mib
        ),
        None => eprintln!(
            "nvidia-ctk: no {} or {}: nothing to cap",
            hook::REQUEST_ENV,
            hook::LIMIT_ENV
        ),
    }
    Ok(())
}
