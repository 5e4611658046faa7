//! What the benchmark reads about the controller process: its memory and CPU from `/proc`, and
//! its own counters from `/metrics` (OpenMetrics text).

use std::collections::BTreeMap;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The controller under measurement.
pub struct Controller {
    pub pid: u32,
    /// `HOST:PORT` of its `--metrics-addr`.
    pub metrics_addr: String,
    /// Its `--log-format json` log, whose `pass done` lines give each pass's planner time.
    pub log: Option<std::path::PathBuf>,
    /// PID of the control plane (API server and etcd), whose CPU each phase reports too.
    pub control_plane_pid: Option<u32>,
    clock_ticks: f64,
}

/// One `pass done` line of the controller's log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PassLine {
    pub writes: u64,
    /// Time of the desired state and its diff, without the writes.
    pub plan_ms: u64,
    /// The desired state alone, planned from the last pass's memo; and from nothing, beside it
    /// (`--check-incremental`).
    pub desired_ms: Option<u64>,
    pub full_ms: Option<u64>,
    /// Of `desired_ms`, the controller's thread on a core (the rest it waited for one).
    pub desired_cpu_ms: Option<u64>,
}

/// The controller's counters at one moment.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    /// `objects_written_total` by `kind/action`.
    pub written: BTreeMap<String, f64>,
    pub passes: f64,
    pub pass_seconds_sum: f64,
    pub pass_seconds_count: f64,
    /// Pass-duration histogram: (upper bound in seconds, cumulative count).
    pub pass_buckets: Vec<(f64, f64)>,
}

impl Metrics {
    pub fn written_total(&self) -> f64 {
        self.written.values().sum()
    }

    /// Writes since `before`, by kind and action (those that changed).
    pub fn written_since(&self, before: &Metrics) -> BTreeMap<String, u64> {
        self.written
            .iter()
            .filter_map(|(k, v)| {
                let d = v - before.written.get(k).copied().unwrap_or(0.0);
                (d > 0.0).then(|| (k.clone(), d as u64))
            })
            .collect()
    }

    /// Passes since `before`: how many, their mean, and the upper bound of the slowest one's
    /// histogram bucket (seconds).
    pub fn passes_since(&self, before: &Metrics) -> (u64, f64, f64) {
        let n = self.pass_seconds_count - before.pass_seconds_count;
        let mean = if n > 0.0 {
            (self.pass_seconds_sum - before.pass_seconds_sum) / n
        } else {
            0.0
        };
        // Cumulative buckets: the slowest pass lies in the first bucket that holds them all.
        let slowest = self
            .pass_buckets
            .iter()
            .find(|(le, c)| {
                let b = before
                    .pass_buckets
                    .iter()
                    .find(|(l, _)| l == le)
                    .map_or(0.0, |(_, c)| *c);
                c - b >= n
            })
            .map_or(0.0, |(le, _)| *le);
        (n as u64, mean, slowest)
    }
}

impl Controller {
    pub fn new(pid: u32, metrics_addr: &str, log: Option<std::path::PathBuf>) -> Controller {
        let clock_ticks = std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0);
        Controller {
            pid,
            metrics_addr: metrics_addr.to_string(),
            log,
            control_plane_pid: None,
            clock_ticks,
        }
    }

    /// Resident memory (VmRSS) in MiB.
    pub fn rss_mib(&self) -> Result<f64, String> {
        let path = format!("/proc/{}/status", self.pid);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("the controller (pid {}) is gone: {path}: {e}", self.pid))?;
        text.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map(|kb| kb / 1024.0)
            .ok_or_else(|| format!("{path} has no VmRSS line"))
    }

    /// CPU seconds used so far (user + system).
    pub fn cpu_seconds(&self) -> Result<f64, String> {
        self.cpu_seconds_of(self.pid, "the controller")
    }

    /// The control plane's CPU seconds so far (user + system; `e2e/controlplane` runs etcd, the
    /// API server and the garbage collector in one process), when its PID was given: what the
    /// fleet's and the controller's requests cost the API server.
    pub fn control_plane_cpu_seconds(&self) -> Option<f64> {
        let pid = self.control_plane_pid?;
        match self.cpu_seconds_of(pid, "the control plane") {
            Ok(s) => Some(s),
            Err(e) => {
                eprintln!("bench-fleet: {e}");
                None
            }
        }
    }

    fn cpu_seconds_of(&self, pid: u32, what: &str) -> Result<f64, String> {
        let path = format!("/proc/{pid}/stat");
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{what} (pid {pid}) is gone: {path}: {e}"))?;
        // Fields after the command name (which may hold spaces) start at field 3, `state`;
        // utime and stime are fields 14 and 15.
        let rest = text.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
        match (ticks(11), ticks(12)) {
            (Some(u), Some(s)) => Ok((u + s) / self.clock_ticks),
            _ => Err(format!("{path}: cannot read utime and stime")),
        }
    }

    /// Every pass the log reports so far (none without a log).
    pub fn passes(&self) -> Vec<PassLine> {
        let Some(path) = &self.log else { return Vec::new() };
        std::fs::read_to_string(path)
            .map(|t| parse_pass_lines(&t))
            .unwrap_or_default()
    }

    /// Scrapes `/metrics`.
    pub async fn metrics(&self) -> Result<Metrics, String> {
        let body = http_get(&self.metrics_addr, "/metrics").await?;
        Ok(parse_metrics(&body))
    }
}

async fn http_get(addr: &str, path: &str) -> Result<String, String> {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("cannot reach the controller's metrics at {addr}: {e}"))?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .map_err(|e| format!("{addr}: {e}"))?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.map_err(|e| format!("{addr}: {e}"))?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    match text.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.") && head.contains(" 200 ") => Ok(body.to_string()),
        _ => Err(format!(
            "{addr}{path}: unexpected answer: {}",
            text.lines().next().unwrap_or("")
        )),
    }
}

/// The values of a label set such as `{kind="GpuNode",action="apply"}`.
fn labels(s: &str) -> BTreeMap<&str, &str> {
    s.trim_start_matches('{')
        .trim_end_matches('}')
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.trim(), v.trim().trim_matches('"')))
        .collect()
}

pub fn parse_metrics(text: &str) -> Metrics {
    let p = gpu_tenancy::controller::metrics::PREFIX;
    let mut m = Metrics::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else { continue };
        let (name, labelset) = match series.find('{') {
            Some(i) => (&series[..i], &series[i..]),
            None => (series, ""),
        };
        let Some(name) = name.strip_prefix(p).and_then(|n| n.strip_prefix('_')) else {
            continue;
        };
        let l = labels(labelset);
        match name {
            "objects_written_total" => {
                let key = format!("{}/{}", l.get("kind").unwrap_or(&"?"), l.get("action").unwrap_or(&"?"));
                m.written.insert(key, value);
            }
            "passes_total" => m.passes += value,
            "pass_duration_seconds_sum" => m.pass_seconds_sum = value,
            "pass_duration_seconds_count" => m.pass_seconds_count = value,
            "pass_duration_seconds_bucket" => {
                if let Some(le) = l.get("le").and_then(|v| v.parse::<f64>().ok()) {
                    m.pass_buckets.push((le, value));
                }
            }
            _ => {}
        }
    }
    m
}

/// The `pass done` lines of a JSON log.
pub fn parse_pass_lines(log: &str) -> Vec<PassLine> {
    log.lines()
        .filter(|l| l.contains("\"pass done\""))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| {
            Some(PassLine {
                writes: v.get("writes")?.as_u64()?,
                plan_ms: v.get("plan_ms")?.as_u64()?,
                desired_ms: v.get("desired_ms").and_then(|x| x.as_u64()),
                full_ms: v.get("full_ms").and_then(|x| x.as_u64()),
                desired_cpu_ms: v.get("desired_cpu_ms").and_then(|x| x.as_u64()),
            })
        })
        .collect()
}
