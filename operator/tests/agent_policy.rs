//! deploy/base/agent-node-policy.yaml's rules for a ResourceClaim's status, evaluated with a CEL
//! interpreter on hand-written requests. On a cluster whose API server checks `status.devices`
//! per driver and node (resourceclaims/driver) that check refuses first, so the e2e suites never
//! see these rules refuse; they are what holds where it is off.

use kube_cel::cel::{Context, Program, Value as Cel};
use serde_json::{Value, json};
use std::path::PathBuf;

const AGENT: &str = "system:serviceaccount:gpu-tenancy-system:gpu-tenancy-agent";

fn policy() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/base/agent-node-policy.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    docs.into_iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicy")
        .expect("the policy")
}

fn eval(ctx: &Context, expr: &str) -> Cel {
    Program::compile(expr)
        .unwrap_or_else(|e| panic!("{expr}: {e}"))
        .execute(ctx)
        .unwrap_or_else(|e| panic!("{expr}: {e}"))
}

/// The messages of the rules that refuse an update of a claim's status from `old` to `new` by
/// the agent of `node` (None: a token bound to no pod); empty when the policy admits it.
fn refusals(node: Option<&str>, old: &Value, new: &Value) -> Vec<String> {
    let p = policy();
    let extra = node.map_or(json!({}), |n| json!({"authentication.kubernetes.io/node-name": [n]}));
    let request = json!({"operation": "UPDATE", "subResource": "status",
        "userInfo": {"username": AGENT, "extra": extra},
        "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"}});
    let mut ctx = Context::default();
    ctx.add_variable("request", request).unwrap();
    ctx.add_variable("object", new.clone()).unwrap();
    ctx.add_variable("oldObject", old.clone()).unwrap();
    for c in p["spec"]["matchConditions"].as_array().unwrap() {
        assert_eq!(eval(&ctx, c["expression"].as_str().unwrap()), Cel::Bool(true), "{c}");
    }
    // Each variable sees the ones before it, as the API server binds them.
    let mut vars: std::collections::HashMap<String, Cel> = Default::default();
    for v in p["spec"]["variables"].as_array().unwrap() {
        let value = eval(&ctx, v["expression"].as_str().unwrap());
        vars.insert(v["name"].as_str().unwrap().to_string(), value);
        ctx.add_variable_from_value("variables", vars.clone());
    }
    let mut out = Vec::new();
    for rule in p["spec"]["validations"].as_array().unwrap() {
        if eval(&ctx, rule["expression"].as_str().unwrap()) != Cel::Bool(true) {
            out.push(rule["message"].as_str().unwrap().to_string());
        }
    }
    out
}

fn claim(devices: Value) -> Value {
    json!({"metadata": {"name": "c", "namespace": "team-a"},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.gputenancy.io", "pool": "n1", "device": "gpu-0"},
            {"request": "net", "driver": "net.example.com", "pool": "n1", "device": "nic-0"}]}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}],
            "devices": devices}})
}

fn ours(pool: &str, scrub: &str) -> Value {
    json!({"driver": "gpu.gputenancy.io", "pool": pool, "device": "gpu-0", "data": {"scrub": scrub}})
}

fn theirs(v: i64) -> Value {
    json!({"driver": "net.example.com", "pool": "n1", "device": "nic-0", "data": {"v": v}})
}

#[test]
fn the_policy_matches_a_claims_status() {
    let p = policy();
    let rules = p["spec"]["matchConstraints"]["resourceRules"].as_array().unwrap();
    assert!(
        rules
            .iter()
            .any(|r| r["resources"] == json!(["resourceclaims/status"]) && r["operations"] == json!(["UPDATE"])),
        "{rules:?}"
    );
}

#[test]
fn the_agent_writes_only_its_own_drivers_entries_of_its_own_pool() {
    let before = claim(json!([theirs(1)]));
    let own = claim(json!([theirs(1), ours("n1", "Scrubbed")]));
    assert_eq!(refusals(Some("n1"), &before, &own), Vec::<String>::new());
    // Changed again, and removed: its own.
    let changed = claim(json!([theirs(1), ours("n1", "Unknown")]));
    assert_eq!(refusals(Some("n1"), &own, &changed), Vec::<String>::new());
    assert_eq!(refusals(Some("n1"), &own, &before), Vec::<String>::new());
    // A claim with no status.devices yet.
    let bare = claim(Value::Null);
    let mut bare = bare.clone();
    bare["status"].as_object_mut().unwrap().remove("devices");
    assert_eq!(
        refusals(Some("n1"), &bare, &claim(json!([ours("n1", "Scrubbed")]))),
        Vec::<String>::new()
    );

    let evidence = "rule agent-writes-its-own-evidence: the gpu-tenancy-agent may write only its own driver's and node's status.devices entries";
    for (what, node, after) in [
        (
            "another node's agent",
            "n2",
            claim(json!([theirs(1), ours("n1", "Scrubbed")])),
        ),
        (
            "an entry of another pool",
            "n1",
            claim(json!([theirs(1), ours("n2", "Scrubbed")])),
        ),
        ("another driver's entry changed", "n1", claim(json!([theirs(2)]))),
        ("another driver's entry removed", "n1", claim(json!([]))),
    ] {
        assert_eq!(refusals(Some(node), &before, &after), [evidence], "{what}");
    }
    // Another node's agent removing this node's entry.
    assert_eq!(refusals(Some("n2"), &own, &before), [evidence]);

    let allocation =
        "rule agent-writes-its-own-evidence: the gpu-tenancy-agent may not change a claim's allocation or reservations";
    let mut moved = own.clone();
    moved["status"]["allocation"]["devices"]["results"][0]["device"] = json!("gpu-1");
    assert_eq!(refusals(Some("n1"), &own, &moved), [allocation]);
    let mut released = own.clone();
    released["status"].as_object_mut().unwrap().remove("reservedFor");
    assert_eq!(refusals(Some("n1"), &own, &released), [allocation]);

    let got = refusals(None, &before, &own);
    assert!(
        got.len() == 1 && got[0].starts_with("rule agent-request-from-its-pod"),
        "{got:?}"
    );
}
