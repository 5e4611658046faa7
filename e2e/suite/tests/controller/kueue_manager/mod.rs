//! The queues the controller writes, run by Kueue's real manager (built from its Go module at the
//! release e2e/kueue/go.mod pins, with its CRDs and webhooks: `gpu_tenancy_e2e::kueue`).
//!
//! The workloads are batch Jobs labelled with the tenant's LocalQueue, admitted by Kueue through
//! its Job integration (its webhook suspends them, its scheduler unsuspends those it admits). The
//! test control plane runs no Job controller and no kubelet, so the test plays them: a Job Kueue
//! unsuspended runs for a set time and then completes (its status written as the Job controller
//! writes it), and one Kueue suspends again (preempted) stops running at once. What a tenant
//! "ran" is then what Kueue admitted, measured in GPU-seconds.
//!
//! [`sharing`]: one grant over a tenant's namespaces, lending and reclaiming, fair sharing, and the
//! showback of queue waits; [`dra`]: claims counted by DeviceClass; [`attacks`]: a tenant's user
//! kept to its own queue and priority.

mod attacks;
mod dra;
mod sharing;

use crate::support::*;
use gpu_tenancy_e2e::kueue::{KueueManager, KueueSettings};
use gpu_tenancy_e2e::{Cleanup, apply_docs_as_kubectl, create_namespace};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ResourceQuota;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// The pool: 8 nodes of two H100s, every GPU whole (Exclusive), `nvidia.com/gpu`.
const POOL: &str = "kq";
const GPU: &str = "nvidia.com/gpu";

/// A policy with a tier that keeps its grants (`solo`) and one whose tenants lend all that is idle.
fn policy() -> serde_json::Value {
    json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "SharingPolicy", "metadata": {"name": POOL},
        "spec": {"tiers": [
            {"name": "solo", "modes": ["Exclusive"], "coLocation": "SameTier"},
            {"name": "lending", "modes": ["Exclusive"], "coLocation": "SameTier", "idleLendingPercent": 100}]}})
}

/// The pool's plan: for the device plugin, or with DRA for `dra_tenants`.
fn plan(dra_tenants: Option<Vec<&str>>) -> serde_json::Value {
    let mut plan = json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuPartitionPlan", "metadata": {"name": POOL},
        "spec": {"nodeSelector": {"matchLabels": {"pool": POOL}}, "gpus": [{"devices": "all", "mode": "Exclusive"}]}});
    if let Some(tenants) = dra_tenants {
        plan["spec"]["deviceAccess"] = json!("DRA");
        plan["spec"]["gpus"][0]["tenants"] = json!(tenants);
    }
    plan
}

fn tenant(name: &str, tier: &str, namespaces: &[&str], gpus: u32, weight: u32) -> serde_json::Value {
    json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuTenant", "metadata": {"name": name},
        "spec": {"policyRef": POOL, "tier": tier, "namespaces": namespaces, "weight": weight,
                 "resources": [{"mode": "Exclusive", "count": gpus}]}})
}

/// The pool, the policy, `tenants` (name, tier, namespaces, GPUs, weight) and their namespaces;
/// then the controller, converged: every tenant's queue written and Active in Kueue.
async fn fleet(client: &Client, cleanup: &Cleanup, kueue: &KueueManager, tenants: &[(&str, &str, &[&str], u32, u32)]) {
    fleet_of(client, cleanup, kueue, tenants, false).await;
}

/// [`fleet`], its pool served by DRA when `dra`.
async fn fleet_of(
    client: &Client,
    cleanup: &Cleanup,
    kueue: &KueueManager,
    tenants: &[(&str, &str, &[&str], u32, u32)],
    dra: bool,
) {
    settled_from_earlier_tests(client).await;
    h100_pool(client, cleanup, POOL, 8).await;
    let dra_tenants = dra.then(|| tenants.iter().map(|t| t.0).collect());
    let mut docs = vec![policy(), plan(dra_tenants)];
    cleanup.add("SharingPolicy", POOL);
    cleanup.add("GpuPartitionPlan", POOL);
    for (name, tier, namespaces, gpus, weight) in tenants {
        for ns in *namespaces {
            create_namespace(client, cleanup, ns, &[]).await;
        }
        docs.push(tenant(name, tier, namespaces, *gpus, *weight));
        cleanup.add("GpuTenant", name);
    }
    apply_docs_as_kubectl(&docs, "kueue-fleet").await;
    let c = start_controller(client).await;
    assert!(c.stores.snapshot().absent.is_empty(), "Kueue's kinds are served");
    converge(client, &c).await;
    // Kueue's status, which the operator's ClusterQueue type does not read.
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", "ClusterQueue"));
    let queues: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    for (name, ..) in tenants {
        let queue = format!("gpu-tenancy-{name}");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let q = queues.get_opt(&queue).await.unwrap();
            let status = q.as_ref().map(|q| q.data["status"].clone()).unwrap_or_default();
            let active = status["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Active" && c["status"] == "True");
            if active {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "ClusterQueue {queue} not Active in Kueue within 30 s: {q:#?}\n{}",
                kueue.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Waits until the tenants, plans and namespaces of an earlier test of this file are gone (their
/// deletion is not waited for): a tenant still listed names a namespace that may be gone already.
async fn settled_from_earlier_tests(client: &Client) {
    let tenants: Api<gpu_tenancy::api::GpuTenant> = Api::all(client.clone());
    let plans: Api<gpu_tenancy::api::GpuPartitionPlan> = Api::all(client.clone());
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut left: Vec<String> = tenants
            .list(&ListParams::default())
            .await
            .unwrap()
            .iter()
            .map(|t| t.name_any())
            .collect();
        left.extend(
            plans
                .list(&ListParams::default())
                .await
                .unwrap()
                .iter()
                .map(|p| p.name_any()),
        );
        left.extend(
            namespaces
                .list(&ListParams::default())
                .await
                .unwrap()
                .iter()
                .map(|n| n.name_any()),
        );
        left.retain(|n| n.starts_with("kq-") || n == POOL);
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "still there from an earlier test: {left:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A Job of one pod asking for `gpus` whole GPUs, in tenant namespace `ns`'s LocalQueue.
async fn submit(client: &Client, ns: &str, name: &str, gpus: u32) {
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "labels": {"kueue.x-k8s.io/queue-name": "gpu-tenancy"}},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{
            "name": "train", "image": "registry.k8s.io/pause:3.10",
            "resources": {"requests": {GPU: gpus, "cpu": "100m"}, "limits": {GPU: gpus}}}]}}}}))
    .unwrap();
    Api::<Job>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &job)
        .await
        .unwrap_or_else(|e| panic!("creating Job {ns}/{name}: {e}"));
}

fn finished(job: &Job) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Complete" && c.status == "True"))
}

fn gpus(job: &Job) -> u64 {
    let requests = job
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .map(|s| {
            s.containers
                .iter()
                .filter_map(|c| c.resources.as_ref()?.requests.as_ref()?.get(GPU))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    requests.iter().map(|q| q.0.parse::<u64>().unwrap_or(0)).sum()
}

/// Plays the Job controller for Jobs in some namespaces: a Job runs from the moment Kueue
/// unsuspends it, completes after `run` (when `run` is set), and stops when Kueue suspends it.
struct JobRunner {
    client: Client,
    namespaces: Vec<String>,
    run: Option<Duration>,
    running_since: HashMap<String, Instant>,
}

impl JobRunner {
    fn new(client: &Client, namespaces: &[&str], run: Option<Duration>) -> JobRunner {
        JobRunner {
            client: client.clone(),
            namespaces: namespaces.iter().map(|n| n.to_string()).collect(),
            run,
            running_since: HashMap::new(),
        }
    }

    /// Ticks until the GPUs running per namespace are exactly `want`; fails after 30 s.
    async fn until_running(&mut self, want: &[(&str, u64)], kueue: &KueueManager) {
        let want: BTreeMap<String, u64> = want.iter().map(|(ns, n)| (ns.to_string(), *n)).collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut running = BTreeMap::new();
        while running != want {
            assert!(
                Instant::now() < deadline,
                "running {running:?}, not {want:?}\n{}",
                kueue.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
            running = self.tick().await.0;
        }
    }

    /// One look at the Jobs: completes those that ran their time; returns the GPUs running per
    /// namespace, and the names of the running Jobs.
    async fn tick(&mut self) -> (BTreeMap<String, u64>, Vec<String>) {
        let mut gpus_running = BTreeMap::new();
        let mut names = Vec::new();
        for ns in self.namespaces.clone() {
            let jobs: Api<Job> = Api::namespaced(self.client.clone(), &ns);
            for job in jobs.list(&ListParams::default()).await.unwrap() {
                let key = format!("{ns}/{}", job.name_any());
                let suspended = job.spec.as_ref().and_then(|s| s.suspend).unwrap_or(false);
                if suspended || finished(&job) {
                    self.running_since.remove(&key);
                    continue;
                }
                let since = *self.running_since.entry(key.clone()).or_insert_with(Instant::now);
                if self.run.is_some_and(|run| since.elapsed() >= run) {
                    complete(&jobs, &job.name_any()).await;
                    self.running_since.remove(&key);
                    continue;
                }
                *gpus_running.entry(ns.clone()).or_default() += gpus(&job);
                names.push(key);
            }
        }
        (gpus_running, names)
    }
}

/// A Job's status as the Job controller writes it when its one pod succeeded.
async fn complete(jobs: &Api<Job>, name: &str) {
    let now = jiff::Timestamp::now().to_string();
    let status = json!({"status": {"startTime": now, "completionTime": now, "succeeded": 1, "conditions": [
        {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": now},
        {"type": "Complete", "status": "True", "lastTransitionTime": now}]}});
    jobs.patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap_or_else(|e| panic!("completing Job {name}: {e}"));
}

/// How many times Kueue admitted the Workloads of namespace `ns`'s Jobs whose name contains
/// `jobs`, by the Workloads' own record: once per eviction (each ended an admission), and once
/// more for each that holds quota now or finished.
async fn admissions(client: &Client, ns: &str, jobs: &str) -> u64 {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", "Workload"));
    let workloads: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource);
    let mut n = 0;
    for w in workloads.list(&ListParams::default()).await.unwrap() {
        let owned = w
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.name.contains(jobs));
        if !owned {
            continue;
        }
        let status = &w.data["status"];
        let evictions: u64 = status["schedulingStats"]["evictions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["count"].as_u64())
            .sum();
        let holds_or_done = status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| (c["type"] == "QuotaReserved" || c["type"] == "Finished") && c["status"] == "True");
        n += evictions + u64::from(holds_or_done);
    }
    n
}

/// The reason Kueue gave for evicting workload `job`'s Workload, if it did.
async fn eviction_reason(client: &Client, ns: &str, job: &str) -> Option<String> {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", "Workload"));
    let workloads: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource);
    let list = workloads.list(&ListParams::default()).await.unwrap();
    list.items
        .iter()
        .filter(|w| {
            w.metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.kind == "Job" && o.name == job)
        })
        .flat_map(|w| w.data["status"]["conditions"].as_array().cloned().unwrap_or_default())
        .find(|c| c["type"] == "Evicted" && c["status"] == "True")
        .and_then(|c| c["reason"].as_str().map(String::from))
}
