//! The hand-over evidence where the tenant reads it: the ResourceClaim's `status.devices` entry
//! the agent writes for each device it prepares, the same evidence in the GpuNode's
//! `status.claims`, who may write it (only the agent of the claim's node, only its own driver's
//! entries; not a tenant's `edit` role), and that a tenant reading its claim learns no other
//! tenant's name.

use super::NODE;
use gpu_tenancy::agent::dra::devices::DRIVER;
use gpu_tenancy::api::GpuNode;
use gpu_tenancy_e2e::access::{eventually, impersonating, outcome};
use gpu_tenancy_e2e::apply_docs_as_kubectl;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// What a device's evidence must say: `scrub`, `previousHolder`, and whether bytes were verified.
pub struct Want {
    pub scrub: &'static str,
    pub previous: &'static str,
    pub verified: bool,
}

/// The entry of `device` in claim `ns/name`'s `status.devices`, once the agent wrote it.
async fn entry(client: &Client, ns: &str, name: &str, device: &str) -> Value {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let c = api.get(name).await.expect("reading the claim");
        let found = c
            .status
            .as_ref()
            .and_then(|s| s.devices.as_ref())
            .and_then(|d| d.iter().find(|e| e.driver == DRIVER && e.device == device).cloned());
        if let Some(e) = found {
            return serde_json::to_value(e).unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "claim {ns}/{name} has no status.devices entry for {device} 30 s after Prepare: {:?}",
            c.status
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Claim `ns/name`, prepared with `device`, shows `want` in its `status.devices` and the GpuNode
/// the same evidence in `status.claims`; returns the claim's entry.
pub async fn shows(client: &Client, ns: &str, name: &str, device: &str, want: Want) -> Value {
    let e = entry(client, ns, name, device).await;
    let data = &e["data"];
    eprintln!("MEASURE evidence on claim {ns}/{name}: {data}");
    let what = format!("claim {ns}/{name}'s evidence {e}");
    assert_eq!(e["pool"], NODE, "{what}");
    assert_eq!(data["scrub"], want.scrub, "{what}");
    assert_eq!(data["previousHolder"], want.previous, "{what}");
    let bytes = data["bytesVerified"].as_u64();
    assert_eq!(bytes.is_some_and(|b| b > 0), want.verified, "{what}");
    assert!(data["handedOverAt"].is_string(), "{what}");
    assert_eq!(
        (&e["conditions"][0]["type"], &e["conditions"][0]["status"]),
        (&json!("Ready"), &json!("True")),
        "{what}"
    );
    // The GpuNode says the same for the device while the claim holds it.
    let nodes: Api<GpuNode> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n = nodes.get(NODE).await.expect("reading the GpuNode");
        let claims = n.status.map(|s| s.claims).unwrap_or_default();
        let mine = claims
            .iter()
            .find(|c| c.device == device && c.claim == format!("{ns}/{name}"));
        if let Some(c) = mine {
            assert_eq!(
                &serde_json::to_value(&c.evidence).unwrap(),
                data,
                "the GpuNode and the claim disagree on {ns}/{name}'s evidence"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "GpuNode {NODE} does not list {ns}/{name}: {claims:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    e
}

/// The edit role in `ns` for user `dev@<ns>`; a client acting as that user.
async fn developer(ns: &str) -> Client {
    let user = format!("dev@{ns}");
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "developers", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]});
    apply_docs_as_kubectl(&[binding], "the developers' RoleBinding").await;
    impersonating(&user, &["system:authenticated"], None).await
}

/// The body of a server-side apply of `ns/name`'s `status.devices` with one entry of `device`
/// in `pool` of `driver`, saying it was scrubbed.
fn forged(ns: &str, name: &str, driver: &str, pool: &str, device: &str) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "status": {"devices": [{"driver": driver, "pool": pool, "device": device,
            "data": {"scrub": "Scrubbed", "bytesVerified": 1, "previousHolder": "SameTenant"}}]}})
}

/// The tenant's user (`edit` in its namespace) reads its claim with the evidence and no other
/// tenant's name (`others`), and cannot write the claim's status: the evidence is not its own to
/// forge.
pub async fn the_tenant_reads_and_cannot_forge(ns: &str, name: &str, device: &str, others: &[&str]) {
    let dev = developer(ns).await;
    let api: Api<ResourceClaim> = Api::namespaced(dev, ns);
    let read = eventually(
        "the developer reads its claim",
        || {
            let api = api.clone();
            async move { outcome(api.get(name).await) }
        },
        |r| r.is_ok(),
    )
    .await;
    assert!(read.is_ok(), "{read:?}");
    let claim = api.get(name).await.unwrap();
    let text = serde_json::to_string(&claim).unwrap();
    assert!(
        text.contains("\"previousHolder\""),
        "the tenant does not see the evidence: {text}"
    );
    for other in others {
        assert!(!text.contains(other), "the tenant's claim names tenant {other}: {text}");
    }
    let pp = PatchParams::apply("forger").force();
    let r = outcome(
        api.patch_status(name, &pp, &Patch::Apply(forged(ns, name, DRIVER, NODE, device)))
            .await,
    );
    let e = r.expect_err("a tenant's edit role wrote its claim's status.devices");
    assert!(e.contains("(403)") && e.contains("resourceclaims/status"), "{e}");
}

/// The agent's service account, as the pod of `node` presents it.
async fn agent_of(node: &str) -> Client {
    let extra = std::collections::HashMap::from([(
        "authentication.kubernetes.io/node-name".to_string(),
        vec![node.to_string()],
    )]);
    impersonating(
        "system:serviceaccount:gpu-tenancy-system:gpu-tenancy-agent",
        &gpu_tenancy_e2e::access::OPERATOR_SA_GROUPS,
        Some(extra),
    )
    .await
}

/// With deploy/base's RBAC and policy: the agent of the claim's node writes its driver's entry
/// (dry run); the agent of another node, and the claim's node's agent for another driver's
/// entry, are refused.
pub async fn only_the_claims_agent_writes_its_entry(ns: &str, name: &str, device: &str) {
    let dry = PatchParams {
        dry_run: true,
        ..PatchParams::apply(gpu_tenancy::agent::dra::CLAIMS_FIELD_MANAGER).force()
    };
    let try_as = |node: &'static str, driver: &'static str| {
        let dry = dry.clone();
        let body = forged(ns, name, driver, NODE, device);
        move || {
            let (dry, body) = (dry.clone(), body.clone());
            async move {
                let api: Api<ResourceClaim> = Api::namespaced(agent_of(node).await, ns);
                outcome(api.patch_status(name, &dry, &Patch::Apply(body)).await)
            }
        }
    };
    let own = eventually("the agent writes its claim's evidence", try_as(NODE, DRIVER), |r| {
        r.is_ok()
    })
    .await;
    assert!(
        own.is_ok(),
        "the agent of the claim's node could not write its entry: {own:?}"
    );
    let other = eventually("another node's agent refused", try_as("another-node", DRIVER), |r| {
        r.is_err()
    })
    .await;
    let e = other.expect_err("the agent of another node wrote the claim's evidence");
    assert!(e.contains("resourceclaims/driver"), "{e}");
    let driver = eventually("another driver's entry refused", try_as(NODE, "gpu.nvidia.com"), |r| {
        r.is_err()
    })
    .await;
    let e = driver.expect_err("the agent wrote another driver's entry");
    assert!(e.contains("resourceclaims/driver"), "{e}");
    // What the API server holds is still the agent's own write.
    let c = Api::<ResourceClaim>::namespaced(gpu_tenancy_e2e::client().await, ns)
        .get(name)
        .await
        .unwrap();
    assert!(
        c.managed_fields()
            .iter()
            .all(|m| m.manager.as_deref() != Some("forger")),
        "a forged write landed"
    );
}
