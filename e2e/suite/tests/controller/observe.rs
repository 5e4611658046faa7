//! What the scenarios with real agents observe: every version of the watched objects, replayed
//! revision by revision; the simulator's state and mutation log, per GPU; waits on GpuNodes.

use futures::StreamExt;
use gpu_tenancy::api::GpuNode;
use gpu_tenancy::api::GpuPartitionPlan;
use gpu_tenancy::labels::SCRUB_PENDING;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Every version of one kind's objects that a watch delivered, with its resourceVersion. The
/// test control plane keeps every kind in one etcd, so resourceVersions are its revisions: one
/// order over Nodes, GpuNodes and plans together.
pub struct Versions<K> {
    seen: Arc<Mutex<Vec<(u64, K)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl<K> Versions<K>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default,
{
    /// Starts watching; returns once the watch has listed what exists, so no later version is missed.
    pub async fn watch(api: Api<K>) -> Versions<K> {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (synced, listed) = tokio::sync::oneshot::channel();
        let into = seen.clone();
        let task = tokio::spawn(async move {
            let mut synced = Some(synced);
            let mut events = watcher(api, watcher::Config::default()).default_backoff().boxed();
            while let Some(ev) = events.next().await {
                match ev {
                    Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                        into.lock().unwrap().push((resource_version(&o), o));
                    }
                    Ok(watcher::Event::InitDone) => {
                        if let Some(s) = synced.take() {
                            let _ = s.send(());
                        }
                    }
                    _ => {}
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(30), listed)
            .await
            .expect("the watch listed within 30 s")
            .unwrap();
        Versions { seen, task }
    }

    /// Waits (at most 10 s) until the watch has delivered `name` at resourceVersion `rv` or later,
    /// so that what a read saw is in the record too.
    pub async fn until_seen(&self, name: &str, rv: u64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self
            .seen
            .lock()
            .unwrap()
            .iter()
            .any(|(v, o)| *v >= rv && o.name_any() == name)
        {
            assert!(
                Instant::now() < deadline,
                "the watch did not deliver {name} at resourceVersion {rv} within 10 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops watching; every version seen, oldest first.
    pub fn stop(self) -> Vec<(u64, K)> {
        self.task.abort();
        let mut v = self.seen.lock().unwrap().clone();
        v.sort_by_key(|(rv, _)| *rv);
        v
    }
}

/// What the cluster showed at one revision: the latest version of each object at or before it.
pub struct Moment<'a> {
    pub revision: u64,
    pub gpu_nodes: BTreeMap<String, &'a GpuNode>,
    pub nodes: BTreeMap<String, &'a Node>,
}

/// Every revision from `from` on at which a watched object changed, with what was visible then.
pub fn moments<'a>(gpu_nodes: &'a [(u64, GpuNode)], nodes: &'a [(u64, Node)], from: u64) -> Vec<Moment<'a>> {
    let mut revisions: Vec<u64> = gpu_nodes
        .iter()
        .map(|v| v.0)
        .chain(nodes.iter().map(|v| v.0))
        .filter(|rv| *rv >= from)
        .collect();
    revisions.sort();
    revisions.dedup();
    fn at<K: ResourceExt>(versions: &[(u64, K)], rv: u64) -> BTreeMap<String, &K> {
        let mut out = BTreeMap::new();
        for (_, o) in versions.iter().filter(|(v, _)| *v <= rv) {
            out.insert(o.name_any(), o);
        }
        out
    }
    revisions
        .into_iter()
        .map(|revision| Moment {
            revision,
            gpu_nodes: at(gpu_nodes, revision),
            nodes: at(nodes, revision),
        })
        .collect()
}

/// An object's resourceVersion as the number it is on this control plane (an etcd revision).
pub fn resource_version<K: Resource>(o: &K) -> u64 {
    o.resource_version().and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// The agent reports this generation of the spec applied and the node Ready.
pub fn applied(n: &GpuNode) -> bool {
    n.status.as_ref().is_some_and(|s| {
        s.observed_generation == n.metadata.generation
            && s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

pub fn condition<'a>(n: &'a GpuNode, type_: &str) -> Option<&'a Condition> {
    n.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)
}

pub fn scrub_tainted(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == SCRUB_PENDING))
}

/// Per GPU index, its instances' profiles as the agent reports them, sorted.
pub fn reported_profiles(n: &GpuNode) -> BTreeMap<u32, Vec<String>> {
    n.status
        .iter()
        .flat_map(|s| &s.gpus)
        .map(|g| {
            let mut p: Vec<String> = g.instances.iter().map(|i| i.profile.clone()).collect();
            p.sort();
            (g.index, p)
        })
        .collect()
}

/// Per GPU index, the profile IDs of its GPU instances in the simulator, sorted.
pub fn sim_profiles(state: &Value) -> BTreeMap<u64, Vec<u64>> {
    state["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            let mut p: Vec<u64> = g["gis"]
                .as_array()
                .unwrap()
                .iter()
                .map(|gi| gi["profile_id"].as_u64().unwrap())
                .collect();
            p.sort();
            (g["index"].as_u64().unwrap(), p)
        })
        .collect()
}

/// Mutation log entries per GPU: call name -> count.
pub fn per_gpu(log: &[Value]) -> BTreeMap<u64, BTreeMap<String, u64>> {
    let mut out: BTreeMap<u64, BTreeMap<String, u64>> = BTreeMap::new();
    for e in log {
        *out.entry(e["gpu"].as_u64().unwrap())
            .or_default()
            .entry(e["call"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    out
}

/// The NVML calls that replace one MIG instance (one compute instance spanning its GPU instance)
/// by two: destroy its compute instance, then its GPU instance; create two GPU instances at their
/// placements and a compute instance in each.
pub fn one_instance_to_two() -> BTreeMap<String, u64> {
    [
        ("nvmlComputeInstanceDestroy", 1),
        ("nvmlGpuInstanceDestroy", 1),
        ("nvmlDeviceCreateGpuInstanceWithPlacement", 2),
        ("nvmlGpuInstanceCreateComputeInstance", 2),
    ]
    .into_iter()
    .map(|(c, n)| (c.to_string(), n))
    .collect()
}

pub async fn apply_plan(client: &Client, plan: Value) -> u64 {
    let name = plan["metadata"]["name"].as_str().unwrap().to_string();
    let p = Api::<GpuPartitionPlan>::all(client.clone())
        .patch(&name, &PatchParams::apply("e2e").force(), &Patch::Apply(plan))
        .await
        .unwrap_or_else(|e| panic!("applying GpuPartitionPlan {name}: {e}"));
    resource_version(&p)
}

/// Polls the GpuNodes until `done` holds for all of `names` (at most `secs`); panics with their
/// statuses otherwise.
pub async fn wait_nodes(client: &Client, names: &[String], secs: u64, what: &str, done: impl Fn(&GpuNode) -> bool) {
    let api: Api<GpuNode> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let mut all = Vec::new();
        for n in names {
            // None until the agent has created it.
            all.push(
                api.get_opt(n)
                    .await
                    .unwrap()
                    .unwrap_or_else(|| GpuNode::new(n, Default::default())),
            );
        }
        if all.iter().all(&done) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {secs} s: {:#?}",
            all.iter()
                .map(|n| (n.name_any(), &n.spec, &n.status))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
