//! A simulated fleet for the controller: Nodes and agent-written GpuNode statuses, and a loop that
//! runs passes until the controller has nothing left to write.

use gpu_tenancy::api::{ConditionSet, GpuNode, GpuNodeStatus, GpuStatus, MigInstanceStatus, set_condition};
use gpu_tenancy::controller::Controller;
use gpu_tenancy::desired::Settings;
use gpu_tenancy::inventory::InventoryFile;
use gpu_tenancy_e2e::{Cleanup, client, create_namespace, ensure_crds, kubectl_async, repo_root};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use std::time::Duration;

pub const AGENT: &str = "gpu-tenancy-agent";

/// A client, the CRDs, and the device plugin's namespace (the controller writes its ConfigMap there).
pub async fn setup(cleanup: &Cleanup) -> Client {
    let client = client().await;
    ensure_crds(&client).await;
    // Kept for the scenarios that follow: deleting it would leave it Terminating for the next one.
    let keep = Cleanup::new();
    for ns in [
        Settings::default().device_plugin_namespace,
        "gpu-tenancy-system".to_string(),
    ] {
        if !kubectl_async(vec!["get".into(), "namespace".into(), ns.clone()])
            .await
            .success
        {
            create_namespace(&client, &keep, &ns, &[]).await;
        }
    }
    std::mem::forget(keep);
    let _ = cleanup;
    client
}

/// Applies the example manifests (policy, tenants, plans) with kubectl.
pub async fn apply_examples() {
    for f in ["examples/policy.yaml", "examples/tenants.yaml", "examples/plans.yaml"] {
        kubectl_async(vec![
            "apply".into(),
            "--server-side".into(),
            "--force-conflicts".into(),
            "-f".into(),
            f.into(),
        ])
        .await
        .ok();
    }
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

/// A real `gpu-tenancy agent run` for a new Node `name` (labelled `pool=<pool>`) with simulated
/// H100s of its own; `sim_ctl` drives them. The agent and the simulator state go when dropped.
pub struct SimAgent {
    dir: std::path::PathBuf,
    name: String,
    agent: std::process::Child,
}

impl SimAgent {
    /// An agent on one simulated H100.
    pub async fn start(client: &Client, cleanup: &Cleanup, name: &str, pool: &str) -> SimAgent {
        SimAgent::start_with(client, cleanup, name, pool, 1).await
    }

    /// An agent on `gpus` simulated H100s (indices 0..gpus).
    pub async fn start_with(client: &Client, cleanup: &Cleanup, name: &str, pool: &str, gpus: u32) -> SimAgent {
        let dir = std::env::temp_dir().join(format!("gt-agent-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("sim.yaml"),
            format!("gpus:\n- {{pciDeviceId: \"0x233010DE\", count: {gpus}}}\n"),
        )
        .unwrap();
        cleanup.add_resource("nodes", name);
        cleanup.add("GpuNode", name);
        let node: Node = serde_json::from_value(json!({"metadata": {"name": name, "labels": {"pool": pool}}})).unwrap();
        let _ = Api::<Node>::all(client.clone())
            .create(&PostParams::default(), &node)
            .await;
        let agent = SimAgent::spawn(&dir, name);
        SimAgent {
            dir,
            name: name.to_string(),
            agent,
        }
    }

    fn spawn(dir: &std::path::Path, name: &str) -> std::process::Child {
        let mut agent = std::process::Command::new(repo_root().join("target/debug/gpu-tenancy"));
        agent
            .args(["agent", "run", "--node-name", name, "--poll", "1"])
            .env("KUBECONFIG", gpu_tenancy_e2e::kubeconfig_path())
            .env("RUST_LOG", "warn");
        sim_env(dir, &mut agent);
        agent.spawn().expect("the agent starts")
    }

    /// Waits up to `timeout` for the agent to exit on its own (an injected abort); its exit status.
    pub async fn exited(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.agent.try_wait().unwrap() {
                return Some(status);
            }
            if tokio::time::Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Starts the agent again on the same simulated GPUs and state (killing it first if it runs),
    /// as its DaemonSet would after a crash.
    pub fn restart(&mut self) {
        let _ = self.agent.kill();
        let _ = self.agent.wait();
        self.agent = SimAgent::spawn(&self.dir, &self.name);
    }

    /// Runs `sim-ctl ARGS` on this agent's simulated GPUs.
    pub fn sim_ctl(&self, args: &[&str]) {
        self.sim_ctl_output(args);
    }

    /// Runs `sim-ctl ARGS` on this agent's simulated GPUs; its standard output.
    pub fn sim_ctl_output(&self, args: &[&str]) -> String {
        let mut cmd = std::process::Command::new(repo_root().join("target/debug/sim-ctl"));
        cmd.args(args);
        sim_env(&self.dir, &mut cmd);
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "sim-ctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// The simulator's whole state (`sim-ctl state`): GPUs, instances, `mutations`, `scrubs`...
    pub fn sim_state(&self) -> serde_json::Value {
        serde_json::from_str(&self.sim_ctl_output(&["state"])).unwrap()
    }

    /// The simulator's NVML mutation log after mutation number `since` (`sim-ctl log`).
    pub fn sim_log(&self, since: u64) -> Vec<serde_json::Value> {
        self.sim_ctl_output(&["log", "--since", &since.to_string()])
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

impl Drop for SimAgent {
    fn drop(&mut self) {
        let _ = self.agent.kill();
        let _ = self.agent.wait();
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

fn sim_env(dir: &std::path::Path, cmd: &mut std::process::Command) {
    let lib = repo_root().join("target/debug/libnvidia_ml_sim.so");
    cmd.env("GPU_TENANCY_SIM_CONFIG", dir.join("sim.yaml"))
        .env("GPU_TENANCY_SIM_STATE", dir.join("sim.state.json"))
        .env("GPU_TENANCY_NVML_LIB", &lib)
        .env("GPU_TENANCY_CUDA_LIB", &lib);
}

/// An in-process controller whose stores have synced (its passes are driven by the test).
pub async fn start_controller(client: &Client) -> Controller {
    let c = Controller::start(client.clone(), Settings::default(), Some("e2e".into()));
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
