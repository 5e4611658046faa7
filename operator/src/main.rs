use clap::Parser;
use gpu_tenancy::cli::{Cli, run};

// jemalloc, not glibc's malloc: at 50,000 nodes the plan is millions of small allocations, and
// glibc's free-list work made `plan` grow faster than the fleet (docs/decisions/jemalloc.md).
// The controller and the agent, the same binary, run on it too.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

// Memory a pass frees is given back to the kernel lazily (`MADV_FREE`, on jemalloc's own thread):
// it stays mapped until the kernel needs it, instead of being unmapped after 10 s. A controller
// idles between changes, and with jemalloc's default its next pass faulted thousands of pages
// back in (`desired_faults` in the pass log), which slowed the first change after a quiet spell.
// The RSS counts those pages until the kernel takes them. The prefixed name is the one
// tikv-jemalloc-sys builds jemalloc to read.
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: &[u8] = b"background_thread:true,muzzy_decay_ms:-1\0";

fn main() {
    let cli = Cli::parse();
    std::process::exit(run(cli));
}
