//! A simulated fleet for the controller: Nodes and agent-written GpuNode statuses, and a loop that
//! runs passes until the controller has nothing left to write.

use crate::observe::scrub_tainted;
use gpu_tenancy::api::{ConditionSet, GpuNode, GpuNodeStatus, GpuStatus, GpuTenant, MigInstanceStatus, set_condition};
use gpu_tenancy::controller::Controller;
use gpu_tenancy::desired::Settings;
use gpu_tenancy::inventory::InventoryFile;
use gpu_tenancy_e2e::{Cleanup, apply_file, client, ensure_crds, ensure_operator_namespaces, repo_root};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use std::time::{Duration, Instant};

pub const AGENT: &str = "gpu-tenancy-agent";

/// A client, the CRDs, and the operator's and device plugin's namespaces (the controller writes
/// its Lease and the device plugin's ConfigMap there).
pub async fn setup(cleanup: &Cleanup) -> Client {
    let client = client().await;
    ensure_crds(&client).await;
    ensure_operator_namespaces(&client).await;
    let _ = cleanup;
    client
}

/// Applies the example manifests (policy, tenants, plans) with kubectl.
pub async fn apply_examples() {
    for f in ["examples/policy.yaml", "examples/tenants.yaml", "examples/plans.yaml"] {
        apply_file(f).await;
    }
}

/// The tenant change of scenario a and the privilege test: team-beta (of examples/tenants.yaml)
/// asks for two 2g.20gb instances instead of four, applied server-side by field `manager`.
pub async fn change_team_beta(client: &Client, manager: &str) {
    let body = json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuTenant", "spec": team_beta_change()});
    Api::<GpuTenant>::all(client.clone())
        .patch("team-beta", &PatchParams::apply(manager).force(), &Patch::Apply(body))
        .await
        .unwrap_or_else(|e| panic!("applying GpuTenant team-beta as {manager}: {e}"));
}

/// The spec [`change_team_beta`] applies.
pub fn team_beta_change() -> serde_json::Value {
    json!({"tier": "internal", "namespaces": ["beta"], "weight": 2,
        "resources": [{"mode": "MPS", "count": 20}, {"mode": "MIG", "profile": "2g.20gb", "count": 2}]})
}

/// Creates the Nodes of examples/inventory.yaml, and for each a GpuNode whose status reports its
/// GPUs the way the agent does.
pub async fn create_fleet(client: &Client) -> Vec<String> {
    let text = std::fs::read_to_string(repo_root().join("examples/inventory.yaml")).unwrap();
    let inventory: InventoryFile = serde_saphyr::from_str(&text).unwrap();
    let nodes = inventory.resolve().unwrap();
    let node_api: Api<Node> = Api::all(client.clone());
    let gn_api: Api<GpuNode> = Api::all(client.clone());
    let mut names = Vec::new();
    for inv in nodes {
        let node = Node {
            metadata: ObjectMeta {
                name: Some(inv.name.clone()),
                labels: Some(
                    inv.labels
                        .clone()
                        .into_iter()
                        .chain([("nvidia.com/gpu.present".into(), "true".into())])
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            ..Node::default()
        };
        node_api.create(&PostParams::default(), &node).await.unwrap();
        gn_api
            .create(&PostParams::default(), &GpuNode::new(&inv.name, Default::default()))
            .await
            .unwrap();
        let status = GpuNodeStatus {
            gpu_count: Some(inv.gpus.len() as u32),
            gpus: inv
                .gpus
                .iter()
                .map(|g| GpuStatus {
                    index: g.index,
                    uuid: format!("GPU-{}-{}", inv.name, g.index),
                    name: g.name.clone(),
                    pci_device_id: g.model.map(|m| m.pci_ids().next().unwrap()).unwrap_or_default(),
                    memory_mib: g.memory_mib,
                    numa_node: Some(g.numa_node),
                    ..GpuStatus::default()
                })
                .collect(),
            ..GpuNodeStatus::default()
        };
        write_status(client, &inv.name, &status).await;
        names.push(inv.name);
    }
    names
}

pub async fn write_status(client: &Client, name: &str, status: &GpuNodeStatus) {
    let api: Api<GpuNode> = Api::all(client.clone());
    api.patch_status(
        name,
        &PatchParams::apply(AGENT).force(),
        &Patch::Apply(json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuNode", "status": status})),
    )
    .await
    .unwrap_or_else(|e| panic!("writing GpuNode {name} status: {e}"));
}

/// The simulated agents: every GpuNode whose spec generation is not yet reported gets a status
/// saying it is applied (instances as the spec says, tenants as bound). Returns the nodes it acted on.
pub async fn agents_apply(client: &Client, only: Option<&[String]>) -> Vec<String> {
    let api: Api<GpuNode> = Api::all(client.clone());
    let mut done = Vec::new();
    for n in api.list(&Default::default()).await.unwrap() {
        if only.is_some_and(|o| !o.contains(&n.name_any())) {
            continue;
        }
        let mut status = n.status.clone().unwrap_or_default();
        if status.observed_generation == n.metadata.generation || n.spec.gpus.is_empty() {
            continue;
        }
        for g in &mut status.gpus {
            let Some(spec) = n.spec.gpus.iter().find(|s| s.index == g.index) else {
                continue;
            };
            g.applied_mode = Some(spec.mode);
            g.applied_tenants = spec.tenants.clone();
            g.applied = Some(true);
            g.instances = spec
                .mig_instances
                .iter()
                .enumerate()
                .map(|(i, m)| MigInstanceStatus {
                    gpu_instance_id: i as u32 + 1,
                    profile: m.profile.clone(),
                    placement: m.placement,
                    tenant: m.tenant.clone(),
                    ..MigInstanceStatus::default()
                })
                .collect();
        }
        status.observed_generation = n.metadata.generation;
        let now = Time(jiff::Timestamp::from_second(jiff::Timestamp::now().as_second()).unwrap());
        set_condition(
            &mut status.conditions,
            ConditionSet::READY,
            true,
            "Applied",
            "every GPU matches the spec",
            n.metadata.generation,
            &now,
        );
        set_condition(
            &mut status.conditions,
            ConditionSet::STALLED,
            false,
            "Applied",
            "",
            n.metadata.generation,
            &now,
        );
        write_status(client, &n.name_any(), &status).await;
        done.push(n.name_any());
    }
    done
}

/// Waits until the controller's stores have seen the latest writes (a watch event arrives), then
/// runs one pass; returns its writes.
pub async fn pass(c: &Controller) -> Vec<String> {
    settle(c).await;
    let report = c.pass().await;
    assert!(report.failed.is_empty(), "writes failed: {:?}", report.failed);
    assert!(
        !report.incremental_differed,
        "the incremental pass differed from the full pass (cells placed, reused: {:?})",
        report.cells
    );
    report.writes
}

/// Lets watch events arrive: returns after 300 ms without a change (at most 10 s).
pub async fn settle(c: &Controller) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match tokio::time::timeout(Duration::from_millis(300), c.changed.notified()).await {
            Err(_) => return,
            Ok(()) if tokio::time::Instant::now() > deadline => return,
            Ok(()) => {}
        }
    }
}

/// Passes (with the simulated agents applying each new spec) until a pass writes nothing.
/// Returns every write made, in order.
pub async fn converge(client: &Client, c: &Controller) -> Vec<String> {
    let mut all = Vec::new();
    for _ in 0..30 {
        let w = pass(c).await;
        let applied = agents_apply(client, None).await;
        if w.is_empty() && applied.is_empty() {
            return all;
        }
        all.extend(w);
    }
    panic!("the controller did not converge in 30 passes; writes so far: {all:?}");
}

/// `count` nodes `<pool>-<i>` labelled `pool=<pool>`, each with two H100s reported by its agent.
pub async fn h100_pool(client: &Client, cleanup: &Cleanup, pool: &str, count: usize) -> Vec<String> {
    let node_api: Api<Node> = Api::all(client.clone());
    let gn_api: Api<GpuNode> = Api::all(client.clone());
    let names: Vec<String> = (0..count).map(|i| format!("{pool}-{i}")).collect();
    for n in &names {
        cleanup.add_resource("nodes", n);
        cleanup.add("GpuNode", n);
        let node: Node = serde_json::from_value(json!({"metadata": {"name": n, "labels": {"pool": pool}}})).unwrap();
        let _ = node_api.create(&PostParams::default(), &node).await;
        let _ = gn_api
            .create(&PostParams::default(), &GpuNode::new(n, Default::default()))
            .await;
        let gpus: Vec<serde_json::Value> = [0, 1]
            .iter()
            .map(|i| json!({"index": i, "uuid": format!("GPU-{n}-{i}"), "name": "NVIDIA H100 80GB HBM3", "pciDeviceId": "0x233010DE", "memoryMiB": 81559}))
            .collect();
        let status: GpuNodeStatus = serde_json::from_value(json!({"gpuCount": 2, "gpus": gpus})).unwrap();
        write_status(client, n, &status).await;
    }
    names
}

/// A plan named `pool` cutting every GPU of the nodes labelled `pool=<pool>` into `profiles`,
/// one node at a time.
pub fn mig_plan(pool: &str, profiles: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuPartitionPlan", "metadata": {"name": pool},
        "spec": {"nodeSelector": {"matchLabels": {"pool": pool}}, "gpus": [{"devices": "all", "mode": "MIG", "mig": {"profiles": profiles}}],
                 "rollout": {"maxUnavailable": 1}}})
}

/// Waits until Node `name` has no scrub-pending taint; fails after 30 s saying it stayed after
/// `after` (the hand-over whose scrub should have lifted it).
pub async fn wait_untainted(client: &Client, name: &str, after: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let node = nodes
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("reading Node {name}: {e}"));
        if !scrub_tainted(&node) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the scrub-pending taint stayed on {name} after {after}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// An in-process controller whose stores have synced (its passes are driven by the test).
pub async fn start_controller(client: &Client) -> Controller {
    let mut c = Controller::start(client.clone(), Settings::default(), Some("e2e".into()));
    // Every pass of every scenario is planned both ways and compared.
    c.check_incremental = true;
    tokio::time::timeout(Duration::from_secs(30), c.stores.wait_until_ready())
        .await
        .expect("stores synced within 30 s")
        .unwrap();
    c
}

/// Runs controller passes in the background until aborted.
pub fn run_passes(c: std::sync::Arc<Controller>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let _ = pass(&c).await;
        }
    })
}
