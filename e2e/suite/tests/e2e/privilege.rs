//! Least privilege on the real API server, by impersonation: what the node agent
//! and a tenant's users may do, as RBAC and the admission policies of deploy/base and of the
//! controller decide it. The controller's own service account is checked against the API
//! server's audit log in tests/controller/privilege.rs (it needs a cluster of its own).

use std::collections::HashMap;

use gpu_tenancy::desired::{POLICY_PREFIX, Settings, TENANTS_POLICY, desired};
use gpu_tenancy::planner::PlanInput;
use gpu_tenancy_e2e::access::{OPERATOR_SA_GROUPS, eventually, impersonating, outcome};
use gpu_tenancy_e2e::{
    Cleanup, Names, api, apply_docs_as_kubectl, client, create_namespace, ensure_crds, kubectl_async, repo_root,
    yaml_docs,
};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Client;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const AGENT_USER: &str = "system:serviceaccount:gpu-tenancy-system:gpu-tenancy-agent";
const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";
const AGENT_POLICY: &str = "gpu-tenancy-agent-own-node";
const VIEWER_ROLE: &str = "gpu-tenancy-tenant-viewer";

/// Refused by RBAC: 403 and the authorizer's "cannot VERB resource" (not a 404 or an admission
/// refusal, which would mean the request was authorised).
#[track_caller]
fn assert_forbidden_by_rbac(r: Result<(), String>, what: &str) {
    let msg = r.expect_err(what);
    assert!(
        msg.ends_with("(403)") && msg.contains("cannot "),
        "{what}: not refused by RBAC: {msg}"
    );
}

/// Applies `docs` server-side as the admin, registering each with `cleanup` under `resource`.
async fn apply_admin(docs: &[Value], cleanup: &Cleanup, what: &str) {
    for d in docs {
        let resource = match d["kind"].as_str().unwrap() {
            "ClusterRole" => "clusterroles.rbac.authorization.k8s.io",
            "ClusterRoleBinding" => "clusterrolebindings.rbac.authorization.k8s.io",
            "ValidatingAdmissionPolicy" => "validatingadmissionpolicies.admissionregistration.k8s.io",
            "ValidatingAdmissionPolicyBinding" => "validatingadmissionpolicybindings.admissionregistration.k8s.io",
            "SharingPolicy" | "GpuTenant" => {
                cleanup.add(d["kind"].as_str().unwrap(), d["metadata"]["name"].as_str().unwrap());
                continue;
            }
            _ => continue, // namespaced: deleted with their namespace
        };
        cleanup.add_resource(resource, d["metadata"]["name"].as_str().unwrap());
    }
    apply_docs_as_kubectl(docs, &format!("privilege-{what}")).await;
}

fn object(kind: &str, name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(
        json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": kind, "metadata": {"name": name}, "spec": spec}),
    )
    .unwrap()
}

/// Every write of the four kinds, as `client`: create, update (PUT), merge patch, server-side
/// apply, status patch, delete, delete of the collection. `existing[kind]` names an object of
/// that kind (RBAC decides before the object is looked up, so any name would do; a real one
/// makes an authorised request succeed rather than 404, which the assertion would also catch).
async fn assert_writes_forbidden(client: &Client, existing: &HashMap<&str, String>, who: &str) {
    for (kind, _, _) in gpu_tenancy_e2e::KINDS {
        let a = api(client, kind);
        let name = &existing[kind];
        let mut obj = object(kind, &format!("{name}-new"), json!({}));
        let what = |verb: &str| format!("{who}: {verb} {kind}");
        assert_forbidden_by_rbac(outcome(a.create(&PostParams::default(), &obj).await), &what("create"));
        obj.metadata.name = Some(name.clone());
        obj.metadata.resource_version = Some("1".into());
        assert_forbidden_by_rbac(
            outcome(a.replace(name, &PostParams::default(), &obj).await),
            &what("update"),
        );
        let patch = json!({"metadata": {"labels": {"gputenancy.io/e2e-privilege": "x"}}});
        assert_forbidden_by_rbac(
            outcome(a.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await),
            &what("patch"),
        );
        let apply = json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": kind, "metadata": {"name": name}});
        assert_forbidden_by_rbac(
            outcome(
                a.patch(name, &PatchParams::apply("e2e").force(), &Patch::Apply(&apply))
                    .await,
            ),
            &what("apply"),
        );
        let status = json!({"status": {"observedGeneration": 99}});
        assert_forbidden_by_rbac(
            outcome(
                a.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
                    .await,
            ),
            &what("patch the status of"),
        );
        assert_forbidden_by_rbac(outcome(a.delete(name, &DeleteParams::default()).await), &what("delete"));
        assert_forbidden_by_rbac(
            outcome(a.delete_collection(&DeleteParams::default(), &Default::default()).await),
            &what("delete all"),
        );
    }
}

/// What deploy/base gives the agent but the per-node policy does not cover yet, and what it
/// must never have: GpuNode specs (the controller's), the other kinds, statuses other than its
/// GpuNode's, its own Node's taints and other labels (the controller's enforcement), namespaces.
#[tokio::test]
async fn agent_cannot_write_specs_other_kinds_or_its_nodes_taints() {
    let admin = client().await;
    ensure_crds(&admin).await;
    let cleanup = Cleanup::new();
    let names = Names::new("privilege-agent");
    let base = names.next();
    let node = format!("{base}-a");

    let rbac: Vec<Value> = yaml_docs(&repo_root().join("deploy/base/agent-rbac.yaml"))
        .into_iter()
        .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "ClusterRoleBinding")
        .collect();
    apply_admin(&rbac, &cleanup, "agent-rbac").await;
    apply_admin(
        &yaml_docs(&repo_root().join("deploy/base/agent-node-policy.yaml")),
        &cleanup,
        "agent-policy",
    )
    .await;

    // Its Node, tainted and labelled by the controller, and one object of each kind.
    cleanup.add_resource("nodes", &node);
    let n: Node = serde_json::from_value(json!({"metadata": {"name": node, "labels": {
        "nvidia.com/device-plugin.config": "mig-mixed", "gputenancy.io/dedicated": "acme"}},
        "spec": {"taints": [{"key": "gputenancy.io/dedicated", "value": "acme", "effect": "NoSchedule"}]}}))
    .unwrap();
    Api::<Node>::all(admin.clone())
        .create(&PostParams::default(), &n)
        .await
        .unwrap();
    let mut existing = HashMap::new();
    for (kind, spec) in [
        ("SharingPolicy", json!({"tiers": [{"name": "t", "modes": ["MIG"]}]})),
        ("GpuTenant", json!({"tier": "t", "namespaces": [format!("{base}-ns")]})),
        (
            "GpuPartitionPlan",
            json!({"nodeSelector": {"matchLabels": {"pool": base}}, "gpus": [{"devices": "all", "mode": "MIG", "mig": {"profiles": []}}]}),
        ),
        ("GpuNode", json!({})),
    ] {
        let name = if kind == "GpuNode" {
            node.clone()
        } else {
            format!("{base}-{}", kind.to_lowercase())
        };
        cleanup.add(kind, &name);
        api(&admin, kind)
            .create(&PostParams::default(), &object(kind, &name, spec))
            .await
            .unwrap_or_else(|e| panic!("creating {kind} {name}: {e}"));
        existing.insert(kind, name);
    }

    let agent = impersonating(
        AGENT_USER,
        &OPERATOR_SA_GROUPS,
        Some(HashMap::from([(NODE_NAME_EXTRA.to_owned(), vec![node.clone()])])),
    )
    .await;
    let nodes = Api::<Node>::all(agent.clone());
    let label = |key: &str| json!({"metadata": {"labels": {key: "x"}}});
    // Wait for RBAC and the policy: the agent labels its node's config state (what it does).
    eventually(
        "the agent sets its node's config.state label",
        || {
            let (nodes, node) = (nodes.clone(), node.clone());
            async move {
                let p = json!({"metadata": {"labels": {"gputenancy.io/config.state": "success"}}});
                outcome(nodes.patch(&node, &PatchParams::default(), &Patch::Merge(&p)).await)
            }
        },
        |r| r.is_ok(),
    )
    .await
    .unwrap();
    // The policy reaches admission a moment after its binding: wait until it refuses the agent's
    // user without a node (a probe that changes nothing when it is let through).
    let unbound = Api::<Node>::all(impersonating(AGENT_USER, &OPERATOR_SA_GROUPS, None).await);
    eventually(
        "the policy refuses the agent without its node",
        || {
            let (unbound, node) = (unbound.clone(), node.clone());
            async move {
                let p = json!({"metadata": {"labels": {"gputenancy.io/config.state": "success"}}});
                outcome(unbound.patch(&node, &PatchParams::default(), &Patch::Merge(&p)).await)
            }
        },
        |r| r.as_ref().is_err_and(|m| m.contains(AGENT_POLICY)),
    )
    .await
    .unwrap_err();
    let untaint = json!({"spec": {"taints": null}});
    let r = outcome(
        nodes
            .patch(&node, &PatchParams::default(), &Patch::Merge(&untaint))
            .await,
    );
    let msg = r.unwrap_err();
    assert!(msg.contains("rule agent-changes-only-its-config-state"), "{msg}");
    let after = Api::<Node>::all(admin.clone()).get(&node).await.unwrap();
    let taints = after.spec.unwrap().taints.unwrap_or_default();
    assert!(
        taints.iter().any(|t| t.key == "gputenancy.io/dedicated"),
        "the dedicated taint was removed: {taints:?}"
    );
    let cordon = json!({"spec": {"unschedulable": true}});
    let r = outcome(
        nodes
            .patch(&node, &PatchParams::default(), &Patch::Merge(&cordon))
            .await,
    );
    assert!(
        r.as_ref()
            .is_err_and(|m| m.contains("agent-changes-only-its-config-state")),
        "cordon: {r:?}"
    );
    for key in [
        "nvidia.com/device-plugin.config",
        "gputenancy.io/dedicated",
        "gputenancy.io/e2e-privilege",
    ] {
        let r = outcome(
            nodes
                .patch(&node, &PatchParams::default(), &Patch::Merge(&label(key)))
                .await,
        );
        assert!(
            r.as_ref()
                .is_err_and(|m| m.contains("agent-changes-only-its-config-state")),
            "the agent set label {key} on its node: {r:?}"
        );
    }
    let drop_label = json!({"metadata": {"labels": {"gputenancy.io/dedicated": null}}});
    let r = outcome(
        nodes
            .patch(&node, &PatchParams::default(), &Patch::Merge(&drop_label))
            .await,
    );
    assert!(r.is_err(), "the agent removed its node's dedicated label");
    assert_forbidden_by_rbac(
        outcome(nodes.delete(&node, &DeleteParams::default()).await),
        "the agent deletes its Node",
    );
    let status = json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}});
    assert_forbidden_by_rbac(
        outcome(
            nodes
                .patch_status(&node, &PatchParams::default(), &Patch::Merge(&status))
                .await,
        ),
        "the agent patches its Node's status",
    );

    // Its own GpuNode's spec is the controller's: no patch, update or apply (RBAC: create only).
    let gn = api(&agent, "GpuNode");
    let spec = json!({"spec": {"plan": "mine"}});
    assert_forbidden_by_rbac(
        outcome(gn.patch(&node, &PatchParams::default(), &Patch::Merge(&spec)).await),
        "the agent patches its GpuNode's spec",
    );
    assert_forbidden_by_rbac(
        outcome(gn.delete(&node, &DeleteParams::default()).await),
        "the agent deletes its GpuNode",
    );
    // The other kinds: nothing but reading GpuNodes.
    for kind in ["SharingPolicy", "GpuTenant", "GpuPartitionPlan"] {
        let a = api(&agent, kind);
        let name = &existing[kind];
        assert_forbidden_by_rbac(outcome(a.get(name).await), &format!("the agent reads {kind}"));
        let p = json!({"metadata": {"labels": {"x": "y"}}});
        assert_forbidden_by_rbac(
            outcome(a.patch(name, &PatchParams::default(), &Patch::Merge(&p)).await),
            &format!("the agent patches {kind}"),
        );
        assert_forbidden_by_rbac(
            outcome(
                a.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
                    .await,
            ),
            &format!("the agent patches {kind}'s status"),
        );
        assert_forbidden_by_rbac(
            outcome(
                a.create(&PostParams::default(), &object(kind, &format!("{name}-2"), json!({})))
                    .await,
            ),
            &format!("the agent creates a {kind}"),
        );
    }
    // Namespaces (a tenant's label is what binds its admission policy) and other namespaces' pods.
    let ns = json!({"metadata": {"labels": {"gputenancy.io/tenant": "x"}}});
    assert_forbidden_by_rbac(
        outcome(
            Api::<Namespace>::all(agent.clone())
                .patch("default", &PatchParams::default(), &Patch::Merge(&ns))
                .await,
        ),
        "the agent labels a namespace",
    );
    assert_forbidden_by_rbac(
        outcome(
            Api::<Pod>::namespaced(agent.clone(), "default")
                .delete("any", &DeleteParams::default())
                .await,
        ),
        "the agent deletes a pod outside the device plugin's namespace",
    );
}

/// A team's developers: a namespace Role (pods, deployments) from the platform team, plus the
/// tenant viewer role of deploy/base. They read their tenant's status, write none of the four
/// kinds, cannot move their namespace out of its tenant, and the admission policy the controller
/// writes for the tenant judges their pods.
#[tokio::test]
async fn tenant_users_read_their_status_write_nothing_and_are_judged_by_admission() {
    let admin = client().await;
    ensure_crds(&admin).await;
    let cleanup = Cleanup::new();
    let names = Names::new("privilege-team");
    let (team, other) = (names.next(), names.next());
    let (ns, other_ns, policy_name) = (format!("{team}-ns"), format!("{other}-ns"), names.next());
    let group = format!("{team}-developers");
    let user = format!("dev@{team}");

    // The tenant viewer role as deploy/base ships it, bound by the platform team to the team.
    let viewer = yaml_docs(&repo_root().join("deploy/base/tenant-viewer.yaml"));
    assert_eq!(viewer.len(), 1, "deploy/base/tenant-viewer.yaml: one ClusterRole");
    assert_eq!(viewer[0]["metadata"]["name"], VIEWER_ROLE);
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": format!("{team}-tenant-viewer")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": VIEWER_ROLE},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}]});
    apply_admin(&[viewer[0].clone(), binding], &cleanup, "viewer").await;

    // A MIG-only tier, the team's tenant and another tenant with dedicated nodes.
    let policy = json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "SharingPolicy", "metadata": {"name": policy_name},
        "spec": {"tiers": [{"name": "mig-only", "modes": ["MIG"], "coLocation": "Forbidden"}]}});
    let tenant = |name: &str, ns: &str| {
        json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuTenant", "metadata": {"name": name},
            "spec": {"tier": "mig-only", "policyRef": policy_name, "namespaces": [ns],
                     "resources": [{"mode": "MIG", "profile": "1g.10gb", "count": 1}]}})
    };
    let objects = [policy, tenant(&team, &ns), tenant(&other, &other_ns)];
    apply_admin(&objects, &cleanup, "tenants").await;
    for (t, n) in [(&team, &ns), (&other, &other_ns)] {
        create_namespace(&admin, &cleanup, n, &[("gputenancy.io/tenant", t)]).await;
    }
    // The platform team's Role for the developers, in their namespace only.
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "developers", "namespace": ns},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create"]},
                  {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list", "watch", "create"]}]});
    let role_binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "developers", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "developers"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}]});
    apply_admin(&[role, role_binding], &cleanup, "role").await;

    // What the controller writes for these tenants: their statuses and admission policies.
    let input_policies = vec![serde_json::from_value(objects[0].clone()).unwrap()];
    let input_tenants: Vec<_> = objects[1..]
        .iter()
        .map(|t| serde_json::from_value(t.clone()).unwrap())
        .collect();
    // One H100 cut into 1g.10gb instances, so the team holds a grant (a pod may ask only for
    // what its tenant was granted).
    let plan: gpu_tenancy::api::GpuPartitionPlan = serde_json::from_value(json!({
        "apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuPartitionPlan", "metadata": {"name": format!("{team}-plan")},
        "spec": {"nodeSelector": {"matchLabels": {"pool": team}}, "gpus": [{"devices": "all", "mode": "MIG",
            "mig": {"profiles": ["1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb"]}}]}}))
    .unwrap();
    let inventory: gpu_tenancy::inventory::InventoryFile = serde_saphyr::from_str(&format!(
        "nodes:\n- name: {team}-node\n  labels: {{pool: {team}}}\n  gpus:\n  - {{pciDeviceId: \"0x233010DE\"}}\n"
    ))
    .unwrap();
    let nodes = inventory.resolve().unwrap();
    let d = desired(
        &PlanInput {
            policies: &input_policies,
            tenants: &input_tenants,
            plans: std::slice::from_ref(&plan),
            nodes: &nodes,
        },
        &Settings::default(),
        &Time(jiff::Timestamp::now()),
    );
    let mine = |n: &str| n.starts_with(POLICY_PREFIX) && (n.ends_with(&team) || n.ends_with(&other));
    let admission: Vec<Value> = d
        .admission_bindings
        .iter()
        .filter(|b| mine(&b.name_any()))
        .map(|b| serde_json::to_value(b).unwrap())
        .collect();
    assert_eq!(admission.len(), 2, "a binding per tenant: {admission:#?}");
    // The tenants' pod policy, every tenant's (other tests bind it too): left in place, it judges
    // nothing without a binding.
    let shared: Vec<Value> = d
        .admission_policies
        .iter()
        .filter(|p| p.name_any() == TENANTS_POLICY)
        .map(|p| serde_json::to_value(p).unwrap())
        .collect();
    assert_eq!(shared.len(), 1, "{:#?}", d.admission_policies);
    apply_docs_as_kubectl(&shared, "privilege-tenants-policy").await;
    apply_admin(&admission, &cleanup, "admission").await;
    let written = d
        .tenants
        .iter()
        .find(|t| t.name_any() == team)
        .unwrap()
        .status
        .clone()
        .unwrap();
    api(&admin, "GpuTenant")
        .patch_status(
            &team,
            &PatchParams::apply("gpu-tenancy-controller").force(),
            &Patch::Apply(json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuTenant", "status": written})),
        )
        .await
        .unwrap();

    let dev = impersonating(&user, &[&group, "system:authenticated"], None).await;
    // Reads its tenant's status: what the admin reads.
    let tenants = api(&dev, "GpuTenant");
    eventually(
        "the developer reads its GpuTenant",
        || {
            let tenants = tenants.clone();
            let team = team.clone();
            async move { outcome(tenants.get(&team).await) }
        },
        |r| r.is_ok(),
    )
    .await
    .unwrap();
    let seen = tenants.get(&team).await.unwrap();
    let truth = api(&admin, "GpuTenant").get(&team).await.unwrap();
    assert_eq!(seen.data["status"], truth.data["status"]);
    let ready = seen.data["status"]["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .any(|c| c["type"] == "Valid" && c["status"] == "True");
    assert!(
        ready,
        "the status the developer reads says Valid: {}",
        seen.data["status"]
    );
    tenants
        .list(&Default::default())
        .await
        .expect("the developer lists GpuTenants");
    let out = kubectl_async(vec![
        "get".into(),
        "gputenant".into(),
        team.clone(),
        format!("--as={user}"),
        format!("--as-group={group}"),
    ])
    .await
    .ok();
    assert!(out.contains(&team), "{out}");

    // Writes nothing of the operator's (its GpuTenant's status is also its admission policies'
    // parameter: what its pods may ask for).
    let mut existing = HashMap::from([("GpuTenant", team.clone()), ("SharingPolicy", policy_name.clone())]);
    existing.insert("GpuPartitionPlan", format!("{team}-plan"));
    existing.insert("GpuNode", format!("{team}-node"));
    assert_writes_forbidden(&dev, &existing, "a tenant's developer").await;
    for kind in ["SharingPolicy", "GpuPartitionPlan", "GpuNode"] {
        assert_forbidden_by_rbac(
            outcome(api(&dev, kind).list(&Default::default()).await),
            &format!("the developer lists {kind}"),
        );
    }
    // Cannot move its namespace out of its tenant (the label binds the admission policy), nor
    // touch the quota or the policy.
    let unlabel = json!({"metadata": {"labels": {"gputenancy.io/tenant": null}}});
    assert_forbidden_by_rbac(
        outcome(
            Api::<Namespace>::all(dev.clone())
                .patch(&ns, &PatchParams::default(), &Patch::Merge(&unlabel))
                .await,
        ),
        "the developer unlabels its namespace",
    );
    assert_forbidden_by_rbac(
        outcome(
            Api::<k8s_openapi::api::core::v1::ResourceQuota>::namespaced(dev.clone(), &ns)
                .delete("gpu-tenancy", &DeleteParams::default())
                .await,
        ),
        "the developer deletes its quota",
    );
    assert_forbidden_by_rbac(
        outcome(
            Api::<k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding>::all(dev.clone())
                .delete(&format!("{POLICY_PREFIX}{team}"), &DeleteParams::default())
                .await,
        ),
        "the developer deletes its admission binding",
    );

    // Its pods, judged by the tenant's admission policy (server-side dry runs).
    let pods = Api::<Pod>::namespaced(dev.clone(), &ns);
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let pod = |limits: Value, tolerations: Value| -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {
            "containers": [{"name": "c", "image": "registry.invalid/cuda:latest", "resources": {"limits": limits}}],
            "tolerations": tolerations}}))
        .unwrap()
    };
    let steal = pod(
        json!({}),
        json!([{"key": "gputenancy.io/dedicated", "operator": "Equal", "value": other, "effect": "NoSchedule"}]),
    );
    let r = eventually(
        "the developer's pod tolerating another tenant's dedicated taint",
        || {
            let (pods, steal, dry) = (pods.clone(), steal.clone(), dry.clone());
            async move { outcome(pods.create(&dry, &steal).await) }
        },
        // Until the admission plugin has read the tenant (its policy's parameter), the binding
        // refuses everything: wait for the rule's own message.
        |r| {
            r.as_ref()
                .is_err_and(|m| m.contains("may tolerate only its own dedicated nodes"))
        },
    )
    .await;
    let msg = r.unwrap_err();
    assert!(
        msg.contains(&format!(
            "GpuTenant {team} (tier mig-only) may tolerate only its own dedicated nodes (gputenancy.io/dedicated={team}), not another tenant's"
        )) && msg.ends_with("(403)"),
        "{msg}"
    );
    let msg = outcome(pods.create(&dry, &pod(json!({"nvidia.com/gpu": "1"}), json!([]))).await).unwrap_err();
    assert!(
        msg.contains(&format!(
            "GpuTenant {team} (tier mig-only) may not use nvidia.com/gpu: it was granted nvidia.com/mig-1g.10gb"
        )),
        "{msg}"
    );
    outcome(
        pods.create(&dry, &pod(json!({"nvidia.com/mig-1g.10gb": "1"}), json!([])))
            .await,
    )
    .expect("the developer's MIG pod is admitted");
    let deployment: k8s_openapi::api::apps::v1::Deployment = serde_json::from_value(json!({
        "metadata": {"name": "d"}, "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {
            "metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "registry.invalid/cuda:latest"}]}}}}))
    .unwrap();
    outcome(
        Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(dev.clone(), &ns)
            .create(&dry, &deployment)
            .await,
    )
    .expect("the developer creates a Deployment in its namespace");
    // Nothing in the other tenant's namespace.
    assert_forbidden_by_rbac(
        outcome(
            Api::<Pod>::namespaced(dev.clone(), &other_ns)
                .create(&dry, &pod(json!({}), json!([])))
                .await,
        ),
        "the developer creates a pod in another tenant's namespace",
    );
}
