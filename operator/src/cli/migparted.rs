//! `gpu-tenancy import --from mig-parted FILE` and `gpu-tenancy export --to mig-parted -f PATH...`.

use super::load::load;
use super::output::{Output, print_data};
use crate::migparted::{MigPartedFile, export, import};
use std::path::{Path, PathBuf};

pub fn run_import(file: &Path, config: Option<&str>, output: Output) -> i32 {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: cannot read {}: {e}", file.display());
            return 2;
        }
    };
    let parsed = match MigPartedFile::parse(&text) {
        Ok(f) => f,
        Err(e) => {
            println!("{}: mig-parted: -: {e}", file.display());
            return 1;
        }
    };
    let plans = match import(&parsed, config) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {}: {e}", file.display());
            return 2;
        }
    };
    match output {
        Output::Json => print_data(&plans, Output::Json),
        _ => {
            let docs: Vec<String> = plans
                .iter()
                .map(|p| serde_saphyr::to_string(p).expect("a plan serialises"))
                .collect();
            print!("{}", docs.join("---\n"));
        }
    }
    eprintln!("imported {} GpuPartitionPlans", plans.len());
    0
}

pub fn run_export(paths: &[PathBuf]) -> i32 {
    let loaded = match load(paths) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    if !loaded.problems.is_empty() {
        for p in &loaded.problems {
            println!("{p}");
        }
        return 1;
    }
    let (file, notes) = export(&loaded.plans);
    print!(
        "{}",
        serde_saphyr::to_string(&file).expect("a mig-parted file serialises")
    );
    for n in notes {
        eprintln!("note: {n}");
    }
    0
}
