//! The control plane itself does what the other tests and the operator rely on: pods are
//! admitted in namespaces the harness creates, and ValidatingAdmissionPolicy is enforced.

use std::time::Duration;

use gpu_tenancy_e2e::{Cleanup, Names, client, create_namespace};
use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, PostParams};
use serde_json::json;

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
