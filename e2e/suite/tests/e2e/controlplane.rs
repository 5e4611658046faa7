//! The control plane itself does what the other tests and the operator rely on: pods are
//! admitted in namespaces the harness creates, ValidatingAdmissionPolicy is enforced, and the
//! controllers of kube-controller-manager that the operator counts on run: the garbage collector
//! (also for owners of our CRD kinds), the namespace controller and the serviceaccount controller.

use std::future::Future;
use std::time::{Duration, Instant};

use gpu_tenancy_e2e::{Cleanup, GROUP, Names, VERSION, api, client, create_namespace, ensure_crds};
use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use serde_json::json;

use crate::fixtures;

/// How long a controller may take to do its part. The GC, namespace and serviceaccount
/// controllers normally take well under a few seconds.
const CONTROLLER_LIMIT: Duration = Duration::from_secs(30);

fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..Default::default()
    }
}

#[tokio::test]
async fn pods_are_admitted_in_a_harness_namespace() {
    let client = client().await;
    let cleanup = Cleanup::new();
    let ns = Names::new("ns").next();
    create_namespace(&client, &cleanup, &ns, &[]).await;
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/none"}]}
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), &ns)
        .create(&dry_run(), &pod)
        .await
        .unwrap_or_else(|e| panic!("a plain pod in {ns} was refused: {e}"));
}

#[tokio::test]
async fn validating_admission_policy_is_enforced() {
    let client = client().await;
    let cleanup = Cleanup::new();
    let names = Names::new("vap");
    let ns = names.next();
    let policy_name = names.next();
    create_namespace(&client, &cleanup, &ns, &[("e2e.gputenancy.io/vap", &policy_name)]).await;

    let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
        "metadata": {"name": policy_name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["configmaps"]
            }]},
            "validations": [{
                "expression": "!has(object.data) || !('forbidden' in object.data)",
                "message": "configmaps here may not have a key named forbidden"
            }]
        }
    }))
    .unwrap();
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
        "metadata": {"name": policy_name},
        "spec": {
            "policyName": policy_name,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {"e2e.gputenancy.io/vap": policy_name}}}
        }
    }))
    .unwrap();
    cleanup.add_resource("validatingadmissionpolicies.admissionregistration.k8s.io", &policy_name);
    cleanup.add_resource(
        "validatingadmissionpolicybindings.admissionregistration.k8s.io",
        &policy_name,
    );
    Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .create(&PostParams::default(), &policy)
        .await
        .expect("creating the policy");
    Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("creating the binding");

    let cms = Api::<ConfigMap>::namespaced(client.clone(), &ns);
    let bad: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "bad"}, "data": {"forbidden": "x"}})).unwrap();
    let good: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "good"}, "data": {"fine": "x"}})).unwrap();
    // Policies take effect asynchronously (the API server's policy informer); poll.
    let mut last = String::from("accepted");
    for _ in 0..100 {
        match cms.create(&dry_run(), &bad).await {
            Err(kube::Error::Api(e)) if e.code == 422 || e.code == 403 => {
                last = e.message;
                break;
            }
            Err(e) => last = e.to_string(),
            Ok(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        last.contains("configmaps here may not have a key named forbidden") && last.contains(&policy_name),
        "the ValidatingAdmissionPolicy was not enforced within 10s; last answer: {last}"
    );
    cms.create(&dry_run(), &good)
        .await
        .expect("a configmap the policy allows was refused");
}

/// Polls `check` every 100 ms until it answers `Ok(true)`; panics after `limit` with `what` and
/// the last answer. Returns how long it took.
async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool, String>>,
{
    let start = Instant::now();
    loop {
        let last = match check().await {
            Ok(true) => return start.elapsed(),
            Ok(false) => String::from("not yet"),
            Err(e) => e,
        };
        assert!(start.elapsed() < limit, "{what}: not within {limit:?} (last: {last})");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `Ok(true)` once `get_opt` says the object is gone.
fn gone<K>(found: kube::Result<Option<K>>) -> Result<bool, String> {
    found.map(|o| o.is_none()).map_err(|e| e.to_string())
}

/// The garbage collector deletes the dependents of a deleted owner of one of our (cluster-scoped)
/// CRD kinds: a namespaced ConfigMap and a cluster-scoped ValidatingAdmissionPolicy, as the
/// operator's ResourceQuotas and admission policies depend on their GpuTenant. A dependent of an
/// owner that still exists stays.
#[tokio::test]
async fn garbage_collector_deletes_dependents_of_a_deleted_custom_resource() {
    let client = client().await;
    ensure_crds(&client).await;
    let cleanup = Cleanup::new();
    let names = Names::new("gc");
    let tenants = api(&client, "GpuTenant");
    let create_tenant = |name: String| {
        let tenants = tenants.clone();
        cleanup.add("GpuTenant", &name);
        async move {
            let obj: DynamicObject = serde_json::from_value(fixtures::valid("GpuTenant", &name)).unwrap();
            tenants
                .create(&PostParams::default(), &obj)
                .await
                .unwrap_or_else(|e| panic!("creating GpuTenant {name}: {e}"))
        }
    };
    let owner_ref = |t: &DynamicObject| {
        json!([{
            "apiVersion": format!("{GROUP}/{VERSION}"),
            "kind": "GpuTenant",
            "name": t.metadata.name.clone().unwrap(),
            "uid": t.metadata.uid.clone().expect("created GpuTenant has a uid"),
        }])
    };
    let doomed = create_tenant(names.next()).await;
    let kept = create_tenant(names.next()).await;
    let doomed_name = doomed.metadata.name.clone().unwrap();

    let ns = names.next();
    create_namespace(&client, &cleanup, &ns, &[]).await;
    let cms = Api::<ConfigMap>::namespaced(client.clone(), &ns);
    for (name, owner) in [("owned", &doomed), ("kept", &kept)] {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": name, "ownerReferences": owner_ref(owner)},
            "data": {"k": "v"}
        }))
        .unwrap();
        cms.create(&PostParams::default(), &cm)
            .await
            .unwrap_or_else(|e| panic!("creating configmap {ns}/{name}: {e}"));
    }
    let policy_name = names.next();
    cleanup.add_resource("validatingadmissionpolicies.admissionregistration.k8s.io", &policy_name);
    // No binding: the policy judges nothing.
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
        "metadata": {"name": policy_name, "ownerReferences": owner_ref(&doomed)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]
            }]},
            "validations": [{"expression": "true"}]
        }
    }))
    .unwrap();
    let policies = Api::<ValidatingAdmissionPolicy>::all(client.clone());
    policies
        .create(&PostParams::default(), &policy)
        .await
        .expect("creating the owned ValidatingAdmissionPolicy");

    tenants
        .delete(&doomed_name, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("deleting GpuTenant {doomed_name}: {e}"));
    let cm_took = eventually(
        CONTROLLER_LIMIT,
        &format!("configmap {ns}/owned deleted by the garbage collector after its GpuTenant"),
        || async { gone(cms.get_opt("owned").await) },
    )
    .await;
    let policy_took = eventually(
        CONTROLLER_LIMIT,
        &format!("ValidatingAdmissionPolicy {policy_name} deleted by the garbage collector after its GpuTenant"),
        || async { gone(policies.get_opt(&policy_name).await) },
    )
    .await;
    eprintln!(
        "garbage collector: namespaced dependent gone {cm_took:?}, cluster-scoped dependent gone {policy_took:?} after the owner's deletion"
    );
    cms.get("kept")
        .await
        .expect("the dependent of a GpuTenant that still exists was deleted");
}

/// Deleting a namespace deletes what is in it, then the namespace (no namespace stays
/// Terminating).
#[tokio::test]
async fn a_deleted_namespace_goes_away_with_its_content() {
    let client = client().await;
    let cleanup = Cleanup::new();
    let ns = Names::new("nsdel").next();
    create_namespace(&client, &cleanup, &ns, &[]).await;
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "content"}, "data": {"k": "v"}})).unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap_or_else(|e| panic!("creating configmap {ns}/content: {e}"));
    let namespaces = Api::<Namespace>::all(client.clone());
    namespaces
        .delete(&ns, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("deleting namespace {ns}: {e}"));
    let took = eventually(
        CONTROLLER_LIMIT,
        &format!("namespace {ns} gone after deletion"),
        || async { gone(namespaces.get_opt(&ns).await) },
    )
    .await;
    eprintln!("namespace controller: namespace with content gone {took:?} after its deletion");
}

/// A namespace gets its `default` ServiceAccount without anyone creating it.
#[tokio::test]
async fn a_new_namespace_gets_its_default_service_account() {
    let client = client().await;
    let cleanup = Cleanup::new();
    let ns = Names::new("sa").next();
    let mut namespace = Namespace::default();
    namespace.metadata.name = Some(ns.clone());
    cleanup.add_resource("namespaces", &ns);
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap_or_else(|e| panic!("creating namespace {ns}: {e}"));
    let sas = Api::<ServiceAccount>::namespaced(client.clone(), &ns);
    let took = eventually(
        CONTROLLER_LIMIT,
        &format!("serviceaccount {ns}/default created by the serviceaccount controller"),
        || async {
            sas.get_opt("default")
                .await
                .map(|o| o.is_some())
                .map_err(|e| e.to_string())
        },
    )
    .await;
    eprintln!("serviceaccount controller: {ns}/default present {took:?} after the namespace's creation");
}
