//! What the fault scenarios share: the cluster's base objects, a MIG pool of real agents, tenants,
//! and waiting for convergence.

use gpu_tenancy::api::{GpuNode, GpuPartitionPlan, GpuTenant};
use gpu_tenancy_e2e::auditor::{AuditConfig, Auditor};
use gpu_tenancy_e2e::procs::{SimAgent, controller_lease};
use gpu_tenancy_e2e::{Cleanup, apply_file, client, ensure_crds, ensure_operator_namespaces};
use k8s_openapi::api::core::v1::Node;
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

/// The layout the pools start with: each H100 cut into two 3g.40gb.
pub fn two_3g() -> Value {
    json!(["3g.40gb", "3g.40gb"])
}

/// The layout they change to: one 3g.40gb and two 2g.20gb.
pub fn one_3g_two_2g() -> Value {
    json!(["3g.40gb", "2g.20gb", "2g.20gb"])
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

/// The profiles of a MIG layout as [`set_plan`] takes them (a JSON list), sorted.
fn sorted_profiles(layout: &Value) -> Vec<String> {
    let mut p: Vec<String> = layout
        .as_array()
        .unwrap_or_else(|| panic!("a MIG layout is a list of profiles, not {layout}"))
        .iter()
        .map(|p| {
            p.as_str()
                .unwrap_or_else(|| panic!("a MIG profile is a string, not {p}"))
                .to_string()
        })
        .collect();
    p.sort();
    p
}

/// Whether every GpuNode of `pool` has a spec cutting each GPU into `layout` (the profiles, as
/// [`set_plan`] takes them) that its agent reported applied and Ready, and every tenant has
/// observed its generation. The profiles, not their count: two layouts of as many instances
/// (3g+2g+2g and 2g+2g+2g) would otherwise pass for each other while a rollout is still between
/// nodes.
pub async fn converged(client: &Client, pool: &str, layout: &Value) -> Result<(), String> {
    let want = sorted_profiles(layout);
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
        let profiles: Vec<Vec<String>> = n
            .spec
            .gpus
            .iter()
            .map(|g| {
                let mut p: Vec<String> = g.mig_instances.iter().map(|i| i.profile.clone()).collect();
                p.sort();
                p
            })
            .collect();
        let shaped = !profiles.is_empty() && profiles.iter().all(|p| *p == want);
        if !(ready && shaped && st.observed_generation == n.metadata.generation) {
            let why: Vec<String> = st
                .conditions
                .iter()
                .map(|c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message))
                .collect();
            return Err(format!(
                "{}: spec {profiles:?} (want {want:?} per GPU) generation {:?} observed {:?} ready {ready} layout {:?} conditions {why:?}",
                n.name_any(),
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
pub async fn wait_converged(client: &Client, pool: &str, layout: &Value, within: Duration) -> Duration {
    let t0 = Instant::now();
    loop {
        match converged(client, pool, layout).await {
            Ok(()) => return t0.elapsed(),
            Err(why) if t0.elapsed() > within => panic!("pool {pool} did not converge within {within:?}: {why}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// How long GpuNodes, GpuTenants and Nodes must stay unwritten for the cluster to count as
/// settled: longer than any gap in the chain spec, agent status, controller pass, tenant status.
const SETTLED_FOR: Duration = Duration::from_secs(3);

/// The newest resourceVersion among the GpuNodes, GpuTenants and Nodes (etcd revisions, so a
/// larger one means a later write); not the lists' own, which every Lease renewal moves.
async fn newest_write(client: &Client) -> u64 {
    fn newest<K: kube::Resource>(items: &[K]) -> u64 {
        items
            .iter()
            .filter_map(|o| o.meta().resource_version.as_deref()?.parse().ok())
            .max()
            .unwrap_or(0)
    }
    let gpu_nodes = Api::<GpuNode>::all(client.clone()).list(&Default::default()).await;
    let tenants = Api::<GpuTenant>::all(client.clone()).list(&Default::default()).await;
    let nodes = Api::<Node>::all(client.clone()).list(&Default::default()).await;
    match (gpu_nodes, tenants, nodes) {
        (Ok(g), Ok(t), Ok(n)) => newest(&g.items).max(newest(&t.items)).max(newest(&n.items)),
        (g, t, n) => panic!(
            "listing GpuNodes, GpuTenants and Nodes: {:?} {:?} {:?}",
            g.err(),
            t.err(),
            n.err()
        ),
    }
}

/// Waits until a controller leads (it renewed the Lease after this call began: a leader killed
/// just before leaves its Lease, and its half-done pass, until a follower takes over), then until
/// nothing has been written for [`SETTLED_FOR`]. A convergence check alone can pass in between: the
/// agents have applied every spec while the new leader has not yet written the specs the old one
/// held back, whose tenants' statuses it had already written.
pub async fn wait_settled(client: &Client, within: Duration) {
    let t0 = Instant::now();
    let since = jiff::Timestamp::now();
    loop {
        let renewed = controller_lease(client)
            .await
            .and_then(|l| l.spec?.renew_time)
            .is_some_and(|t| t.0 > since);
        if renewed {
            break;
        }
        assert!(
            t0.elapsed() < within,
            "no controller renewed its Lease within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (mut last, mut unchanged_since) = (newest_write(client).await, Instant::now());
    while unchanged_since.elapsed() < SETTLED_FOR {
        assert!(
            t0.elapsed() < within,
            "GpuNodes, GpuTenants or Nodes still written {within:?} after convergence (newest resourceVersion {last})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = newest_write(client).await;
        if now != last {
            (last, unchanged_since) = (now, Instant::now());
        }
    }
}

/// The end state is consistent: once the cluster has settled ([`wait_settled`]), a fresh auditor
/// with no grace (every finding across objects is a violation at once) sees nothing, and neither
/// did the one that watched throughout.
pub async fn assert_consistent_now(client: &Client, watched: &Auditor) {
    let t0 = Instant::now();
    wait_settled(client, Duration::from_secs(60)).await;
    eprintln!("MEASURE settled {:?} after convergence", t0.elapsed());
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
