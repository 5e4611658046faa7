//! One pass of the controller: a snapshot of the stores, the desired state (from the last pass's
//! memo, checked against a full pass when asked), the diff against the snapshot, the writes and
//! the events; and the desired state of a snapshot on its own, as tests and `plan` of a live
//! cluster compute it.

use super::stores::{self, Snapshot, Stores};
use super::thread_time::ThreadRun;
use super::{diff, writer};
use crate::desired::{Desired, DesiredMemo, Settings, desired_with};
use crate::inventory::{ClusterInventories, NodeInventory};
use crate::planner::PlanInput;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Client;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// The planner's node inputs from the cluster ([`crate::inventory::cluster_inventories`]).
pub fn node_inventories(s: &Snapshot) -> Vec<NodeInventory> {
    crate::inventory::cluster_inventories(&s.nodes, &s.gpu_nodes)
}

/// What a pass keeps for the next: the planner's and the renderer's memo, and the nodes'
/// inventories by revision.
#[derive(Default)]
pub struct PassMemo {
    pub desired: DesiredMemo,
    pub inventories: ClusterInventories,
}

impl PassMemo {
    /// Starts the memo afresh from `s` when a burst of nodes read again has ended
    /// ([`ClusterInventories::worth_starting_afresh`]): the planning of one pass from nothing,
    /// which the controller does after a pass's writes, off the path of any change, so that the
    /// next changes walk a memo laid out in one pass. Returns how long it took, if it did.
    pub fn start_afresh_if_worth(&mut self, s: &Snapshot, settings: &Settings, now: &Time) -> Option<Duration> {
        if !self.inventories.worth_starting_afresh() {
            return None;
        }
        let started = Instant::now();
        // The old memo goes first: the new one is laid out in the memory it leaves.
        *self = PassMemo::default();
        drop(desired_with_memo(s, settings, now, Some(self)));
        Some(started.elapsed())
    }
}

/// Condition times at whole seconds, as Kubernetes writes them.
pub fn now_seconds() -> Time {
    let now = jiff::Timestamp::now();
    Time(jiff::Timestamp::from_second(now.as_second()).unwrap_or(now))
}

/// The desired state of the cluster in `s`.
pub fn desired_of(s: &Snapshot, settings: &Settings, now: &Time) -> Desired {
    desired_with_memo(s, settings, now, None)
}

/// [`desired_of`], placing again only the parts of the fleet whose inputs changed since the pass
/// `memo` kept ([`crate::planner::plan_with`]). Kueue is on where discovery found its queues
/// served ([`Settings::kueue`]): every Kueue kind is one CRD of the same release.
pub fn desired_with_memo(s: &Snapshot, settings: &Settings, now: &Time, memo: Option<&mut PassMemo>) -> Desired {
    let kueue = !s.absent.contains(&super::kinds::Kind::ClusterQueue);
    let with_kueue;
    let settings = if settings.kueue == kueue {
        settings
    } else {
        with_kueue = Settings {
            kueue,
            ..settings.clone()
        };
        &with_kueue
    };
    let read;
    let (nodes, memo) = match memo {
        Some(PassMemo { desired, inventories }) => (inventories.read(&s.nodes, &s.gpu_nodes), Some(desired)),
        None => {
            read = node_inventories(s);
            (&read[..], None)
        }
    };
    desired_with(
        &PlanInput {
            policies: &s.policies,
            tenants: &s.tenants,
            plans: &s.plans,
            nodes,
        },
        settings,
        now,
        memo,
    )
}

/// What one pass did.
#[derive(Debug, Default)]
pub struct PassReport {
    /// The writes made, as `action Kind name`.
    pub writes: Vec<String>,
    /// Writes that failed or were held back, each with why ([`writer::Failure`]).
    pub failed: Vec<writer::Failure>,
    /// Time spent planning (the pure part: desired state and diff), and in the whole pass.
    pub plan_time: Duration,
    pub total_time: Duration,
    /// The desired state alone (planned from the memo), and the allocation's cells placed and
    /// taken from the memo.
    pub desired_time: Duration,
    /// Of `desired_time`, the pass's thread on a core and waiting for one (Linux only): on a
    /// machine other processes keep busy, the wall time says more of them than of the pass.
    pub desired_run: Option<ThreadRun>,
    pub cells: (usize, usize),
    /// With `--check-incremental`: the full pass's time, computed beside the incremental one.
    pub full_time: Option<Duration>,
    /// With `--check-incremental`: the incremental pass differed from the full pass (whose
    /// result was written).
    pub incremental_differed: bool,
    /// Bookkeeping held back while nodes joined, and when the controller must pass again
    /// to write it even if nothing changes ([`diff::hold`]).
    pub held: diff::Held,
    /// Tenants with the statuses of this pass (for the per-tenant metrics).
    pub tenants: Vec<std::sync::Arc<crate::api::GpuTenant>>,
}

/// The writes made, as `action Kind name`: all but the failed ones (by their place).
fn made(writes: &[diff::Write], failed: &[writer::Failure]) -> Vec<String> {
    let failed: std::collections::BTreeSet<usize> = failed.iter().map(|f| f.index).collect();
    writes
        .iter()
        .enumerate()
        .filter(|(i, _)| !failed.contains(i))
        .map(|(_, w)| w.to_string())
        .collect()
}

/// A pass's desired state, and how it was planned.
struct Planned {
    desired: Desired,
    /// Planned from the memo, alone (the snapshot and the full pass not counted).
    desired_time: Duration,
    desired_run: Option<ThreadRun>,
    /// The allocation's cells placed, and taken from the memo.
    cells: (usize, usize),
    full_time: Option<Duration>,
    differed: bool,
}

/// The controller: its stores, its writer and its settings.
pub struct Controller {
    pub stores: Stores,
    pub(crate) writer: writer::Writer,
    settings: Settings,
    /// Notified on every change any store sees.
    pub changed: Arc<Notify>,
    /// What the last pass planned and rendered, so the next places again and renders again only
    /// what its changes can affect.
    memo: Mutex<PassMemo>,
    /// The owned objects the last pass found already so, by resourceVersion
    /// ([`diff::Seen`]), so the next compares only what changed.
    seen: Mutex<diff::Seen>,
    /// Also plan every pass from nothing, compare, and write the full pass's result if they differ.
    pub check_incremental: bool,
}

impl Controller {
    /// Creates the stores and spawns the watches that keep them current.
    pub fn start(client: Client, settings: Settings, instance: Option<String>) -> Controller {
        Self::start_rediscovering(client, settings, instance, None)
    }

    /// [`Controller::start`], asking discovery again every `rediscovery` for the optional kinds it
    /// found absent ([`Stores::appeared`]).
    pub fn start_rediscovering(
        client: Client,
        settings: Settings,
        instance: Option<String>,
        rediscovery: Option<Duration>,
    ) -> Controller {
        let changed = Arc::new(Notify::new());
        let (stores, drive) = stores::stores(&client, &settings.device_plugin_namespace, changed.clone(), rediscovery);
        tokio::spawn(futures::StreamExt::for_each(drive, |()| async {}));
        Controller {
            stores,
            writer: writer::Writer::new(client, instance),
            settings,
            changed,
            memo: Mutex::default(),
            seen: Mutex::default(),
            check_incremental: false,
        }
    }

    /// The desired state of `snapshot`, planned with the memo of the last pass; with
    /// `check_incremental`, checked against the full pass.
    fn plan(&self, snapshot: &Snapshot, now: &Time) -> Planned {
        let mut memo = self.memo.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (started, run) = (Instant::now(), ThreadRun::now());
        let d = desired_with_memo(snapshot, &self.settings, now, Some(&mut memo));
        let desired_time = started.elapsed();
        // No await since `started`: the same thread ran the whole of it.
        let desired_run = ThreadRun::now().zip(run).map(|(now, then)| now.since(then));
        let cells = (memo.desired.plan.allocation.placed, memo.desired.plan.allocation.reused);
        if !self.check_incremental {
            return Planned {
                desired: d,
                desired_time,
                desired_run,
                cells,
                full_time: None,
                differed: false,
            };
        }
        let started = Instant::now();
        let full = desired_of(snapshot, &self.settings, now);
        let full_time = Some(started.elapsed());
        let differed = full != d;
        if differed {
            // Fail closed: the full pass is the reference; forget everything kept.
            tracing::error!("the incremental pass differs from the full pass; writing the full pass's result");
            *memo = PassMemo::default();
        }
        Planned {
            desired: full,
            desired_time,
            desired_run,
            cells,
            full_time,
            differed,
        }
    }

    /// One pass over the whole fleet: snapshot, desired state, diff, writes, events.
    pub async fn pass(&self) -> PassReport {
        let started = Instant::now();
        let snapshot = self.stores.snapshot();
        let now = now_seconds();
        let Planned {
            desired: d,
            desired_time,
            desired_run,
            cells,
            full_time,
            differed,
        } = self.plan(&snapshot, &now);
        let diff = {
            let mut seen = self.seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            diff::diff_with(&d, &snapshot, &mut seen, Instant::now())
        };
        let plan_time = started.elapsed();
        let outcome = self.writer.write_all(&diff.writes).await;
        self.writer.publish(&diff.notes).await;
        let report = PassReport {
            writes: made(&diff.writes, &outcome.failed),
            failed: outcome.failed,
            plan_time,
            total_time: started.elapsed(),
            desired_time,
            desired_run,
            cells,
            full_time,
            incremental_differed: differed,
            held: diff.held,
            tenants: d.tenants,
        };
        let mut memo = self.memo.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(took) = memo.start_afresh_if_worth(&snapshot, &self.settings, &now) {
            tracing::info!(
                ms = took.as_millis() as u64,
                nodes = snapshot.nodes.len(),
                "planner memo started afresh after a burst of nodes read again"
            );
        }
        report
    }
}
