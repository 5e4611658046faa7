//! Output formats: tables for people, YAML or JSON for machines.

use clap::ValueEnum;
use serde::Serialize;
use std::io::Write;

/// `-o` of the commands that print one document: `agent` and `import`. `plan -o` adds `wide`
/// ([`super::plan::PlanOutput`]) and `report -o` has CSV, not YAML ([`super::report::ReportOutput`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Aligned columns for people.
    #[default]
    Table,
    /// YAML, for machines.
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

/// Like [`print_table`], but the last column is wrapped at spaces onto lines of their own, so
/// that no line is wider than `width` characters where the other columns leave it room.
pub fn print_table_within(header: &[&str], rows: &[Vec<String>], width: usize) {
    const PADDING: usize = 3;
    let Some(last) = header.len().checked_sub(1) else {
        return;
    };
    let cell = |row: &[String], i: usize| row.get(i).map_or(0, |c| c.chars().count());
    let others: usize = (0..last)
        .map(|i| {
            rows.iter()
                .map(|r| cell(r, i))
                .max()
                .unwrap_or(0)
                .max(header[i].chars().count())
                + PADDING
        })
        .sum();
    let room = width.saturating_sub(others);
    if room < 20 {
        return print_table(header, rows);
    }
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let lines = wrap(row.get(last).map_or("", String::as_str), room);
        for (n, line) in lines.into_iter().enumerate() {
            let mut r: Vec<String> = if n == 0 {
                row[..last.min(row.len())].to_vec()
            } else {
                vec![String::new(); last]
            };
            r.push(line);
            out.push(r);
        }
    }
    print_table(header, &out)
}

/// `text` in lines of at most `width` characters, broken at spaces (a longer word keeps its line).
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = vec![String::new()];
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        let line = lines.last_mut().expect("one line at least");
        if line.is_empty() {
            line.push_str(word);
        } else if line.chars().count() + 1 + word.chars().count() <= width {
            line.push(' ');
            line.push_str(word);
        } else {
            lines.push(word.to_string());
        }
    }
    lines
}
