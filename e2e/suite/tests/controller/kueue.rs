//! Queues per tenant with Kueue (docs/concepts/queues.md) on the real API server. Without
//! Kueue's CRDs the controller is Ready and writes no Kueue object; with them (Kueue's own CRDs,
//! of the release e2e/kueue/go.mod pins, which `e2e/run.sh build-kueue` copies into
//! e2e/bin/kueue-manifests/) it writes every tenant's queues, and the API server
//! validating them against Kueue's schema is the oracle that they are well-formed. The CRDs are
//! removed at the end, so the scenarios after these run without Kueue.

use crate::support::*;
use gpu_tenancy::api::{GpuTenant, SharingPolicy};
use gpu_tenancy::controller::kinds::KUEUE_KINDS;
use gpu_tenancy::kueue::{ClusterQueue, Cohort, LocalQueue, ResourceFlavor, WorkloadPriorityClass};
use gpu_tenancy_e2e::{Cleanup, kubectl_async};
use k8s_openapi::api::core::v1::ResourceQuota;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, ResourceExt};
use serde_json::json;
use std::time::Duration;

const CRDS: [&str; 5] = [
    "resourceflavors.kueue.x-k8s.io",
    "cohorts.kueue.x-k8s.io",
    "clusterqueues.kueue.x-k8s.io",
    "localqueues.kueue.x-k8s.io",
    "workloadpriorityclasses.kueue.x-k8s.io",
];

/// The file of CRD `name` (`clusterqueues.kueue.x-k8s.io`) in Kueue's `config/components/crd/bases/`.
fn crd_file(name: &str) -> String {
    let (plural, group) = name.split_once('.').expect("a CRD name is plural.group");
    format!("{group}_{plural}")
}

fn queue_writes(writes: &[String]) -> Vec<&String> {
    writes
        .iter()
        .filter(|w| KUEUE_KINDS.iter().any(|k| w.contains(&format!(" {k} "))))
        .collect()
}

/// Removes Kueue's CRDs (and with them every object of their kinds) when dropped, and waits
/// until they are gone.
struct KueueCrds;

impl KueueCrds {
    async fn install(client: &Client) -> KueueCrds {
        let mut args: Vec<String> = ["apply", "--server-side", "--field-manager=gpu-tenancy-e2e"]
            .map(String::from)
            .to_vec();
        for name in CRDS {
            args.push("-f".into());
            args.push(format!("e2e/bin/kueue-manifests/crds/{}.yaml", crd_file(name)));
        }
        kubectl_async(args).await.ok();
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for name in CRDS {
            tokio::time::timeout(
                Duration::from_secs(60),
                await_condition(crds.clone(), name, conditions::is_crd_established()),
            )
            .await
            .unwrap_or_else(|_| panic!("CRD {name} not Established within 60 s"))
            .unwrap_or_else(|e| panic!("watching CRD {name}: {e}"));
        }
        // Served in discovery a moment after Established.
        for _ in 0..100 {
            if Api::<ClusterQueue>::all(client.clone())
                .list(&ListParams::default())
                .await
                .is_ok()
            {
                return KueueCrds;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("ClusterQueues not served after their CRD was Established");
    }
}

impl Drop for KueueCrds {
    fn drop(&mut self) {
        let mut args = vec![
            "delete".to_string(),
            "crd".into(),
            "--ignore-not-found".into(),
            "--timeout=60s".into(),
        ];
        args.extend(CRDS.map(String::from));
        let out = gpu_tenancy_e2e::kubectl(&args);
        if !out.success {
            eprintln!("removing Kueue's CRDs failed: {}", out.stderr);
        }
    }
}

/// Tenant `tenant`'s granted units under quota key `key` (`requests.<resource name>`), from its status.
async fn grant(client: &Client, tenant: &str, key: &str) -> u64 {
    let t = Api::<GpuTenant>::all(client.clone()).get(tenant).await.unwrap();
    t.status
        .unwrap()
        .allocation
        .iter()
        .filter(|a| {
            format!(
                "requests.{}",
                gpu_tenancy::device_plugin::resource_name(a.mode, a.profile.as_deref())
            ) == key
        })
        .map(|a| u64::from(a.granted))
        .sum()
}

/// Without Kueue's CRDs: the controller is Ready and writes no queue, and the quotas split
/// each grant.
async fn without_kueue(client: &Client) {
    // Ready: the stores synced without waiting for the kinds the API server does not serve.
    let c = start_controller(client).await;
    let absent = c.stores.snapshot().absent;
    assert!(KUEUE_KINDS.iter().all(|k| absent.contains(k)), "{absent:?}");
    let writes = converge(client, &c).await;
    assert_eq!(queue_writes(&writes), Vec::<&String>::new());
    for t in Api::<GpuTenant>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
    {
        assert_eq!(t.status.and_then(|s| s.queue), None, "no queue without Kueue");
    }
    // Each namespace's quota is its share of the grant: acme's two namespaces split it.
    let hard = |q: ResourceQuota| q.spec.unwrap().hard.unwrap();
    let prod = hard(
        Api::namespaced(client.clone(), "acme-prod")
            .get("gpu-tenancy")
            .await
            .unwrap(),
    );
    let dev = hard(
        Api::namespaced(client.clone(), "acme-dev")
            .get("gpu-tenancy")
            .await
            .unwrap(),
    );
    let key = "requests.nvidia.com/mig-1g.10gb";
    let total = grant(client, "acme", key).await;
    let n = |q: &std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
        q[key].0.parse::<u64>().unwrap()
    };
    assert_eq!(n(&prod) + n(&dev), total);
}

#[tokio::test]
async fn kueue_queues_are_written_only_with_its_crds_and_pass_its_schema() {
    let cleanup = Cleanup::new();
    let client = setup(&cleanup).await;
    apply_examples().await;
    for n in create_fleet(&client).await {
        cleanup.add_resource("nodes", &n);
        cleanup.add("GpuNode", &n);
    }
    without_kueue(&client).await;
    // Discovery is at start: a controller started after the CRDs are installed writes the queues.
    let _crds = KueueCrds::install(&client).await;
    let c = start_controller(&client).await;
    assert!(c.stores.snapshot().absent.is_empty());
    // Every write succeeds (`pass` fails on any): the API server took each object.
    let writes = converge(&client, &c).await;
    assert!(!queue_writes(&writes).is_empty(), "{writes:#?}");

    let tenants: Vec<String> = Api::<GpuTenant>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .iter()
        .map(|t| t.name_any())
        .collect();
    let queues = Api::<ClusterQueue>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    let names: Vec<String> = queues.iter().map(|q| q.name_any()).collect();
    let want: Vec<String> = tenants.iter().map(|t| format!("gpu-tenancy-{t}")).collect();
    assert_eq!(names, want);
    // Each tenant's status names its queue, shown by `kubectl get gputenants -o wide`.
    for t in Api::<GpuTenant>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
    {
        let queue = t.status.as_ref().and_then(|s| s.queue.clone());
        assert_eq!(queue, Some(format!("gpu-tenancy-{}", t.name_any())));
    }
    let wide = kubectl_async(["get", "gputenants", "-o", "wide"].map(String::from).to_vec())
        .await
        .ok();
    assert!(
        wide.lines().next().is_some_and(|h| h.contains("QUEUE")) && wide.contains("gpu-tenancy-acme"),
        "{wide}"
    );
    let locals = Api::<LocalQueue>::namespaced(client.clone(), "acme-dev")
        .get("gpu-tenancy")
        .await
        .unwrap();
    assert_eq!(locals.spec.cluster_queue, "gpu-tenancy-acme");
    let priorities = Api::<WorkloadPriorityClass>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(priorities.items.len(), tenants.len());
    let flavors = Api::<ResourceFlavor>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(flavors.iter().any(|f| f.name_any() == "gpu-tenancy-any"));

    // Each namespace's quota is a ceiling at the whole grant, and acme's queue holds the grant.
    let key = "requests.nvidia.com/mig-1g.10gb";
    let total = grant(&client, "acme", key).await;
    assert!(total > 0);
    for ns in ["acme-prod", "acme-dev"] {
        let q: ResourceQuota = Api::namespaced(client.clone(), ns).get("gpu-tenancy").await.unwrap();
        assert_eq!(q.spec.unwrap().hard.unwrap()[key].0, total.to_string(), "{ns}");
    }
    let acme = queues.iter().find(|q| q.name_any() == "gpu-tenancy-acme").unwrap();
    let held: u64 = acme.spec.resource_groups[0]
        .flavors
        .iter()
        .flat_map(|f| &f.resources)
        .filter(|r| r.name == "nvidia.com/mig-1g.10gb")
        .map(|r| r.nominal_quota.0.parse::<u64>().unwrap())
        .sum();
    assert_eq!(held, total);

    // A tier that lends: its tenants' queues join a Cohort with lending and borrowing limits,
    // which Kueue's schema (its CEL rules on limits and cohorts) accepts.
    let policies: Api<SharingPolicy> = Api::all(client.clone());
    let internal = policies
        .get("default")
        .await
        .unwrap()
        .spec
        .tiers
        .iter()
        .position(|t| t.name == "internal")
        .unwrap();
    let lend =
        |op: &str| json!([{"op": op, "path": format!("/spec/tiers/{internal}/idleLendingPercent"), "value": 50}]);
    policies
        .patch(
            "default",
            &PatchParams::default(),
            &Patch::Json::<()>(serde_json::from_value(lend("add")).unwrap()),
        )
        .await
        .unwrap();
    let writes = converge(&client, &c).await;
    let restore = json!([{"op": "remove", "path": format!("/spec/tiers/{internal}/idleLendingPercent")}]);
    policies
        .patch(
            "default",
            &PatchParams::default(),
            &Patch::Json::<()>(serde_json::from_value(restore).unwrap()),
        )
        .await
        .unwrap();
    let cohorts: Vec<String> = Api::<Cohort>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .iter()
        .map(|c| c.name_any())
        .collect();
    assert_eq!(cohorts, ["gpu-tenancy.internal.default"], "{writes:#?}");
    let beta = Api::<ClusterQueue>::all(client.clone())
        .get("gpu-tenancy-team-beta")
        .await
        .unwrap();
    assert_eq!(beta.spec.cohort_name.as_deref(), Some("gpu-tenancy.internal.default"));
    assert!(
        beta.spec.resource_groups[0].flavors[0].resources[0]
            .lending_limit
            .is_some()
    );
    // Back without lending: the cohort goes.
    converge(&client, &c).await;
    assert!(
        Api::<Cohort>::all(client.clone())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

/// Kueue installed while the controller runs: the real controller binary, asking discovery again
/// every second, watches Kueue's kinds once they are served and writes the queues, without a
/// restart (and keeps its lease).
#[tokio::test]
async fn kueue_queues_are_written_once_its_crds_are_installed_without_a_restart() {
    use gpu_tenancy_e2e::procs::{ControllerProcess, lease_holder, wait_for_leader};
    let cleanup = Cleanup::new();
    let client = setup(&cleanup).await;
    apply_examples().await;
    for n in create_fleet(&client).await {
        cleanup.add_resource("nodes", &n);
        cleanup.add("GpuNode", &n);
    }
    let identity = "kueue-rediscovery";
    let mut controller = ControllerProcess::start_with_args(identity, 5, &["--discovery-interval", "1"]);
    wait_for_leader(&client, identity, Duration::from_secs(60)).await;
    let tenants: Api<GpuTenant> = Api::all(client.clone());
    let queue_named = || async {
        tenants
            .get("acme")
            .await
            .ok()
            .and_then(|t| t.status)
            .and_then(|s| s.queue)
    };
    // Planning without Kueue first: the tenant's status gets written, naming no queue.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while tenants
        .get("acme")
        .await
        .unwrap()
        .status
        .is_none_or(|s| s.summary.is_none())
    {
        assert!(std::time::Instant::now() < deadline, "acme's status never written");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(queue_named().await, None);
    let _crds = KueueCrds::install(&client).await;
    let queues: Api<ClusterQueue> = Api::all(client.clone());
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while queues.get_opt("gpu-tenancy-acme").await.unwrap().is_none() || queue_named().await.is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the running controller wrote no queue within 60 s of Kueue's CRDs"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(queue_named().await.as_deref(), Some("gpu-tenancy-acme"));
    assert_eq!(
        lease_holder(&client).await.as_deref(),
        Some(identity),
        "the lease was kept"
    );
    // Stopped before Kueue's CRDs go, which it would then fail to write.
    controller.terminate();
}
