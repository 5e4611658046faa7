use clap::Parser;
use gpu_tenancy::cli::{Cli, run};

fn main() {
    let cli = Cli::parse();
    std::process::exit(run(cli));
}
