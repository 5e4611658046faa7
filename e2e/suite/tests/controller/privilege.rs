//! Least privilege of the controller, judged by the API server itself: the
//! `gpu-tenancy controller` binary runs *as* its service account (kubeconfig impersonation)
//! with deploy/base/controller-rbac.yaml, through a converge of examples/, a tenant change and
//! a tenant deletion. The control plane's audit log (e2e/controlplane writes DIR/audit.log next
//! to the kubeconfig) says which requests that account sent and which were refused; a
//! SelfSubjectRulesReview as that account says what it is granted. Every grant must have been
//! used, or be listed below with why the run cannot show it; nothing may have been refused.

use crate::support::*;
use gpu_tenancy::api::{GpuNode, GpuPartitionPlan, GpuTenant};
use gpu_tenancy_e2e::access::{OPERATOR_SA_GROUPS, impersonating};
use gpu_tenancy_e2e::procs::{CONTROLLER_LEASE, CONTROLLER_NAMESPACE, ControllerProcess};
use gpu_tenancy_e2e::{Cleanup, kubeconfig_path, kubectl_async, repo_root};
use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use k8s_openapi::api::authorization::v1::{SelfSubjectRulesReview, SelfSubjectRulesReviewSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, ResourceQuota};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::io::{Read, Seek, SeekFrom};
use std::time::{Duration, Instant};

const CONTROLLER_SA: &str = "system:serviceaccount:gpu-tenancy-system:gpu-tenancy-controller";
/// An account of the same namespace bound to nothing: what every service account may do anyway
/// (discovery, self reviews), subtracted from the controller's grants.
const NOBODY_SA: &str = "system:serviceaccount:gpu-tenancy-system:gpu-tenancy-privilege-nobody";
/// The namespaces whose Roles the controller has; "default" shows its cluster-wide grants alone.
const REVIEWED: [&str; 3] = ["default", "gpu-tenancy-system", "nvidia-device-plugin"];

/// Grants this run cannot show in use, each with why it is needed: (verb, group, resource, why).
const NOT_SHOWN: &[(&str, &str, &str, &str)] = &[
    (
        "watch",
        "coordination.k8s.io",
        "leases",
        "every replica watches the Lease to take over at once when it is released; the audit log \
         shows that watch only once its response starts, which in a run this short it often has not",
    ),
    (
        "get",
        "gputenancy.io",
        "gputenants",
        "the API server checks it (verb get, any name) before it admits a policy or binding whose \
         parameter is a GpuTenant; that check is part of the create, not a request of its own",
    ),
    (
        "patch",
        "events.k8s.io",
        "events",
        "kube-runtime's Recorder patches an Event that repeats within its cache window; this run's events do not repeat",
    ),
];

/// One permission: verb, API group, resource (with "/subresource"), and the namespace it is
/// granted or used in ("" for cluster-wide or cluster-scoped).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Permission {
    verb: String,
    group: String,
    resource: String,
    namespace: String,
}

/// Leaves the cluster as a version with a policy per tenant would have: the tenants' shared
/// policies deleted, and `tenant`'s binding naming a policy of the tenant's own (created). Returns
/// that policy's name.
async fn upgrade_from_a_policy_per_tenant(client: &Client, tenant: &str) -> String {
    use gpu_tenancy::desired::{POLICY_PREFIX, TENANTS_CLAIMS_POLICY, TENANTS_POLICY};
    use gpu_tenancy::labels::{MANAGED_BY, MANAGED_BY_VALUE};
    let vaps = Api::<ValidatingAdmissionPolicy>::all(client.clone());
    let bindings = Api::<ValidatingAdmissionPolicyBinding>::all(client.clone());
    for p in [TENANTS_POLICY, TENANTS_CLAIMS_POLICY] {
        let _ = vaps.delete(p, &DeleteParams::default()).await;
    }
    let name = format!("{POLICY_PREFIX}{tenant}");
    let _ = vaps.delete(&name, &DeleteParams::default()).await;
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {MANAGED_BY: MANAGED_BY_VALUE}},
        "spec": {"failurePolicy": "Fail",
                 "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                     "operations": ["CREATE"], "resources": ["pods"]}]},
                 "validations": [{"expression": "true"}]}}))
    .unwrap();
    vaps.create(&PostParams::default(), &policy).await.unwrap();
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {MANAGED_BY: MANAGED_BY_VALUE}},
        "spec": {"policyName": name, "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {"matchExpressions": [
                     {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [tenant]}]}}}}))
    .unwrap();
    let _ = bindings.delete(&name, &DeleteParams::default()).await;
    bindings.create(&PostParams::default(), &binding).await.unwrap();
    name
}

/// The admin kubeconfig with `as`/`as-groups` set: the controller binary reads it like any
/// kubeconfig and every request it sends is the service account's.
fn controller_kubeconfig(dir: &std::path::Path) -> std::path::PathBuf {
    let text = std::fs::read_to_string(kubeconfig_path()).unwrap();
    let mut kc: Value = serde_saphyr::from_str(&text).expect("the kubeconfig is YAML");
    for user in kc["users"].as_array_mut().expect("kubeconfig users") {
        user["user"]["as"] = json!(CONTROLLER_SA);
        user["user"]["as-groups"] = json!(OPERATOR_SA_GROUPS);
    }
    let path = dir.join("controller.kubeconfig");
    std::fs::write(&path, serde_json::to_string(&kc).unwrap()).unwrap();
    path
}

/// What `user` may do in each reviewed namespace beyond what an unbound account may, as the
/// API server's authorizer answers (SelfSubjectRulesReview). Cluster-wide grants (seen in
/// "default") are recorded once with namespace "".
async fn granted(user: &str) -> BTreeSet<Permission> {
    let mut by_ns = Vec::new();
    for who in [user, NOBODY_SA] {
        let api: Api<SelfSubjectRulesReview> = Api::all(impersonating(who, &OPERATOR_SA_GROUPS, None).await);
        let mut sets = Vec::new();
        for ns in REVIEWED {
            let review = SelfSubjectRulesReview {
                spec: SelfSubjectRulesReviewSpec {
                    namespace: Some(ns.into()),
                },
                ..Default::default()
            };
            let status = api
                .create(&PostParams::default(), &review)
                .await
                .unwrap_or_else(|e| panic!("SelfSubjectRulesReview as {who} in {ns}: {e}"))
                .status
                .expect("a review answers with a status");
            assert!(
                !status.incomplete,
                "{who} in {ns}: incomplete rules: {:?}",
                status.evaluation_error
            );
            let mut set = BTreeSet::new();
            for r in status.resource_rules {
                assert!(
                    r.resource_names.as_ref().is_none_or(|n| n.is_empty()),
                    "{who}: a rule by name, {r:?}"
                );
                for verb in &r.verbs {
                    for group in r.api_groups.iter().flatten() {
                        for resource in r.resources.iter().flatten() {
                            assert!(
                                !(verb.contains('*') || group.contains('*') || resource.contains('*'))
                                    || who == NOBODY_SA,
                                "{who} has a wildcard grant: {r:?}"
                            );
                            set.insert((verb.clone(), group.clone(), resource.clone()));
                        }
                    }
                }
            }
            sets.push(set);
        }
        by_ns.push(sets);
    }
    let (mine, nobody) = (&by_ns[0], &by_ns[1]);
    let cluster: BTreeSet<_> = mine[0].difference(&nobody[0]).cloned().collect();
    let mut out = BTreeSet::new();
    for (i, ns) in REVIEWED.iter().enumerate() {
        for (verb, group, resource) in mine[i].difference(&nobody[i]) {
            let cluster_wide = cluster.contains(&(verb.clone(), group.clone(), resource.clone()));
            out.insert(Permission {
                verb: verb.clone(),
                group: group.clone(),
                resource: resource.clone(),
                namespace: if cluster_wide { String::new() } else { ns.to_string() },
            });
        }
    }
    out
}

/// The audit events after byte `offset` of the log that `user` sent (through impersonation).
fn audit_events(log: &std::path::Path, offset: u64, user: &str) -> Vec<Value> {
    let mut f = std::fs::File::open(log).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    let mut text = String::new();
    f.read_to_string(&mut text).unwrap();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["impersonatedUser"]["username"] == user)
        .collect()
}

fn permission_of(event: &Value) -> Option<Permission> {
    let o = &event["objectRef"];
    let resource = o["resource"].as_str()?;
    let resource = match o["subresource"].as_str() {
        Some(sub) => format!("{resource}/{sub}"),
        None => resource.to_owned(),
    };
    Some(Permission {
        verb: event["verb"].as_str()?.to_owned(),
        group: o["apiGroup"].as_str().unwrap_or("").to_owned(),
        resource,
        namespace: o["namespace"].as_str().unwrap_or("").to_owned(),
    })
}

fn code(event: &Value) -> i64 {
    event["responseStatus"]["code"].as_i64().unwrap_or(0)
}

/// Polls `done` every 250 ms until it holds; fails with `what` after `secs`.
async fn wait_for<F, Fut>(what: &str, secs: u64, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done().await {
        assert!(Instant::now() < deadline, "{what}: not within {secs} s");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Every GpuTenant and GpuPartitionPlan has Ready=True for its current generation.
async fn all_ready(client: &Client) -> bool {
    let ready = |conds: &[gpu_tenancy::api::Condition], generation: Option<i64>, observed: Option<i64>| {
        observed == generation && conds.iter().any(|c| c.type_ == "Ready" && c.status == "True")
    };
    let tenants = Api::<GpuTenant>::all(client.clone())
        .list(&Default::default())
        .await
        .unwrap();
    let plans = Api::<GpuPartitionPlan>::all(client.clone())
        .list(&Default::default())
        .await
        .unwrap();
    !tenants.items.is_empty()
        && tenants.iter().all(|t| {
            let s = t.status.clone().unwrap_or_default();
            ready(&s.conditions, t.metadata.generation, s.observed_generation)
        })
        && plans.iter().all(|p| {
            let s = p.status.clone().unwrap_or_default();
            ready(&s.conditions, p.metadata.generation, s.observed_generation)
        })
}

#[tokio::test]
async fn controller_service_account_is_granted_exactly_what_it_uses() {
    let t0 = Instant::now();
    let cleanup = Cleanup::new();
    let client = setup(&cleanup).await;
    let log = kubeconfig_path().with_file_name("audit.log");
    assert!(
        log.is_file(),
        "{} is missing: this test reads the audit log that e2e/controlplane writes next to its kubeconfig (run it with e2e/run.sh)",
        log.display()
    );
    let offset = std::fs::metadata(&log).unwrap().len();

    // The controller's RBAC exactly as deploy/base installs it.
    let rbac = repo_root().join("deploy/base/controller-rbac.yaml");
    for d in gpu_tenancy_e2e::yaml_docs(&rbac) {
        match d["kind"].as_str() {
            Some("ClusterRole") => cleanup.add_resource(
                "clusterroles.rbac.authorization.k8s.io",
                d["metadata"]["name"].as_str().unwrap(),
            ),
            Some("ClusterRoleBinding") => cleanup.add_resource(
                "clusterrolebindings.rbac.authorization.k8s.io",
                d["metadata"]["name"].as_str().unwrap(),
            ),
            _ => {}
        }
    }
    kubectl_async(vec![
        "apply".into(),
        "--server-side".into(),
        "-f".into(),
        rbac.display().to_string(),
    ])
    .await
    .ok();
    apply_examples().await;
    for n in create_fleet(&client).await {
        cleanup.add_resource("nodes", &n);
        cleanup.add("GpuNode", &n);
    }
    // Objects the controller must create, so that its creates show: the device plugin's
    // ConfigMap and the Lease (removed here), a tenant whose namespace does not exist yet (asking
    // for nothing, so the examples' grants stay as they are). And
    // an owned ConfigMap under another name (as after --device-plugin-config-map changed): the
    // controller's to delete.
    let settings = gpu_tenancy::desired::Settings::default();
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), &settings.device_plugin_namespace);
    let _ = config_maps
        .delete(&settings.device_plugin_config_map, &DeleteParams::default())
        .await;
    let stale = format!("{}-old", settings.device_plugin_config_map);
    let stale_cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": stale,
        "labels": {gpu_tenancy::labels::MANAGED_BY: gpu_tenancy::labels::MANAGED_BY_VALUE}}}))
    .unwrap();
    let _ = config_maps.delete(&stale, &DeleteParams::default()).await;
    config_maps.create(&PostParams::default(), &stale_cm).await.unwrap();
    // What an earlier version left: no tenants' policies, and acme's binding naming a policy of
    // acme's own. The controller creates the shared policies, moves the binding once its store
    // shows them, and then deletes the old policy.
    let old_policy = upgrade_from_a_policy_per_tenant(&client, "acme").await;
    let leases = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(client.clone(), CONTROLLER_NAMESPACE);
    let _ = leases.delete(CONTROLLER_LEASE, &DeleteParams::default()).await;
    let names = gpu_tenancy_e2e::Names::new("privilege");
    let new_tenant = names.next();
    cleanup.add("GpuTenant", &new_tenant);
    cleanup.add_resource("namespaces", &new_tenant);
    let tenants: Api<GpuTenant> = Api::all(client.clone());
    let spec = json!({"metadata": {"name": new_tenant},
        "spec": {"tier": "internal", "namespaces": [new_tenant], "resources": []}});
    tenants
        .create(&PostParams::default(), &serde_json::from_value(spec).unwrap())
        .await
        .unwrap();

    // The controller binary as its service account; the simulated agents apply every spec.
    let dir = std::env::temp_dir().join(format!("gt-privilege-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut controller = ControllerProcess::start_with_kubeconfig("privilege", 5, controller_kubeconfig(&dir));
    let agents_client = client.clone();
    let agents = tokio::spawn(async move {
        loop {
            agents_apply(&agents_client, None).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });

    // (a) It converges: every tenant and plan Ready, as in scenario a.
    let vaps = Api::<ValidatingAdmissionPolicy>::all(client.clone());
    let acme_binding = || async {
        Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
            .get_opt(&format!("{}acme", gpu_tenancy::desired::POLICY_PREFIX))
            .await
            .unwrap()
            .map(|b| b.spec.policy_name)
    };
    wait_for(
        "examples/ converged by the controller as its service account, acme's earlier policy gone",
        120,
        || async {
            all_ready(&client).await
                && config_maps.get_opt(&stale).await.unwrap().is_none()
                && vaps.get_opt(&old_policy).await.unwrap().is_none()
                && acme_binding().await.as_deref() == Some(gpu_tenancy::desired::TENANTS_POLICY)
        },
    )
    .await;
    let converged = t0.elapsed();

    // A tenant change: team-beta asks for other things, acme gives up a namespace (its quota
    // there is the controller's to delete: the tenant still owns it).
    change_team_beta(&client, "e2e-privilege").await;
    let mut acme = tenants.get("acme").await.unwrap();
    acme.spec.namespaces.retain(|n| n != "acme-dev");
    acme.metadata.managed_fields = None;
    tenants.replace("acme", &PostParams::default(), &acme).await.unwrap();
    let quotas = |ns: &str| Api::<ResourceQuota>::namespaced(client.clone(), ns);
    wait_for("the tenant change applied", 60, || async {
        all_ready(&client).await && quotas("acme-dev").get_opt("gpu-tenancy").await.unwrap().is_none()
    })
    .await;

    // The DRA mode's objects: the new tenant gets a GPU of a DRA pool of its own (a node of one
    // H100 that no example selects), so the controller writes its DeviceClass and the policy
    // renaming nvidia.com/gpu in its pods; the deletion below deletes both.
    let dra_node = format!("{new_tenant}-dra");
    cleanup.add_resource("nodes", &dra_node);
    cleanup.add("GpuNode", &dra_node);
    cleanup.add("GpuPartitionPlan", &dra_node);
    let node: k8s_openapi::api::core::v1::Node =
        serde_json::from_value(json!({"metadata": {"name": dra_node, "labels": {"pool": dra_node}}})).unwrap();
    Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    let gpu_nodes: Api<GpuNode> = Api::all(client.clone());
    gpu_nodes
        .create(&PostParams::default(), &GpuNode::new(&dra_node, Default::default()))
        .await
        .unwrap();
    let h100 = gpu_tenancy::api::GpuStatus {
        index: 0,
        uuid: format!("GPU-{dra_node}-0"),
        name: "NVIDIA H100 80GB HBM3".into(),
        pci_device_id: "0x233010DE".into(),
        memory_mib: 81559,
        numa_node: Some(0),
        ..Default::default()
    };
    let dra_status = gpu_tenancy::api::GpuNodeStatus {
        gpu_count: Some(1),
        gpus: vec![h100],
        ..Default::default()
    };
    write_status(&client, &dra_node, &dra_status).await;
    let dra_plan = json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuPartitionPlan", "metadata": {"name": dra_node},
        "spec": {"nodeSelector": {"matchLabels": {"pool": dra_node}}, "deviceAccess": "DRA",
                 "gpus": [{"devices": "all", "mode": "Exclusive", "tenants": [new_tenant]}]}});
    gpu_tenancy_e2e::apply_docs_as_kubectl(&[dra_plan], "the DRA plan").await;
    tenants
        .patch(
            &new_tenant,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"resources": [{"mode": "Exclusive", "count": 1}]}})),
        )
        .await
        .unwrap();
    let classes: Api<k8s_openapi::api::resource::v1::DeviceClass> = Api::all(client.clone());
    let maps: Api<k8s_openapi::api::admissionregistration::v1::MutatingAdmissionPolicy> = Api::all(client.clone());
    let class = format!("{new_tenant}.gpu.gputenancy.io");
    let rename = format!("{}{new_tenant}", gpu_tenancy::desired::MUTATION_PREFIX);
    wait_for("the DRA tenant's DeviceClass and rename policy written", 60, || async {
        classes.get_opt(&class).await.unwrap().is_some() && maps.get_opt(&rename).await.unwrap().is_some()
    })
    .await;

    // A tenant deletion that orphans its dependents, so the garbage collector leaves them and
    // the controller's own deletes are what removes them.
    tenants
        .delete(
            &new_tenant,
            &DeleteParams {
                propagation_policy: Some(PropagationPolicy::Orphan),
                ..DeleteParams::default()
            },
        )
        .await
        .unwrap();
    // Its DRA plan goes with it (a plan naming a tenant that is gone is not Ready).
    let _ = Api::<GpuPartitionPlan>::all(client.clone())
        .delete(&dra_node, &DeleteParams::default())
        .await;
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    let binding = format!("{}{new_tenant}", gpu_tenancy::desired::POLICY_PREFIX);
    wait_for(
        "the deleted tenant's quota and admission binding deleted by the controller",
        60,
        || async {
            tenants.get_opt(&new_tenant).await.unwrap().is_none()
                && bindings.get_opt(&binding).await.unwrap().is_none()
                && classes.get_opt(&class).await.unwrap().is_none()
                && maps.get_opt(&rename).await.unwrap().is_none()
                && quotas(&new_tenant).get_opt("gpu-tenancy").await.unwrap().is_none()
                && all_ready(&client).await
        },
    )
    .await;

    // An eviction an agent asks for: h100-mig's nodes go to busyGpuPolicy Evict, the agent of
    // gpu-h100-1 lists a GPU pod of its node in its status, and the controller reads the pod and
    // evicts it (its only get of one object, and its pods/eviction grant).
    let plans: Api<GpuPartitionPlan> = Api::all(client.clone());
    plans
        .patch(
            "h100-mig",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"rollout": {"busyGpuPolicy": "Evict"}}})),
        )
        .await
        .unwrap();
    // Applied as well as written: the simulated agents above write a node's whole status (read
    // before) once its spec's generation is new, and one that read it before the request below
    // was written would write it over (CI saw the request vanish and the wait below time out).
    wait_for(
        "gpu-h100-1's spec says busyGpuPolicy Evict and its agent applied it",
        60,
        || async {
            let n = gpu_nodes.get("gpu-h100-1").await.unwrap();
            n.spec.busy_gpu_policy == gpu_tenancy::api::BusyGpuPolicy::Evict
                && n.status.is_some_and(|s| s.observed_generation == n.metadata.generation)
        },
    )
    .await;
    let system_pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    let trainer: Pod = serde_json::from_value(json!({"metadata": {"name": "privilege-trainer"},
        "spec": {"nodeName": "gpu-h100-1", "containers": [{"name": "c", "image": "registry.invalid/cuda:12",
            "resources": {"limits": {"nvidia.com/mig-1g.10gb": 1}}}]}}))
    .unwrap();
    let trainer = system_pods.create(&PostParams::default(), &trainer).await.unwrap();
    let mut status = gpu_nodes.get("gpu-h100-1").await.unwrap().status.unwrap();
    status.eviction_requests = vec![gpu_tenancy::api::EvictionRequest {
        namespace: "kube-system".into(),
        name: trainer.name_any(),
        uid: trainer.uid().unwrap(),
        gpus: vec![4],
    }];
    write_status(&client, "gpu-h100-1", &status).await;
    wait_for("the asked-for pod evicted by the controller", 60, || async {
        // Should a late write of the simulated agents have replaced the status, ask again: what
        // is tested is the controller's eviction, not the test's race with its own agents.
        let asked = gpu_nodes
            .get("gpu-h100-1")
            .await
            .unwrap()
            .status
            .is_some_and(|s| !s.eviction_requests.is_empty());
        if !asked {
            write_status(&client, "gpu-h100-1", &status).await;
        }
        system_pods
            .get("privilege-trainer")
            .await
            .is_ok_and(|p| p.metadata.deletion_timestamp.is_some())
    })
    .await;
    status.eviction_requests.clear();
    write_status(&client, "gpu-h100-1", &status).await;
    let _ = system_pods
        .delete(
            "privilege-trainer",
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            },
        )
        .await;

    // A watch shows in the log when its response starts; a watcher may open it a moment after
    // its list (or after a retry): give each listed kind up to 15 s to show its watch.
    wait_for("a watch for every kind the controller listed", 15, || async {
        let events = audit_events(&log, offset, CONTROLLER_SA);
        let of = |verb: &str| -> BTreeSet<(String, String)> {
            events
                .iter()
                .filter(|e| e["verb"] == verb)
                .filter_map(permission_of)
                .map(|p| (p.group, p.resource))
                .collect()
        };
        let mut listed = of("list");
        listed.remove(&("coordination.k8s.io".to_string(), "leases".to_string())); // see NOT_SHOWN
        listed.is_subset(&of("watch"))
    })
    .await;

    // SIGTERM, as Kubernetes stops the pod: the controller gives its Lease up and exits.
    let exit = controller.terminate().expect("the controller was running");
    agents.abort();
    assert!(exit.success(), "the controller exited with {exit}");

    let events = audit_events(&log, offset, CONTROLLER_SA);
    let refused: Vec<String> = events
        .iter()
        .filter(|e| code(e) == 403)
        .map(|e| format!("{} {}", e["verb"], e["requestURI"]))
        .collect();
    // (c) Nothing it sent was refused (it would have retried and the steps above would hang
    // or be slow, but a refused read can hide behind a cache: the log says it directly).
    assert!(refused.is_empty(), "requests of the controller refused: {refused:#?}");
    let used: BTreeSet<Permission> = events.iter().filter_map(permission_of).collect();
    // An SSA patch that creates its object is authorised as create as well (201 Created).
    let created: BTreeSet<Permission> = events
        .iter()
        .filter(|e| e["verb"] == "patch" && code(e) == 201)
        .filter_map(permission_of)
        .map(|p| Permission {
            verb: "create".into(),
            ..p
        })
        .collect();
    let non_resource: BTreeSet<String> = events
        .iter()
        .filter(|e| e["objectRef"].is_null())
        .map(|e| format!("{} {}", e["verb"], e["requestURI"]))
        .collect();
    let grants = granted(CONTROLLER_SA).await;
    let covers = |g: &Permission, u: &Permission| {
        g.verb == u.verb
            && g.group == u.group
            && g.resource == u.resource
            && (g.namespace.is_empty() || g.namespace == u.namespace)
    };
    eprintln!(
        "MEASURE controller as its service account: converged in {converged:?}, whole run {:?}; {} requests, \
         {} distinct permissions used, {} granted; non-resource requests: {non_resource:?}",
        t0.elapsed(),
        events.len(),
        used.len(),
        grants.len()
    );
    for g in &grants {
        eprintln!("granted {g:?}");
    }
    for u in &used {
        eprintln!("used {u:?}");
    }
    let optional: BTreeSet<(String, String)> = gpu_tenancy::controller::kinds::TABLE
        .iter()
        .filter(|r| r.optional)
        .map(|r| {
            let ar = r.kind.api_resource();
            (ar.group, ar.plural)
        })
        .collect();
    // (b) Every grant was used (a create through a creating apply), or is listed with its reason.
    let unused: Vec<&Permission> = grants
        .iter()
        .filter(|g| !used.iter().chain(&created).any(|u| covers(g, u)))
        .filter(|g| {
            !NOT_SHOWN
                .iter()
                .any(|(v, gr, r, _)| g.verb == *v && g.group == *gr && g.resource == *r)
        })
        // The optional kinds (Kueue's) are not served here: granted, never watched nor written.
        .filter(|g| !optional.iter().any(|(gr, r)| g.group == *gr && g.resource == *r))
        .collect();
    assert!(
        unused.is_empty(),
        "granted to the controller and never used: {unused:#?}"
    );
    // Every NOT_SHOWN entry is still granted (a stale entry would hide nothing, but mislead).
    for (v, gr, r, why) in NOT_SHOWN {
        assert!(
            grants
                .iter()
                .any(|g| g.verb == *v && g.group == *gr && g.resource == *r),
            "NOT_SHOWN lists {v} {gr} {r} ({why}), which is not granted"
        );
    }
    // The controller's table of kinds is what it watched (each row listed, nothing else but the
    // Lease) and what deploy/base grants it (operator/tests/deploy_rbac.rs holds the file to it).
    let listed: BTreeSet<(String, String)> = used
        .iter()
        .filter(|u| u.verb == "list" && u.resource != "leases")
        .map(|u| (u.group.clone(), u.resource.clone()))
        .collect();
    let rows: BTreeSet<(String, String)> = gpu_tenancy::controller::kinds::TABLE
        .iter()
        .filter(|r| !r.optional)
        .map(|r| {
            let ar = r.kind.api_resource();
            (ar.group, ar.plural)
        })
        .collect();
    assert_eq!(listed, rows, "the kinds listed are the table's rows");
    for p in gpu_tenancy::controller::kinds::permissions() {
        assert!(
            grants
                .iter()
                .any(|g| g.verb == p.verb && g.group == p.group && g.resource == p.resource),
            "the table of kinds needs {p:?}, which is not granted"
        );
    }
    // And everything used is granted (the authorizer agrees with the review).
    let ungranted: Vec<&Permission> = used.iter().filter(|u| !grants.iter().any(|g| covers(g, u))).collect();
    assert!(ungranted.is_empty(), "used without a grant: {ungranted:#?}");

    // Leave the examples as the other scenarios expect them.
    apply_examples().await;
    std::fs::remove_dir_all(&dir).ok();
}
