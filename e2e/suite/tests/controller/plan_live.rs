//! `plan` of a live cluster: `kubectl get nodes,gpunodes,gputenancy -o yaml | gpu-tenancy plan -f -`
//! reads the cluster's own objects (kubectl's List, Nodes, GpuNode statuses and specs as the
//! running state) and must say what the controller's next pass writes. The oracle is the API
//! server: the GpuNode specs and tenant grants the in-process controller wrote.

use gpu_tenancy::api::{GpuNode, GpuTenant};
use gpu_tenancy_e2e::{kubectl_async, repo_root};
use kube::{Api, Client, ResourceExt};
use serde_json::Value;
use std::collections::BTreeMap;
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
    let mut child = std::process::Command::new(repo_root().join("target/debug/gpu-tenancy"))
        .args(["plan", "-f", "-", "-o", "json"])
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
    let out = child.wait_with_output().expect("plan ends");
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "plan -f - printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), json)
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
