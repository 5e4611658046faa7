//! Exactly which requests the writer makes for a pass's writes, in order: an ordinary pass, a
//! pass that deletes, and the writes it holds back when one they depend on fails.

use super::*;
use crate::controller::desired_of;
use crate::controller::diff::tests::{apply, snapshot};
use crate::controller::diff::{Diff, diff};
use crate::controller::fixtures::{ApiServer, mock_client};
use crate::controller::stores::Snapshot;
use crate::desired::Settings;
use crate::planner::fixtures::now;
use serde_json::{Value, json};

/// The query of every server-side apply: forced, as the controller's field manager.
const SSA: &str = "?&force=true&fieldManager=gpu-tenancy-controller&fieldValidation=Ignore";
const APPLY: &str = "application/apply-patch+yaml";

/// A writer that sends one write at a time, so the order of its requests is the order of the
/// writes.
fn writer() -> (Writer, ApiServer) {
    let (client, server) = mock_client();
    let mut w = Writer::new(client, None);
    w.set_in_flight(1);
    (w, server)
}

/// One request as the test saw it.
#[derive(Debug)]
pub(crate) struct Request {
    pub line: String,
    pub content_type: Option<String>,
    pub body: Value,
}

/// Makes `writes` against an API server that refuses (500) the requests whose line contains one
/// of `refuse` and takes every other; the requests in order, and the outcome.
pub(crate) async fn requests(writes: &[Write], refuse: &[&str]) -> (Vec<Request>, Outcome) {
    let (w, mut server) = writer();
    let mut seen = Vec::new();
    let write = w.write_all(writes);
    tokio::pin!(write);
    loop {
        tokio::select! {
            outcome = &mut write => {
                server.no_more().await;
                return (seen, outcome);
            }
            sent = server.next() => {
                let line = sent.line();
                seen.push(Request { line: line.clone(), content_type: sent.content_type.clone(), body: sent.body.clone() });
                if refuse.iter().any(|r| line.contains(r)) {
                    sent.refuse(500, "InternalError");
                } else {
                    sent.ok();
                }
            }
        }
    }
}

fn pass(s: &Snapshot) -> Diff {
    diff(&desired_of(s, &Settings::default(), &now()), s)
}

fn lines(r: &[Request]) -> Vec<&str> {
    r.iter().map(|r| r.line.as_str()).collect()
}

fn apply_of(path: &str) -> String {
    format!("PATCH {path}{SSA}")
}

const CONFIG: &str = "/api/v1/namespaces/nvidia-device-plugin/configmaps/gpu-tenancy-device-plugin-configs";
const NODE: &str = "PATCH /api/v1/nodes/n1?";
const GPU_NODE: &str = "/apis/gputenancy.io/v1alpha1/gpunodes/n1";
const VAP: &str = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies";
const VAPB: &str = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings";
const MAP: &str = "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies";
const MAPB: &str = "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicybindings";

/// The first pass over a node and a tenant: one request per write, in the diff's order, each a
/// server-side apply of exactly the write's object but the node's, a JSON patch that tests the
/// taints it read before it replaces them.
#[tokio::test]
async fn an_ordinary_pass_makes_one_request_per_write_in_order() {
    let d = pass(&snapshot());
    let (sent, outcome) = requests(&d.writes, &[]).await;
    assert!(outcome.failed.is_empty(), "{:?}", outcome.failed);
    let mut want = vec![apply_of(CONFIG), NODE.to_string(), apply_of(GPU_NODE)];
    for status in ["sharingpolicies/default", "gputenants/acme", "gpupartitionplans/mig"] {
        want.push(apply_of(&format!("/apis/gputenancy.io/v1alpha1/{status}/status")));
    }
    want.push(apply_of("/api/v1/namespaces/acme"));
    want.push(apply_of("/api/v1/namespaces/acme/resourcequotas/gpu-tenancy"));
    want.push(apply_of(&format!("{MAP}/gputenancy.io-off-gpu-nodes")));
    want.push(apply_of(&format!("{MAPB}/gputenancy.io-off-gpu-nodes")));
    let policies = [
        "claims-no-tenant",
        "claims-tenants",
        "device-env-keys",
        "no-tenant",
        "node-files",
        "tenants",
    ];
    for p in policies {
        want.push(apply_of(&format!("{VAP}/gputenancy.io-{p}")));
    }
    let bindings = [
        "claims-no-tenant",
        "claims-tenant-acme",
        "device-env-keys",
        "no-tenant",
        "node-files",
        "tenant-acme",
    ];
    for b in bindings {
        want.push(apply_of(&format!("{VAPB}/gputenancy.io-{b}")));
    }
    assert_eq!(lines(&sent), want);
    for (r, w) in sent.iter().zip(&d.writes) {
        match w {
            Write::Apply { object, .. } | Write::Status { object, .. } => {
                assert_eq!(r.content_type.as_deref(), Some(APPLY), "{}", r.line);
                assert_eq!(&r.body, object, "{}", r.line);
            }
            Write::NodePatch(p) => {
                assert_eq!(r.content_type.as_deref(), Some("application/json-patch+json"));
                assert_eq!(r.body, p.operations());
                assert_eq!(
                    r.body[r.body.as_array().unwrap().len() - 2],
                    json!({"op": "test", "path": "/spec/taints",
                        "value": [{"effect": "NoSchedule", "key": "node.kubernetes.io/unschedulable"}]})
                );
            }
            other => panic!("unexpected {other}"),
        }
    }
}

/// A tenant removed: its GPUs' spec changes, its namespace loses our labels by a merge patch
/// (never deleted) and leaves the mutating binding, its bindings are deleted before its quota,
/// in the background.
#[tokio::test]
async fn a_removed_tenant_makes_a_merge_patch_and_deletes() {
    let mut s = snapshot();
    let first = pass(&s);
    apply(&mut s, &first);
    s.tenants.clear();
    let d = pass(&s);
    let (sent, outcome) = requests(&d.writes, &[]).await;
    assert!(outcome.failed.is_empty(), "{:?}", outcome.failed);
    let changed: Vec<&Request> = sent.iter().filter(|r| !r.line.contains("/status?")).collect();
    let changed_lines: Vec<&str> = changed.iter().map(|r| r.line.as_str()).collect();
    assert_eq!(
        changed_lines,
        [
            &apply_of(GPU_NODE),
            "PATCH /api/v1/namespaces/acme?",
            &apply_of(&format!("{MAPB}/gputenancy.io-off-gpu-nodes")),
            &format!("DELETE {VAPB}/gputenancy.io-claims-tenant-acme?"),
            &format!("DELETE {VAPB}/gputenancy.io-tenant-acme?"),
            "DELETE /api/v1/namespaces/acme/resourcequotas/gpu-tenancy?",
        ]
    );
    assert_eq!(changed[1].content_type.as_deref(), Some("application/merge-patch+json"));
    assert_eq!(
        changed[1].body,
        json!({"metadata": {"labels": {"gputenancy.io/managed-by": null, "gputenancy.io/tenant": null}}})
    );
    for delete in &changed[3..] {
        assert_eq!(delete.body["propagationPolicy"], "Background", "{}", delete.line);
    }
}

/// The device plugin's ConfigMap refused: no node patch is sent (a label naming a config that
/// is not there would make the plugin fall back to its default sharing), nor the GpuNode spec of
/// a node whose taints were not written; everything else is.
#[tokio::test]
async fn a_refused_config_holds_the_nodes_and_their_specs_back() {
    let d = pass(&snapshot());
    let (sent, outcome) = requests(&d.writes, &["configmaps"]).await;
    let sent = lines(&sent);
    assert_eq!(sent.len(), d.writes.len() - 2);
    assert_eq!(sent[0], apply_of(CONFIG));
    assert!(!sent.contains(&NODE), "{sent:#?}");
    assert!(!sent.iter().any(|l| l.contains(GPU_NODE)), "{sent:#?}");
    let failed: Vec<(usize, Kind, bool, String)> = outcome
        .failed
        .iter()
        .map(|f| (f.index, f.kind, f.error.held_back(), f.to_string()))
        .collect();
    assert_eq!(failed.len(), 3, "{failed:#?}");
    assert_eq!((failed[0].0, failed[0].1, failed[0].2), (0, Kind::ConfigMap, false));
    assert_eq!(
        failed[1],
        (
            1,
            Kind::Node,
            true,
            "patch Node n1: not sent: the device plugin's ConfigMap could not be written in this pass".into()
        )
    );
    assert_eq!(
        failed[2],
        (
            2,
            Kind::GpuNode,
            true,
            "apply GpuNode n1: not sent: Node n1's labels and taints could not be written in this pass".into()
        )
    );
}

/// A node's patch refused (its taints changed since they were read): its GpuNode spec is held
/// back; the config and everything after the spec go.
#[tokio::test]
async fn a_refused_node_patch_holds_its_spec_back() {
    let d = pass(&snapshot());
    let (sent, outcome) = requests(&d.writes, &["/nodes/n1"]).await;
    let sent = lines(&sent);
    assert_eq!(sent[..2], [apply_of(CONFIG).as_str(), NODE]);
    assert!(sent[2].contains("/sharingpolicies/default/status"), "{sent:#?}");
    assert_eq!(sent.len(), d.writes.len() - 1);
    let kinds: Vec<(Kind, bool)> = outcome.failed.iter().map(|f| (f.kind, f.error.held_back())).collect();
    assert_eq!(kinds, [(Kind::Node, false), (Kind::GpuNode, true)]);
}
