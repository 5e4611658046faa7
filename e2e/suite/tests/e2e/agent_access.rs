//! deploy/base/agent-node-policy.yaml on the real API server: the agent's ClusterRole lets it
//! write every GpuNode and every Node's labels; the ValidatingAdmissionPolicy narrows that to its
//! own node, named by the `authentication.kubernetes.io/node-name` extra of a service account
//! token bound to a pod. The test acts as the agent by impersonation (user, groups and that
//! extra), the way Kubernetes' own per-node-update e2e test does.

use std::collections::HashMap;

use gpu_tenancy_e2e::access::{OPERATOR_SA_GROUPS, eventually, impersonating, outcome};
use gpu_tenancy_e2e::{Cleanup, Names, api, apply_docs_as_kubectl, client, ensure_crds, repo_root, yaml_docs};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// The agent's service account (deploy/base/agent-rbac.yaml).
const AGENT_USER: &str = "system:serviceaccount:gpu-tenancy-system:gpu-tenancy-agent";
/// The user extra a pod-bound service account token carries.
const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";
const POLICY: &str = "gpu-tenancy-agent-own-node";
const POLICY_FILE: &str = "deploy/base/agent-node-policy.yaml";

/// A client acting as the agent's service account, from a pod on `node` (None: no node extra).
async fn agent_client(node: Option<&str>) -> Client {
    let extra = node.map(|n| HashMap::from([(NODE_NAME_EXTRA.to_owned(), vec![n.to_owned()])]));
    impersonating(AGENT_USER, &OPERATOR_SA_GROUPS, extra).await
}

/// Applies the objects of `docs` (server-side) and registers them with `cleanup`.
async fn apply(docs: &[Value], cleanup: &Cleanup, what: &str) {
    for d in docs {
        let kind = d["kind"].as_str().unwrap();
        let resource = match kind {
            "ValidatingAdmissionPolicy" => "validatingadmissionpolicies.admissionregistration.k8s.io",
            "ValidatingAdmissionPolicyBinding" => "validatingadmissionpolicybindings.admissionregistration.k8s.io",
            "ClusterRole" => "clusterroles.rbac.authorization.k8s.io",
            "ClusterRoleBinding" => "clusterrolebindings.rbac.authorization.k8s.io",
            other => panic!("unexpected {other}"),
        };
        cleanup.add_resource(resource, d["metadata"]["name"].as_str().unwrap());
    }
    apply_docs_as_kubectl(docs, &format!("agent-access-{what}")).await;
}

async fn patch_status(client: &Client, name: &str) -> Result<(), String> {
    let patch = json!({"status": {"layout": "e2e-agent-access"}});
    outcome(
        api(client, "GpuNode")
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await,
    )
}

async fn label_node(client: &Client, name: &str) -> Result<(), String> {
    let patch = json!({"metadata": {"labels": {"gputenancy.io/config.state": "x"}}});
    outcome(
        Api::<Node>::all(client.clone())
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await,
    )
}

async fn create_gpunode(client: &Client, name: &str) -> Result<(), String> {
    let obj: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "gputenancy.io/v1alpha1",
        "kind": "GpuNode",
        "metadata": {"name": name},
        "spec": {},
    }))
    .unwrap();
    outcome(api(client, "GpuNode").create(&PostParams::default(), &obj).await)
}

#[track_caller]
fn assert_refused(r: Result<(), String>, rule: &str, what: &str) {
    let msg = r.expect_err(what);
    assert!(
        msg.contains(POLICY) && msg.contains(rule) && msg.contains("(403)"),
        "{what}: refused, but not by {POLICY} rule {rule}: {msg}"
    );
}

#[tokio::test]
async fn agent_writes_only_its_own_nodes_gpunode_and_node() {
    let admin = client().await;
    ensure_crds(&admin).await;
    let cleanup = Cleanup::new();
    let names = Names::new("agent-access");
    let base = names.next();
    let (a, b, c) = (format!("{base}-a"), format!("{base}-b"), format!("{base}-c"));

    // The agent's cluster-wide permissions and the policy, from deploy/base.
    let rbac: Vec<Value> = yaml_docs(&repo_root().join("deploy/base/agent-rbac.yaml"))
        .into_iter()
        .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "ClusterRoleBinding")
        .collect();
    assert_eq!(
        rbac.len(),
        2,
        "deploy/base/agent-rbac.yaml: the agent's ClusterRole and binding"
    );
    apply(&rbac, &cleanup, "rbac").await;
    let policy = yaml_docs(&repo_root().join(POLICY_FILE));
    assert_eq!(policy.len(), 2, "{POLICY_FILE}: the policy and its binding");
    for d in &policy {
        assert_eq!(d["metadata"]["name"], POLICY);
    }
    assert_eq!(policy[0]["spec"]["failurePolicy"], "Fail");
    apply(&policy, &cleanup, "policy").await;

    // Two Nodes, and GpuNode b (the agent of node a creates its own).
    for n in [&a, &b] {
        cleanup.add_resource("nodes", n);
        let mut node = Node::default();
        node.metadata.name = Some(n.clone());
        Api::<Node>::all(admin.clone())
            .create(&PostParams::default(), &node)
            .await
            .unwrap_or_else(|e| panic!("creating Node {n}: {e}"));
    }
    for n in [&a, &b, &c] {
        cleanup.add("GpuNode", n);
    }
    create_gpunode(&admin, &b).await.expect("the admin creates GpuNode b");

    let agent_a = agent_client(Some(&a)).await;

    // Wait until the policy is in force: the agent of a patching b's status is refused by it
    // (not by RBAC, which refuses with a different message until the binding is seen).
    let r = eventually(
        "agent of a patches GpuNode b's status",
        || patch_status(&agent_a, &b),
        |r| r.as_ref().is_err_and(|m| m.contains(POLICY)),
    )
    .await;
    assert_refused(
        r,
        "rule agent-writes-its-own-node",
        "agent of a patches GpuNode b's status",
    );

    // Its own GpuNode: created, then its status patched.
    // (Authorization passed above: the agent's ClusterRole is in force too.)
    create_gpunode(&agent_a, &a)
        .await
        .expect("the agent of a creates GpuNode a");
    patch_status(&agent_a, &a)
        .await
        .expect("the agent of a patches GpuNode a's status");
    let status = api(&admin, "GpuNode").get(&a).await.unwrap().data["status"].clone();
    assert_eq!(status["layout"], "e2e-agent-access");

    // Another node's GpuNode: neither created nor updated (spec or status).
    let r = create_gpunode(&agent_a, &c).await;
    assert_refused(r, "rule agent-writes-its-own-node", "agent of a creates GpuNode c");
    let r = patch_status(&agent_a, &b).await;
    assert_refused(
        r,
        "rule agent-writes-its-own-node",
        "agent of a patches GpuNode b's status",
    );
    let r = r_msg(&patch_status(&agent_a, &b).await);
    assert!(r.contains(&format!("node {a} may not write GpuNode {b}")), "{r}");

    // Node labels: its own, yes; another node's, no.
    label_node(&agent_a, &a).await.expect("the agent of a labels Node a");
    let r = label_node(&agent_a, &b).await;
    assert_refused(r.clone(), "rule agent-writes-its-own-node", "agent of a labels Node b");
    assert!(r_msg(&r).contains(&format!("node {a} may not write Node {b}")), "{r:?}");
    let node_b = Api::<Node>::all(admin.clone()).get(&b).await.unwrap();
    assert!(
        !node_b
            .metadata
            .labels
            .unwrap_or_default()
            .contains_key("gputenancy.io/config.state"),
        "Node b was labelled"
    );

    // The agent's user without the node extra (a token not bound to a pod): refused, even for a.
    let unbound = agent_client(None).await;
    let r = patch_status(&unbound, &a).await;
    assert_refused(
        r,
        "rule agent-request-from-its-pod",
        "the agent without node-name patches GpuNode a",
    );
    let r = label_node(&unbound, &a).await;
    assert_refused(
        r,
        "rule agent-request-from-its-pod",
        "the agent without node-name labels Node a",
    );

    // The device plugin's pods: the agent restarts (deletes) the one on its own node, never one
    // on another node. RBAC grants delete in the plugin's namespace (a Role of agent-rbac.yaml).
    let ns = "nvidia-device-plugin";
    let mut namespace = Namespace::default();
    namespace.metadata.name = Some(ns.to_string());
    let _ = Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &namespace)
        .await;
    let role: Vec<Value> = yaml_docs(&repo_root().join("deploy/base/agent-rbac.yaml"))
        .into_iter()
        .filter(|d| d["kind"] == "Role" || d["kind"] == "RoleBinding")
        .collect();
    assert_eq!(
        role.len(),
        2,
        "deploy/base/agent-rbac.yaml: the device plugin Role and binding"
    );
    apply_docs_as_kubectl(&role, "agent-access-role").await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let (on_a, on_b) = (format!("{base}-on-a"), format!("{base}-on-b"));
    for (pod, node) in [(&on_a, &a), (&on_b, &b)] {
        let p: Pod = serde_json::from_value(json!({"metadata": {"name": pod}, "spec": {"nodeName": node,
            "containers": [{"name": "plugin", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"}]}}))
        .unwrap();
        pods.create(&PostParams::default(), &p)
            .await
            .unwrap_or_else(|e| panic!("creating pod {pod}: {e}"));
    }
    let dry_delete = |client: Client, pod: String| async move {
        let dp = DeleteParams {
            dry_run: true,
            ..Default::default()
        };
        outcome(Api::<Pod>::namespaced(client, ns).delete(&pod, &dp).await.map(|_| ()))
    };
    let r = eventually(
        "agent of a deletes the plugin's pod on b",
        || dry_delete(agent_a.clone(), on_b.clone()),
        |r| r.as_ref().is_err_and(|m| m.contains(POLICY)),
    )
    .await;
    assert_refused(
        r.clone(),
        "rule agent-deletes-pods-of-its-node",
        "agent of a deletes a pod on b",
    );
    assert!(
        r_msg(&r).contains(&format!("node {a} may not delete pod {ns}/{on_b}")),
        "{r:?}"
    );
    eventually(
        "agent of a deletes the plugin's pod on a",
        || dry_delete(agent_a.clone(), on_a.clone()),
        |r| r.is_ok(),
    )
    .await
    .expect("the agent of a deletes the device plugin's pod on its node");
    let r = dry_delete(unbound.clone(), on_a.clone()).await;
    assert_refused(
        r,
        "rule agent-request-from-its-pod",
        "the agent without node-name deletes a pod",
    );
    for pod in [&on_a, &on_b] {
        pods.delete(pod, &DeleteParams::default().grace_period(0)).await.ok();
    }

    // Other users are not matched: the admin writes GpuNode b's status and labels Node b.
    patch_status(&admin, &b)
        .await
        .expect("the admin patches GpuNode b's status");
    label_node(&admin, &b).await.expect("the admin labels Node b");
}

fn r_msg(r: &Result<(), String>) -> String {
    r.clone().err().unwrap_or_default()
}
