//! The node agent's device-plugin mode: what it does for NVIDIA's device plugin on its node. It
//! restarts the plugin's pod after a MIG change (the plugin reads devices only at start), reports
//! the plugin's MPS daemon ([`mps`]), and lists the pods that hold a busy GPU for the controller to
//! evict (the plugin cannot say which pod holds which device).

pub mod mps;

use super::Options;
use crate::api::{EvictionRequest, GpuStatus};
use crate::device_plugin::{RESOURCE_GPU, RESOURCE_SHARED, mig_resource};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams};
use kube::{Client, ResourceExt};

/// The device-plugin resource names through which pods reach `gpu` as it is now: its MIG
/// instances' profiles, or the whole-GPU names.
fn resource_names(gpu: &GpuStatus) -> Vec<String> {
    if gpu.instances.is_empty() {
        vec![RESOURCE_GPU.to_string(), RESOURCE_SHARED.to_string()]
    } else {
        gpu.instances.iter().map(|i| mig_resource(&i.profile)).collect()
    }
}

/// `busyGpuPolicy: Evict`: the pods of this node that ask for a resource of a busy GPU, for the
/// controller to evict through the Eviction API (so PodDisruptionBudgets hold). Without the
/// kubelet's pod-resources API the agent cannot tell which pod holds which device, so every pod
/// on the node asking for that GPU's resource names is listed (a superset, never a miss).
/// `None` when the pods cannot be listed.
pub async fn eviction_requests(client: &Client, opts: &Options, busy: &[&GpuStatus]) -> Option<Vec<EvictionRequest>> {
    let all: Api<Pod> = Api::all(client.clone());
    let pods = match all
        .list(&ListParams::default().fields(&format!("spec.nodeName={}", opts.node)))
        .await
    {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list this node's pods to ask for their eviction from busy GPUs");
            return None;
        }
    };
    let mut out = Vec::new();
    for pod in pods {
        let Some(spec) = &pod.spec else { continue };
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) || pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let asked: Vec<&String> = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .filter_map(|c| c.resources.as_ref())
            .flat_map(|r| r.limits.iter().flatten().chain(r.requests.iter().flatten()))
            .map(|(k, _)| k)
            .collect();
        let gpus: Vec<u32> = busy
            .iter()
            .filter(|g| resource_names(g).iter().any(|n| asked.contains(&n)))
            .map(|g| g.index)
            .collect();
        if gpus.is_empty() {
            continue;
        }
        out.push(EvictionRequest {
            namespace: pod.namespace().unwrap_or_default(),
            name: pod.name_any(),
            uid: pod.uid().unwrap_or_default(),
            gpus,
        });
    }
    out.sort();
    Some(out)
}

/// Deletes the device plugin's pod on this node so its DaemonSet starts one that re-reads the devices.
pub async fn restart_device_plugin(client: &Client, opts: &Options) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &opts.device_plugin_namespace);
    let lp = ListParams::default()
        .labels(&opts.device_plugin_selector)
        .fields(&format!("spec.nodeName={}", opts.node));
    match pods.list(&lp).await {
        Ok(list) => {
            for p in list {
                match pods.delete(&p.name_any(), &DeleteParams::default()).await {
                    Ok(_) => tracing::info!(pod = %p.name_any(), "restarted the device plugin after a MIG change"),
                    Err(e) => tracing::warn!(pod = %p.name_any(), error = %e, "could not restart the device plugin"),
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "could not list the device plugin's pods"),
    }
}
