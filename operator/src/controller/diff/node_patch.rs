//! A Node's labels and taints, our keys only, as one JSON patch whose only precondition is on
//! what it replaces. The Node is also written by the kubelet, node controllers and our agents
//! (their `config.state` label): a patch conditional on the Node's resourceVersion failed (409)
//! whenever an agent's label write came between our read and our write, costing a pass and a
//! backoff each (2-7 per 1,000-node bench run). Labels are a map, so setting or removing our
//! keys needs no precondition; taints are one list, so the patch tests that the list is still
//! the one read before replacing it.

use k8s_openapi::api::core::v1::Taint;
use serde_json::{Value, json};
use std::collections::BTreeMap;

#[derive(Clone, Debug, PartialEq)]
pub struct NodePatch {
    pub name: String,
    /// Our labels to set (`Some`) or remove (`None`).
    pub labels: BTreeMap<String, Option<String>>,
    /// Whether the Node had any labels (a JSON patch cannot add a key to a missing map).
    pub had_labels: bool,
    /// The taints when ours change: the list as read (`None`: the Node had none) and the list to write.
    pub taints: Option<(Option<Vec<Taint>>, Vec<Taint>)>,
    /// The Node's version as read: the precondition of adding a taint list where there was none.
    pub resource_version: Option<String>,
}

impl NodePatch {
    /// The RFC 6902 operations.
    pub fn operations(&self) -> Value {
        let mut ops = Vec::new();
        if !self.had_labels {
            let set: BTreeMap<&String, &String> = self
                .labels
                .iter()
                .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)))
                .collect();
            if !set.is_empty() {
                ops.push(json!({"op": "add", "path": "/metadata/labels", "value": set}));
            }
        } else {
            for (key, value) in &self.labels {
                let path = format!("/metadata/labels/{}", escape(key));
                ops.push(match value {
                    Some(v) => json!({"op": "add", "path": path, "value": v}),
                    None => json!({"op": "remove", "path": path}),
                });
            }
        }
        if let Some((read, write)) = &self.taints {
            match read {
                Some(read) => {
                    ops.push(json!({"op": "test", "path": "/spec/taints", "value": read}));
                    ops.push(json!({"op": "replace", "path": "/spec/taints", "value": write}));
                }
                None => {
                    ops.push(
                        json!({"op": "test", "path": "/metadata/resourceVersion", "value": self.resource_version}),
                    );
                    ops.push(json!({"op": "add", "path": "/spec/taints", "value": write}));
                }
            }
        }
        Value::Array(ops)
    }
}

/// A key as one JSON pointer segment (RFC 6901): `~` and `/` escaped.
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str) -> Taint {
        Taint {
            key: key.into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        }
    }

    /// Checked with the json-patch crate (the RFC's implementation kube uses): on the Node as read
    /// the patch gives the wanted Node; once another writer changed the taints it fails, and an
    /// agent's label written in between is kept.
    #[test]
    fn the_patch_sets_our_keys_and_replaces_only_the_taints_it_read() {
        let node = json!({"metadata": {"name": "n1", "resourceVersion": "7",
            "labels": {"kubernetes.io/hostname": "n1", "nvidia.com/device-plugin.config": "old", "gputenancy.io/dedicated": "a"}},
            "spec": {"taints": [taint("node.kubernetes.io/unschedulable")]}});
        let patch = NodePatch {
            name: "n1".into(),
            labels: BTreeMap::from([
                ("nvidia.com/device-plugin.config".into(), Some("mig-mixed".into())),
                ("gputenancy.io/dedicated".into(), None),
            ]),
            had_labels: true,
            taints: Some((
                Some(vec![taint("node.kubernetes.io/unschedulable")]),
                vec![
                    taint("node.kubernetes.io/unschedulable"),
                    taint("gputenancy.io/scrub-pending"),
                ],
            )),
            resource_version: Some("7".into()),
        };
        let ops: json_patch::Patch = serde_json::from_value(patch.operations()).unwrap();
        // An agent's label lands between our read and our write: no conflict, and it stays.
        let mut live = node.clone();
        live["metadata"]["labels"]["gputenancy.io/config.state"] = json!("success");
        live["metadata"]["resourceVersion"] = json!("8");
        json_patch::patch(&mut live, &ops).expect("applies over another writer's label");
        assert_eq!(
            live["metadata"]["labels"],
            json!({"kubernetes.io/hostname": "n1", "nvidia.com/device-plugin.config": "mig-mixed", "gputenancy.io/config.state": "success"})
        );
        assert_eq!(live["spec"]["taints"][1]["key"], "gputenancy.io/scrub-pending");
        // Another writer changed the taints: refused, nothing half-applied.
        let mut moved = node.clone();
        moved["spec"]["taints"] = json!([taint("node.kubernetes.io/not-ready")]);
        let before = moved.clone();
        assert!(json_patch::patch(&mut moved, &ops).is_err());
        assert_eq!(moved, before);
    }

    #[test]
    fn a_node_with_no_labels_or_taints_gets_them_on_its_version() {
        let patch = NodePatch {
            name: "n1".into(),
            labels: BTreeMap::from([("gputenancy.io/sharing".into(), Some("MPS".into()))]),
            had_labels: false,
            taints: Some((None, vec![taint("gputenancy.io/sharing")])),
            resource_version: Some("3".into()),
        };
        let ops: json_patch::Patch = serde_json::from_value(patch.operations()).unwrap();
        let mut node = json!({"metadata": {"name": "n1", "resourceVersion": "3"}, "spec": {}});
        json_patch::patch(&mut node, &ops).unwrap();
        assert_eq!(node["metadata"]["labels"], json!({"gputenancy.io/sharing": "MPS"}));
        assert_eq!(node["spec"]["taints"][0]["key"], "gputenancy.io/sharing");
        let mut newer = json!({"metadata": {"name": "n1", "resourceVersion": "4"}, "spec": {}});
        assert!(json_patch::patch(&mut newer, &ops).is_err(), "a newer Node: read again");
    }
}
