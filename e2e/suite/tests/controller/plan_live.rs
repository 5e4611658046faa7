//! `plan` of a live cluster: `kubectl get nodes,gpunodes,gputenancy -o yaml | gpu-tenancy plan -f -`
//! reads the cluster's own objects (kubectl's List, Nodes, GpuNode statuses and specs as the
//! running state) and must say what the controller's next pass writes. The oracle is the API
//! server: the GpuNode specs and tenant grants the in-process controller wrote, and with `-o yaml`
//! every object it wrote.

use crate::support::*;
use gpu_tenancy::api::{GpuNode, GpuTenant};
use gpu_tenancy::controller::kinds::{Kind, TABLE};
use gpu_tenancy::labels::{MANAGED_BY, MANAGED_BY_VALUE};
use gpu_tenancy_e2e::{Cleanup, apply_file, kubectl_async, repo_root};
use kube::api::{DynamicObject, ListParams};
use kube::{Api, Client, ResourceExt};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;

/// What the cluster runs now, as `kubectl get nodes,gpunodes,gputenancy -o yaml` prints it.
pub async fn export() -> String {
    kubectl_async(
        ["get", "nodes,gpunodes,gputenancy", "-o", "yaml"]
            .map(String::from)
            .to_vec(),
    )
    .await
    .ok()
}

/// `gpu-tenancy plan -f - -o json` of `yaml`; its exit code and the JSON.
pub fn plan(yaml: &str) -> (i32, Value) {
    let out = plan_as(yaml, "json");
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "plan -f - printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), json)
}

/// `gpu-tenancy plan -f - -o OUTPUT` of `yaml`.
pub fn plan_as(yaml: &str, output: &str) -> std::process::Output {
    let mut child = std::process::Command::new(repo_root().join("target/debug/gpu-tenancy"))
        .args(["plan", "-f", "-", "-o", output])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("gpu-tenancy plan runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(yaml.as_bytes())
        .expect("plan reads its input");
    child.wait_with_output().expect("plan ends")
}

/// `yaml` (a kubectl List) with GpuTenant `name`'s spec replaced: a change not yet merged.
pub fn with_tenant_spec(yaml: &str, name: &str, spec: Value) -> String {
    let mut list: Value = serde_saphyr::from_str(yaml).expect("kubectl prints YAML");
    let items = list["items"].as_array_mut().expect("a List");
    let tenant = items
        .iter_mut()
        .find(|i| i["kind"] == "GpuTenant" && i["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no GpuTenant {name} in the export"));
    tenant["spec"] = spec;
    // JSON is YAML.
    list.to_string()
}

/// Per node the GpuNode spec `plan` printed, and per tenant its grants and allocation.
pub fn planned(json: &Value) -> (BTreeMap<String, Value>, BTreeMap<String, Value>) {
    let nodes = json["nodes"]
        .as_array()
        .expect("plan's nodes")
        .iter()
        .map(|n| {
            let n: GpuNode = serde_json::from_value(n.clone()).expect("a GpuNode");
            (n.name_any(), serde_json::to_value(&n.spec).unwrap())
        })
        .collect();
    let tenants = json["tenants"]
        .as_array()
        .expect("plan's tenants")
        .iter()
        .map(|t| {
            let t: GpuTenant = serde_json::from_value(t.clone()).expect("a GpuTenant");
            (t.name_any(), grants_of(&t))
        })
        .collect();
    (nodes, tenants)
}

/// The same, as the API server holds them.
pub async fn on_server(client: &Client) -> (BTreeMap<String, Value>, BTreeMap<String, Value>) {
    let nodes = Api::<GpuNode>::all(client.clone())
        .list(&Default::default())
        .await
        .unwrap()
        .into_iter()
        .map(|n| (n.name_any(), serde_json::to_value(&n.spec).unwrap()))
        .collect();
    let tenants = Api::<GpuTenant>::all(client.clone())
        .list(&Default::default())
        .await
        .unwrap()
        .into_iter()
        .map(|t| (t.name_any(), grants_of(&t)))
        .collect();
    (nodes, tenants)
}

fn grants_of(t: &GpuTenant) -> Value {
    let s = t.status.clone().unwrap_or_default();
    serde_json::json!({"grants": s.grants, "allocation": s.allocation})
}

/// Every entry of `want` equal to `got`'s, naming the first that differs.
pub fn assert_same(what: &str, want: &BTreeMap<String, Value>, got: &BTreeMap<String, Value>) {
    assert_eq!(
        want.keys().collect::<Vec<_>>(),
        got.keys().collect::<Vec<_>>(),
        "{what}: the same objects"
    );
    for (name, w) in want {
        assert_eq!(Some(w), got.get(name), "{what}: {name} (plan, then the API server)");
    }
}

/// An object by kind, namespace and name.
type Key = (String, String, String);

/// What `kubectl get nodes,gpunodes,gputenancy -o yaml | gpu-tenancy plan -f - -o yaml` prints,
/// by kind, namespace and name.
fn printed(yaml: &str) -> BTreeSet<Key> {
    let out = plan_as(yaml, "yaml");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("plan -o yaml prints YAML");
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    docs.iter()
        .filter(|d| !d.is_null())
        .map(|d| (s(&d["kind"]), s(&d["metadata"]["namespace"]), s(&d["metadata"]["name"])))
        .collect()
}

/// What the controller wrote, as the API server holds it: every object of each kind it writes
/// whole that carries its managed-by label (the Nodes it labelled and the tenant namespaces
/// included), and the GpuNodes, whose specs it writes.
async fn written(client: &Client) -> BTreeSet<Key> {
    let mut out = BTreeSet::new();
    // An optional kind not served (Kueue's, here) has nothing to list.
    for row in TABLE.iter().filter(|r| r.planned && !r.optional) {
        let ar = row.kind.api_resource();
        let api = Api::<DynamicObject>::all_with(client.clone(), &ar);
        let params = match row.kind {
            Kind::GpuNode => ListParams::default(),
            _ => ListParams::default().labels(&format!("{MANAGED_BY}={MANAGED_BY_VALUE}")),
        };
        for o in api.list(&params).await.unwrap() {
            out.insert((ar.kind.clone(), o.namespace().unwrap_or_default(), o.name_any()));
        }
    }
    out
}

/// With a fleet like `make run`'s (every sharing mode of the device plugin, and a DRA pool),
/// once the controller has written everything, `plan -o yaml` of the cluster's export prints
/// exactly the objects it wrote. The oracle is the API server.
#[tokio::test]
async fn plan_yaml_of_the_live_cluster_prints_every_object_the_controller_wrote() {
    let cleanup = Cleanup::new();
    let client = setup(&cleanup).await;
    apply_examples().await;
    apply_file("examples/dra/pool.yaml").await;
    for tenant in ["vision", "speech"] {
        cleanup.add("GpuTenant", tenant);
        cleanup.add_resource("namespaces", tenant);
    }
    cleanup.add("GpuPartitionPlan", "h100-dra");
    for n in create_fleet(&client).await {
        cleanup.add_resource("nodes", &n);
        cleanup.add("GpuNode", &n);
    }
    let c = start_controller(&client).await;
    converge(&client, &c).await;

    let written = written(&client).await;
    let printed = printed(&export().await);
    let kinds: BTreeSet<String> = written.iter().map(|k| k.0.clone()).collect();
    // Kueue's kinds are not served here: neither written nor printed.
    let absent = c.stores.snapshot().absent;
    let every: BTreeSet<String> = TABLE
        .iter()
        .filter(|r| r.planned && !absent.contains(&r.kind))
        .map(|r| r.kind.api_resource().kind)
        .collect();
    assert_eq!(
        kinds, every,
        "a fleet of both modes: the controller wrote every kind plan prints"
    );
    let missing: Vec<&Key> = written.difference(&printed).collect();
    let extra: Vec<&Key> = printed.difference(&written).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "written but not printed: {missing:#?}\nprinted but not written: {extra:#?}"
    );
    eprintln!(
        "MEASURE plan -o yaml of the live cluster: {} objects of {} kinds",
        printed.len(),
        kinds.len()
    );

    // The DRA pool goes: its tenants' objects with it, so later tests start from examples/.
    for (kind, name) in [
        ("gputenants", "vision"),
        ("gputenants", "speech"),
        ("gpupartitionplans", "h100-dra"),
    ] {
        kubectl_async(vec![
            "delete".into(),
            format!("{kind}.gputenancy.io"),
            name.into(),
            "--ignore-not-found".into(),
        ])
        .await
        .ok();
    }
    converge(&client, &c).await;
}
