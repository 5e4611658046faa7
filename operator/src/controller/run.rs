//! The controller's process: stores, the metrics and health server, leader election, and the loop
//! that runs a pass when something changed (debounced), only while leading.

use super::leader::{self, Election};
use super::metrics::Metrics;
use super::pass::{Controller, PassReport};
use crate::desired::Settings;
use crate::runtime::backoff::Backoff;
use crate::runtime::http;
use kube::Client;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Where the Lease lives and who this replica is.
#[derive(Clone, Debug)]
pub struct LeaderOptions {
    pub namespace: String,
    pub lease_name: String,
    pub identity: String,
    pub duration: Duration,
}

#[derive(Clone, Debug)]
pub struct Options {
    pub settings: Settings,
    pub metrics_addr: SocketAddr,
    /// `None`: this replica always leads (`--no-leader-election`).
    pub leader: Option<LeaderOptions>,
    /// Quiet time after a change before a pass runs, so a burst of changes makes one pass.
    pub debounce: Duration,
    /// Writes of one stage in flight at once ([`super::writer::WRITES_IN_FLIGHT`] by default).
    pub writes_in_flight: usize,
    /// Plan every pass from nothing too, and write that where the incremental pass differs.
    pub check_incremental: bool,
    /// How often discovery is asked again for the optional kinds it found absent (Kueue's): once
    /// one is served, the controller starts its stores again, keeping its lease.
    pub discovery_interval: Duration,
}

/// Why the controller stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}")]
    Metrics(std::io::Error),
}

/// Waits for `rx` to say true (or for shutdown); returns false on shutdown.
async fn until_true(rx: &mut watch::Receiver<bool>) -> bool {
    rx.wait_for(|v| *v).await.is_ok()
}

/// Joins the election, retrying with backoff while the API server cannot be reached: one line
/// per attempt, never a panic.
async fn elect(client: &Client, opts: &LeaderOptions) -> Election {
    let mut backoff = Backoff::for_api_errors();
    loop {
        match leader::start(
            client.clone(),
            &opts.namespace,
            &opts.lease_name,
            &opts.identity,
            opts.duration,
        )
        .await
        {
            Ok(e) => return e,
            Err(e) => {
                let wait = backoff.next();
                tracing::error!(error = %e, retry_in = ?wait, "cannot join the leader election; retrying");
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// Runs the controller until `shutdown` completes (SIGTERM, Ctrl-C), then gives the lease up so a
/// follower takes over at once.
pub async fn run(
    client: Client,
    options: Options,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let (stop_tx, stop) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let metrics = Arc::new(Metrics::new());
    let ready = serve_metrics(options.metrics_addr, metrics.clone(), stop.clone()).await?;
    let mut controller = start(&client, &options, &metrics);
    if !caches_synced(&controller, stop.clone()).await {
        return Ok(());
    }
    let _ = ready.send(true);
    tracing::info!("caches synced");

    let election = match &options.leader {
        Some(opts) => {
            tokio::select! {
                e = elect(&client, opts) => e,
                _ = stopped(stop.clone()) => return Ok(()),
            }
        }
        None => Election::always_leader(),
    };
    loop {
        let mut lead = Lead {
            controller: &controller,
            metrics: &metrics,
            debounce: options.debounce,
            backoff: Backoff::for_api_errors(),
            retry: None,
            held_until: None,
        };
        let until = stop_or_appeared(stop.clone(), controller.stores.appeared.clone());
        lead.until_stopped(election.is_leader.clone(), until).await;
        if *stop.borrow() {
            break;
        }
        // An optional kind is served now: new stores watch it; the lease is kept meanwhile.
        tracing::info!("starting the watches again, with the kinds the API server serves now");
        drop(controller);
        controller = start(&client, &options, &metrics);
        if !caches_synced(&controller, stop.clone()).await {
            break;
        }
    }
    // Stop writing before giving the lease up, so two replicas never write at once.
    drop(controller);
    if let Err(e) = election.release().await {
        tracing::warn!(error = %e, "could not release the lease; a follower takes over when it expires");
    }
    tracing::info!("stopped");
    Ok(())
}

/// A stop signal that says true when `stop` does, or when `appeared` is notified.
fn stop_or_appeared(stop: watch::Receiver<bool>, appeared: Arc<tokio::sync::Notify>) -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        tokio::select! {
            _ = stopped(stop) => {}
            _ = appeared.notified() => {}
            // Nobody listens any more.
            _ = tx.closed() => return,
        }
        let _ = tx.send(true);
    });
    rx
}

/// Completes once `stop` says true (or its sender is gone).
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|v| *v).await;
}

/// Serves metrics and probes until `stop`; returns the sender that makes the readiness probe
/// say ready.
async fn serve_metrics(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    stop: watch::Receiver<bool>,
) -> Result<watch::Sender<bool>, RunError> {
    let (ready_tx, ready_rx) = watch::channel(false);
    let listener = http::bind(addr).await.map_err(RunError::Metrics)?;
    let readiness = http::Readiness {
        // Readiness does not depend on leadership: a follower with synced caches is ready to take
        // over at once, and a Deployment whose followers are never ready would block its rollouts.
        ready: ready_rx,
        not_ready: "the watch caches have not synced yet",
    };
    tokio::spawn(http::serve_on(listener, metrics, readiness, stopped(stop)));
    Ok(ready_tx)
}

/// The controller with its stores' watches started, writing as `options` say.
fn start(client: &Client, options: &Options, metrics: &Arc<Metrics>) -> Controller {
    let identity = options.leader.as_ref().map(|l| l.identity.clone());
    let mut controller = Controller::start_rediscovering(
        client.clone(),
        options.settings.clone(),
        identity,
        Some(options.discovery_interval),
    );
    controller.writer.set_in_flight(options.writes_in_flight);
    controller.writer.count_in(metrics.clone());
    controller.check_incremental = options.check_incremental;
    controller
}

/// Waits for every store's first list; false if stopped first.
async fn caches_synced(controller: &Controller, stop: watch::Receiver<bool>) -> bool {
    tracing::info!("listing policies, tenants, plans, GPU nodes, nodes, namespaces and owned objects ...");
    tokio::select! {
        r = controller.stores.wait_until_ready() => {
            if r.is_err() {
                tracing::error!("a watch stopped before its first list");
            }
            true
        }
        _ = stopped(stop) => false,
    }
}

/// What wakes the loop while it leads.
enum Wake {
    /// Run a pass.
    Pass,
    /// Leadership changed: look again.
    Leadership,
    Stop,
}

/// The loop of passes while leading.
struct Lead<'a> {
    controller: &'a Controller,
    metrics: &'a Metrics,
    debounce: Duration,
    backoff: Backoff,
    /// When a failed pass is retried.
    retry: Option<Duration>,
    /// Bookkeeping a pass held back while nodes joined must go out by then, changes or not.
    held_until: Option<std::time::Instant>,
}

impl Lead<'_> {
    /// Runs a pass when something changed (debounced), only while leading, until `stop`.
    async fn until_stopped(&mut self, mut leading: watch::Receiver<bool>, mut stop: watch::Receiver<bool>) {
        loop {
            self.metrics.set_leader(*leading.borrow());
            if !*leading.borrow() {
                tracing::info!("following: waiting to lead");
                tokio::select! {
                    ok = until_true(&mut leading) => if !ok { break },
                    _ = stop.changed() => break,
                }
                tracing::info!("leading");
                self.metrics.set_leader(true);
            } else {
                match self.wait_for_work(&mut leading, &mut stop).await {
                    Wake::Pass => {}
                    Wake::Leadership => continue,
                    Wake::Stop => break,
                }
            }
            if *stop.borrow() {
                break;
            }
            if *leading.borrow() {
                let report = self.controller.pass().await;
                self.record(&report);
            }
        }
    }

    /// Waits for a change, for the retry of a failed pass, or for held bookkeeping's time; then
    /// lets a burst of watch events settle (at most 10 debounce periods).
    async fn wait_for_work(&self, leading: &mut watch::Receiver<bool>, stop: &mut watch::Receiver<bool>) -> Wake {
        let held = self
            .held_until
            .map(|t| t.saturating_duration_since(std::time::Instant::now()));
        let wait = self.retry.into_iter().chain(held).min().unwrap_or(Duration::MAX);
        tokio::select! {
            _ = self.controller.changed.notified() => {}
            _ = tokio::time::sleep(wait) => {}
            r = leading.changed() => return if r.is_err() { Wake::Stop } else { Wake::Leadership },
            _ = stop.changed() => return Wake::Stop,
        }
        for _ in 0..10 {
            if tokio::time::timeout(self.debounce, self.controller.changed.notified())
                .await
                .is_err()
            {
                break;
            }
        }
        Wake::Pass
    }

    /// Metrics and logs of a pass; a failed one is retried with backoff.
    fn record(&mut self, report: &PassReport) {
        self.metrics.set_tenants(&report.tenants);
        let ok = report.failed.is_empty();
        self.held_until = report.held.until;
        self.metrics.pass(report.total_time, ok);
        if !ok {
            // One error per write the API server refused, by its kind; those held back for it
            // are counted in the pass's result, not again.
            for f in report.failed.iter().filter(|f| !f.error.held_back()) {
                self.metrics.error("write", &f.kind.to_string());
            }
            let wait = self.backoff.next();
            tracing::warn!(failed = report.failed.len(), retry_in = ?wait, "pass had failed writes; retrying");
            self.retry = Some(wait);
            return;
        }
        self.backoff.reset();
        self.retry = None;
        if !report.writes.is_empty() {
            log_pass(report);
        }
    }
}

/// The `pass done` line: what a pass wrote and what it cost.
fn log_pass(report: &PassReport) {
    tracing::info!(
        writes = report.writes.len(),
        plan_ms = report.plan_time.as_millis() as u64,
        desired_ms = report.desired_time.as_millis() as u64,
        desired_cpu_ms = report.desired_run.map(|r| r.on_cpu.as_millis() as u64),
        desired_wait_ms = report.desired_run.map(|r| r.waiting.as_millis() as u64),
        desired_faults = report.desired_run.map(|r| r.faults.0),
        full_ms = report.full_time.map(|t| t.as_millis() as u64),
        cells_placed = report.cells.0,
        cells_reused = report.cells.1,
        held = report.held.writes,
        "pass done"
    );
}
