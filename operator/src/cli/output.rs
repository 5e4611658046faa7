//! Output formats: tables for people, YAML or JSON for machines.

use clap::ValueEnum;
use serde::Serialize;
use std::io::Write;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Aligned columns for people.
    #[default]
    Table,
    /// YAML, for machines and for applying.
    Yaml,
    /// JSON, for machines.
    Json,
}

/// Prints a value as YAML or JSON.
pub fn print_data<T: Serialize>(value: &T, format: Output) {
    match format {
        Output::Json => println!("{}", serde_json::to_string_pretty(value).expect("output serialises")),
        _ => print!("{}", serde_saphyr::to_string(value).expect("output serialises")),
    }
}

/// Prints rows as columns aligned the way `kubectl get` aligns them.
pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let mut tw = tabwriter::TabWriter::new(Vec::new()).padding(3);
    let _ = writeln!(tw, "{}", header.join("\t"));
    for row in rows {
        let _ = writeln!(tw, "{}", row.join("\t"));
    }
    let _ = tw.flush();
    if let Ok(bytes) = tw.into_inner() {
        print!("{}", String::from_utf8_lossy(&bytes));
    }
}
