//! A real Prometheus (e2e/bin/prometheus, built from Prometheus' Go module by `e2e/run.sh build`)
//! scraping the product's metrics endpoints every second, for the scenarios that check what a
//! person sees through it: its HTTP API and `gpu-tenancy report`.

use crate::repo_root;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct PrometheusProcess {
    pub addr: SocketAddr,
    dir: PathBuf,
    child: Child,
}

impl PrometheusProcess {
    /// Starts Prometheus scraping `targets` (job `gpu-tenancy`) every second; waits until ready.
    pub async fn start(name: &str, targets: &[SocketAddr]) -> PrometheusProcess {
        Self::start_with_jobs(name, targets, "").await
    }

    /// [`Self::start`] with more scrape jobs: `jobs`, YAML list items of `scrape_configs`.
    pub async fn start_with_jobs(name: &str, targets: &[SocketAddr], jobs: &str) -> PrometheusProcess {
        let bin = repo_root().join("e2e/bin/prometheus");
        assert!(bin.is_file(), "{} is missing: run `e2e/run.sh build`", bin.display());
        let dir = std::env::temp_dir().join(format!("gt-prometheus-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a directory for Prometheus");
        let targets: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
        let config = format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nscrape_configs:\n- job_name: gpu-tenancy\n  static_configs:\n  - targets: [{}]\n{jobs}",
            targets.join(", ")
        );
        std::fs::write(dir.join("prometheus.yml"), config).expect("writing prometheus.yml");
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port");
        let log = std::fs::File::create(dir.join("prometheus.log")).expect("a log file");
        let child = Command::new(bin)
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("Prometheus starts");
        let p = PrometheusProcess { addr, dir, child };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some((200, _)) = crate::procs::http_get(addr, "/-/ready").await {
                return p;
            }
            assert!(
                Instant::now() < deadline,
                "Prometheus not ready within 60 s (log: {})",
                p.dir.join("prometheus.log").display()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for PrometheusProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
