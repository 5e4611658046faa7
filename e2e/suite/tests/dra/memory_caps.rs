//! The driver's memory cap, node side: on a node whose driver (the simulator's `driverVersion`),
//! container toolkit and cgroups can cap, the agent reports it in `status.memoryCaps` and the CDI
//! spec of a time-sliced share carries the toolkit's hook and the share's memory, valid to the
//! CDI library at the lowest version that expresses it.

use gpu_tenancy::agent::dra::devices::{DRIVER, Unit, device_name};
use gpu_tenancy::api::{GpuNode, MemoryCapMethod, Mode};
use gpu_tenancy_e2e::kubelet;
use gpu_tenancy_e2e::procs::SimAgent;
use gpu_tenancy_e2e::{Cleanup, client, create_namespace, ensure_crds, ensure_operator_namespaces};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
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

/// The claim of `device`, allocated as the scheduler would write it.
async fn claim(client: &Client, device: &str) -> kubelet::Claim {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), TENANT);
    let c: ResourceClaim = serde_json::from_value(json!({"metadata": {"name": "share"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}}))
    .unwrap();
    let c = api
        .create(&PostParams::default(), &c)
        .await
        .expect("creating the claim");
    let status = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "share"},
        "status": {"allocation": {"devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}]}}}});
    api.patch_status(
        "share",
        &PatchParams::apply("e2e-scheduler").force(),
        &Patch::Apply(status),
    )
    .await
    .expect("writing the claim's allocation");
    kubelet::claim(TENANT, "share", &c.uid().unwrap())
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
            "timeSlicing": {"replicas": 4}, "tenants": [TENANT], "shares": [{"tenant": TENANT, "count": 2}]}]}});
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
    let device = device_name(0, &Unit::Share { k: 0 }, Mode::TimeSlicing, Some(TENANT));
    let c = claim(&client, &device).await;
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
}
