use clap::Parser;
use gpu_tenancy::cli::{Cli, run};

// jemalloc, not glibc's malloc: at 50,000 nodes the plan is millions of small allocations, and
// glibc's free-list work made `plan` grow faster than the fleet (`perf`: `_int_malloc`,
// `unlink_chunk` and `malloc_consolidate` 17-19x the time for 10x the fleet). The controller and
// the agent, the same binary, run on it too.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    let cli = Cli::parse();
    std::process::exit(run(cli));
}
