use clap::Parser;
use gpu_tenancy::cli::{Cli, run};

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    let cli = Cli::parse();
    std::process::exit(run(cli));
}
