//! The controller's scenarios, in one sequence on one cluster (each step starts from the last).

use crate::observe::{applied, scrub_tainted};
use crate::plan_live;
use crate::support::*;
use gpu_tenancy::api::{GpuNode, GpuPartitionPlan, GpuTenant};
use gpu_tenancy::desired::Settings;
use gpu_tenancy_e2e::kubelet::pod_resources::{ListPodResourcesResponse, PodResourcesServer, pod_holding};
use gpu_tenancy_e2e::procs::{ControllerProcess, SimAgent, lease_holder, wait_for_leader};
use gpu_tenancy_e2e::{Cleanup, kubectl_async};
use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, ResourceQuota};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use std::time::{Duration, Instant};

fn count(writes: &[String], prefix: &str) -> usize {
    writes.iter().filter(|w| w.starts_with(prefix)).count()
}

#[tokio::test]
async fn a_controller_converges_writes_only_on_change_and_enforces_isolation() {
    let cleanup = Cleanup::new();
    let client = setup(&cleanup).await;
    apply_examples().await;
    let nodes = create_fleet(&client).await;
    let c = start_controller(&client).await;

    // (a) The initial apply of examples/: everything is written once, then nothing.
    let t0 = Instant::now();
    let initial = converge(&client, &c).await;
    eprintln!(
        "MEASURE initial apply of examples/: {} writes in {:?}: {initial:#?}",
        initial.len(),
        t0.elapsed()
    );
    assert_eq!(count(&initial, "apply GpuNode"), nodes.len(), "{initial:#?}");
    for ns in [
        "acme-prod",
        "acme-dev",
        "beta",
        "delta",
        "gamma-training",
        "research-sandbox",
    ] {
        let q = Api::<ResourceQuota>::namespaced(client.clone(), ns)
            .get("gpu-tenancy")
            .await;
        assert!(q.is_ok(), "no quota in {ns}");
    }
    let cm = Api::<ConfigMap>::namespaced(client.clone(), &Settings::default().device_plugin_namespace)
        .get(&Settings::default().device_plugin_config_map)
        .await
        .unwrap();
    let keys: Vec<&String> = cm.data.as_ref().unwrap().keys().collect();
    // Every node's config, and `default`: the config the plugin refuses, for nodes with no plan.
    assert_eq!(keys, ["default", "exclusive", "mig-mixed", "mps-4", "time-slicing-4"]);
    let h200 = Api::<Node>::all(client.clone()).get("gpu-h200-1").await.unwrap();
    assert_eq!(h200.labels()["nvidia.com/device-plugin.config"], "time-slicing-4");
    // Ours beside the others' (the API server taints a new Node not-ready): only our keys were written.
    let taints = h200.spec.unwrap().taints.unwrap();
    let ours: Vec<(&str, Option<&str>)> = taints
        .iter()
        .filter(|t| t.key.starts_with("gputenancy.io/"))
        .map(|t| (t.key.as_str(), t.value.as_deref()))
        .collect();
    assert_eq!(ours, [("gputenancy.io/sharing", Some("TimeSlicing"))]);
    assert!(
        taints.iter().any(|t| t.key == "node.kubernetes.io/not-ready"),
        "{taints:?}"
    );
    let beta_ns = Api::<Namespace>::all(client.clone()).get("beta").await.unwrap();
    assert_eq!(beta_ns.labels()["gputenancy.io/tenant"], "team-beta");
    assert!(
        Api::<ValidatingAdmissionPolicy>::all(client.clone())
            .get(gpu_tenancy::desired::TENANTS_POLICY)
            .await
            .is_ok()
    );
    assert!(
        Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
            .get("gputenancy.io-tenant-acme")
            .await
            .is_ok_and(|b| b.spec.policy_name == gpu_tenancy::desired::TENANTS_POLICY)
    );
    // Statuses people read: granted vs requested, Ready, the plan applied on its nodes.
    let out = kubectl_async(vec!["get".into(), "gputenants".into()]).await.ok();
    eprintln!("{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("acme ") && l.contains("12/12") && l.contains("True")),
        "{out}"
    );
    assert_eq!(
        out.lines().filter(|l| l.contains(" True ")).count(),
        5,
        "every example tenant is Ready: {out}"
    );
    let out = kubectl_async(vec!["get".into(), "gpupartitionplans".into()]).await.ok();
    eprintln!("{out}");
    let plan = Api::<GpuPartitionPlan>::all(client.clone())
        .get("h100-mig")
        .await
        .unwrap();
    let ready = plan
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.status, "True", "{}", ready.message);

    // (b) Idle: a pass with nothing changed writes nothing.
    let idle = pass(&c).await;
    assert_eq!(idle, Vec::<String>::new());
    eprintln!("MEASURE idle pass: 0 writes");

    // `plan` of the live cluster (kubectl's export, no inventory file): converged, it plans
    // what runs and moves nothing; with team-beta's change applied to the export (a change not
    // yet merged), it says what the controller's next pass writes.
    let live = plan_live::export().await;
    let (code, now) = plan_live::plan(&live);
    assert_eq!((code, &now["problems"]), (0, &json!([])), "plan of the live cluster");
    assert_eq!(now["changes"], json!([]), "a converged cluster: nothing changes hands");
    let (planned_nodes, planned_tenants) = plan_live::planned(&now);
    let (server_nodes, server_tenants) = plan_live::on_server(&client).await;
    plan_live::assert_same("GpuNode specs, converged", &planned_nodes, &server_nodes);
    plan_live::assert_same("tenant grants, converged", &planned_tenants, &server_tenants);
    let what_if = plan_live::with_tenant_spec(&live, "team-beta", team_beta_change());
    let (_, next) = plan_live::plan(&what_if);
    assert_ne!(
        next["changes"],
        json!([]),
        "the change moves something: {}",
        next["changes"]
    );
    let (predicted_nodes, predicted_tenants) = plan_live::planned(&next);

    // (c) One tenant's request changes: only its objects are written.
    change_team_beta(&client, "e2e").await;
    let mut change = pass(&c).await;
    let (server_nodes, server_tenants) = plan_live::on_server(&client).await;
    plan_live::assert_same(
        "GpuNode specs after the change's first pass",
        &predicted_nodes,
        &server_nodes,
    );
    plan_live::assert_same(
        "tenant grants after the change's first pass",
        &predicted_tenants,
        &server_tenants,
    );
    eprintln!(
        "MEASURE plan of the live cluster: {} nodes, {} tenants; the change's first pass as planned ({} changes)",
        server_nodes.len(),
        server_tenants.len(),
        next["changes"].as_array().map_or(0, Vec::len)
    );
    change.extend(converge(&client, &c).await);
    eprintln!("MEASURE one tenant change: {} writes: {change:#?}", change.len());
    assert!(
        change.contains(&"status GpuTenant team-beta".to_string()),
        "{change:#?}"
    );
    assert!(
        change.contains(&"apply ResourceQuota beta/gpu-tenancy".to_string()),
        "{change:#?}"
    );
    for w in &change {
        assert!(
            w.contains("team-beta")
                || w.contains("beta/")
                || w.starts_with("apply GpuNode gpu-h100")
                || w.starts_with("status GpuPartitionPlan h100-mig"),
            "a write that is not team-beta's: {w} in {change:#?}"
        );
    }

    // Short capacity shows with the numbers: team-delta asks for more MPS shares than are left.
    Api::<GpuTenant>::all(client.clone())
        .patch(
            "team-delta",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(
                json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuTenant", "spec": {
                "tier": "internal", "namespaces": ["delta"], "resources": [{"mode": "MPS", "count": 20}]}}),
            ),
        )
        .await
        .unwrap();
    converge(&client, &c).await;
    let delta = Api::<GpuTenant>::all(client.clone()).get("team-delta").await.unwrap();
    let short = delta
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "CapacityShort")
        .unwrap();
    assert_eq!(short.status, "True");
    assert!(
        short
            .message
            .contains("MPS shares: granted 8 of 20; capacity short: 24 free for 2 tenants"),
        "{}",
        short.message
    );

    // (d) Isolation, by the API server: team-beta (MPS shares and MIG instances) may not tolerate
    // the time-slicing taint; its MIG pod is admitted.
    // No controller-manager may run here to give the namespace its default ServiceAccount.
    let sa: k8s_openapi::api::core::v1::ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "default"}})).unwrap();
    let _ = Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(client.clone(), "beta")
        .create(&PostParams::default(), &sa)
        .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "beta");
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let pod = |limits: serde_json::Value, tolerations: serde_json::Value| -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {
            "containers": [{"name": "c", "image": "cuda", "resources": {"limits": limits}}], "tolerations": tolerations}}))
        .unwrap()
    };
    let refused = pods
        .create(&dry, &pod(json!({"nvidia.com/gpu.shared": "1"}), json!([{"key": "gputenancy.io/sharing", "operator": "Equal", "value": "TimeSlicing", "effect": "NoSchedule"}])))
        .await
        .expect_err("a time-slicing toleration of an internal tenant is refused");
    assert!(
        refused.to_string().contains(
            "GpuTenant team-beta (tier internal) may tolerate the taint gputenancy.io/sharing only with operator Equal and the value of a mode it holds shares of (MPS)"
        ),
        "{refused}"
    );
    pods.create(&dry, &pod(json!({"nvidia.com/mig-2g.20gb": "1"}), json!([])))
        .await
        .expect("a MIG pod of team-beta is admitted");

    // (e) A restarted controller (new stores, same cluster) rewrites nothing.
    drop(c);
    let c = start_controller(&client).await;
    let after_restart = pass(&c).await;
    assert_eq!(
        after_restart,
        Vec::<String>::new(),
        "a restarted controller rewrote: {after_restart:#?}"
    );

    // (f) Deleting a tenant removes its objects.
    Api::<GpuTenant>::all(client.clone())
        .delete("team-delta", &DeleteParams::default())
        .await
        .unwrap();
    let gone = converge(&client, &c).await;
    eprintln!("MEASURE deleting team-delta: {gone:#?}");
    // Its quota and admission bindings go: by the garbage collector (the quota is owned by the
    // tenant), or by the controller's own deletes when it is faster.
    let deadline = Instant::now() + Duration::from_secs(30);
    while Api::<ResourceQuota>::namespaced(client.clone(), "delta")
        .get("gpu-tenancy")
        .await
        .is_ok()
        || Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
            .get("gputenancy.io-tenant-team-delta")
            .await
            .is_ok()
    {
        assert!(
            Instant::now() < deadline,
            "team-delta's quota or admission binding outlived it: {gone:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let ns = Api::<Namespace>::all(client.clone()).get("delta").await.unwrap();
    assert!(
        !ns.labels().contains_key("gputenancy.io/tenant"),
        "the namespace keeps no tenant label"
    );
    // And a pass after that writes nothing.
    assert_eq!(pass(&c).await, Vec::<String>::new());
    let _ = Api::<GpuNode>::all(client.clone());
}

/// A plan change reaches its nodes at most `maxUnavailable` at a time.
#[tokio::test]
async fn b_a_plan_change_rolls_out_within_max_unavailable() {
    let cleanup = Cleanup::new();
    let client = setup(&cleanup).await;
    apply_examples().await;
    let c = start_controller(&client).await;
    // Four more H100 nodes under their own plan, maxUnavailable 1.
    let gn_api: Api<GpuNode> = Api::all(client.clone());
    let names = h100_pool(&client, &cleanup, "roll", 4).await;
    let plan = |profiles: serde_json::Value| mig_plan("roll", profiles);
    let plans: Api<GpuPartitionPlan> = Api::all(client.clone());
    plans
        .patch(
            "roll",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(plan(json!(["3g.40gb", "3g.40gb"]))),
        )
        .await
        .unwrap();
    converge(&client, &c).await;
    // The new layout: each pass may start at most one node; the agents apply one node per round.
    plans
        .patch(
            "roll",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(plan(json!(["7g.80gb"]))),
        )
        .await
        .unwrap();
    let mut rounds = 0;
    loop {
        let w = pass(&c).await;
        let changing: Vec<String> = gn_api
            .list(&Default::default())
            .await
            .unwrap()
            .into_iter()
            .filter(|n| names.contains(&n.name_any()))
            .filter(|n| n.status.as_ref().and_then(|s| s.observed_generation) != n.metadata.generation)
            .map(|n| n.name_any())
            .collect();
        assert!(
            changing.len() <= 1,
            "more than maxUnavailable nodes changing: {changing:?} after {w:?}"
        );
        let applied = agents_apply(&client, Some(&names)).await;
        rounds += 1;
        let done = gn_api
            .list(&Default::default())
            .await
            .unwrap()
            .into_iter()
            .filter(|n| names.contains(&n.name_any()))
            .all(|n| {
                n.spec.gpus.iter().all(|g| g.mig_instances.len() == 1)
                    && n.status.as_ref().and_then(|s| s.observed_generation) == n.metadata.generation
            });
        if done && applied.is_empty() {
            break;
        }
        assert!(rounds < 20, "the rollout did not finish in 20 rounds");
    }
    eprintln!("MEASURE rollout of 4 nodes at maxUnavailable 1: {rounds} rounds");
    assert!(
        rounds >= 4,
        "4 nodes at maxUnavailable 1 need at least 4 rounds, took {rounds}"
    );
    plans.delete("roll", &DeleteParams::default()).await.unwrap();
}

/// The controller binary, leader-elected, in two replicas: the follower takes over when the
/// leader stops mid-rollout, and finishes the rollout with no grant lost or doubled.
#[tokio::test]
async fn c_a_follower_takes_over_mid_rollout() {
    let cleanup = Cleanup::new();
    let client = setup(&cleanup).await;
    apply_examples().await;
    h100_pool(&client, &cleanup, "fo", 3).await;
    let plan = |profiles: serde_json::Value| mig_plan("fo", profiles);
    let plans: Api<GpuPartitionPlan> = Api::all(client.clone());
    cleanup.add("GpuPartitionPlan", "fo");
    plans
        .patch(
            "fo",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(plan(json!(["3g.40gb", "3g.40gb"]))),
        )
        .await
        .unwrap();

    // The simulated agents apply each new spec, one node per tick.
    let agents_client = client.clone();
    let agents = tokio::spawn(async move {
        loop {
            agents_apply(&agents_client, None).await;
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
    });
    // replica-a starts first and leads; replica-b joins once a holds the lease.
    let mut a = ControllerProcess::start("replica-a", 5);
    let converged = |client: Client| async move {
        let nodes = Api::<GpuNode>::all(client).list(&Default::default()).await.unwrap();
        nodes.iter().filter(|n| n.name_any().starts_with("fo-")).all(|n| {
            !n.spec.gpus.is_empty() && n.status.as_ref().and_then(|s| s.observed_generation) == n.metadata.generation
        })
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while !(converged(client.clone()).await && lease_holder(&client).await.as_deref() == Some("replica-a")) {
        assert!(
            Instant::now() < deadline,
            "replica-a did not lead and converge within 120 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let b = ControllerProcess::start("replica-b", 5);
    // Let replica-b list everything and wait on the lease before the leader goes.
    tokio::time::sleep(Duration::from_secs(3)).await;
    eprintln!(
        "MEASURE controller RSS with examples/ and 3 more nodes: {} KiB",
        a.rss_kib()
    );

    // A new layout; stop the leader as soon as the rollout has started.
    plans
        .patch(
            "fo",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(plan(json!(["7g.80gb"]))),
        )
        .await
        .unwrap();
    let started = |client: Client| async move {
        let nodes = Api::<GpuNode>::all(client).list(&Default::default()).await.unwrap();
        nodes
            .iter()
            .any(|n| n.name_any().starts_with("fo-") && n.spec.gpus.iter().any(|g| g.mig_instances.len() == 1))
    };
    while !started(client.clone()).await {
        assert!(Instant::now() < deadline, "the rollout did not start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let t0 = Instant::now();
    a.terminate();
    wait_for_leader(&client, "replica-b", Duration::from_secs(30)).await;
    eprintln!(
        "MEASURE failover (SIGTERM to the follower holding the lease): {:?}",
        t0.elapsed()
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let nodes = Api::<GpuNode>::all(client.clone())
            .list(&Default::default())
            .await
            .unwrap();
        let fo: Vec<&GpuNode> = nodes.iter().filter(|n| n.name_any().starts_with("fo-")).collect();
        let changing = fo
            .iter()
            .filter(|n| n.status.as_ref().and_then(|s| s.observed_generation) != n.metadata.generation)
            .count();
        assert!(changing <= 1, "more than maxUnavailable nodes changing");
        if fo
            .iter()
            .all(|n| n.spec.gpus.iter().all(|g| g.mig_instances.len() == 1))
            && changing == 0
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "replica-b did not finish the rollout within 120 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Nothing lost or doubled: what the cluster holds is exactly the desired state of what it holds.
    let c = start_controller(&client).await;
    settle(&c).await;
    let snapshot = c.stores.snapshot();
    let d =
        gpu_tenancy::controller::desired_of(&snapshot, &Settings::default(), &gpu_tenancy::controller::now_seconds());
    let pending = gpu_tenancy::controller::diff::diff(&d, &snapshot).writes;
    assert!(
        pending
            .iter()
            .all(|w| !matches!(w, gpu_tenancy::controller::diff::Write::Apply { .. })),
        "after the failover the cluster differs from the desired state: {pending:#?}"
    );
    agents.abort();
    drop(b);
    plans.delete("fo", &DeleteParams::default()).await.unwrap();
}

/// Flux's own apply machinery and kstatus, with the controller running: a new tenant ends
/// Current, an invalid plan ends Failed instead of hanging InProgress.
#[tokio::test]
async fn d_flux_sees_the_controller_s_statuses() {
    let cleanup = Cleanup::new();
    let client = setup(&cleanup).await;
    apply_examples().await;
    let c = std::sync::Arc::new(start_controller(&client).await);
    let loop_c = c.clone();
    let controller = tokio::spawn(async move {
        loop {
            let _ = pass(&loop_c).await;
        }
    });
    let dir = std::env::temp_dir().join(format!("gt-flux-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("gitops.yaml");
    std::fs::write(
        &file,
        r#"apiVersion: gputenancy.io/v1alpha1
kind: GpuTenant
metadata: {name: flux-team}
spec:
  tier: internal
  namespaces: [flux-team]
  resources: []
---
apiVersion: gputenancy.io/v1alpha1
kind: GpuPartitionPlan
metadata: {name: flux-impossible}
spec:
  nodeSelector: {matchLabels: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3, pool: flux}}
  gpus:
  - devices: all
    mode: MIG
    mig: {profiles: [4g.40gb, 4g.40gb]}
"#,
    )
    .unwrap();
    cleanup.add("GpuTenant", "flux-team");
    cleanup.add("GpuPartitionPlan", "flux-impossible");
    let gitops = gpu_tenancy_e2e::repo_root().join("e2e/bin/gitops");
    let kubeconfig = gpu_tenancy_e2e::kubeconfig_path();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(gitops)
            .args(["flux-apply-wait", "--kubeconfig"])
            .arg(kubeconfig)
            .args(["--timeout", "60s", "--interval", "500ms"])
            .arg(&file)
            .output()
            .expect("e2e/bin/gitops runs (built by e2e/run.sh)")
    })
    .await
    .unwrap();
    controller.abort();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(1),
        "Flux sees one object Failed, none timing out: {stdout}"
    );
    let line = |kind: &str| -> serde_json::Value {
        stdout
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|l| l["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind} in {stdout}"))
    };
    assert_eq!(line("GpuTenant")["status"], "Current", "{stdout}");
    assert_eq!(line("GpuPartitionPlan")["status"], "Failed", "{stdout}");
    std::fs::remove_dir_all(dir).ok();
}

/// A real agent (`gpu-tenancy agent run` on two simulated GPUs) under `busyGpuPolicy: Evict`: a
/// GPU to change still runs a process, so the agent evicts the pod that holds it (the kubelet's
/// pod-resources API, played by the test, says which), leaves the GPU alone while the process
/// runs, and applies the change once it ends. A pod asking for the same resource name on the
/// other GPU is not evicted; without the API the agent says so in `PodResources`.
#[tokio::test]
async fn e_a_busy_gpu_is_evicted_then_changed() {
    let cleanup = Cleanup::new();
    let client = setup(&cleanup).await;
    cleanup.add("GpuPartitionPlan", "busy");
    let agent = SimAgent::start_with(&client, &cleanup, "busy-0", "busy", 2).await;
    let controller = run_passes(std::sync::Arc::new(start_controller(&client).await));
    // GPU 0 changes, GPU 1 keeps its 7g.80gb.
    let plan = |profiles: serde_json::Value| {
        let mut p = mig_plan("busy", profiles.clone());
        p["spec"]["gpus"] = json!([
            {"devices": "0", "mode": "MIG", "mig": {"profiles": profiles}},
            {"devices": "1", "mode": "MIG", "mig": {"profiles": ["7g.80gb"]}}]);
        p["spec"]["rollout"]["busyGpuPolicy"] = json!("Evict");
        p
    };
    let plans: Api<GpuPartitionPlan> = Api::all(client.clone());
    plans
        .patch(
            "busy",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(plan(json!(["7g.80gb"]))),
        )
        .await
        .unwrap();
    let gn: Api<GpuNode> = Api::all(client.clone());
    let until = |what: &'static str, check: fn(&GpuNode) -> bool| {
        let gn = gn.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(90);
            loop {
                if let Ok(n) = gn.get("busy-0").await
                    && check(&n)
                {
                    return n;
                }
                assert!(Instant::now() < deadline, "busy-0 never showed {what}");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    };
    fn applied(n: &GpuNode, want: &str) -> bool {
        let s = n.status.clone().unwrap_or_default();
        s.gpu_layout.as_deref() == Some(want)
            && s.observed_generation == n.metadata.generation
            && s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True")
    }
    fn pod_resources(n: &GpuNode) -> Option<(String, String)> {
        let s = n.status.as_ref()?;
        let c = s.conditions.iter().find(|c| c.type_ == "PodResources")?;
        Some((c.status.clone(), c.reason.clone()))
    }
    let n = until("0:7g.80gb 1:7g.80gb", |n| applied(n, "0:7g.80gb 1:7g.80gb")).await;
    // No kubelet socket yet: said so, by resource name until it answers.
    assert_eq!(pod_resources(&n), Some(("False".into(), "Unavailable".into())));
    let instance_uuid = |n: &GpuNode, gpu: usize| -> String {
        n.status.as_ref().unwrap().gpus[gpu].instances[0]
            .uuid
            .clone()
            .expect("an instance UUID")
    };
    let (on_gpu0, on_gpu1) = (instance_uuid(&n, 0), instance_uuid(&n, 1));
    // A workload on each GPU's instance, and their pods (bound to the node; there is no kubelet):
    // both ask for nvidia.com/mig-7g.80gb, which both GPUs serve. The test's kubelet says which
    // holds which.
    let kubelet = PodResourcesServer::start(&agent.pod_resources_socket());
    let mig = "nvidia.com/mig-7g.80gb";
    kubelet.set(ListPodResourcesResponse {
        pod_resources: vec![
            pod_holding("kube-system", "busy-workload", "c", mig, &[&on_gpu0]),
            pod_holding("kube-system", "other-gpu-workload", "c", mig, &[&on_gpu1]),
        ],
    });
    until("PodResources=True", |n| {
        pod_resources(n) == Some(("True".into(), "Read".into()))
    })
    .await;
    agent.sim_ctl(&["attach", "--gpu", "0", "--start", "0", "--pid", "4242"]);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    // No kubelet confirms a graceful deletion here.
    let at_once = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    for name in ["busy-workload", "other-gpu-workload"] {
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": name}, "spec": {
            "nodeName": "busy-0",
            "containers": [{"name": "c", "image": "cuda", "resources": {"limits": {mig: "1"}}}]}}))
        .unwrap();
        let _ = pods.delete(name, &at_once).await;
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    // The new layout of GPU 0: the agent finds it busy and evicts its pod.
    plans
        .patch(
            "busy",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(plan(json!(["3g.40gb", "3g.40gb"]))),
        )
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let terminating = |p: &Option<Pod>| p.as_ref().is_some_and(|p| p.metadata.deletion_timestamp.is_some());
    // Evicted: gone, or terminating (no kubelet here confirms the deletion).
    loop {
        let p = pods.get_opt("busy-workload").await.unwrap();
        if p.is_none() || terminating(&p) {
            break;
        }
        assert!(Instant::now() < deadline, "the pod on the busy GPU was not evicted");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let n = gn.get("busy-0").await.unwrap();
    let status = n.status.unwrap();
    assert_eq!(
        status.gpus[0].reason.map(|r| r.as_str()),
        Some("Busy"),
        "the GPU is left alone while the process runs"
    );
    let asked: Vec<&str> = status.eviction_requests.iter().map(|r| r.name.as_str()).collect();
    assert!(
        asked.iter().all(|n| *n == "busy-workload"),
        "only the busy GPU's holder is asked for: {asked:?}"
    );
    // The process ends: the change goes through, and the other GPU's pod stayed throughout.
    agent.sim_ctl(&["detach", "--pid", "4242"]);
    until("0:3g.40gb+3g.40gb 1:7g.80gb", |n| {
        applied(n, "0:3g.40gb+3g.40gb 1:7g.80gb")
    })
    .await;
    let other = pods.get_opt("other-gpu-workload").await.unwrap();
    assert!(
        other.is_some() && !terminating(&other),
        "the pod on the other GPU was evicted: {other:?}"
    );
    // The kubelet gone: the agent says so again.
    drop(kubelet);
    until("PodResources=False", |n| {
        pod_resources(n) == Some(("False".into(), "Unavailable".into()))
    })
    .await;
    controller.abort();
    drop(agent);
    plans.delete("busy", &DeleteParams::default()).await.ok();
    for name in ["busy-workload", "other-gpu-workload"] {
        let _ = pods.delete(name, &at_once).await;
    }
}

/// A real agent on a simulated GPU: an instance moves from one tenant to another. The node takes
/// no new pods (scrub-pending taint) until the agent reports the instance scrubbed for its new
/// tenant; the status records that scrub.
#[tokio::test]
async fn f_a_moved_instance_is_scrubbed_before_it_is_ready() {
    let cleanup = Cleanup::new();
    let client = setup(&cleanup).await;
    apply_examples().await;
    for (kind, name) in [("GpuPartitionPlan", "mv"), ("GpuTenant", "mv-a"), ("GpuTenant", "mv-b")] {
        cleanup.add(kind, name);
    }
    let agent = SimAgent::start(&client, &cleanup, "mv-0", "mv").await;
    let tenant = |name: &str, count: u32| {
        json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuTenant", "metadata": {"name": name},
            "spec": {"tier": "internal", "namespaces": [name], "resources": if count == 0 { json!([]) } else {
                json!([{"mode": "MIG", "profile": "3g.40gb", "count": count}]) }}})
    };
    let tenants: Api<GpuTenant> = Api::all(client.clone());
    let apply = |name: &'static str, count: u32| {
        let tenants = tenants.clone();
        let body = tenant(name, count);
        async move {
            tenants
                .patch(name, &PatchParams::apply("e2e").force(), &Patch::Apply(body))
                .await
                .unwrap();
        }
    };
    apply("mv-a", 2).await;
    apply("mv-b", 0).await; // exists (the plan names it) but asks for nothing yet
    // The plan dedicates the node to the two tenants, so their instances are served there first.
    let mut plan = mig_plan("mv", json!(["3g.40gb", "3g.40gb"]));
    plan["spec"]["gpus"][0]["tenants"] = json!(["mv-a", "mv-b"]);
    Api::<GpuPartitionPlan>::all(client.clone())
        .patch("mv", &PatchParams::apply("e2e").force(), &Patch::Apply(plan))
        .await
        .unwrap();
    let controller = run_passes(std::sync::Arc::new(start_controller(&client).await));
    let gn: Api<GpuNode> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let tenants_of = |n: &GpuNode| -> Vec<Option<String>> {
        n.status
            .as_ref()
            .map(|s| s.gpus[0].instances.iter().map(|i| i.tenant.clone()).collect())
            .unwrap_or_default()
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        // The GpuNode is made by the controller's first pass, which may not have run yet.
        let Some(n) = gn.get_opt("mv-0").await.unwrap() else {
            assert!(Instant::now() < deadline, "GpuNode mv-0 was never made");
            tokio::time::sleep(Duration::from_millis(250)).await;
            continue;
        };
        if applied(&n)
            && tenants_of(&n) == [Some("mv-a".to_string()), Some("mv-a".to_string())]
            && !scrub_tainted(&nodes.get("mv-0").await.unwrap())
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "mv-a never got both instances applied: ready {} tenants {:?} taint {} spec {:?} status {:?}",
            applied(&n),
            tenants_of(&n),
            scrub_tainted(&nodes.get("mv-0").await.unwrap()),
            n.spec,
            n.status
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // mv-a's workload leaves data in the instance at 4.
    agent.sim_ctl(&[
        "attach", "--gpu", "0", "--start", "4", "--pid", "5151", "--tenant", "mv-a",
    ]);
    agent.sim_ctl(&["detach", "--pid", "5151"]);
    // mv-a gives one up, mv-b takes it: the instance changes hands.
    apply("mv-a", 1).await;
    apply("mv-b", 1).await;
    let mut saw_taint = false;
    let deadline = Instant::now() + Duration::from_secs(90);
    let moved = loop {
        let n = gn.get("mv-0").await.unwrap();
        saw_taint |= scrub_tainted(&nodes.get("mv-0").await.unwrap());
        let st = n.status.clone().unwrap_or_default();
        let b = st.gpus.first().and_then(|g| {
            g.instances
                .iter()
                .find(|i| i.tenant.as_deref() == Some("mv-b"))
                .cloned()
        });
        if let Some(b) = b.filter(|_| applied(&n)) {
            break b;
        }
        assert!(Instant::now() < deadline, "the instance never reached mv-b");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let scrub = moved.last_scrub.expect("the moved instance records its scrub");
    assert_eq!(scrub.result, gpu_tenancy::api::ScrubResult::Scrubbed, "{scrub:?}");
    assert_eq!(scrub.tenant.as_deref(), Some("mv-b"), "{scrub:?}");
    assert!(
        saw_taint,
        "the node carried the scrub-pending taint during the hand-over"
    );
    wait_untainted(&client, "mv-0", "the hand-over").await;
    controller.abort();
}
