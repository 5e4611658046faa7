//! 100 pods of two tenants created at once on one node of Kubernetes' own kubelet: 8 simulated
//! H100s, each time-sliced into 16 shares, four GPUs per tenant, pods of one share and of two.
//! The agent has just started, so every GPU's past is unknown and its first claim scrubs it
//! (2 s each here): the other claims of that GPU wait for that one scrub, none starts a second,
//! and claims on other GPUs do not wait for it. A second round of the same tenants on the same
//! shares scrubs nothing.
//!
//! The oracles are the kubelet's own pod status (Running), the runtime's record of what each
//! container was given (its tenant's devices only), and the simulator's count of scrubs.

use crate::support::*;
use gpu_tenancy_e2e::apply_docs_as_kubectl;
use gpu_tenancy_e2e::node::RealNode;
use gpu_tenancy_e2e::procs::SimAgent;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

const NODE: &str = "dra-burst-n1";
const TENANTS: [&str; 2] = ["burst-a", "burst-b"];
const GPUS: u32 = 8;
const REPLICAS: u32 = 16;
/// Per tenant: 36 pods of one share and 14 of two, its 64 shares (four GPUs) in all.
const PODS_OF_ONE: usize = 36;
const PODS_OF_TWO: usize = 14;
const SCRUB_MS: u64 = 2000;

fn world() -> Vec<Value> {
    let mut docs: Vec<Value> = TENANTS
        .iter()
        .map(|t| {
            json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuTenant", "metadata": {"name": t},
                "spec": {"tier": "experimental", "namespaces": [t],
                    "resources": [{"mode": "TimeSlicing", "count": (PODS_OF_ONE + 2 * PODS_OF_TWO)}]}})
        })
        .collect();
    docs.push(
        json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuPartitionPlan", "metadata": {"name": "dra-burst"},
        "spec": {"nodeSelector": {"matchLabels": {"pool": "dra-burst"}}, "deviceAccess": "DRA", "gpus": [
            {"devices": "all", "mode": "TimeSlicing", "timeSlicing": {"replicas": REPLICAS}}]}}),
    );
    docs
}

fn template(tenant: &str, shares: u32) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": format!("shares-{shares}")},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu",
            "exactly": {"deviceClassName": class(tenant, "timeslicing"), "count": shares}}]}}}})
}

fn pod(name: &str, shares: u32) -> Value {
    let mut p = pod_body(
        name,
        json!([{"name": "gpu", "resourceClaimTemplateName": format!("shares-{shares}")}]),
        json!({}),
    );
    p["spec"]["containers"][0]["resources"]["claims"] = json!([{"name": "gpu", "request": "gpu"}]);
    p["spec"]["nodeSelector"] = json!({"pool": "dra-burst"});
    p["spec"]["automountServiceAccountToken"] = json!(false);
    p["spec"]["containers"][0]["securityContext"]["runAsUser"] = json!(1000);
    // An untagged image is pulled for every container (policy Always), and a hundred pulls at
    // once meet the kubelet's pull rate limit: the image is on the node already.
    p["spec"]["containers"][0]["imagePullPolicy"] = json!("IfNotPresent");
    p
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

pub async fn a_hundred_pods_at_once(c: &mut Cluster) {
    let docs = world();
    c._cleanup.add_docs(&docs);
    apply_docs_as_kubectl(&docs, "the burst's tenants and plan").await;
    let node = RealNode::start(&c.client, &c._cleanup, NODE, "pool=dra-burst").await;
    let mut agent = SimAgent::start_dra(&c.client, &c._cleanup, NODE, "dra-burst", GPUS).await;
    agent.env = vec![("GPU_TENANCY_SIM_SCRUB_MS".into(), SCRUB_MS.to_string())];
    agent.serve_kubelet(&node.registry_dir(), &node.plugins_dir(), &node.cdi_dir());
    until("the burst node's shares published for their tenants", 90, || async {
        let d = devices(&c.client).await;
        let ready: Vec<_> = d
            .iter()
            .filter(|((n, _), dev)| n == NODE && dev.get("taints").is_none())
            .collect();
        match ready.len() == (GPUS * REPLICAS) as usize {
            true => Ok(()),
            false => Err(format!("{} of {} shares ready", ready.len(), GPUS * REPLICAS)),
        }
    })
    .await;
    crate::real_kubelet::nvidia_spec(&c.client, &node).await;
    for t in TENANTS {
        until("the tenant's namespace", 60, || async {
            Api::<k8s_openapi::api::core::v1::Namespace>::all(c.client.clone())
                .get_opt(t)
                .await
                .map_err(|e| e.to_string())?
                .map(|_| ())
                .ok_or_else(|| "not yet".to_string())
        })
        .await;
        c._cleanup.add_resource("namespaces", t);
        for shares in [1, 2] {
            create_template(&c.client, t, &template(t, shares)).await;
        }
    }
    // A GPU's first claim scrubs it (its past is unknown to the agent just started); the other
    // claims of the GPU join that scrub or find it done.
    round(c, &node, &agent, "first round", GPUS as usize).await;
    // The same tenants again on the same shares: no scrub is due.
    round(c, &node, &agent, "second round", 0).await;
    drop(agent);
    drop(node);
}

/// Creates the 100 pods at once, waits until all are Running, and checks what each was given and
/// that exactly `scrubs_due` scrubs were made.
async fn round(c: &Cluster, node: &RealNode, agent: &SimAgent, which: &str, scrubs_due: usize) {
    let scrubs_before = agent.sim_state()["scrubs"].as_array().map_or(0, Vec::len);

    // All at once: every pod is created before any is checked.
    let mut created: BTreeMap<(String, String), Instant> = BTreeMap::new();
    let creates = TENANTS.iter().flat_map(|t| {
        (0..PODS_OF_ONE + PODS_OF_TWO).map(move |i| {
            let shares = if i < PODS_OF_TWO { 2 } else { 1 };
            (t.to_string(), format!("{t}-{i}"), shares)
        })
    });
    let started = futures::future::join_all(creates.map(|(t, name, shares)| {
        let client = c.client.clone();
        async move {
            create(&client, &t, &pod(&name, shares))
                .await
                .unwrap_or_else(|e| panic!("pod {t}/{name}: {e}"));
            ((t, name), Instant::now())
        }
    }))
    .await;
    created.extend(started);
    let t0 = Instant::now();

    let mut running: BTreeMap<(String, String), Duration> = BTreeMap::new();
    let mut scheduled: BTreeMap<(String, String), Duration> = BTreeMap::new();
    while running.len() < created.len() {
        for t in TENANTS {
            let pods = Api::<Pod>::namespaced(c.client.clone(), t)
                .list(&ListParams::default())
                .await
                .expect("listing the pods");
            for p in pods {
                let key = (t.to_string(), p.metadata.name.clone().unwrap_or_default());
                if p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some() && !scheduled.contains_key(&key) {
                    scheduled.insert(key.clone(), created[&key].elapsed());
                }
                let is_running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
                if is_running && !running.contains_key(&key) {
                    running.insert(key.clone(), created[&key].elapsed());
                }
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(180),
            "{} of {} pods Running after 180 s; the kubelet:\n{}",
            running.len(),
            created.len(),
            node.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut times: Vec<Duration> = running.values().copied().collect();
    times.sort();
    let mut to_scheduled: Vec<Duration> = scheduled.values().copied().collect();
    to_scheduled.sort();
    // What the node took once the scheduler had bound the pod.
    let mut on_node: Vec<Duration> = running
        .iter()
        .map(|(k, r)| r.saturating_sub(scheduled.get(k).copied().unwrap_or_default()))
        .collect();
    on_node.sort();
    let scrubs = agent.sim_state()["scrubs"].as_array().map_or(0, Vec::len) - scrubs_before;
    eprintln!(
        "MEASURE 100 pods at once on one real kubelet (8 H100 x 16 time-sliced shares, 2 tenants, {SCRUB_MS} ms scrubs), {which}: creation to Running p50 {:.1} s, p99 {:.1} s, max {:.1} s; to bound by the scheduler p50 {:.1} s, p99 {:.1} s; bound to Running p50 {:.1} s, p99 {:.1} s; {scrubs} scrubs",
        percentile(&times, 0.5).as_secs_f64(),
        percentile(&times, 0.99).as_secs_f64(),
        times.last().unwrap().as_secs_f64(),
        percentile(&to_scheduled, 0.5).as_secs_f64(),
        percentile(&to_scheduled, 0.99).as_secs_f64(),
        percentile(&on_node, 0.5).as_secs_f64(),
        percentile(&on_node, 0.99).as_secs_f64(),
    );

    assert_eq!(
        scrubs,
        scrubs_due,
        "scrubs of the {which}: {}",
        agent.sim_state()["scrubs"]
    );
    // Each container was given its tenant's devices (the runtime's record), each claim only its
    // tenant's shares, and no share went to two claims (the claims' allocations).
    for (t, name) in created.keys() {
        let container = node
            .containers()
            .into_iter()
            .rev()
            .find(|x| x["pod"] == name.as_str())
            .unwrap_or_else(|| panic!("the runtime created no container for {t}/{name}"));
        let env: Vec<&str> = container["env"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(
            env.contains(&format!("GPU_TENANCY_TENANT={t}").as_str()),
            "{t}/{name}'s container: {container}"
        );
    }
    let published = devices(&c.client).await;
    let mut given: BTreeSet<String> = BTreeSet::new();
    for t in TENANTS {
        let claims = Api::<k8s_openapi::api::resource::v1::ResourceClaim>::namespaced(c.client.clone(), t)
            .list(&ListParams::default())
            .await
            .expect("listing the claims");
        for claim in claims {
            let results = claim
                .status
                .and_then(|s| s.allocation)
                .and_then(|a| a.devices)
                .and_then(|d| d.results)
                .unwrap_or_default();
            for r in results {
                let dev = &published[&(NODE.to_string(), r.device.clone())];
                assert_eq!(attr(dev, "tenant"), t, "{t}'s claim got {}: {dev}", r.device);
                assert!(given.insert(r.device.clone()), "{} allocated to two claims", r.device);
            }
        }
    }
    assert_eq!(given.len(), 2 * (PODS_OF_ONE + 2 * PODS_OF_TWO));
    for (t, name) in created.keys() {
        let _ = Api::<Pod>::namespaced(c.client.clone(), t)
            .delete(name, &DeleteParams::default().grace_period(0))
            .await;
    }
    until("the burst's pods and claims gone", 120, || async {
        let mut left = 0;
        for t in TENANTS {
            left += Api::<Pod>::namespaced(c.client.clone(), t)
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
                .items
                .len();
            left += Api::<k8s_openapi::api::resource::v1::ResourceClaim>::namespaced(c.client.clone(), t)
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
                .items
                .len();
        }
        match left {
            0 => Ok(()),
            n => Err(format!("{n} pods and claims left")),
        }
    })
    .await;
}
