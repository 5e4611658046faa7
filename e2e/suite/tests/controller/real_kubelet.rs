//! The device-plugin mode on Kubernetes' own kubelet: a node whose kubelet (e2e/kubelet) has a
//! device plugin registered with its device manager, advertising what NVIDIA's plugin would for
//! the config the controller rendered for the node (`e2e/bin/kubelet device-plugin`), on the
//! node's simulated GPUs. The kubelet admits the tenant's pods, allocates them devices and starts
//! them; the agent reads the kubelet's own pod-resources server. Nothing here imitates the kubelet.
//!
//! The oracles are not the agent's: which GPU each pod's container was given comes from the
//! runtime's record of the environment the kubelet set from the plugin's Allocate answer, the
//! GPUs' UUIDs from the simulator's state. The imitation of the pod-resources API
//! (`gpu_tenancy_e2e::kubelet::pod_resources`) stays in scenarios.rs (scenario e), metrics.rs and
//! metrics_work.rs: their figures need a fixed answer (which pod holds which MIG device of an A100
//! and of an H100, which replicas of a time-sliced GPU), where a kubelet picks the devices itself;
//! the agent's paths they exercise (`PodResources`, `UngrantedUse`, eviction of only the holder)
//! are exercised here against the real kubelet's answers.

use crate::observe::{applied, condition, wait_nodes};
use crate::support::*;
use gpu_tenancy::agent::pod_resources;
use gpu_tenancy::api::GpuNode;
use gpu_tenancy_e2e::node::{NodeDevices, RealNode};
use gpu_tenancy_e2e::procs::{SimAgent, http_get};
use gpu_tenancy_e2e::{Cleanup, apply_file};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const NODE: &str = "dp-kubelet-0";
const POOL: &str = "dp-kubelet";
const TENANT: &str = "dpk";

fn tenant() -> Value {
    json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuTenant", "metadata": {"name": TENANT},
        "spec": {"tier": "internal", "namespaces": [TENANT], "resources": [{"mode": "Exclusive", "count": 2}]}})
}

/// Both GPUs of the node whole, for the tenant; `busyGpuPolicy: Evict`. `mig`: both cut into one
/// 7g.80gb instead (a change that waits for a busy GPU).
fn plan(mig: bool) -> Value {
    let gpus = if mig {
        json!([{"devices": "all", "mode": "MIG", "mig": {"profiles": ["7g.80gb"]}}])
    } else {
        json!([{"devices": "all", "mode": "Exclusive", "tenants": [TENANT]}])
    };
    json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuPartitionPlan", "metadata": {"name": POOL},
        "spec": {"nodeSelector": {"matchLabels": {"pool": POOL}}, "gpus": gpus,
                 "rollout": {"maxUnavailable": 1, "busyGpuPolicy": "Evict"}}})
}

async fn apply(client: &Client, kind: &str, doc: Value) {
    let name = doc["metadata"]["name"].as_str().expect("a name").to_string();
    let ar = gpu_tenancy_e2e::api_resource(kind);
    Api::<kube::api::DynamicObject>::all_with(client.clone(), &ar)
        .patch(
            &name,
            &PatchParams::apply("e2e-real-kubelet").force(),
            &Patch::Apply(doc),
        )
        .await
        .unwrap_or_else(|e| panic!("applying {kind} {name}: {e}"));
}

/// Polls `check` every 300 ms until it gives `Some`; fails the test after `secs` with `what`
/// and the last answer's reason.
async fn eventually<T, F, Fut>(what: &str, secs: u64, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        match check().await {
            Ok(v) => return v,
            Err(why) => assert!(Instant::now() < deadline, "{what}: not within {secs} s: {why}"),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// A pod of the tenant asking for one `nvidia.com/gpu`, created without a node and bound to the
/// real node as the scheduler binds (the admission rules refuse pods that name their node).
async fn gpu_pod(client: &Client, name: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), TENANT);
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": name}, "spec": {
        "automountServiceAccountToken": false,
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "c", "image": "pause",
            "securityContext": {"runAsUser": 1000},
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}))
    .expect("a Pod");
    // Retried while the namespace's default service account and the tenant's quota are not there.
    eventually(&format!("pod {TENANT}/{name} created"), 60, || async {
        match pods.create(&PostParams::default(), &pod).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": NODE}});
    pods.create_subresource::<_, Value>("binding", name, &PostParams::default(), &binding)
        .await
        .unwrap_or_else(|e| panic!("binding pod {name} to {NODE}: {e}"));
}

async fn running(client: &Client, node: &RealNode, name: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), TENANT);
    eventually(
        &format!("pod {TENANT}/{name} Running on the real kubelet"),
        90,
        || async {
            let st = pods
                .get(name)
                .await
                .map_err(|e| e.to_string())?
                .status
                .unwrap_or_default();
            match st.phase.as_deref() {
                Some("Running") => Ok(()),
                _ => Err(format!("{st:?}\nthe kubelet's log:\n{}", node.log_tail())),
            }
        },
    )
    .await;
}

/// Waits until pod `name` is gone from the API server (the real kubelet confirmed its end).
async fn gone(client: &Client, name: &str, secs: u64) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), TENANT);
    eventually(&format!("pod {TENANT}/{name} gone"), secs, || async {
        match pods.get_opt(name).await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(p) => Err(format!("still there, deletion {:?}", p.metadata.deletion_timestamp)),
        }
    })
    .await;
}

/// The GPU UUID the runtime's record says pod `name`'s container was given (the kubelet's
/// environment from the plugin's Allocate answer).
fn given(node: &RealNode, name: &str) -> String {
    let c = node
        .containers()
        .into_iter()
        .rev()
        .find(|c| c["pod"] == name && c["container"] == "c")
        .unwrap_or_else(|| panic!("the runtime created no container of pod {name}"));
    let env: Vec<&str> = c["containerEnv"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    env.iter()
        .find_map(|e| e.strip_prefix("NVIDIA_VISIBLE_DEVICES="))
        .unwrap_or_else(|| panic!("pod {name}'s container got no NVIDIA_VISIBLE_DEVICES: {c}"))
        .to_string()
}

/// The config the controller rendered for the node: its label's key in the plugin's ConfigMap.
async fn rendered_config(client: &Client) -> (String, String) {
    let nodes: Api<Node> = Api::all(client.clone());
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "nvidia-device-plugin");
    eventually("the node's device plugin config rendered", 60, || async {
        let node = nodes.get(NODE).await.map_err(|e| e.to_string())?;
        let key = node
            .metadata
            .labels
            .unwrap_or_default()
            .get("nvidia.com/device-plugin.config")
            .cloned()
            .ok_or("no nvidia.com/device-plugin.config label yet")?;
        let cm = cms
            .get("gpu-tenancy-device-plugin-configs")
            .await
            .map_err(|e| e.to_string())?;
        let config = cm
            .data
            .unwrap_or_default()
            .get(&key)
            .cloned()
            .ok_or(format!("no key {key}"))?;
        Ok((key, config))
    })
    .await
}

/// The tenant's namespace (the controller may have made it already).
async fn namespace(client: &Client, cleanup: &Cleanup) {
    cleanup.add_resource("namespaces", TENANT);
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": TENANT}})).expect("a Namespace");
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("creating namespace {TENANT}: {e}"),
    }
}

fn ungranted(n: &GpuNode) -> Option<(String, String, String)> {
    condition(n, "UngrantedUse").map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// The node, its agent reading the kubelet's pod-resources server, the controller's plan applied
/// and the device plugin started on the config the controller rendered; the GPUs' UUIDs by index.
async fn start_node(client: &Client, cleanup: &Cleanup) -> (RealNode, SimAgent, Vec<String>) {
    apply_file("examples/policy.yaml").await;
    cleanup.add("GpuTenant", TENANT);
    cleanup.add("GpuPartitionPlan", POOL);
    apply(client, "GpuTenant", tenant()).await;
    namespace(client, cleanup).await;
    let t0 = Instant::now();
    let mut node = RealNode::start(client, cleanup, NODE, &format!("pool={POOL}")).await;
    eprintln!(
        "MEASURE the real kubelet's Node Ready in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let mut agent = SimAgent::start_with(client, cleanup, NODE, POOL, 2).await;
    agent.read_kubelet(&node.pod_resources_socket());
    apply(client, "GpuPartitionPlan", plan(false)).await;
    let names = [NODE.to_string()];
    wait_nodes(client, &names, 90, "the plan applied", |n| {
        applied(n) && n.status.as_ref().and_then(|s| s.gpu_layout.as_deref()) == Some("0:Exclusive 1:Exclusive")
    })
    .await;
    let state = agent.sim_state();
    let uuids: Vec<String> = state["gpus"]
        .as_array()
        .expect("the simulator's GPUs")
        .iter()
        .map(|g| g["uuid"].as_str().expect("a UUID").to_string())
        .collect();
    let (key, config) = rendered_config(client).await;
    assert_eq!(key, "exclusive", "the node's config: {config}");
    let devices = NodeDevices {
        gpus: uuids.clone(),
        ..Default::default()
    };
    node.start_device_plugin(client, &config, &devices, &[("nvidia.com/gpu", 2)])
        .await;
    (node, agent, uuids)
}

/// The tenant's namespace's allocated GPU-seconds on the agent's `/metrics`: the devices its
/// pods hold by the kubelet's answer.
async fn namespace_seconds(addr: std::net::SocketAddr) -> f64 {
    let (code, body) = eventually("the agent's /metrics", 30, || async {
        http_get(addr, "/metrics")
            .await
            .ok_or_else(|| "nothing listens yet".to_string())
    })
    .await;
    assert_eq!(code, 200, "{body}");
    body.lines()
        .filter(|l| {
            l.starts_with("gpu_tenancy_namespace_allocated_gpu_seconds")
                && l.contains(&format!("namespace=\"{TENANT}\""))
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// The kubelet's own pod-resources answer, read as the agent reads it, says each pod of
/// `held_by` holds its GPU (as the runtime's record says it was given), and the agent reads it.
async fn the_kubelet_says_who_holds_them(client: &Client, node: &RealNode, held_by: &[(&str, &String)]) {
    let held = pod_resources::read(&node.pod_resources_socket())
        .await
        .expect("the kubelet's pod-resources server answers");
    for &(pod, gpu) in held_by {
        let d = held
            .devices
            .get(gpu)
            .unwrap_or_else(|| panic!("{gpu} is held by nobody: {held:?}"));
        assert_eq!(d.resource, "nvidia.com/gpu");
        let holders: Vec<(&str, &str)> = d
            .holders
            .iter()
            .map(|h| (h.namespace.as_str(), h.pod.as_str()))
            .collect();
        assert_eq!(holders, [(TENANT, pod)], "who holds {gpu}");
    }
    wait_nodes(
        client,
        &[NODE.to_string()],
        30,
        "PodResources read from the real kubelet",
        |n| condition(n, "PodResources").is_some_and(|c| c.status == "True" && c.reason == "Read"),
    )
    .await;
}

/// Deletes pod `name` and waits until the kubelet has confirmed its end.
async fn delete(client: &Client, name: &str) {
    Api::<Pod>::namespaced(client.clone(), TENANT)
        .delete(name, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("deleting {name}: {e}"));
    gone(client, name, 60).await;
}

/// Pods of the tenant run on the real kubelet with the GPUs its device manager allocated; the
/// kubelet's own pod-resources answer says so, the agent reads it (`PodResources`), explains the
/// processes on held GPUs (`UngrantedUse`), counts the namespace's holdings, finds the process a
/// pod left behind, and under `busyGpuPolicy: Evict` asks only for the pod holding the busy GPU,
/// which the kubelet then stops.
#[tokio::test]
async fn g_device_plugin_pods_on_a_real_kubelet() {
    let cleanup = Cleanup::new();
    let client = setup(&cleanup).await;
    let controller = run_passes(std::sync::Arc::new(start_controller(&client).await));
    let (node, mut agent, uuids) = start_node(&client, &cleanup).await;
    let metrics = agent.serve_metrics();
    let names = [NODE.to_string()];

    // Two pods, each given one GPU by the kubelet's device manager.
    let t0 = Instant::now();
    for p in ["p0", "p1"] {
        gpu_pod(&client, p).await;
    }
    for p in ["p0", "p1"] {
        running(&client, &node, p).await;
    }
    eprintln!(
        "MEASURE two device-plugin pods Running on the real kubelet {:.1} s after their creation",
        t0.elapsed().as_secs_f64()
    );
    let (g0, g1) = (given(&node, "p0"), given(&node, "p1"));
    assert!(
        g0 != g1 && uuids.contains(&g0) && uuids.contains(&g1),
        "p0 got {g0}, p1 {g1}, GPUs {uuids:?}"
    );
    let index = |u: &str| {
        uuids
            .iter()
            .position(|x| x == u)
            .expect("a GPU of the node")
            .to_string()
    };
    let (i0, i1) = (index(&g0), index(&g1));

    the_kubelet_says_who_holds_them(&client, &node, &[("p0", &g0), ("p1", &g1)]).await;

    // A process on each pod's GPU: both explained by the kubelet's answer.
    for (gpu, pid) in [(&i0, "4301"), (&i1, "4302")] {
        agent.sim_ctl(&[
            "attach",
            "--gpu",
            gpu,
            "--pid",
            pid,
            "--tenant",
            TENANT,
            "--mib",
            "1000",
            "--sm-util",
            "50",
        ]);
    }
    wait_nodes(&client, &names, 30, "UngrantedUse None", |n| {
        ungranted(n).is_some_and(|(s, r, _)| s == "False" && r == "None")
    })
    .await;
    let before = namespace_seconds(metrics).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = namespace_seconds(metrics).await;
    assert!(
        after > before,
        "namespace {TENANT}'s allocated GPU-seconds did not grow: {before} then {after}"
    );

    // p1 ends (the kubelet confirms it) but its process stays: ungranted use on its GPU.
    delete(&client, "p1").await;
    let on = format!("on GPU {i1} that");
    wait_nodes(&client, &names, 30, "UngrantedUse on p1's GPU", |n| {
        ungranted(n).is_some_and(|(s, _, m)| s == "True" && m.contains(&on))
    })
    .await;
    agent.sim_ctl(&["detach", "--pid", "4302"]);

    // p2 gets the GPU p1 left.
    gpu_pod(&client, "p2").await;
    running(&client, &node, "p2").await;
    assert_eq!(given(&node, "p2"), g1, "p2 was given the free GPU");
    evict_the_busy_gpus_holder(&client, &agent, &i0).await;
    unhealthy_in_status_and_metrics(&client, &agent, metrics, &i1).await;
    // Deleted while the kubelet runs to confirm it: the namespace's deletion must not wait on it.
    delete(&client, "p2").await;
    controller.abort();
    drop(agent);
    drop(node);
}

/// The device-plugin mode reports device health as the DRA mode does: an XID on p2's GPU makes it
/// unhealthy in the GpuNode and in the metrics, every row of it and no other (NVIDIA's device plugin withdraws it from the
/// kubelet on its own); an application's XID before it changes nothing.
async fn unhealthy_in_status_and_metrics(client: &Client, agent: &SimAgent, metrics: std::net::SocketAddr, gpu: &str) {
    let names = [NODE.to_string()];
    let reason = |n: &GpuNode| {
        n.status
            .as_ref()
            .and_then(|s| s.gpus.iter().find(|g| g.index.to_string() == gpu))
            .and_then(|g| g.unhealthy.as_ref())
            .map(|u| u.reason)
    };
    agent.sim_ctl(&["event", "--gpu", gpu, "--xid", "43"]);
    agent.sim_ctl(&["event", "--gpu", gpu, "--xid", "48"]);
    wait_nodes(client, &names, 30, "the GPU unhealthy in its GpuNode", |n| {
        reason(n) == Some(gpu_tenancy::api::HealthReason::Xid)
    })
    .await;
    let api: Api<GpuNode> = Api::all(client.clone());
    let n = api.get(NODE).await.expect("the GpuNode");
    let status = n.status.unwrap_or_default();
    let message = status
        .gpus
        .iter()
        .find_map(|g| g.unhealthy.as_ref())
        .map(|u| u.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains("XID 48"),
        "the first XID that counts is reported, not 43: {message}"
    );
    let sick: Vec<String> = http_get(metrics, "/metrics")
        .await
        .map(|(_, body)| body)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("gpu_tenancy_device_unhealthy{") && l.ends_with(" 1"))
        .map(String::from)
        .collect();
    assert!(
        !sick.is_empty()
            && sick
                .iter()
                .all(|r| r.contains(&format!("gpu=\"{gpu}\"")) && r.contains("reason=\"Xid\"")),
        "the metrics' unhealthy devices: {sick:?}"
    );
}

/// Both GPUs are to be cut into MIG; p0's GPU is busy (process 4301): the agent asks only for
/// p0, whose GPU the kubelet says it holds, not p2, which asks for the same resource; the
/// controller evicts it and the kubelet stops it. Then the process ends and the change goes on.
async fn evict_the_busy_gpus_holder(client: &Client, agent: &SimAgent, busy: &str) {
    apply(client, "GpuPartitionPlan", plan(true)).await;
    let gpu_nodes: Api<GpuNode> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), TENANT);
    let mut asked = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let st = gpu_nodes
            .get(NODE)
            .await
            .expect("the GpuNode")
            .status
            .unwrap_or_default();
        asked.extend(
            st.eviction_requests
                .iter()
                .map(|r| format!("{}/{}", r.namespace, r.name)),
        );
        if pods.get_opt("p0").await.expect("reading p0").is_none() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "p0 was not evicted from the busy GPU: asked for {asked:?}; status {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(
        asked.into_iter().collect::<Vec<_>>(),
        [format!("{TENANT}/p0")],
        "only the busy GPU's holder is asked for"
    );
    let n = gpu_nodes.get(NODE).await.expect("the GpuNode");
    let gpu = &n.status.expect("a status").gpus[busy.parse::<usize>().unwrap()];
    assert_eq!(
        gpu.reason.map(|r| r.as_str()),
        Some("Busy"),
        "GPU {busy} waits for its process"
    );
    agent.sim_ctl(&["detach", "--pid", "4301"]);
    wait_nodes(client, &[NODE.to_string()], 90, "both GPUs cut", |n| {
        applied(n) && n.status.as_ref().and_then(|s| s.gpu_layout.as_deref()) == Some("0:7g.80gb 1:7g.80gb")
    })
    .await;
    let p2 = pods.get_opt("p2").await.expect("reading p2");
    assert!(
        p2.as_ref().is_some_and(|p| p.metadata.deletion_timestamp.is_none()),
        "p2, on the GPU that was not busy, was evicted: {p2:?}"
    );
}
