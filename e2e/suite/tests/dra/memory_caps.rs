//! The driver's memory cap, node side: on a node whose driver (the simulator's `driverVersion`),
//! container toolkit and cgroups can cap, the agent reports it in `status.memoryCaps` and the CDI
//! spec of a time-sliced share carries the toolkit's hook and the share's memory, valid to the
//! CDI library at the lowest version that expresses it. A container given two claims whose specs
//! carry different caps is refused at Prepare, whichever claim is prepared: the runtime would apply
//! one value to the GPUs of both.

use gpu_tenancy::agent::dra::devices::{DRIVER, Unit, device_name};
use gpu_tenancy::api::{GpuNode, MemoryCapMethod, Mode};
use gpu_tenancy_e2e::kubelet;
use gpu_tenancy_e2e::procs::SimAgent;
use gpu_tenancy_e2e::{Cleanup, client, create_namespace, ensure_crds, ensure_operator_namespaces};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const NODE: &str = "dra-caps";
const TENANT: &str = "dra-caps-t";

/// Waits until `what` holds of the GpuNode.
async fn node_says(client: &Client, what: &str, want: impl Fn(&GpuNode) -> bool) -> GpuNode {
    let api: Api<GpuNode> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = api.get(NODE).await.unwrap();
        if want(&n) {
            return n;
        }
        assert!(Instant::now() < deadline, "{what}: the GpuNode says {:#?}", n.status);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A pod of the tenant whose containers (name, claims) consume claims of the same names, as
/// the API server holds it.
async fn pod(client: &Client, name: &str, containers: &[(&str, &[&str])]) -> Pod {
    let mut entries: Vec<&str> = containers.iter().flat_map(|(_, c)| c.iter().copied()).collect();
    entries.sort();
    entries.dedup();
    let containers: Vec<Value> = containers
        .iter()
        .map(|(n, cs)| {
            json!({"name": n, "image": "x", "resources": {"claims": cs.iter().map(|c| json!({"name": c})).collect::<Vec<_>>()}})
        })
        .collect();
    let p: Pod = serde_json::from_value(json!({"metadata": {"name": name},
        "spec": {"containers": containers,
            "resourceClaims": entries.iter().map(|e| json!({"name": e, "resourceClaimName": e})).collect::<Vec<_>>()}}))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), TENANT)
        .create(&PostParams::default(), &p)
        .await
        .expect("creating the pod")
}

/// Claim `name` of `devices`, allocated and reserved for `pod` as the scheduler would write it.
async fn claim(client: &Client, name: &str, devices: &[&str], pod: &Pod) -> kubelet::Claim {
    crate::claim_in_pool(client, TENANT, name, NODE, devices, Some(pod)).await
}

/// Share `k` of GPU 0.
fn share(k: u32) -> String {
    device_name(0, &Unit::Share { k }, Mode::TimeSlicing, Some(TENANT))
}

#[tokio::test]
async fn a_share_the_driver_can_cap_gets_the_hook_and_its_memory() {
    let cleanup = Cleanup::new();
    let client = client().await;
    ensure_crds(&client).await;
    ensure_operator_namespaces(&client).await;
    let body = json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuTenant", "metadata": {"name": TENANT},
        "spec": {"tier": "x", "namespaces": [TENANT]}});
    gpu_tenancy_e2e::api(&client, "GpuTenant")
        .patch(TENANT, &PatchParams::apply("e2e").force(), &Patch::Apply(body))
        .await
        .unwrap();
    cleanup.add("GpuTenant", TENANT);
    create_namespace(&client, &cleanup, TENANT, &[]).await;
    let config = "driverVersion: \"615.20.01\"\ngpus:\n- {pciDeviceId: \"0x233010DE\", count: 1}\n";
    let agent = SimAgent::start_dra_config(&client, &cleanup, NODE, "caps", config, 1).await;
    let spec = json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuNode", "metadata": {"name": NODE},
        "spec": {"plan": "caps", "deviceAccess": "DRA", "gpus": [{"index": 0, "mode": "TimeSlicing",
            "timeSlicing": {"replicas": 4}, "tenants": [TENANT], "shares": [{"tenant": TENANT, "count": 3}]}]}});
    Api::<GpuNode>::all(client.clone())
        .patch(
            NODE,
            &PatchParams::apply("gpu-tenancy-controller").force(),
            &Patch::Apply(spec),
        )
        .await
        .expect("writing the GpuNode spec");

    // No toolkit and no cgroup v2 on the simulated node yet: nothing caps a time-sliced share.
    let n = node_says(&client, "not capped without a toolkit", |n| {
        n.status
            .as_ref()
            .is_some_and(|s| s.memory_caps.first().is_some_and(|c| c.method == MemoryCapMethod::None))
    })
    .await;
    let cap = &n.status.as_ref().unwrap().memory_caps[0];
    assert_eq!(serde_json::to_value(cap).unwrap()["reason"], "ToolkitMissing");

    agent.offer_driver_caps();
    let n = node_says(&client, "capped by the driver", |n| {
        n.status.as_ref().is_some_and(|s| {
            s.memory_caps
                .first()
                .is_some_and(|c| c.method == MemoryCapMethod::Driver)
                && s.observed_generation == n.metadata.generation
                && s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True")
        })
    })
    .await;
    let st = n.status.unwrap();
    // The simulated H100 80GB's memory; a share is a quarter of it: 81559 / 4 = 20389 MiB.
    assert_eq!(st.gpus[0].memory_mib, 81559);
    let uuid = st.gpus[0].uuid.clone();

    let dir = agent.dir().to_path_buf();
    kubelet::register(&dir.join(format!("plugins_registry/{DRIVER}-reg.sock"))).await;
    let one = pod(&client, "one", &[("c", &["share"])]).await;
    let c = claim(&client, "share", &[&share(0)], &one).await;
    let dra = dir.join(format!("plugins/{DRIVER}/dra.sock"));
    let deadline = Instant::now() + Duration::from_secs(30);
    let ids = loop {
        match kubelet::prepare(&dra, &c).await {
            Ok(Ok(d)) => break d,
            other if Instant::now() > deadline => panic!("the share was not prepared: {other:?}"),
            _ => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    };
    let path = dir.join(format!("cdi/gputenancy.io-gpu_{}.json", c.uid));
    let spec: Value = serde_json::from_slice(&std::fs::read(&path).expect("the claim's CDI spec")).unwrap();
    let edits = &spec["devices"][0]["containerEdits"];
    let env: Vec<&str> = edits["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(env.contains(&"NVIDIA_GPU_MEMORY_REQUEST=20389"), "{env:?}");
    assert!(env.contains(&"NVIDIA_GPU_MEMORY_LIMIT=20389"), "{env:?}");
    assert_eq!(
        edits["hooks"],
        json!([{"hookName": "createRuntime", "path": "/usr/bin/nvidia-ctk",
            "args": ["nvidia-ctk", "hook", "apply-cuda-memory-limits", "--driver-root", "/", "--gpu-id", uuid]}])
    );
    let ids: Vec<String> = ids.into_iter().flat_map(|(_, ids)| ids).collect();
    super::cdi_valid(&dir.join("cdi"), &ids);
    kubelet::unprepare(&dra, &c).await.unwrap().expect("unprepare");
    two_claims_in_one_container(&client, &dir).await;
}

/// One share in one claim (20389 MiB), two of the same GPU in the other (40778 MiB): a container
/// consuming both is refused, whichever claim is prepared; two claims of one share each (the same
/// cap) are prepared.
async fn two_claims_in_one_container(client: &Client, dir: &std::path::Path) {
    let dra = &dir.join(format!("plugins/{DRIVER}/dra.sock"));
    let mixed = pod(client, "mixed", &[("main", &["small", "large"])]).await;
    let small = claim(client, "small", &[&share(0)], &mixed).await;
    let large = claim(client, "large", &[&share(1), &share(2)], &mixed).await;
    for (c, mine, theirs) in [(&small, "small", "large"), (&large, "large", "small")] {
        match kubelet::prepare(dra, c).await.expect("the plugin answers") {
            Err(e) => {
                for part in [
                    "container main of pod dra-caps-t/mixed".to_string(),
                    format!("consumes claim {mine}"),
                    format!("and claim {theirs}"),
                    "20389 MiB".into(),
                    "40778 MiB".into(),
                    "use one claim with all the shares".into(),
                ] {
                    assert!(e.contains(&part), "claim {mine}: {part:?} not in {e}");
                }
            }
            Ok(d) => panic!("claim {mine} beside claim {theirs} was prepared: {d:?}"),
        }
    }
    let spec = |c: &kubelet::Claim| dir.join(format!("cdi/gputenancy.io-gpu_{}.json", c.uid)).exists();
    assert!(!spec(&small) && !spec(&large), "a refused claim's CDI spec was written");

    let even = pod(client, "even", &[("main", &["x", "y"])]).await;
    let x = claim(client, "x", &[&share(0)], &even).await;
    let y = claim(client, "y", &[&share(1)], &even).await;
    for c in [&x, &y] {
        let d = kubelet::prepare(dra, c).await.expect("the plugin answers");
        assert!(d.is_ok(), "claim {} of the same cap: {d:?}", c.name);
    }
    for c in [&x, &y] {
        kubelet::unprepare(dra, c).await.unwrap().expect("unprepare");
    }
}
