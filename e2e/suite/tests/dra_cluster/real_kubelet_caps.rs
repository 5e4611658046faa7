//! Two jobs that each want 30 GiB on one time-sliced 40 GB GPU, through the whole chain: the
//! agent's Prepare writes each claim's CDI spec with the driver's memory cap, Kubernetes' own
//! kubelet creates the containers, the runtime applies the specs and runs their `createRuntime`
//! hook (the simulator's stand-in for the container toolkit, given to the agent as
//! `--nvidia-ctk`), which sets each container's cap in the simulated driver; then each container's
//! process allocates in 10 GiB steps, the two taking turns.
//!
//! The numbers, by hand: an A100-SXM4-40GB has 40960 MiB; time-sliced into 4 shares, a share is
//! 10240 MiB. Tenant A's claim holds 3 shares (a 30720 MiB cap), B's one (10240 MiB). Turns: A
//! 10240, B 10240, A 20480, then B's second step is past its cap and fails (10240 + 10240 >
//! 10240), and A's third succeeds: A holds the 30 GiB it wants, the GPU is full, B alone is
//! refused. Without caps (nvml-sim's tests/memory_caps.rs) both jobs' third steps fail.
//!
//! The tenants' tier scrubs memory `Never`: under `OnTenantChange` the second tenant's share of a
//! GPU the first one uses must be scrubbed first, which clears the whole GPU, so the agent
//! refuses it while the first job runs (fail closed), and two tenants time-slice one GPU only
//! when their claims are prepared in the same scrub.
//!
//! The oracles: the runtime's record (the hook run, with the GPU's UUID), the simulator's caps
//! and allocations, and the agent's metrics of memory used against cap.

use crate::support::*;
use gpu_tenancy_e2e::apply_docs_as_kubectl;
use gpu_tenancy_e2e::node::RealNode;
use gpu_tenancy_e2e::procs::{SimAgent, http_get};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const NODE: &str = "dra-caps-n1";
const A: &str = "caps-a";
const B: &str = "caps-b";
/// One A100-SXM4-40GB behind a driver that caps containers' memory (R615 and later).
const CONFIG: &str = "driverVersion: \"615.26.01\"\ngpus:\n- {pciDeviceId: \"0x20B010DE\"}\n";
const SHARE_MIB: u64 = 40960 / 4;
const STEP_MIB: &str = "10240";
/// `sim-ctl alloc`'s exit status for an allocation refused as out of memory.
const OUT_OF_MEMORY: i32 = 3;
/// The tier the two tenants are of, added to the default SharingPolicy for this scenario.
const TIER: &str = "caps-scratch";

fn world() -> Vec<Value> {
    let tenant = |name: &str, shares: u32| {
        json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuTenant", "metadata": {"name": name},
            "spec": {"tier": TIER, "namespaces": [name],
                "resources": [{"mode": "TimeSlicing", "count": shares}]}})
    };
    vec![
        tenant(A, 3),
        tenant(B, 1),
        json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuPartitionPlan", "metadata": {"name": "dra-caps"},
            "spec": {"nodeSelector": {"matchLabels": {"pool": "dra-caps"}}, "deviceAccess": "DRA", "gpus": [
                {"devices": "all", "mode": "TimeSlicing", "timeSlicing": {"replicas": 4}}]}}),
    ]
}

fn policies(client: &kube::Client) -> Api<DynamicObject> {
    Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("gputenancy.io", "v1alpha1", "SharingPolicy"),
            "sharingpolicies",
        ),
    )
}

/// Adds (`add`) or removes [`TIER`], time-slicing that scrubs nothing, in the default policy.
async fn scratch_tier(client: &kube::Client, add: bool) {
    let api = policies(client);
    let mut p = api.get("default").await.expect("the default SharingPolicy");
    let tiers = p.data["spec"]["tiers"].as_array_mut().expect("the policy's tiers");
    tiers.retain(|t| t["name"] != TIER);
    if add {
        tiers.push(json!({"name": TIER, "modes": ["TimeSlicing"], "coLocation": "SameTier", "scrubMemory": "Never"}));
    }
    api.replace("default", &PostParams::default(), &p)
        .await
        .expect("replacing the default SharingPolicy");
}

fn template(tenant: &str, shares: u32) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "job"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu",
            "exactly": {"deviceClassName": class(tenant, "timeslicing"), "count": shares}}]}}}})
}

fn pod(name: &str) -> Value {
    let mut p = pod_body(
        name,
        json!([{"name": "gpu", "resourceClaimTemplateName": "job"}]),
        json!({}),
    );
    p["spec"]["containers"][0]["resources"]["claims"] = json!([{"name": "gpu", "request": "gpu"}]);
    p["spec"]["nodeSelector"] = json!({"pool": "dra-caps"});
    p["spec"]["automountServiceAccountToken"] = json!(false);
    p["spec"]["containers"][0]["securityContext"]["runAsUser"] = json!(1000);
    p["spec"]["containers"][0]["imagePullPolicy"] = json!("IfNotPresent");
    p
}

/// Pod `ns/name` Running on the real kubelet; its UID.
async fn running(c: &Cluster, node: &RealNode, ns: &str, name: &str) -> String {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let p = pods.get(name).await.expect("the pod");
        let st = p.status.clone().unwrap_or_default();
        if st.phase.as_deref() == Some("Running") {
            return p.metadata.uid.expect("a pod has a UID");
        }
        assert!(
            Instant::now() < deadline,
            "pod {ns}/{name} did not run: {st:#?}\nthe kubelet's log:\n{}",
            node.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The container the runtime created for pod `ns/name`, as it recorded it.
fn given(node: &RealNode, ns: &str, name: &str) -> Value {
    node.containers()
        .into_iter()
        .rev()
        .find(|c| c["pod"] == name && c["namespace"] == ns)
        .unwrap_or_else(|| panic!("the runtime created no container for pod {ns}/{name}"))
}

/// Process `pid` of container `id` allocates one more step; `sim-ctl`'s exit status.
fn step(agent: &SimAgent, uuid: &str, id: &str, pid: u32) -> Option<i32> {
    let pid = pid.to_string();
    let out = agent.sim_ctl_output(&[
        "alloc",
        "--gpu",
        uuid,
        "--container",
        id,
        "--pid",
        &pid,
        "--mib",
        STEP_MIB,
    ]);
    out.status.code()
}

pub async fn two_30_gib_jobs_on_a_40_gb_gpu(c: &mut Cluster) {
    scratch_tier(&c.client, true).await;
    let docs = world();
    c._cleanup.add_docs(&docs);
    apply_docs_as_kubectl(&docs, "the capped node's tenants and plan").await;
    let node = RealNode::start(&c.client, &c._cleanup, NODE, "pool=dra-caps").await;
    let mut agent = SimAgent::start_dra_config(&c.client, &c._cleanup, NODE, "dra-caps", CONFIG, 1).await;
    agent.use_nvidia_ctk("1.20.1");
    let metrics = agent.serve_metrics();
    agent.serve_kubelet(&node.registry_dir(), &node.plugins_dir(), &node.cdi_dir());
    until("the four shares published, 3 for A and 1 for B", 90, || async {
        let d = devices(&c.client).await;
        let of = |t: &str| {
            d.iter()
                .filter(|((n, _), dev)| n == NODE && attr(dev, "tenant") == t && dev.get("taints").is_none())
                .count()
        };
        match (of(A), of(B)) {
            (3, 1) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    crate::real_kubelet::nvidia_spec(&c.client, &node).await;
    for (t, shares) in [(A, 3), (B, 1)] {
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
        create_template(&c.client, t, &template(t, shares)).await;
        create(&c.client, t, &pod("job"))
            .await
            .unwrap_or_else(|e| panic!("pod {t}/job: {e}"));
    }
    let uid_a = running(c, &node, A, "job").await;
    let uid_b = running(c, &node, B, "job").await;
    let uuid = agent.sim_state()["gpus"][0]["uuid"]
        .as_str()
        .expect("the GPU's UUID")
        .to_string();

    // The runtime ran each container's hook, naming the GPU.
    let (ca, cb) = (given(&node, A, "job"), given(&node, B, "job"));
    for cont in [&ca, &cb] {
        let hooks = cont["hooks"].as_array().cloned().unwrap_or_default();
        let args: Vec<&str> = hooks
            .first()
            .and_then(|h| h["args"].as_array())
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        assert_eq!(hooks.len(), 1, "one cap hook per container and GPU: {cont}");
        assert!(
            args.contains(&"apply-cuda-memory-limits") && args.contains(&uuid.as_str()),
            "{cont}"
        );
    }
    let (id_a, id_b) = (ca["id"].as_str().unwrap(), cb["id"].as_str().unwrap());
    let caps: Vec<(String, String, u64)> = agent.sim_state()["caps"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|c| {
            (
                c["gpuUuid"].as_str().unwrap_or_default().to_string(),
                c["container"].as_str().unwrap_or_default().to_string(),
                c["limitMib"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        caps,
        vec![
            (uuid.clone(), id_a.to_string(), 3 * SHARE_MIB),
            (uuid.clone(), id_b.to_string(), SHARE_MIB)
        ]
    );

    // The turns: A, B, A, B (past its cap), A.
    let (pid_a, pid_b) = (7101, 7102);
    assert_eq!(step(&agent, &uuid, id_a, pid_a), Some(0));
    assert_eq!(step(&agent, &uuid, id_b, pid_b), Some(0));
    assert_eq!(step(&agent, &uuid, id_a, pid_a), Some(0));
    assert_eq!(
        step(&agent, &uuid, id_b, pid_b),
        Some(OUT_OF_MEMORY),
        "B past its own cap"
    );
    assert_eq!(
        step(&agent, &uuid, id_a, pid_a),
        Some(0),
        "A keeps allocating to its 30 GiB"
    );

    // The agent's metrics: each tenant's processes (by their pods) against its cap.
    agent.fake_process(pid_a, &format!("0::/kubepods/burstable/pod{uid_a}/0123abcd\n"));
    agent.fake_process(pid_b, &format!("0::/kubepods/burstable/pod{uid_b}/4567ef01\n"));
    let bytes = |mib: u64| format!("{:.1}", (mib * 1024 * 1024) as f64);
    let want = [
        ("used", A, bytes(3 * SHARE_MIB)),
        ("cap", A, bytes(3 * SHARE_MIB)),
        ("used", B, bytes(SHARE_MIB)),
        ("cap", B, bytes(SHARE_MIB)),
    ];
    until("the agent's memory-against-cap rows", 60, || async {
        let (_, text) = http_get(metrics, "/metrics").await.ok_or_else(|| "no answer".to_string())?;
        let missing: Vec<String> = want
            .iter()
            .map(|(what, t, v)| {
                format!(r#"gpu_tenancy_share_memory_{what}_bytes{{Hostname="{NODE}",gpu="0",UUID="{uuid}",tenant="{t}"}} {v}"#)
            })
            .filter(|line| !text.lines().any(|l| l == line))
            .collect();
        match missing.is_empty() {
            true => Ok(()),
            false => Err(format!(
                "missing {missing:?} in:\n{}",
                text.lines().filter(|l| l.contains("share_memory")).collect::<Vec<_>>().join("\n")
            )),
        }
    })
    .await;

    for t in [A, B] {
        let _ = Api::<Pod>::namespaced(c.client.clone(), t)
            .delete("job", &DeleteParams::default().grace_period(0))
            .await;
    }
    for pid in [pid_a, pid_b] {
        agent.sim_ctl(&["detach", "--pid", &pid.to_string()]);
    }
    drop(agent);
    drop(node);
    scratch_tier(&c.client, false).await;
}
