//! An auditor of the invariants (docs/design.md#invariants): it watches the cluster (GpuNodes, GpuTenants, SharingPolicies,
//! GpuPartitionPlans, Nodes, Pods) for as long as it lives, checks every snapshot
//! ([`checks::check`]) and records each violation with its time and object. Scenarios start one,
//! do their worst, then call [`Auditor::assert_clean`].
//!
//! Findings that span objects are only violations once they last [`AuditConfig::grace`]: one
//! controller pass writes a GpuNode spec, then statuses, then taints, so a reader between two
//! writes sees them half done (and a controller killed between two writes leaves them so until
//! the next leader's pass). Grants are compared with specs only while nothing is rolling out.

pub mod checks;

pub use checks::{Class, Finding, Kind, Snapshot};

use futures::StreamExt;
use gpu_tenancy::api::{GpuNode, GpuPartitionPlan, GpuTenant, SharingPolicy};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

#[derive(Clone, Copy, Debug)]
pub struct AuditConfig {
    /// How long a finding across objects may last before it is a violation.
    pub grace: Duration,
    /// Time between two checks.
    pub interval: Duration,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            grace: Duration::from_secs(20),
            interval: Duration::from_millis(200),
        }
    }
}

/// A violation: the first time it was seen as one, and the finding.
#[derive(Clone, Debug)]
pub struct Violation {
    pub at: SystemTime,
    pub finding: Finding,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = jiff::Timestamp::try_from(self.at)
            .map(|t| t.to_string())
            .unwrap_or_default();
        write!(
            f,
            "{at} {:?} {}: {}",
            self.finding.kind, self.finding.object, self.finding.message
        )
    }
}

#[derive(Default)]
struct Record {
    violations: Vec<Violation>,
    /// Since when each finding across objects has been seen without a break.
    pending: BTreeMap<(Kind, String, String), Instant>,
    checks: u64,
}

pub struct Auditor {
    record: Arc<Mutex<Record>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// A store of `K`, kept by a watch that survives API server restarts (backoff, relist).
fn watch<K>(api: Api<K>, tasks: &mut Vec<tokio::task::JoinHandle<()>>) -> Store<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (store, writer) = reflector::store();
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .touched_objects();
    tasks.push(tokio::spawn(async move {
        futures::pin_mut!(stream);
        while stream.next().await.is_some() {}
    }));
    store
}

impl Auditor {
    /// Starts watching; returns once every store has listed its objects.
    pub async fn start(client: &Client, config: AuditConfig) -> Auditor {
        let mut tasks = Vec::new();
        let gpu_nodes = watch(Api::<GpuNode>::all(client.clone()), &mut tasks);
        let tenants = watch(Api::<GpuTenant>::all(client.clone()), &mut tasks);
        let policies = watch(Api::<SharingPolicy>::all(client.clone()), &mut tasks);
        // Plans are watched so a scenario's log can show them; no invariant reads them (a held-back
        // node keeps its old layout on purpose).
        let plans = watch(Api::<GpuPartitionPlan>::all(client.clone()), &mut tasks);
        let nodes = watch(Api::<Node>::all(client.clone()), &mut tasks);
        let pods = watch(Api::<Pod>::all(client.clone()), &mut tasks);
        let ready = async {
            gpu_nodes.wait_until_ready().await.ok();
            tenants.wait_until_ready().await.ok();
            policies.wait_until_ready().await.ok();
            plans.wait_until_ready().await.ok();
            nodes.wait_until_ready().await.ok();
            pods.wait_until_ready().await.ok();
        };
        tokio::time::timeout(Duration::from_secs(30), ready)
            .await
            .expect("the auditor's watches listed the cluster within 30 s");
        let record = Arc::new(Mutex::new(Record::default()));
        let rec = record.clone();
        tasks.push(tokio::spawn(async move {
            let mut history = checks::History::default();
            loop {
                let snap = Snapshot {
                    gpu_nodes: gpu_nodes.state().iter().map(|o| (**o).clone()).collect(),
                    tenants: tenants.state().iter().map(|o| (**o).clone()).collect(),
                    policies: policies.state().iter().map(|o| (**o).clone()).collect(),
                    nodes: nodes.state().iter().map(|o| (**o).clone()).collect(),
                    pods: pods.state().iter().map(|o| (**o).clone()).collect(),
                };
                let findings = checks::check(&snap, &mut history);
                let quiet = checks::quiescent(&snap);
                rec.lock().unwrap().observe(findings, quiet, config.grace);
                tokio::time::sleep(config.interval).await;
            }
        }));
        Auditor { record, tasks }
    }

    /// Every violation seen so far.
    pub fn violations(&self) -> Vec<Violation> {
        self.record.lock().unwrap().violations.clone()
    }

    /// How many snapshots have been checked.
    pub fn checks(&self) -> u64 {
        self.record.lock().unwrap().checks
    }

    /// Waits until at least `n` more snapshots have been checked.
    pub async fn wait_checks(&self, n: u64) {
        let until = self.checks() + n;
        while self.checks() < until {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Fails the test, listing every violation, if there was any.
    #[track_caller]
    pub fn assert_clean(&self) {
        let v = self.violations();
        assert!(
            v.is_empty(),
            "the auditor saw {} violation(s) of the invariants (docs/design.md#invariants):\n{}",
            v.len(),
            v.iter().map(|v| format!("  {v}")).collect::<Vec<_>>().join("\n")
        );
    }
}

impl Record {
    fn observe(&mut self, findings: Vec<Finding>, quiescent: bool, grace: Duration) {
        self.checks += 1;
        let now = Instant::now();
        let mut still = BTreeMap::new();
        for finding in findings {
            let key = (finding.kind, finding.object.clone(), finding.message.clone());
            let due = match finding.class {
                Class::Instant => true,
                Class::Quiescent if !quiescent => continue,
                Class::Settling | Class::Quiescent => {
                    let since = *self.pending.get(&key).unwrap_or(&now);
                    still.insert(key.clone(), since);
                    now.duration_since(since) >= grace
                }
            };
            let known = self.violations.iter().any(|v| {
                v.finding.kind == finding.kind
                    && v.finding.object == finding.object
                    && v.finding.message == finding.message
            });
            if due && !known {
                eprintln!(
                    "AUDITOR violation {:?} {}: {}",
                    finding.kind, finding.object, finding.message
                );
                self.violations.push(Violation {
                    at: SystemTime::now(),
                    finding,
                });
            }
        }
        self.pending = still;
    }
}

impl Drop for Auditor {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}
