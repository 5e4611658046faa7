//! Drives the simulated NVML node from outside: start and stop workloads, reboot, reset, inject
//! faults, read the mutation log and the state. Uses the same `GPU_TENANCY_SIM_CONFIG` (and
//! `GPU_TENANCY_SIM_STATE`) as the library.

use clap::{Parser, Subcommand};
use nvidia_ml_sim::{caps, ctl, stale, state};

/// Control the simulated NVML node (state file from GPU_TENANCY_SIM_CONFIG / GPU_TENANCY_SIM_STATE).
#[derive(Parser)]
#[command(name = "sim-ctl")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start a simulated compute process on a GPU or on the MIG instance starting at --start.
    Attach {
        /// GPU index.
        #[arg(long)]
        gpu: u32,
        /// Memory slice where the MIG instance starts (required on a MIG GPU).
        #[arg(long)]
        start: Option<u32>,
        /// Process ID to report.
        #[arg(long)]
        pid: u32,
        /// Tenant whose data the process leaves in memory.
        #[arg(long)]
        tenant: Option<String>,
        /// Memory the process uses, MiB.
        #[arg(long, default_value_t = 1024)]
        mib: u64,
        /// Percent of the device's SMs the process keeps busy (0-100).
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=100))]
        sm_util: u32,
    },
    /// A process of a container allocates memory on a whole GPU (registered on its first
    /// allocation): past the container's cap (set by the toolkit's hook) or the GPU's free memory
    /// it fails as out of memory (exit code 3) and nothing changes.
    Alloc {
        /// GPU UUID or index.
        #[arg(long)]
        gpu: String,
        /// The container's ID (as the OCI runtime gave it to the hook).
        #[arg(long)]
        container: String,
        /// Process ID to report.
        #[arg(long)]
        pid: u32,
        /// MiB allocated now, on top of what the process holds.
        #[arg(long)]
        mib: u64,
        /// Tenant whose data the process leaves in memory.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// End a simulated process (its data stays in GPU memory).
    Detach {
        #[arg(long)]
        pid: u32,
    },
    /// Hold a GPU open without a compute process (nvidia-persistenced, nvidia_drm...): it cannot be
    /// reset, so a MIG mode change stays pending with activation status IN_USE.
    Hold {
        #[arg(long)]
        gpu: u32,
        #[arg(long, default_value = "nvidia-persistenced")]
        by: String,
    },
    /// Let go of a GPU held with `hold` (every holder without --by).
    Release {
        #[arg(long)]
        gpu: u32,
        #[arg(long)]
        by: Option<String>,
    },
    /// Reboot the node: instances and processes are gone, pending MIG modes apply.
    Reboot,
    /// Reset one GPU (a pass-through GPU: reboot its VM): applies its pending MIG mode (refused
    /// while processes run or holders hold it).
    Reset {
        #[arg(long)]
        gpu: u32,
    },
    /// Make the N-th next call of a function (or `mutation`: any mutating call) fail.
    Fail {
        /// NVML/CUDA function name, or `mutation`.
        #[arg(long)]
        call: String,
        /// Only calls about this GPU (or its instances) count.
        #[arg(long)]
        gpu: Option<u32>,
        /// Which call from now fails (1 = the next).
        #[arg(long, default_value_t = 1)]
        nth: u64,
        /// Error: an NVML name such as IN_USE, UNKNOWN, INSUFFICIENT_RESOURCES, or a number.
        #[arg(long, default_value = "UNKNOWN")]
        error: String,
        /// How many consecutive calls fail.
        #[arg(long, default_value_t = 1)]
        times: u32,
    },
    /// Make calls fail at random, each with probability --rate, until `clear-faults`.
    FailRandom {
        /// NVML/CUDA function name, `mutation` (mutating calls) or `any` (every call).
        #[arg(long, default_value = "any")]
        call: String,
        /// Only calls about this GPU (or its instances) count.
        #[arg(long)]
        gpu: Option<u32>,
        /// Probability that a matching call fails, 0 to 1.
        #[arg(long)]
        rate: f64,
        /// Error: an NVML name such as UNKNOWN, GPU_IS_LOST, or a number.
        #[arg(long, default_value = "UNKNOWN")]
        error: String,
        /// Seed of the generator (non-zero), to repeat a run.
        #[arg(long)]
        seed: Option<u64>,
    },
    /// Abort the process that makes the N-th mutation from now, right after it lands.
    AbortAt {
        #[arg(long)]
        mutation: u64,
    },
    /// Remove every injected fault and abort point.
    ClearFaults,
    /// Mark a GPU (or the instance at --start) as holding a tenant's data.
    Dirty {
        #[arg(long)]
        gpu: u32,
        #[arg(long)]
        start: Option<u32>,
        #[arg(long)]
        tenant: String,
    },
    /// The driver reports an error on a GPU (or the MIG instance at --start), as NVML's event sets
    /// deliver it: an XID (--xid 79: fallen off the bus; 48: double-bit ECC; 13: an application's
    /// fault) or an uncorrectable ECC error (--ecc-uncorrectable).
    Event {
        #[arg(long)]
        gpu: u32,
        #[arg(long)]
        start: Option<u32>,
        #[arg(
            long,
            required_unless_present = "ecc_uncorrectable",
            conflicts_with = "ecc_uncorrectable"
        )]
        xid: Option<u64>,
        #[arg(long)]
        ecc_uncorrectable: bool,
    },
    /// Plant a stale byte that a memset does not clear, at --offset of the memory a scrub of the
    /// GPU (or of the MIG instance at --start) clears, in the order it clears it.
    Plant {
        #[arg(long)]
        gpu: u32,
        #[arg(long)]
        start: Option<u32>,
        /// Bytes from the start of the memory the scrub clears.
        #[arg(long)]
        offset: u64,
        /// The byte, 0x01 to 0xFF.
        #[arg(long, default_value = "0xAB", value_parser = stale::parse_byte)]
        value: u8,
    },
    /// Remove the stale bytes of a GPU and its instances (of every GPU without --gpu).
    Unplant {
        #[arg(long)]
        gpu: Option<u32>,
    },
    /// Print the mutation log as JSON lines (after mutation number --since).
    Log {
        #[arg(long, default_value_t = 0)]
        since: u64,
    },
    /// Print the whole simulated state as JSON.
    State,
}

fn main() {
    let cli = Cli::parse();
    let result = state::Paths::from_env().and_then(|p| run(&p, cli.cmd));
    if let Err(e) = result {
        eprintln!("sim-ctl: {e}");
        std::process::exit(2);
    }
}

/// Exit code of an allocation refused as out of memory (2: any other error).
const OUT_OF_MEMORY: i32 = 3;

fn alloc(
    p: &state::Paths,
    gpu: String,
    container: String,
    pid: u32,
    mib: u64,
    tenant: Option<String>,
) -> Result<(), String> {
    let gpu_uuid = match gpu.parse::<u32>() {
        Ok(i) => state::read(p)?
            .gpu(i)
            .map(|g| g.uuid.clone())
            .ok_or_else(|| format!("no GPU {i}"))?,
        Err(_) => gpu,
    };
    let a = caps::Alloc {
        gpu_uuid,
        container,
        pid,
        mib,
        tenant,
    };
    match caps::alloc(p, &a) {
        Ok(total) => {
            println!("{total}");
            Ok(())
        }
        Err(e) if e.is_out_of_memory() => {
            eprintln!("sim-ctl: {e}");
            std::process::exit(OUT_OF_MEMORY);
        }
        Err(e) => Err(e.to_string()),
    }
}

fn run(p: &state::Paths, cmd: Cmd) -> Result<(), String> {
    match cmd {
        Cmd::Attach {
            gpu,
            start,
            pid,
            tenant,
            mib,
            sm_util,
        } => ctl::attach(
            p,
            &ctl::Attach {
                gpu,
                placement_start: start,
                pid,
                tenant,
                used_mib: mib,
                sm_util,
            },
        ),
        Cmd::Alloc {
            gpu,
            container,
            pid,
            mib,
            tenant,
        } => alloc(p, gpu, container, pid, mib, tenant),
        Cmd::Detach { pid } => ctl::detach(p, pid),
        Cmd::Hold { gpu, by } => ctl::hold(p, gpu, &by),
        Cmd::Release { gpu, by } => ctl::release(p, gpu, by.as_deref()),
        Cmd::Reboot => ctl::reboot(p),
        Cmd::Reset { gpu } => ctl::reset(p, gpu),
        Cmd::Fail {
            call,
            gpu,
            nth,
            error,
            times,
        } => ctl::fail_on(p, &call, gpu, nth, &error, times),
        Cmd::FailRandom {
            call,
            gpu,
            rate,
            error,
            seed,
        } => ctl::fail_at_random(p, &call, gpu, rate, &error, seed),
        Cmd::AbortAt { mutation } => ctl::abort_at(p, mutation),
        Cmd::ClearFaults => ctl::clear_faults(p),
        Cmd::Dirty { gpu, start, tenant } => ctl::set_dirty(p, gpu, start, &tenant),
        Cmd::Event {
            gpu,
            start,
            xid,
            ecc_uncorrectable: _,
        } => {
            let event = xid.map_or(ctl::DriverEvent::EccUncorrectable, ctl::DriverEvent::Xid);
            ctl::event(p, gpu, start, event)
        }
        Cmd::Plant {
            gpu,
            start,
            offset,
            value,
        } => stale::plant(p, gpu, start, offset, value),
        Cmd::Unplant { gpu } => stale::unplant(p, gpu),
        Cmd::Log { since } => {
            for e in ctl::log_since(p, since)? {
                println!("{}", serde_json::to_string(&e).expect("log entries serialise"));
            }
            Ok(())
        }
        Cmd::State => {
            println!(
                "{}",
                serde_json::to_string_pretty(&state::read(p)?).expect("state serialises")
            );
            Ok(())
        }
    }
}
