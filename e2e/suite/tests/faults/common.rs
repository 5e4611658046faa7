//! What the fault scenarios share: the cluster's base objects, a MIG pool of real agents, tenants,
//! and waiting for convergence.

use gpu_tenancy::api::{GpuNode, GpuPartitionPlan, GpuTenant};
use gpu_tenancy_e2e::auditor::{AuditConfig, Auditor};
use gpu_tenancy_e2e::procs::SimAgent;
use gpu_tenancy_e2e::{Cleanup, apply_file, client, ensure_crds, ensure_operator_namespaces};
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// A client, the CRDs, the operator's and device plugin's namespaces, and examples/policy.yaml
/// (tiers external, internal, experimental).
pub async fn setup() -> Client {
    let client = client().await;
    ensure_crds(&client).await;
    ensure_operator_namespaces(&client).await;
    apply_file("examples/policy.yaml").await;
    client
}

/// `count` agents `<pool>-<i>`, each on one simulated H100, under a MIG plan `pool` cutting it into
/// `profiles`, one node at a time.
pub async fn mig_pool(client: &Client, cleanup: &Cleanup, pool: &str, count: usize, profiles: Value) -> Vec<SimAgent> {
    cleanup.add("GpuPartitionPlan", pool);
    set_plan(client, pool, profiles).await;
    let mut agents = Vec::new();
    for i in 0..count {
        agents.push(SimAgent::start(client, cleanup, &format!("{pool}-{i}"), pool).await);
    }
    agents
}

pub async fn set_plan(client: &Client, pool: &str, profiles: Value) {
    let plan = json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuPartitionPlan", "metadata": {"name": pool},
        "spec": {"nodeSelector": {"matchLabels": {"pool": pool}}, "gpus": [{"devices": "all", "mode": "MIG", "mig": {"profiles": profiles}}],
                 "rollout": {"maxUnavailable": 1}}});
    Api::<GpuPartitionPlan>::all(client.clone())
        .patch(pool, &PatchParams::apply("e2e-faults").force(), &Patch::Apply(plan))
        .await
        .unwrap_or_else(|e| panic!("applying plan {pool}: {e}"));
}

/// A tenant of tier `internal` with one namespace of its name, asking for MIG instances.
pub async fn set_tenant(client: &Client, cleanup: &Cleanup, name: &str, mig: &[(&str, u32)]) {
    cleanup.add("GpuTenant", name);
    let resources: Vec<Value> = mig
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(p, n)| json!({"mode": "MIG", "profile": p, "count": n}))
        .collect();
    let body = json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuTenant", "metadata": {"name": name},
        "spec": {"tier": "internal", "namespaces": [name], "resources": resources}});
    Api::<GpuTenant>::all(client.clone())
        .patch(name, &PatchParams::apply("e2e-faults").force(), &Patch::Apply(body))
        .await
        .unwrap_or_else(|e| panic!("applying tenant {name}: {e}"));
}

/// Whether every GpuNode of `pool` has a spec of `instances` instances per GPU that its agent
/// reported applied and Ready, and every tenant has observed its generation.
pub async fn converged(client: &Client, pool: &str, instances: usize) -> Result<(), String> {
    let nodes = Api::<GpuNode>::all(client.clone())
        .list(&Default::default())
        .await
        .map_err(|e| e.to_string())?;
    let prefix = format!("{pool}-");
    let ours: Vec<&GpuNode> = nodes.iter().filter(|n| n.name_any().starts_with(&prefix)).collect();
    if ours.is_empty() {
        return Err(format!("no GpuNode of pool {pool} yet"));
    }
    for n in ours {
        let st = n.status.clone().unwrap_or_default();
        let ready = st.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True");
        let shaped = !n.spec.gpus.is_empty() && n.spec.gpus.iter().all(|g| g.mig_instances.len() == instances);
        if !(ready && shaped && st.observed_generation == n.metadata.generation) {
            let why: Vec<String> = st
                .conditions
                .iter()
                .map(|c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message))
                .collect();
            return Err(format!(
                "{}: spec {:?} generation {:?} observed {:?} ready {ready} layout {:?} conditions {why:?}",
                n.name_any(),
                n.spec.gpus.iter().map(|g| g.mig_instances.len()).collect::<Vec<_>>(),
                n.metadata.generation,
                st.observed_generation,
                st.layout
            ));
        }
    }
    for t in Api::<GpuTenant>::all(client.clone())
        .list(&Default::default())
        .await
        .map_err(|e| e.to_string())?
    {
        if t.status.as_ref().and_then(|s| s.observed_generation) != t.metadata.generation {
            return Err(format!("GpuTenant {} has not been observed", t.name_any()));
        }
    }
    Ok(())
}

/// Waits for [`converged`]; returns how long it took.
pub async fn wait_converged(client: &Client, pool: &str, instances: usize, within: Duration) -> Duration {
    let t0 = Instant::now();
    loop {
        match converged(client, pool, instances).await {
            Ok(()) => return t0.elapsed(),
            Err(why) if t0.elapsed() > within => panic!("pool {pool} did not converge within {within:?}: {why}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// The end state is consistent: a fresh auditor with no grace (every finding across objects is a
/// violation at once) sees nothing, and neither did the one that watched throughout.
pub async fn assert_consistent_now(client: &Client, watched: &Auditor) {
    let now = Auditor::start(
        client,
        AuditConfig {
            grace: Duration::ZERO,
            ..AuditConfig::default()
        },
    )
    .await;
    now.wait_checks(3).await;
    now.assert_clean();
    watched.assert_clean();
    eprintln!("MEASURE auditor: {} snapshots checked, no violation", watched.checks());
}
