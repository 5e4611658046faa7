//! What one write of a GpuNode's status costs the API server, beside the same bytes written as a
//! ConfigMap's data: the control plane's CPU (from `/proc`) over writes made one at a time,
//! rounds of each alternating, in the bench's own converged cluster (the controller and the agents
//! running, so each write's watch events reach them as a real one's do). A third kind of round
//! sends the status as the agent once did, with the API server's default field validation
//! (`Warn`: the apply body parsed twice), beside the agent's own (`Ignore`, see
//! [`gpu_tenancy::runtime::client::apply_params`]): the saving measured in every run.
//!
//! Why: a fleet's first convergence is bound by the API server's CPU on this 2-core machine, and
//! a joining node's GpuNode takes a create (its GPUs declared), a spec write and a status write
//! (what it applied). This tells how much of that is the object's shape (a CRD status of
//! many typed fields, validated, merged field by field, decoded and encoded as maps) rather than
//! its bytes.

use crate::probe::Controller;
use gpu_tenancy::api::GpuNode;
use gpu_tenancy::runtime::client::apply_params;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde_json::{Value, json};
use std::time::Duration;

/// The ConfigMap the comparison writes (in `default`), deleted afterwards.
const CONFIG_MAP: &str = "gpu-tenancy-bench-write-cost";
const BENCH_MANAGER: &str = "gpu-tenancy-fleet-bench";

#[derive(Clone, Debug, Default, Serialize)]
pub struct WriteCost {
    /// The GpuNode whose status was written (the fleet's largest).
    pub node: String,
    /// Its status as JSON, in bytes.
    pub status_bytes: usize,
    pub rounds: usize,
    pub writes_per_round: usize,
    /// Control plane CPU per write, median over the rounds, and the rounds' range.
    pub gpunode_status_ms: f64,
    pub gpunode_status_ms_range: (f64, f64),
    /// The same status written with the server's default field validation (`Warn`).
    pub gpunode_status_default_validation_ms: f64,
    pub gpunode_status_default_validation_ms_range: (f64, f64),
    pub config_map_ms: f64,
    pub config_map_ms_range: (f64, f64),
}

/// `status` with every GPU's message marked with `k`: each write changes the object (a write of
/// what is already there is answered without storing anything), and nothing the controller plans
/// from or the agent compares against its spec.
fn variant(status: &Value, k: usize) -> Value {
    let mut s = status.clone();
    if let Some(gpus) = s.get_mut("gpus").and_then(Value::as_array_mut) {
        for g in gpus {
            let was = g.get("message").and_then(Value::as_str).unwrap_or("").to_string();
            g["message"] = json!(format!("bench write {k}: {was}"));
        }
    }
    s
}

/// CPU seconds of the control plane, or why it cannot be read.
fn cpu(ctl: &Controller) -> Result<f64, String> {
    ctl.control_plane_cpu_seconds()
        .ok_or_else(|| "the control plane's CPU cannot be read (give --control-plane-pid)".to_string())
}

fn median_and_range(v: &mut [f64]) -> (f64, (f64, f64)) {
    v.sort_by(f64::total_cmp);
    match v {
        [] => (f64::NAN, (f64::NAN, f64::NAN)),
        _ => (v[v.len() / 2], (v[0], v[v.len() - 1])),
    }
}

/// The kinds of write a round makes, in the order the rounds alternate.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Round {
    /// The GpuNode status as its agent sends it.
    Agent,
    /// The same status with the API server's default field validation (`Warn`).
    DefaultValidation,
    /// The status's bytes as a ConfigMap's data.
    ConfigMap,
}

impl Round {
    const ALL: [Round; 3] = [Round::Agent, Round::DefaultValidation, Round::ConfigMap];
}

/// Where the measured writes go, and how each is sent.
struct Targets {
    nodes: Api<GpuNode>,
    config_maps: Api<ConfigMap>,
    /// The GpuNode written, and its status as its agent last wrote it.
    node: String,
    status: Value,
}

impl Targets {
    /// The status as the agent sends it (its field manager and apply parameters), or with the
    /// server's default field validation.
    async fn write_status(&self, status: Value, default_validation: bool) -> Result<(), kube::Error> {
        let body = json!({"apiVersion": GpuNode::api_version(&()), "kind": GpuNode::kind(&()), "status": status});
        let mut agent = apply_params(gpu_tenancy::agent::FIELD_MANAGER);
        if default_validation {
            agent.field_validation = None;
        }
        self.nodes
            .patch_status(&self.node, &agent, &Patch::Apply(body))
            .await
            .map(drop)
    }

    async fn write_config_map(&self, status: &Value) -> Result<(), kube::Error> {
        let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": CONFIG_MAP},
                          "data": {"status": status.to_string()}});
        let bench = apply_params(BENCH_MANAGER);
        self.config_maps
            .patch(CONFIG_MAP, &bench, &Patch::Apply(body))
            .await
            .map(drop)
    }

    /// Control plane CPU per write (ms) of each round, by kind ([`Round::ALL`]'s order).
    async fn rounds(&self, ctl: &Controller, rounds: usize, per_round: usize) -> Result<[Vec<f64>; 3], String> {
        let mut ms: [Vec<f64>; 3] = Default::default();
        let mut k = 0;
        for _ in 0..rounds {
            for (i, round) in Round::ALL.into_iter().enumerate() {
                // Let the last round's watch events and the controller's pass settle.
                tokio::time::sleep(Duration::from_millis(500)).await;
                let before = cpu(ctl)?;
                for _ in 0..per_round {
                    k += 1;
                    let body = variant(&self.status, k);
                    match round {
                        Round::Agent | Round::DefaultValidation => self
                            .write_status(body, round == Round::DefaultValidation)
                            .await
                            .map_err(|e| {
                                format!("writing GpuNode {}'s status (as its agent) failed: {e}", self.node)
                            })?,
                        Round::ConfigMap => self
                            .write_config_map(&body)
                            .await
                            .map_err(|e| format!("applying ConfigMap default/{CONFIG_MAP} failed: {e}"))?,
                    }
                }
                ms[i].push((cpu(ctl)? - before) * 1000.0 / per_round as f64);
            }
        }
        Ok(ms)
    }

    /// Puts the node's status back as its agent wrote it and deletes the ConfigMap, whatever the
    /// rounds did; says what could not be undone.
    async fn undo(&self) -> Result<(), String> {
        let mut left = Vec::new();
        if let Err(e) = self.write_status(self.status.clone(), false).await {
            left.push(format!(
                "GpuNode {}'s status keeps a marked message per GPU ({e}); its agent writes it again on its next poll",
                self.node
            ));
        }
        match self.config_maps.delete(CONFIG_MAP, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => left.push(format!(
                "ConfigMap default/{CONFIG_MAP} is left ({e}); delete it with kubectl"
            )),
        }
        match left.is_empty() {
            true => Ok(()),
            false => Err(left.join("; ")),
        }
    }
}

/// Measures on the fleet's largest GpuNode status, then undoes its writes (even when a write
/// failed): the node's status as its agent wrote it, no ConfigMap.
pub async fn measure(client: &Client, ctl: &Controller, rounds: usize, per_round: usize) -> Result<WriteCost, String> {
    let nodes: Api<GpuNode> = Api::all(client.clone());
    let listed = nodes
        .list(&Default::default())
        .await
        .map_err(|e| format!("listing GpuNodes: {e}"))?;
    let (node, status) = listed
        .items
        .iter()
        .filter_map(|n| Some((n.name_any(), serde_json::to_value(n.status.as_ref()?).ok()?)))
        .max_by_key(|(_, s)| s.to_string().len())
        .ok_or("no GpuNode has a status to measure with")?;
    let targets = Targets {
        nodes,
        config_maps: Api::namespaced(client.clone(), "default"),
        node,
        status,
    };
    let measured = targets.rounds(ctl, rounds, per_round).await;
    let undone = targets.undo().await;
    let [mut on_node, mut on_node_default, mut on_map] = match (measured, undone) {
        (Ok(m), Ok(())) => m,
        (Ok(_), Err(u)) => return Err(u),
        (Err(e), Ok(())) => return Err(e),
        (Err(e), Err(u)) => return Err(format!("{e}; and {u}")),
    };
    let (gpunode_status_ms, gpunode_status_ms_range) = median_and_range(&mut on_node);
    let (gpunode_status_default_validation_ms, gpunode_status_default_validation_ms_range) =
        median_and_range(&mut on_node_default);
    let (config_map_ms, config_map_ms_range) = median_and_range(&mut on_map);
    Ok(WriteCost {
        status_bytes: targets.status.to_string().len(),
        node: targets.node,
        rounds,
        writes_per_round: per_round,
        gpunode_status_ms,
        gpunode_status_ms_range,
        gpunode_status_default_validation_ms,
        gpunode_status_default_validation_ms_range,
        config_map_ms,
        config_map_ms_range,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_variant_changes_every_gpu_message_and_nothing_else() {
        let status = json!({"observedGeneration": 3, "gpus": [{"index": 0, "message": "done"}, {"index": 1}]});
        let a = variant(&status, 1);
        let b = variant(&status, 2);
        assert_ne!(a, b);
        assert_eq!(a["gpus"][0]["message"], "bench write 1: done");
        assert_eq!(a["gpus"][1]["message"], "bench write 1: ");
        assert_eq!(a["observedGeneration"], 3);
        assert_eq!(a["gpus"][0]["index"], 0);
    }

    #[test]
    fn median_and_range_of_rounds() {
        assert_eq!(median_and_range(&mut [3.0, 1.0, 2.0]), (2.0, (1.0, 3.0)));
        assert!(median_and_range(&mut []).0.is_nan());
    }
}
