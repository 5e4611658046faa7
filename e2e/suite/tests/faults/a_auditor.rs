//! The auditor catches each kind of violation: states that break the invariants (docs/design.md#invariants) are written
//! straight to the API server (no controller or agent runs here) and the auditor must flag each,
//! naming the object. A consistent state before them is not flagged.

use crate::common::setup;
use gpu_tenancy_e2e::auditor::{AuditConfig, Auditor, Kind};
use gpu_tenancy_e2e::{Cleanup, create_namespace};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const H100: &str = "NVIDIA H100 80GB HBM3";

async fn apply(client: &Client, kind: &str, name: &str, body: Value) -> i64 {
    let api: Api<DynamicObject> = gpu_tenancy_e2e::api(client, kind);
    let mut body = body;
    body["apiVersion"] = json!("gputenancy.io/v1alpha1");
    body["kind"] = json!(kind);
    body["metadata"]["name"] = json!(name);
    let o = api
        .patch(name, &PatchParams::apply("e2e-audit").force(), &Patch::Apply(body))
        .await
        .unwrap_or_else(|e| panic!("applying {kind} {name}: {e}"));
    o.metadata.generation.unwrap_or(1)
}

async fn status(client: &Client, kind: &str, name: &str, status: Value) {
    let api: Api<DynamicObject> = gpu_tenancy_e2e::api(client, kind);
    api.patch_status(
        name,
        &PatchParams::apply("e2e-audit").force(),
        &Patch::Apply(json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": kind, "status": status})),
    )
    .await
    .unwrap_or_else(|e| panic!("writing {kind} {name} status: {e}"));
}

fn gpu_status(index: u32, mode: &str, tenants: &[&str], scrub_for: Option<&str>, time: &str) -> Value {
    let mut g = json!({"index": index, "uuid": format!("GPU-au-{index}"), "name": H100, "pciDeviceId": "0x233010DE",
        "memoryMiB": 81559, "appliedMode": mode, "appliedTenants": tenants, "applied": true,
        "profiles": [{"id": 9, "name": "3g.40gb", "computeSlices": 3, "memorySlices": 4, "memoryMiB": 40320, "maxInstances": 2,
                      "placements": [{"start": 0, "size": 4}, {"start": 4, "size": 4}]}]});
    if let Some(t) = scrub_for {
        g["lastScrub"] = json!({"time": time, "result": "Scrubbed", "tenant": t, "bytesCleared": 1});
    }
    g
}

async fn expect(auditor: &Auditor, kind: Kind, object: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let v = auditor.violations();
        if let Some(found) = v.iter().find(|v| v.finding.kind == kind && v.finding.object == object) {
            eprintln!("auditor self-test: caught {found}");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the auditor did not flag {kind:?} on {object} within 20 s; it saw: {:#?}",
            v.iter().map(|v| v.to_string()).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_the_auditor_flags_each_kind_of_violation() {
    let cleanup = Cleanup::new();
    let client = setup().await;
    let auditor = Auditor::start(
        &client,
        AuditConfig {
            grace: Duration::from_secs(1),
            ..AuditConfig::default()
        },
    )
    .await;
    for (t, tier) in [("au-x", "external"), ("au-y", "internal"), ("au-z", "internal")] {
        create_namespace(&client, &cleanup, t, &[]).await;
        cleanup.add("GpuTenant", t);
        apply(
            &client,
            "GpuTenant",
            t,
            json!({"spec": {"tier": tier, "namespaces": [t], "resources": []}}),
        )
        .await;
    }
    cleanup.add_resource("nodes", "au-0");
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "au-0"}})).unwrap();
    let _ = Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await;
    cleanup.add("GpuNode", "au-0");

    // A consistent state first: GPU 3 Exclusive to au-y, scrubbed for it, tenant status to match.
    let spec = |gpu3: &str| json!({"spec": {"gpus": [{"index": 3, "mode": "Exclusive", "tenants": [gpu3], "scrub": "OnTenantChange"}]}});
    let generation = apply(&client, "GpuNode", "au-0", spec("au-y")).await;
    status(
        &client,
        "GpuNode",
        "au-0",
        json!({"observedGeneration": generation, "gpuCount": 1,
        "gpus": [gpu_status(3, "Exclusive", &["au-y"], Some("au-y"), "2026-01-01T00:00:00Z")]}),
    )
    .await;
    for t in ["au-x", "au-y", "au-z"] {
        let grants = if t == "au-y" {
            json!([{"node": "au-0", "gpu": 3, "mode": "Exclusive", "count": 1}])
        } else {
            json!([])
        };
        status(
            &client,
            "GpuTenant",
            t,
            json!({"observedGeneration": 1, "grants": grants}),
        )
        .await;
    }
    auditor.wait_checks(15).await;
    auditor.assert_clean();

    // Hand-over without scrub: GPU 3 reported serving au-z with au-y's old scrub record.
    status(
        &client,
        "GpuNode",
        "au-0",
        json!({"observedGeneration": generation, "gpuCount": 1,
        "gpus": [gpu_status(3, "Exclusive", &["au-z"], Some("au-y"), "2026-01-01T00:00:00Z")]}),
    )
    .await;
    expect(&auditor, Kind::HandOverWithoutScrub, "GpuNode/au-0").await;

    // The spec hands GPU 3 back to au-y: unapplied, and Node au-0 has no scrub-pending taint.
    // GPU 0: two 3g.40gb on overlapping slices and three where the driver offers two; GPU 1: MPS
    // shared by an external (Forbidden, no MPS) and an internal tenant; GPU 2: Exclusive to two.
    let generation = apply(
        &client,
        "GpuNode",
        "au-0",
        json!({"spec": {"gpus": [
        {"index": 0, "mode": "MIG", "migInstances": [
            {"profile": "3g.40gb", "placement": {"start": 0, "size": 4}, "tenant": "au-y"},
            {"profile": "3g.40gb", "placement": {"start": 2, "size": 4}, "tenant": "au-z"},
            {"profile": "3g.40gb", "placement": {"start": 4, "size": 4}}]},
        {"index": 1, "mode": "MPS", "mps": {"maxClients": 4}, "tenants": ["au-x", "au-y"]},
        {"index": 2, "mode": "Exclusive", "tenants": ["au-y", "au-z"]},
        {"index": 3, "mode": "Exclusive", "tenants": ["au-y"], "scrub": "OnTenantChange"},
        {"index": 4, "mode": "MPS", "mps": {"maxClients": 4}, "tenants": ["au-y", "au-z"]}]}}),
    )
    .await;
    status(&client, "GpuNode", "au-0", json!({"observedGeneration": generation, "gpuCount": 5,
        "gpus": [gpu_status(0, "MIG", &[], None, ""), gpu_status(3, "Exclusive", &["au-z"], Some("au-y"), "2026-01-01T00:00:00Z"),
                 gpu_status(4, "MPS", &["au-y", "au-z"], Some("au-y"), "2026-01-01T00:00:00Z")]})).await;
    expect(&auditor, Kind::ScrubTaintMissing, "Node/au-0").await;
    expect(&auditor, Kind::Overcommit, "GpuNode/au-0").await;
    expect(&auditor, Kind::TierIsolation, "GpuNode/au-0").await;
    let ov: Vec<String> = auditor
        .violations()
        .iter()
        .filter(|v| v.finding.kind == Kind::Overcommit)
        .map(|v| v.finding.message.clone())
        .collect();
    for needle in [
        "overlaps another instance",
        "3 instances of 3g.40gb, the driver offers 2",
        "Exclusive GPU given to 2 tenants",
    ] {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !auditor.violations().iter().any(|v| v.finding.message.contains(needle)) {
            assert!(
                Instant::now() < deadline,
                "no Overcommit finding saying {needle:?}: {ov:#?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    // Grants: au-y's status omits GPU 1 and its GPU 0 instance (lost); au-z lists GPU 2 as au-y
    // does and a GPU 7 no spec gives (doubled); five MPS shares on GPU 4 of four clients.
    status(&client, "GpuTenant", "au-y", json!({"observedGeneration": 1, "grants": [
        {"node": "au-0", "gpu": 2, "mode": "Exclusive", "count": 1}, {"node": "au-0", "gpu": 3, "mode": "Exclusive", "count": 1},
        {"node": "au-0", "gpu": 4, "mode": "MPS", "count": 3}]})).await;
    status(&client, "GpuTenant", "au-z", json!({"observedGeneration": 1, "grants": [
        {"node": "au-0", "gpu": 0, "mode": "MIG", "profile": "3g.40gb", "placement": "2:4", "count": 1},
        {"node": "au-0", "gpu": 2, "mode": "Exclusive", "count": 1}, {"node": "au-0", "gpu": 7, "mode": "Exclusive", "count": 1},
        {"node": "au-0", "gpu": 4, "mode": "MPS", "count": 2}]})).await;
    status(
        &client,
        "GpuTenant",
        "au-x",
        json!({"observedGeneration": 1, "grants": [{"node": "au-0", "gpu": 1, "mode": "MPS", "count": 1}]}),
    )
    .await;
    expect(&auditor, Kind::GrantLost, "GpuTenant/au-y").await;
    expect(&auditor, Kind::GrantDoubled, "GpuTenant/au-z").await;
    expect(&auditor, Kind::GrantDoubled, "GpuNode/au-0").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !auditor
        .violations()
        .iter()
        .any(|v| v.finding.message.contains("5 shares granted"))
    {
        assert!(Instant::now() < deadline, "MPS shares beyond maxClients not flagged");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A pod of the external tenant asking for MPS shares (no admission policy here to refuse it).
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "shared"}, "spec": {"containers": [
        {"name": "c", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu.shared": "1"}}}],
        "tolerations": [{"key": "gputenancy.io/scrub-pending", "operator": "Exists", "effect": "NoSchedule"}]}}))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), "au-x")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    expect(&auditor, Kind::PodBreaksIsolation, "Pod/au-x/shared").await;
    eprintln!(
        "MEASURE auditor self-test: {} violations flagged, every kind",
        auditor.violations().len()
    );
}
