//! The queues the controller writes, run by Kueue's real manager (built from its Go module at the
//! release e2e/kueue/go.mod pins, with its CRDs and webhooks: `gpu_tenancy_e2e::kueue`).
//!
//! The workloads are batch Jobs labelled with the tenant's LocalQueue, admitted by Kueue through
//! its Job integration (its webhook suspends them, its scheduler unsuspends those it admits). The
//! test control plane runs no Job controller and no kubelet, so the test plays them: a Job Kueue
//! unsuspended runs for a set time and then completes (its status written as the Job controller
//! writes it), and one Kueue suspends again (preempted) stops running at once. What a tenant
//! "ran" is then what Kueue admitted, measured in GPU-seconds.

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

/// One grant, one queue: a tenant's two namespaces share its four GPUs. One namespace takes all
/// four while the other is idle (the even split without Kueue gives each two), and the other's
/// Job is admitted as soon as the first frees a GPU. Each namespace's ResourceQuota is the
/// ceiling at the whole grant.
#[tokio::test]
async fn kueue_manager_one_grant_is_shared_by_the_tenants_namespaces() {
    let cleanup = Cleanup::new();
    let client = setup(&cleanup).await;
    let kueue = KueueManager::start(&client, &KueueSettings::default()).await;
    let (a, b) = ("kq-solo-a", "kq-solo-b");
    fleet(&client, &cleanup, &kueue, &[("kq-solo", "solo", &[a, b], 4, 1)]).await;
    for ns in [a, b] {
        let quota: ResourceQuota = Api::namespaced(client.clone(), ns).get("gpu-tenancy").await.unwrap();
        assert_eq!(
            quota.spec.unwrap().hard.unwrap()[&format!("requests.{GPU}")].0,
            "4",
            "{ns}"
        );
    }

    let mut runner = JobRunner::new(&client, &[a, b], None);
    for i in 0..5 {
        submit(&client, a, &format!("a-{i}"), 1).await;
    }
    let mut running = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while running.get(a).copied().unwrap_or(0) < 4 {
        assert!(
            Instant::now() < deadline,
            "namespace {a} ran {running:?} GPUs, not its tenant's 4\n{}",
            kueue.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        running = runner.tick().await.0;
    }
    submit(&client, b, "b-0", 1).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (running, names) = runner.tick().await;
    assert_eq!(
        running,
        BTreeMap::from([(a.to_string(), 4)]),
        "the grant is used up: nothing more runs ({names:?})"
    );

    // Two of a's Jobs end: one GPU goes to a's fifth Job (queued first), the other to b's.
    let jobs: Api<Job> = Api::namespaced(client.clone(), a);
    for name in names.iter().take(2) {
        complete(&jobs, name.rsplit('/').next().unwrap()).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (running, names) = runner.tick().await;
        if running.get(b) == Some(&1) {
            assert_eq!(running.get(a), Some(&3), "{names:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "b's Job never ran: {running:?}\n{}",
            kueue.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(kueue);
}

/// A lending tier: what a tenant leaves idle, another borrows, and the lender takes it back by
/// preemption when its own Jobs come. Then two tenants of weights 2 and 1, each with a backlog,
/// contend for a third tenant's idle GPUs: Kueue's fair sharing splits them about 2:1, while each
/// keeps its own grant.
#[tokio::test]
async fn kueue_manager_lends_idle_gpus_takes_them_back_and_shares_them_by_weight() {
    let cleanup = Cleanup::new();
    let client = setup(&cleanup).await;
    let settings = KueueSettings {
        fair_sharing: true,
        ..KueueSettings::default()
    };
    let kueue = KueueManager::start(&client, &settings).await;
    // A real Prometheus scraping Kueue's metrics, for the showback report's queue figures.
    let token = kueue.metrics_token().await;
    let prom =
        gpu_tenancy_e2e::prometheus::PrometheusProcess::start_with_jobs("kueue", &[], &kueue.scrape_job(&token)).await;
    let (b, c, d) = ("kq-b", "kq-c", "kq-d");
    fleet(
        &client,
        &cleanup,
        &kueue,
        &[
            ("kq-b", "lending", &[b], 3, 2),
            ("kq-c", "lending", &[c], 3, 1),
            ("kq-d", "lending", &[d], 3, 1),
        ],
    )
    .await;

    // c runs its own three; b its three and three more, borrowed from d, which is idle.
    let mut runner = JobRunner::new(&client, &[b, c, d], None);
    for i in 0..3 {
        submit(&client, c, &format!("c-{i}"), 1).await;
    }
    for i in 0..6 {
        submit(&client, b, &format!("b-{i}"), 1).await;
    }
    let want = BTreeMap::from([(b.to_string(), 6), (c.to_string(), 3)]);
    let mut running = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while running != want {
        assert!(
            Instant::now() < deadline,
            "running {running:?}, not {want:?}\n{}",
            kueue.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        running = runner.tick().await.0;
    }
    // d's own Jobs come: Kueue preempts b's three borrowed Jobs to run them.
    let reclaim_started = Instant::now();
    for i in 0..3 {
        submit(&client, d, &format!("d-{i}"), 1).await;
    }
    let want = BTreeMap::from([(b.to_string(), 3), (c.to_string(), 3), (d.to_string(), 3)]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while running != want {
        assert!(
            Instant::now() < deadline,
            "running {running:?}, not {want:?}\n{}",
            kueue.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        running = runner.tick().await.0;
    }
    let reclaimed_in = reclaim_started.elapsed();
    let mut preempted = Vec::new();
    for i in 0..6 {
        let job = format!("b-{i}");
        if let Some(reason) = eviction_reason(&client, b, &job).await {
            preempted.push((job, reason));
        }
    }
    assert_eq!(preempted.len(), 3, "b's borrowed Jobs preempted: {preempted:?}");
    assert!(preempted.iter().all(|(_, r)| r == "Preempted"), "{preempted:?}");
    eprintln!("lend and reclaim: d's 3 GPUs back in {reclaimed_in:?}; preempted {preempted:?}");

    // Everything ends; then b (weight 2) and c (weight 1) each keep a backlog of one-GPU Jobs of
    // 3 s, while d stays idle.
    for ns in [b, c, d] {
        let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
        for job in jobs.list(&ListParams::default()).await.unwrap() {
            jobs.delete(&job.name_any(), &Default::default()).await.unwrap();
        }
    }
    // The report's window starts here: Kueue's series of b's and c's queues exist by now (a
    // counter's first sample is the base of its increase), and nothing is admitted for 3 s.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let window_start = Instant::now();
    let mut runner = JobRunner::new(&client, &[b, c], Some(Duration::from_secs(3)));
    let mut submitted = BTreeMap::from([(b, 0usize), (c, 0usize)]);
    let mut borrowed_seconds = BTreeMap::from([(b, 0f64), (c, 0f64)]);
    let mut seconds = BTreeMap::from([(b, 0f64), (c, 0f64)]);
    let started = Instant::now();
    let mut last = Instant::now();
    while started.elapsed() < Duration::from_secs(45) {
        // Each keeps 8 Jobs queued or running.
        let (running, _) = runner.tick().await;
        let dt = last.elapsed().as_secs_f64();
        last = Instant::now();
        for ns in [b, c] {
            let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
            let live = jobs
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .iter()
                .filter(|j| !finished(j))
                .count();
            for _ in live..8 {
                let n = submitted.get_mut(ns).unwrap();
                submit(&client, ns, &format!("{ns}-w{n}"), 1).await;
                *n += 1;
            }
            let gpus = running.get(ns).copied().unwrap_or(0) as f64;
            // The first 10 s are the queues filling; the split is measured after.
            if started.elapsed() > Duration::from_secs(10) {
                *seconds.get_mut(ns).unwrap() += gpus * dt;
                *borrowed_seconds.get_mut(ns).unwrap() += (gpus - 3.0).max(0.0) * dt;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ratio = borrowed_seconds[b] / borrowed_seconds[c].max(0.001);
    eprintln!(
        "fair sharing over 35 s: GPU-seconds {seconds:?}, of them borrowed {borrowed_seconds:?}: {ratio:.2} to 1 (weights 2:1)"
    );
    assert!(
        (1.5..=2.7).contains(&ratio),
        "borrowed GPU-seconds {borrowed_seconds:?}: {ratio:.2}, not about 2\n{}",
        kueue.log_tail()
    );
    for ns in [b, c] {
        assert!(seconds[ns] >= 3.0 * 30.0, "{ns} kept its own grant: {seconds:?}");
    }

    // Showback: `gpu-tenancy report` counts the workloads each queue admitted in the window, from
    // Kueue's own histogram in Prometheus, with their mean wait; the Workloads say how many.
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Whole seconds, reaching back into the idle seconds before the window's start.
    let window = window_start.elapsed().as_secs() + 2;
    let out = std::process::Command::new(gpu_tenancy_e2e::repo_root().join("target/debug/gpu-tenancy"))
        .args([
            "report",
            "--prometheus",
            &prom.url(),
            "--since",
            &format!("{window}s"),
            "-o",
            "json",
        ])
        .output()
        .expect("gpu-tenancy report runs");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("report printed no JSON ({e}): {}", String::from_utf8_lossy(&out.stderr)));
    let row = |t: &str| {
        report["tenants"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["tenant"] == t)
            .cloned()
            .unwrap_or_else(|| panic!("no row of {t} in {report:#}"))
    };
    for ns in [b, c] {
        let r = row(ns);
        let admitted = r["admittedWorkloads"].as_f64().unwrap_or(-1.0);
        let seen = admissions(&client, ns, "-w").await as f64;
        eprintln!(
            "showback over {window} s: {ns} admitted {admitted:.1} (its Workloads show {seen}), mean wait {} s",
            r["meanQueueWaitSeconds"]
        );
        // Prometheus' increase() extrapolates to the window's edges: about a scrape interval's
        // worth of admissions (about one a second here) at each.
        assert!(
            (admitted - seen).abs() <= 3.0 + seen * 0.05,
            "{ns}: report says {admitted:.1} admitted, its Workloads {seen}\n{report:#}"
        );
        assert!(
            r["meanQueueWaitSeconds"].as_f64().is_some_and(|w| w > 0.0),
            "{report:#}"
        );
    }
    let out = std::process::Command::new(gpu_tenancy_e2e::repo_root().join("target/debug/gpu-tenancy"))
        .args(["report", "--prometheus", &prom.url(), "--since", &format!("{window}s")])
        .output()
        .expect("gpu-tenancy report runs");
    let table = String::from_utf8_lossy(&out.stdout);
    eprintln!("MEASURE report table with Kueue:\n{table}");
    let queues = table.split("Queues (Kueue)").nth(1).unwrap_or_default();
    for ns in [b, c] {
        assert!(queues.lines().any(|l| l.starts_with(ns)), "{table}");
    }
    assert!(
        table.lines().all(|l| l.len() <= 80),
        "fits an 80-column terminal:\n{table}"
    );
    drop(kueue);
}

/// A Job of one pod whose GPU is a ResourceClaim from template `template`.
async fn submit_claiming(client: &Client, ns: &str, name: &str, template: &str) {
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "labels": {"kueue.x-k8s.io/queue-name": "gpu-tenancy"}},
        "spec": {"template": {"spec": {"restartPolicy": "Never",
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [{"name": "train", "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": {"cpu": "100m"}, "claims": [{"name": "gpu"}]}}]}}}}))
    .unwrap();
    Api::<Job>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &job)
        .await
        .unwrap_or_else(|e| panic!("creating Job {ns}/{name}: {e}"));
}

/// On a DRA pool, a tenant's ResourceClaims count against its queue by their DeviceClass: Kueue,
/// configured with the mappings `gpu-tenancy plan -o kueue-config` prints for the live cluster,
/// counts each claim of the tenant's class as one unit of the resource the queue holds its two
/// GPUs under, so two Jobs run and the third waits for one of them to end.
#[tokio::test]
async fn kueue_manager_counts_a_dra_claim_against_the_tenant_s_queue_by_its_device_class() {
    let cleanup = Cleanup::new();
    let client = setup(&cleanup).await;
    let (tenant, class, resource) = ("kq-e", "kq-e.gpu.gputenancy.io", "kq-e.gputenancy.io/gpu");
    let settings = KueueSettings {
        device_class_mappings: vec![(resource.to_string(), vec![class.to_string()])],
        ..KueueSettings::default()
    };
    let kueue = KueueManager::start(&client, &settings).await;
    fleet_of(&client, &cleanup, &kueue, &[(tenant, "solo", &[tenant], 2, 1)], true).await;
    // What Kueue was configured with is what `plan -o kueue-config` says of this cluster.
    let out = crate::plan_live::plan_as(&crate::plan_live::export().await, "kueue-config");
    let printed: serde_json::Value =
        serde_saphyr::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap_or_else(|e| {
            panic!(
                "plan -o kueue-config printed no YAML ({e}): {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    assert_eq!(
        printed["resources"]["deviceClassMappings"],
        json!([{"name": resource, "deviceClassNames": [class]}])
    );

    let template: k8s_openapi::api::resource::v1::ResourceClaimTemplate = serde_json::from_value(json!({
        "metadata": {"name": "one-gpu", "namespace": tenant},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": class, "count": 1}}]}}}}))
    .unwrap();
    // The API server applies a changed admission binding a moment after it is written.
    let templates: Api<k8s_openapi::api::resource::v1::ResourceClaimTemplate> = Api::namespaced(client.clone(), tenant);
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Err(e) = templates.create(&PostParams::default(), &template).await {
        assert!(
            Instant::now() < deadline,
            "creating the claim template in {tenant}: {e}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for i in 0..3 {
        submit_claiming(&client, tenant, &format!("e-{i}"), "one-gpu").await;
    }
    let mut runner = JobRunner::new(&client, &[tenant], None);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut names = Vec::new();
    while names.len() < 2 {
        assert!(
            Instant::now() < deadline,
            "running {names:?}, not two Jobs\n{}",
            kueue.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        names = runner.tick().await.1;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let names = runner.tick().await.1;
    assert_eq!(names.len(), 2, "the queue holds two GPUs: {names:?}");
    // Kueue's admission of each counts the claim as one unit of the tenant's resource.
    let resource_api = ApiResource::from_gvk(&GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", "Workload"));
    let workloads: Api<DynamicObject> = Api::namespaced_with(client.clone(), tenant, &resource_api);
    let admitted: Vec<serde_json::Value> = workloads
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter_map(|w| {
            let usage = &w.data["status"]["admission"]["podSetAssignments"][0]["resourceUsage"];
            (!usage.is_null()).then(|| usage.clone())
        })
        .collect();
    assert_eq!(admitted.len(), 2, "{admitted:?}");
    for usage in &admitted {
        assert_eq!(usage[resource], "1", "{usage}");
    }
    // One ends: the third runs.
    let jobs: Api<Job> = Api::namespaced(client.clone(), tenant);
    complete(&jobs, names[0].rsplit('/').next().unwrap()).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now_running = runner.tick().await.1;
        if now_running.iter().any(|n| !names.contains(n)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the third Job never ran: {now_running:?}\n{}",
            kueue.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(kueue);
}

/// A tenant user with Kubernetes' `edit` role in its namespace (impersonated), with Kueue's own
/// roles aggregated into it, against the queues the controller wrote: it cannot write
/// ClusterQueues, Cohorts, WorkloadPriorityClasses or LocalQueues (Kueue gives `edit` read
/// access only), and its workloads may name only its own tenant's WorkloadPriorityClass. Where a
/// cluster grants more (LocalQueues and Workloads), the operator's admission policy still keeps a
/// LocalQueue to its own tenant's ClusterQueue and a Workload to its own priority; a namespace of
/// no tenant names none of the operator's queues.
#[tokio::test]
async fn kueue_manager_a_tenant_user_names_only_its_own_queue_and_priority() {
    use gpu_tenancy_e2e::access::{eventually, impersonating, outcome};
    let cleanup = Cleanup::new();
    let client = setup(&cleanup).await;
    let kueue = KueueManager::start(&client, &KueueSettings::default()).await;
    let (x, y, none) = ("kq-x", "kq-y", "kq-none");
    fleet(
        &client,
        &cleanup,
        &kueue,
        &[(x, "solo", &[x], 2, 1), (y, "solo", &[y], 2, 1)],
    )
    .await;
    create_namespace(&client, &cleanup, none, &[]).await;
    let user = format!("dev@{x}");
    let mut bindings = vec![
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "kq-developers", "namespace": x},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}),
    ];
    apply_docs_as_kubectl(&bindings, "kueue-developers").await;
    let dev = impersonating(&user, &["system:authenticated"], None).await;
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let kueue_api = |client: &Client, ns: Option<&str>, kind: &str| -> Api<DynamicObject> {
        let r = ApiResource::from_gvk(&GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", kind));
        match ns {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &r),
            None => Api::all_with(client.clone(), &r),
        }
    };
    let object = |kind: &str, name: &str, ns: Option<&str>, spec: serde_json::Value| -> DynamicObject {
        serde_json::from_value(json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": kind,
            "metadata": {"name": name, "namespace": ns}, "spec": spec}))
        .unwrap()
    };
    let local_queue = |target: &str| object("LocalQueue", "mine", Some(x), json!({"clusterQueue": target}));
    let workload = |class: &str| {
        object(
            "Workload",
            "mine",
            Some(x),
            json!({"queueName": "gpu-tenancy", "priority": 0,
            "priorityClassRef": {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": class},
            "podSets": [{"name": "main", "count": 1, "template": {"spec": {"containers": [{"name": "c", "image": "pause"}]}}}]}),
        )
    };
    let job = |class: &str| -> Job {
        serde_json::from_value(json!({"metadata": {"name": "mine", "namespace": x, "labels": {
                "kueue.x-k8s.io/queue-name": "gpu-tenancy", "kueue.x-k8s.io/priority-class": class}},
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "pause",
                "resources": {"requests": {GPU: 1}, "limits": {GPU: 1}}}]}}}}))
        .unwrap()
    };
    let (own, other) = (format!("gpu-tenancy-{x}"), format!("gpu-tenancy-{y}"));
    let mut failures = Vec::new();
    let mut expect = |case: &str, got: Result<(), String>, says: Option<&[&str]>| {
        let ok = match (says, &got) {
            (None, Ok(())) => true,
            (Some(words), Err(e)) => words.iter().all(|w| e.contains(w)),
            _ => false,
        };
        if !ok {
            failures.push(format!(
                "{case}: got {got:?}, wanted {}",
                says.map_or("admitted".into(), |w| format!("refused saying {w:?}"))
            ));
        }
    };

    // RBAC: the edit role writes none of Kueue's kinds (Kueue aggregates read access only).
    let rbac = ["forbidden", &user];
    let got = outcome(
        kueue_api(&dev, Some(x), "LocalQueue")
            .create(&dry, &local_queue(&other))
            .await,
    );
    expect(
        "a LocalQueue naming another tenant's ClusterQueue (edit)",
        got,
        Some(&rbac),
    );
    let cq = object("ClusterQueue", "mine", None, json!({"namespaceSelector": {}}));
    expect(
        "a ClusterQueue (edit)",
        outcome(kueue_api(&dev, None, "ClusterQueue").create(&dry, &cq).await),
        Some(&rbac),
    );
    let cohort = object("Cohort", "mine", None, json!({}));
    expect(
        "a Cohort (edit)",
        outcome(kueue_api(&dev, None, "Cohort").create(&dry, &cohort).await),
        Some(&rbac),
    );
    let wpc: DynamicObject = serde_json::from_value(
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
        "metadata": {"name": "mine"}, "value": 1000}),
    )
    .unwrap();
    let got = outcome(kueue_api(&dev, None, "WorkloadPriorityClass").create(&dry, &wpc).await);
    expect("a WorkloadPriorityClass (edit)", got, Some(&rbac));
    let got = outcome(kueue_api(&dev, Some(x), "Workload").create(&dry, &workload(&own)).await);
    expect("a Workload (edit)", got, Some(&rbac));
    // Can read them: the aggregated view reached the edit role.
    let got = eventually(
        "Kueue's view roles aggregated into edit",
        || async { outcome(kueue_api(&dev, Some(x), "LocalQueue").get("gpu-tenancy").await) },
        |r| r.is_ok(),
    )
    .await;
    expect("reading its LocalQueue (edit)", got, None);

    // Admission: a Job may name only its own tenant's priority.
    let jobs: Api<Job> = Api::namespaced(dev.clone(), x);
    let refused_priority = [
        "GpuTenant kq-x",
        "kueue.x-k8s.io/priority-class",
        "gpu-tenancy-kq-y",
        "name gpu-tenancy-kq-x",
    ];
    let got = eventually(
        "the queue policy bound",
        || async { outcome(jobs.create(&dry, &job(&other)).await) },
        |r| r.is_err(),
    )
    .await;
    expect(
        "a Job with another tenant's priority class",
        got,
        Some(&refused_priority),
    );
    expect(
        "a Job with its own priority class",
        outcome(jobs.create(&dry, &job(&own)).await),
        None,
    );

    // A cluster that grants more: LocalQueues and Workloads in the tenant's namespace.
    let writer = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "kq-queue-writer"},
        "rules": [{"apiGroups": ["kueue.x-k8s.io"], "resources": ["localqueues", "workloads"], "verbs": ["create"]}]});
    cleanup.add_resource("clusterroles.rbac.authorization.k8s.io", "kq-queue-writer");
    bindings = vec![
        writer,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "kq-queue-writers", "namespace": x},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kq-queue-writer"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}),
    ];
    apply_docs_as_kubectl(&bindings, "kueue-queue-writers").await;
    let locals = kueue_api(&dev, Some(x), "LocalQueue");
    let got = eventually(
        "the queue writer role bound",
        || async { outcome(locals.create(&dry, &local_queue(&own)).await) },
        |r| r.is_ok(),
    )
    .await;
    expect("a LocalQueue naming its own ClusterQueue (granted)", got, None);
    let got = outcome(locals.create(&dry, &local_queue(&other)).await);
    expect(
        "a LocalQueue naming another tenant's ClusterQueue (granted)",
        got,
        Some(&[
            "GpuTenant kq-x",
            "spec.clusterQueue gpu-tenancy-kq-y",
            "name gpu-tenancy-kq-x",
        ]),
    );
    let workloads = kueue_api(&dev, Some(x), "Workload");
    let got = outcome(workloads.create(&dry, &workload(&other)).await);
    expect(
        "a Workload with another tenant's priority class (granted)",
        got,
        Some(&["GpuTenant kq-x", "spec.priorityClassRef gpu-tenancy-kq-y"]),
    );
    expect(
        "a Workload with its own priority class (granted)",
        outcome(workloads.create(&dry, &workload(&own)).await),
        None,
    );
    // A namespace of no tenant names none of the operator's queues, even as the admin.
    let mut stray = local_queue(&own);
    stray.metadata.namespace = Some(none.into());
    let got = outcome(kueue_api(&client, Some(none), "LocalQueue").create(&dry, &stray).await);
    expect(
        "a LocalQueue of a namespace of no tenant naming a tenant's ClusterQueue (admin)",
        got,
        Some(&["of no GpuTenant", "gpu-tenancy-*"]),
    );
    assert!(failures.is_empty(), "{failures:#?}");
    drop(kueue);
}
