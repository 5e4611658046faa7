//! Evictions agents ask for (`busyGpuPolicy: Evict`), made by the controller after it checks the
//! pod. The agent may not evict: an Eviction (`pods/eviction`) carries only the pod's name, so no
//! admission rule can keep one node's agent to its own node's pods, and RBAC cannot narrow a
//! verb to a node. The controller reads the pod and evicts it only if it runs on the node whose
//! agent asked, asks for a GPU resource, and is the pod asked for (its UID); otherwise it refuses
//! and says so. Through the Eviction API, so PodDisruptionBudgets hold (a refusal is retried
//! with the pass's backoff).

use crate::device_plugin::is_gpu_resource;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, EvictParams, Preconditions};
use kube::{Client, ResourceExt};

/// What an eviction request came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Evicted,
    /// Nothing to do: the pod is gone, ending, or another pod now has its name.
    Gone,
    /// Not evicted, and never will be for this request: why.
    Refused(String),
}

/// Why a pod may not be evicted at `node`'s request, if it may not.
pub fn refusal(pod: &Pod, node: &str) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let on = spec.node_name.as_deref().unwrap_or("");
    if on != node {
        return Some(format!(
            "the pod runs on node {:?}, not on {node}: an agent may have only its own node's pods evicted",
            on
        ));
    }
    let asks_gpu = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .filter_map(|c| c.resources.as_ref())
        .flat_map(|r| r.limits.iter().flatten().chain(r.requests.iter().flatten()))
        .any(|(k, _)| is_gpu_resource(k));
    (!asks_gpu).then(|| "the pod asks for no GPU resource, so it holds no GPU to free".to_string())
}

/// Evicts `namespace/name` if it is the pod `uid`, runs on `node` and asks for a GPU.
pub async fn evict(
    client: &Client,
    namespace: &str,
    name: &str,
    uid: &str,
    node: &str,
) -> Result<Outcome, kube::Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let Some(pod) = pods.get_opt(name).await? else {
        return Ok(Outcome::Gone);
    };
    if pod.uid().as_deref() != Some(uid) || pod.metadata.deletion_timestamp.is_some() {
        return Ok(Outcome::Gone);
    }
    if let Some(why) = refusal(&pod, node) {
        return Ok(Outcome::Refused(why));
    }
    let params = EvictParams {
        delete_options: Some(DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        }),
        ..EvictParams::default()
    };
    match pods.evict(name, &params).await {
        Ok(_) => Ok(Outcome::Evicted),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(Outcome::Gone),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(node: &str, limits: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}]}
        }))
        .unwrap()
    }

    #[test]
    fn only_gpu_pods_of_the_asking_node() {
        assert_eq!(refusal(&pod("n1", json!({"nvidia.com/gpu": "1"})), "n1"), None);
        assert!(
            refusal(&pod("n2", json!({"nvidia.com/gpu": "1"})), "n1")
                .unwrap()
                .contains("runs on node \"n2\"")
        );
        assert!(
            refusal(&pod("n1", json!({"cpu": "1"})), "n1")
                .unwrap()
                .contains("no GPU resource")
        );
        assert!(refusal(&pod("", json!({"nvidia.com/mig-1g.10gb": "1"})), "n1").is_some());
    }
}
