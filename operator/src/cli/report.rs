//! `gpu-tenancy report`: per-tenant GPU-hours from Prometheus, as a table, JSON or CSV, and a plot.

use crate::report::{self, Report, plot, prometheus::Prometheus};
use clap::ValueEnum;
use std::path::PathBuf;

/// `report -o`: the table, or the report as data ([`super::output::print_data`]'s JSON, or CSV for
/// spreadsheets); no YAML, unlike [`super::output::Output`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ReportOutput {
    /// Aligned columns for people.
    #[default]
    Table,
    Json,
    /// One line per tenant and mode, for spreadsheets.
    Csv,
}

#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// Prometheus that scrapes the agents and the controller, e.g. http://prometheus.monitoring:9090.
    #[arg(long, value_name = "URL", env = "GPU_TENANCY_PROMETHEUS")]
    prometheus: String,
    /// The window, ending now: a Prometheus duration (90s, 30m, 24h, 7d, 2w).
    #[arg(long, value_name = "DURATION", default_value = "7d")]
    since: String,
    #[arg(short = 'o', long, value_enum, default_value_t)]
    output: ReportOutput,
    /// Also draw allocation and use over time per tenant into this .svg or .png file.
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
    /// TrueType font for the plot's text (default: DejaVu or Liberation Sans where installed).
    #[arg(long, value_name = "FILE", requires = "plot")]
    font: Option<PathBuf>,
}

fn hours(h: f64) -> String {
    format!("{h:.2}")
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "-".into(), f)
}

fn table(r: &Report) {
    let mut rows = Vec::new();
    for t in &r.tenants {
        let units = match (t.granted_units, t.requested_units) {
            (Some(g), Some(q)) => format!("{g}/{q}"),
            _ => "-".into(),
        };
        rows.push(vec![
            t.tenant.clone(),
            "all".into(),
            hours(t.allocated_gpu_hours),
            opt(t.used_gpu_hours, hours),
            opt(t.efficiency, |e| format!("{:.0}%", e * 100.0)),
            units,
        ]);
        if t.modes.len() > 1 {
            for m in &t.modes {
                rows.push(vec![
                    String::new(),
                    m.mode.clone(),
                    hours(m.allocated_gpu_hours),
                    opt(m.used_gpu_hours, hours),
                    String::new(),
                    String::new(),
                ]);
            }
        } else if let Some(m) = t.modes.first() {
            rows.last_mut().expect("a row was pushed")[1] = m.mode.clone();
        }
    }
    println!(
        "GPU-hours over the last {} up to {} (UTC), {} GPU-h in all",
        humanize(r.window_seconds),
        jiff::Timestamp::from_second(r.end as i64)
            .map(|t| t.strftime("%Y-%m-%d %H:%M").to_string())
            .unwrap_or_default(),
        hours(r.total_gpu_hours)
    );
    super::output::print_table(
        &["TENANT", "MODE", "ALLOC GPU-h", "USED GPU-h", "EFFIC", "GRANTED/REQ"],
        &rows,
    );
    top_namespaces(r);
    queues(r);
}

/// With Kueue: each tenant's queue, the workloads it admitted in the window and their mean wait.
fn queues(r: &Report) {
    let rows: Vec<Vec<String>> = r
        .tenants
        .iter()
        .filter_map(|t| {
            let admitted = t.admitted_workloads?;
            Some(vec![
                t.tenant.clone(),
                format!("{admitted:.0}"),
                opt(t.mean_queue_wait_seconds, |w| format!("{w:.1}s")),
            ])
        })
        .collect();
    if rows.is_empty() {
        return;
    }
    println!("\nQueues (Kueue): workloads admitted and their mean wait, from creation or requeue");
    super::output::print_table(&["TENANT", "ADMITTED", "MEAN WAIT"], &rows);
}

/// Namespaces shown per tenant in the table (all of them are in the JSON and CSV).
const TOP_NAMESPACES: usize = 3;
/// Longer namespace names are cut in the table, so it stays within 80 columns.
const NAMESPACE_COLUMN: usize = 32;

/// Each tenant's top namespaces: the GPU-hours its pods there held, and their part of the
/// tenant's allocation (the rest no pod held).
fn top_namespaces(r: &Report) {
    let mut rows = Vec::new();
    for t in r.tenants.iter().filter(|t| !t.namespaces.is_empty()) {
        for (i, n) in t.namespaces.iter().take(TOP_NAMESPACES).enumerate() {
            let name = match n.namespace.len() > NAMESPACE_COLUMN {
                true => format!("{}...", &n.namespace[..NAMESPACE_COLUMN - 3]),
                false => n.namespace.clone(),
            };
            let part = (t.allocated_gpu_hours > 0.0).then(|| n.allocated_gpu_hours / t.allocated_gpu_hours);
            rows.push(vec![
                if i == 0 { t.tenant.clone() } else { String::new() },
                name,
                hours(n.allocated_gpu_hours),
                opt(part, |p| format!("{:.0}%", p * 100.0)),
            ]);
        }
    }
    if rows.is_empty() {
        return;
    }
    println!("\nTop namespaces: the GPU-hours their pods held (the kubelet's pod-resources)");
    super::output::print_table(&["TENANT", "NAMESPACE", "HELD GPU-h", "OF ALLOC"], &rows);
}

fn humanize(seconds: f64) -> String {
    let s = seconds.round() as u64;
    match s {
        s if s % 86400 == 0 => format!("{}d", s / 86400),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// One line per tenant and mode, then one per tenant and namespace (mode empty, its GPU-hours
/// held in `allocated_gpu_hours`), then with Kueue one per tenant's queue (mode `queue`).
fn csv(r: &Report) {
    println!(
        "tenant,mode,allocated_gpu_hours,used_gpu_hours,efficiency,admitted_workloads,mean_queue_wait_seconds,namespace"
    );
    for t in &r.tenants {
        for m in &t.modes {
            let eff = match (m.used_gpu_hours, m.allocated_gpu_hours) {
                (Some(u), a) if a > 0.0 => format!("{:.4}", u / a),
                _ => String::new(),
            };
            println!(
                "{},{},{:.4},{},{eff},,,",
                t.tenant,
                m.mode,
                m.allocated_gpu_hours,
                m.used_gpu_hours.map(|u| format!("{u:.4}")).unwrap_or_default()
            );
        }
        for n in &t.namespaces {
            println!("{},,{:.4},,,,,{}", t.tenant, n.allocated_gpu_hours, n.namespace);
        }
        if let Some(n) = t.admitted_workloads {
            let wait = t.mean_queue_wait_seconds.map(|w| format!("{w:.3}")).unwrap_or_default();
            println!("{},queue,,,,{n:.0},{wait},", t.tenant);
        }
    }
}

pub fn run(args: ReportArgs) -> i32 {
    let window = match report::parse_window(&args.since) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    let prom = match Prometheus::new(&args.prometheus) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return 2;
        }
    };
    let result = runtime.block_on(async {
        let r = report::report(&prom, window).await?;
        let timeline = match &args.plot {
            Some(_) => Some(report::timeline(&prom, window, r.end).await?),
            None => None,
        };
        Ok::<_, report::prometheus::PromError>((r, timeline))
    });
    let (r, timeline) = match result {
        Ok(v) => v,
        Err(e) => {
            eprintln!("error: {e}");
            return 1;
        }
    };
    match args.output {
        ReportOutput::Table => table(&r),
        ReportOutput::Json => super::output::print_data(&r, super::output::Output::Json),
        ReportOutput::Csv => csv(&r),
    }
    if let (Some(path), Some(t)) = (&args.plot, &timeline) {
        let title = format!(
            "GPUs allocated (solid) and busy (dashed) per tenant, last {}",
            humanize(window)
        );
        if let Err(e) = plot::draw(path, args.font.as_deref(), &title, t) {
            eprintln!("error: {e}");
            return 1;
        }
        eprintln!("plot written to {}", path.display());
    }
    0
}
