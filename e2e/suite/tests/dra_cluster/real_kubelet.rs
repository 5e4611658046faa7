//! The DRA plugin with Kubernetes' own kubelet: a node whose kubelet (e2e/kubelet) registers the
//! agent through its plugin watcher, calls Prepare and Unprepare as it does in production, and
//! hands the CDI device IDs to a runtime that resolves them as containerd does. Nothing here
//! imitates the kubelet.

use crate::support::*;
use gpu_tenancy_e2e::apply_docs_as_kubectl;
use gpu_tenancy_e2e::node::RealNode;
use gpu_tenancy_e2e::procs::SimAgent;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DeleteParams};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const NODE: &str = "dra-kubelet-n1";
const TENANT: &str = "dra-k";

fn world() -> Vec<Value> {
    vec![
        json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuTenant", "metadata": {"name": TENANT},
            "spec": {"tier": "internal", "namespaces": [TENANT], "resources": [{"mode": "Exclusive", "count": 1}]}}),
        json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuPartitionPlan", "metadata": {"name": "dra-kubelet"},
            "spec": {"nodeSelector": {"matchLabels": {"pool": "dra-kubelet"}}, "deviceAccess": "DRA", "gpus": [
                {"devices": "all", "mode": "Exclusive", "tenants": [TENANT]}]}}),
    ]
}

/// A template of one device of the tenant's GPU class; `first_available`: as the one
/// alternative of a `firstAvailable` request (a subrequest `gpu/mine`).
fn template(name: &str, first_available: bool) -> Value {
    let class = class(TENANT, "gpu");
    let request = if first_available {
        json!({"name": "gpu", "firstAvailable": [{"name": "mine", "deviceClassName": class}]})
    } else {
        json!({"name": "gpu", "exactly": {"deviceClassName": class}})
    };
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [request]}}}})
}

/// A pod on the real node whose container uses request `gpu` of a claim from `template`. No
/// service account token: the test control plane publishes no root CA ConfigMap to mount.
fn pod(name: &str, template: &str) -> Value {
    let mut p = pod_body(
        name,
        json!([{"name": "gpu", "resourceClaimTemplateName": template}]),
        json!({}),
    );
    p["spec"]["containers"][0]["resources"]["claims"] = json!([{"name": "gpu", "request": "gpu"}]);
    p["spec"]["nodeSelector"] = json!({"pool": "dra-kubelet"});
    p["spec"]["automountServiceAccountToken"] = json!(false);
    // The runtime's images name no user: the kubelet needs one to honour runAsNonRoot.
    p["spec"]["containers"][0]["securityContext"]["runAsUser"] = json!(1000);
    p
}

async fn running(client: &Client, node: &RealNode, name: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), TENANT);
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let p = pods.get(name).await.expect("the pod");
        let st = p.status.clone().unwrap_or_default();
        if st.phase.as_deref() == Some("Running") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "pod {TENANT}/{name} did not run on the real kubelet: {st:#?}\nthe kubelet's log:\n{}",
            node.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn gone(client: &Client, name: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), TENANT);
    let _ = pods.delete(name, &DeleteParams::default().grace_period(0)).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while pods.get_opt(name).await.expect("reading the pod").is_some() {
        assert!(Instant::now() < deadline, "pod {TENANT}/{name} was not deleted");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The hand-over evidence on pod `name`'s claim, once the agent wrote it: (scrub, previous
/// holder, bytes verified), as the claim's `status.devices` entry of this driver says.
async fn evidence(client: &Client, name: &str) -> (String, String, u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match evidence_now(client, name).await {
            Ok(data) => {
                eprintln!("MEASURE evidence on pod {name}'s claim: {data}");
                return (
                    data["scrub"].as_str().unwrap_or_default().to_string(),
                    data["previousHolder"].as_str().unwrap_or_default().to_string(),
                    data["bytesVerified"].as_u64().unwrap_or(0),
                );
            }
            Err(e) if Instant::now() > deadline => panic!("the hand-over evidence on pod {name}'s claim: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
}

async fn evidence_now(client: &Client, name: &str) -> Result<Value, String> {
    let p = Api::<Pod>::namespaced(client.clone(), TENANT)
        .get(name)
        .await
        .map_err(|e| e.to_string())?;
    let claim = p
        .status
        .and_then(|s| s.resource_claim_statuses)
        .and_then(|c| c.into_iter().find_map(|c| c.resource_claim_name))
        .ok_or("no claim generated yet")?;
    let c = Api::<k8s_openapi::api::resource::v1::ResourceClaim>::namespaced(client.clone(), TENANT)
        .get(&claim)
        .await
        .map_err(|e| e.to_string())?;
    let entry = c
        .status
        .and_then(|s| s.devices)
        .and_then(|d| {
            d.into_iter()
                .find(|d| d.driver == gpu_tenancy::agent::dra::devices::DRIVER)
        })
        .ok_or(format!("claim {claim} has no status.devices entry of the driver"))?;
    Ok(serde_json::to_value(entry.data).unwrap())
}

/// The device the runtime gave pod `name`'s container: its CDI device IDs and environment.
fn given(node: &RealNode, name: &str) -> Option<Value> {
    node.containers()
        .into_iter()
        .rev()
        .find(|c| c["pod"] == name && c["container"] == "c")
}

async fn published(client: &Client, what: &str) {
    until(what, 90, || async {
        let d = devices(client).await;
        match d.get(&(NODE.to_string(), "gpu-0".to_string())) {
            Some(dev) if attr(dev, "tenant") == TENANT && dev.get("taints").is_none() => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

/// NVIDIA's own CDI spec of the node's GPUs, as `nvidia-ctk cdi generate
/// --device-name-strategy=uuid` (and the GPU Operator) write it: a `nvidia.com/gpu` device per
/// GPU, named by its UUID, which brings the driver's files. Prepare names it beside the agent's
/// own device; a node without it fails every container ("unresolvable CDI devices").
pub async fn nvidia_spec(client: &Client, node: &RealNode) {
    let d = devices(client).await;
    let uuids: Vec<String> = d
        .iter()
        .filter(|((n, _), _)| *n == node.name)
        .filter_map(|(_, dev)| attr(dev, "uuid").as_str().map(String::from))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert!(!uuids.is_empty(), "the node's devices carry no UUID: {d:?}");
    let devices: Vec<Value> = uuids
        .iter()
        .map(|u| json!({"name": u, "containerEdits": {"env": [format!("NVIDIA_DRIVER_DEVICE={u}")]}}))
        .collect();
    let spec = json!({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": devices,
        "containerEdits": {"env": ["NVIDIA_DRIVER_LIBRARIES=injected"]}});
    std::fs::write(
        node.cdi_dir().join("nvidia.json"),
        serde_json::to_vec_pretty(&spec).unwrap(),
    )
    .expect("writing NVIDIA's CDI spec");
}

/// Registration by the kubelet itself, a pod Running with its device, a `firstAvailable` pod's
/// container given its device, and the slices back after the kubelet restarts (it wipes them).
pub async fn pods_run_on_a_real_kubelet(c: &mut Cluster) {
    let docs = world();
    c._cleanup.add_docs(&docs);
    apply_docs_as_kubectl(&docs, "the real kubelet's tenant and plan").await;
    let t0 = Instant::now();
    let mut node = RealNode::start(&c.client, &c._cleanup, NODE, "pool=dra-kubelet").await;
    eprintln!(
        "MEASURE the real kubelet's Node Ready in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let mut agent = SimAgent::start_dra(&c.client, &c._cleanup, NODE, "dra-kubelet", 1).await;
    agent.serve_kubelet(&node.registry_dir(), &node.plugins_dir(), &node.cdi_dir());
    published(&c.client, "the real node's GPU published for its tenant").await;
    nvidia_spec(&c.client, &node).await;
    until("the tenant's namespace", 60, || async {
        Api::<k8s_openapi::api::core::v1::Namespace>::all(c.client.clone())
            .get_opt(TENANT)
            .await
            .map_err(|e| e.to_string())?
            .map(|_| ())
            .ok_or_else(|| "not yet".to_string())
    })
    .await;
    c._cleanup.add_resource("namespaces", TENANT);

    for (tpl, first) in [("k-exact", false), ("k-first", true)] {
        create_template(&c.client, TENANT, &template(tpl, first)).await;
    }

    // A pod whose claim the kubelet prepares: the agent registered through the kubelet's plugin
    // watcher, the CDI specs resolved by the runtime.
    let t0 = Instant::now();
    create(&c.client, TENANT, &pod("k1", "k-exact"))
        .await
        .expect("creating the pod");
    running(&c.client, &node, "k1").await;
    eprintln!(
        "MEASURE a pod with a claim Running on the real kubelet {:.1} s after its creation",
        t0.elapsed().as_secs_f64()
    );
    let k1 = given(&node, "k1").expect("the runtime created pod k1's container");
    let env: Vec<&str> = k1["env"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(
        env.iter().any(|e| e.starts_with("NVIDIA_VISIBLE_DEVICES=GPU-"))
            && env.contains(&"GPU_TENANCY_TENANT=dra-k")
            && env.contains(&"NVIDIA_DRIVER_LIBRARIES=injected"),
        "pod k1's container was not given its GPU: {k1}"
    );
    // The agent's first claim on the GPU: its past unknown, scrubbed.
    let (scrub, previous, bytes) = evidence(&c.client, "k1").await;
    assert_eq!((scrub.as_str(), previous.as_str()), ("Scrubbed", "Unknown"));
    assert!(bytes > 0, "scrubbed with no byte verified");
    gone(&c.client, "k1").await;

    // firstAvailable: the kubelet matches the container's request `gpu` against the device's
    // request names; answered as `gpu/mine`, the container would start without its GPU.
    create(&c.client, TENANT, &pod("k2", "k-first"))
        .await
        .expect("creating the firstAvailable pod");
    running(&c.client, &node, "k2").await;
    let k2 = given(&node, "k2").expect("the runtime created pod k2's container");
    assert!(
        k2["cdiDevices"].as_array().is_some_and(|d| !d.is_empty()),
        "the firstAvailable pod's container was given no device: {k2}"
    );
    // The same tenant's claim before it, no scrub (scrubMemory OnTenantChange).
    let (scrub, previous, bytes) = evidence(&c.client, "k2").await;
    assert_eq!(
        (scrub.as_str(), previous.as_str(), bytes),
        ("NotNeeded", "SameTenant", 0)
    );

    // A reboot: the runtime's containers and its CDI directory are gone, the kubelet's checkpoint
    // is not. The kubelet makes the pod's sandbox again and calls Prepare again; the container is
    // created again only if the claim's spec is there again.
    let before = node.containers().iter().filter(|c| c["pod"] == "k2").count();
    node.reboot(&c.client, &["nvidia.json"]).await;
    until("pod k2's container created again after the reboot", 90, || async {
        let now = node.containers().iter().filter(|c| c["pod"] == "k2").count();
        if now > before {
            Ok(())
        } else {
            Err(format!(
                "{now} containers of k2, as before the reboot; the kubelet:\n{}",
                node.log_tail()
            ))
        }
    })
    .await;
    running(&c.client, &node, "k2").await;

    // The kubelet restarts and wipes its node's slices: the agent writes them back.
    node.restart_kubelet(&c.client).await;
    let t0 = Instant::now();
    published(&c.client, "the slices back after the kubelet's restart").await;
    eprintln!(
        "MEASURE slices back {:.1} s after the restarted kubelet was Ready",
        t0.elapsed().as_secs_f64()
    );
    health_reaches_the_pod(&c.client, &node, &agent, "k2").await;
    gone(&c.client, "k2").await;

    // The agent down for longer than the kubelet waits: 30 s after the last connection to a
    // plugin drops, the kubelet deletes the driver's slices. They are back once the agent is
    // (which also starts with no record of the XID above: health marks last until a restart).
    agent.kill();
    let t0 = Instant::now();
    until("the kubelet deleted the slices of the stopped plugin", 90, || async {
        let d = devices(&c.client).await;
        match d.keys().filter(|(n, _)| n == NODE).count() {
            0 => Ok(()),
            n => Err(format!("{n} devices still published")),
        }
    })
    .await;
    eprintln!(
        "MEASURE the kubelet deleted the stopped plugin's slices after {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    agent.restart();
    published(&c.client, "the slices back after the agent's restart").await;
    drop(agent);
}

/// What the kubelet says of the health of pod `name`'s devices (`allocatedResourcesStatus`).
async fn pod_health(client: &Client, name: &str) -> Vec<String> {
    let p = Api::<Pod>::namespaced(client.clone(), TENANT)
        .get(name)
        .await
        .expect("the pod");
    let statuses = p.status.and_then(|s| s.container_statuses).unwrap_or_default();
    statuses
        .iter()
        .flat_map(|c| c.allocated_resources_status.clone().unwrap_or_default())
        .flat_map(|r| r.resources.unwrap_or_default())
        .map(|r| format!("{}={}", r.resource_id, r.health.unwrap_or_default()))
        .collect()
}

/// A driver error on the GPU of a running pod: an application's XID (13) changes nothing; a
/// GPU's (79, fallen off the bus) makes it unhealthy in the GpuNode, taints its device in the
/// slice, and reaches the pod's status through the kubelet's health stream.
async fn health_reaches_the_pod(client: &Client, node: &RealNode, agent: &SimAgent, pod: &str) {
    // The kubelet names a device by its first CDI device ID (the claim's own spec here).
    let all = |h: &[String], health: &str| !h.is_empty() && h.iter().all(|r| r.ends_with(&format!("={health}")));
    until("the kubelet reports the pod's GPU Healthy", 60, || async {
        let h = pod_health(client, pod).await;
        match all(&h, "Healthy") {
            true => Ok(()),
            false => Err(format!("{h:?}; the kubelet:\n{}", node.log_tail())),
        }
    })
    .await;
    let gpu_node = || async {
        let n: Value = Api::<kube::api::DynamicObject>::all_with(
            client.clone(),
            &kube::api::ApiResource::from_gvk_with_plural(
                &kube::api::GroupVersionKind::gvk("gputenancy.io", "v1alpha1", "GpuNode"),
                "gpunodes",
            ),
        )
        .get(NODE)
        .await
        .map(|o| o.data)
        .unwrap_or_default();
        n
    };
    agent.sim_ctl(&["event", "--gpu", "0", "--xid", "13"]);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let n = gpu_node().await;
    assert!(
        n["status"]["gpus"][0].get("unhealthy").is_none(),
        "an application's XID made the GPU unhealthy: {}",
        n["status"]["gpus"][0]
    );

    let t0 = Instant::now();
    agent.sim_ctl(&["event", "--gpu", "0", "--xid", "79"]);
    until("the GPU unhealthy in its GpuNode", 30, || async {
        let n = gpu_node().await;
        match n["status"]["gpus"][0]["unhealthy"]["reason"].as_str() {
            Some("Xid") => Ok(()),
            _ => Err(format!("{}", n["status"]["gpus"][0])),
        }
    })
    .await;
    until("the device tainted unhealthy in its slice", 30, || async {
        let d = devices(client).await;
        let dev = d
            .get(&(NODE.to_string(), "gpu-0".to_string()))
            .cloned()
            .unwrap_or_default();
        let tainted = dev["taints"].as_array().is_some_and(|t| {
            t.iter()
                .any(|t| t["key"] == "gputenancy.io/unhealthy" && t["value"] == "Xid")
        });
        match tainted {
            true => Ok(()),
            false => Err(format!("{dev}")),
        }
    })
    .await;
    until("the kubelet reports the pod's GPU Unhealthy", 60, || async {
        let h = pod_health(client, pod).await;
        match all(&h, "Unhealthy") {
            true => Ok(()),
            false => Err(format!("{h:?}; the kubelet:\n{}", node.log_tail())),
        }
    })
    .await;
    eprintln!(
        "MEASURE an XID on a pod's GPU in the pod's status {:.1} s after the driver reported it",
        t0.elapsed().as_secs_f64()
    );
}
