//! MIG cut on demand, the scheduler's side: a dynamic H100 published as partitionable devices
//! (`gpu_tenancy::mig::dynamic::publish`: a counter set of the GPU's memory slices, compute slices
//! and media extension, and one device per profile × placement consuming them), and the real
//! kube-scheduler allocating claims for pods on its node. The oracles are the API server, which
//! validates the slices, the scheduler's allocations, and NVIDIA's published placement table
//! (`nvidia-smi mig -lgipp` of an H100 NVL, the same geometry as the H100 80GB).
//!
//! The pods and claims are in `kube-system`, a namespace the operator exempts: whatever admission
//! policies an earlier scenario of this binary left, the scheduler alone decides here.

use crate::support::fake_ready;
use gpu_tenancy::mig::dynamic::GpuState;
use gpu_tenancy::mig::dynamic::publish::{self, DynamicGpu};
use gpu_tenancy_e2e::{Cleanup, client, repo_root};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};

const NODE: &str = "dyn-h100";
const NS: &str = "kube-system";
const CLASS: &str = "dynamic-mig.e2e.gputenancy.io";

/// NVIDIA's placements per profile ID: starts and size, from the published `-lgipp` output.
fn nvidia_placements() -> BTreeMap<u32, (BTreeSet<u32>, u32)> {
    let text = std::fs::read_to_string(repo_root().join("operator/tests/data/nvidia-smi/h100-nvl-lgipp.txt")).unwrap();
    text.lines()
        .filter(|l| l.starts_with("GPU"))
        .map(|l| {
            let id: u32 = l
                .split("Profile ID")
                .nth(1)
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap()
                .parse()
                .unwrap();
            let braces = &l[l.find('{').unwrap() + 1..l.find('}').unwrap()];
            let starts = braces.split(',').map(|s| s.trim().parse().unwrap()).collect();
            let size = l.rsplit(':').next().unwrap().trim().parse().unwrap();
            (id, (starts, size))
        })
        .collect()
}

fn claim(name: &str, profile: &str) -> ResourceClaim {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"devices": {"requests": [{"name": "mig", "exactly": {
        "deviceClassName": CLASS, "count": 1,
        "selectors": [{"cel": {"expression": format!("device.attributes[\"gpu.gputenancy.io\"].profile == \"{profile}\"")}}]}}]}}}))
    .unwrap()
}

fn pod(name: &str, claim: &str) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": {
        "nodeSelector": {"kubernetes.io/hostname": NODE},
        "resourceClaims": [{"name": "mig", "resourceClaimName": claim}],
        "containers": [{"name": "c", "image": "pause", "resources": {"claims": [{"name": "mig"}]}}]}}))
    .unwrap()
}

/// The allocated device of `claim`: its profile ID (by NVIDIA's numbering), start and size.
async fn placement(client: &Client, slices: &[Value], claim: &str) -> Option<(String, u32, u32)> {
    let c = Api::<ResourceClaim>::namespaced(client.clone(), NS)
        .get(claim)
        .await
        .ok()?;
    let device = c.status?.allocation?.devices?.results?.into_iter().next()?.device;
    let d = slices
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .find(|d| d["name"] == device.as_str())?;
    let a = &d["attributes"];
    Some((
        a["profile"]["string"].as_str()?.to_string(),
        a["placementStart"]["int"].as_u64()? as u32,
        a["placementSize"]["int"].as_u64()? as u32,
    ))
}

#[tokio::test]
async fn the_scheduler_places_mig_instances_cut_on_demand_where_nvidia_allows() {
    let cleanup = Cleanup::new();
    let client = client().await;
    let node: Node =
        serde_json::from_value(json!({"metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}}}))
            .unwrap();
    cleanup.add_resource("nodes", NODE);
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    fake_ready(&client, NODE).await;
    let h100 = gpu_tenancy::mig::model_by_name("NVIDIA H100 80GB HBM3").unwrap();
    let free = GpuState::default();
    let gpus = [DynamicGpu {
        index: 0,
        uuid: "GPU-dyn-0",
        model: h100,
        taken: &free,
    }];
    let slices = publish::slices(NODE, &gpus, 1);
    for s in &slices {
        let s: ResourceSlice = serde_json::from_value(s.clone()).unwrap();
        let name = s.metadata.name.clone().unwrap();
        cleanup.add_resource("resourceslices.resource.k8s.io", &name);
        Api::<ResourceSlice>::all(client.clone())
            .create(&PostParams::default(), &s)
            .await
            .unwrap_or_else(|e| panic!("the API server refused the dynamic slice {name}: {e}"));
    }
    let class: DeviceClass = serde_json::from_value(json!({"metadata": {"name": CLASS}, "spec": {"selectors": [{"cel": {"expression":
        "device.driver == \"gpu.gputenancy.io\" && \"placementStart\" in device.attributes[\"gpu.gputenancy.io\"]"}}]}}))
    .unwrap();
    cleanup.add_resource("deviceclasses.resource.k8s.io", CLASS);
    Api::<DeviceClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await
        .unwrap();

    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let start = |name: &'static str, profile: &'static str| {
        let (claims, pods) = (claims.clone(), pods.clone());
        async move {
            claims
                .create(&PostParams::default(), &claim(name, profile))
                .await
                .unwrap();
            pods.create(&PostParams::default(), &pod(name, name)).await.unwrap();
        }
    };
    let names = ["dyn-3g-a", "dyn-3g-b", "dyn-1g"];
    let done = || async {
        for n in names {
            let _ = pods.delete(n, &DeleteParams::default().grace_period(0)).await;
            let _ = claims.delete(n, &DeleteParams::default()).await;
        }
    };
    start("dyn-3g-a", "3g.40gb").await;
    start("dyn-3g-b", "3g.40gb").await;
    let table = nvidia_placements();
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while got.len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "both 3g claims allocated within 60 s: {got:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        got = Vec::new();
        for n in ["dyn-3g-a", "dyn-3g-b"] {
            got.extend(placement(&client, &slices, n).await);
        }
    }
    // Two 3g instances: NVIDIA places them only at 0 and 4, 4 slices each.
    let starts: BTreeSet<u32> = got.iter().map(|g| g.1).collect();
    assert_eq!(starts, table[&9].0, "{got:?}");
    assert!(got.iter().all(|g| g.2 == table[&9].1), "{got:?}");
    // The GPU is full: a 1g waits.
    start("dyn-1g", "1g.10gb").await;
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let waiting = placement(&client, &slices, "dyn-1g").await;
    if waiting.is_some() {
        done().await;
    }
    assert_eq!(waiting, None, "no memory slice is left for a 1g");
    // One 3g ends: the 1g goes into its slices, at a start NVIDIA allows.
    let freed = got[1].1;
    let _ = pods.delete("dyn-3g-b", &DeleteParams::default().grace_period(0)).await;
    let _ = claims.delete("dyn-3g-b", &DeleteParams::default()).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let one = loop {
        if let Some(p) = placement(&client, &slices, "dyn-1g").await {
            break p;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the 1g claim allocated within 60 s of a 3g's end"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    done().await;
    let (_, at, size) = one;
    assert!(table[&19].0.contains(&at) && size == table[&19].1, "1g at {at}:{size}");
    assert!(
        (freed..freed + 4).contains(&at),
        "the 1g at {at}, in the freed 3g's slices from {freed}"
    );
}
