//! `busyGpuPolicy: Evict` in the device-plugin mode: which pods of this node the agent asks the
//! controller to evict (through the Eviction API, so PodDisruptionBudgets hold) so that a busy
//! GPU can change.
//!
//! With the kubelet's pod-resources API ([`crate::agent::pod_resources`]) the agent knows which
//! pod holds which device, and asks only for the pods that hold the busy GPU (its UUID, its MIG
//! instances' UUIDs, their replicas). Without it, or for a pod the answer does not account for
//! fully, it asks for every pod that requests a busy GPU's resource names, as before: a superset,
//! never a miss. Evicting fewer pods because of something unknown would leave the GPU busy and
//! the change stuck; evicting more only costs those pods a restart.

use crate::agent::pod_resources::{DeviceId, DeviceRef, Holdings, PodRef};
use crate::api::{EvictionRequest, GpuStatus};
use crate::device_plugin::{RESOURCE_GPU, RESOURCE_SHARED, is_gpu_resource, mig_resource};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use kube::ResourceExt;
use std::collections::{BTreeMap, BTreeSet};

/// The device-plugin resource names through which pods reach `gpu` as it is now: its MIG
/// instances' profiles, or the whole-GPU names.
fn resource_names(gpu: &GpuStatus) -> Vec<String> {
    if gpu.instances.is_empty() {
        vec![RESOURCE_GPU.to_string(), RESOURCE_SHARED.to_string()]
    } else {
        gpu.instances.iter().map(|i| mig_resource(&i.profile)).collect()
    }
}

/// The GPU resources a container asks for, with how many (`None`: not a whole number, which no
/// extended resource is; counted as unknown). Extended resources have requests equal to limits,
/// so either says it.
fn gpu_requests(c: &Container) -> BTreeMap<&str, Option<u64>> {
    let r = c.resources.as_ref();
    let limits = r.and_then(|r| r.limits.as_ref()).into_iter().flatten();
    let requests = r.and_then(|r| r.requests.as_ref()).into_iter().flatten();
    let mut out = BTreeMap::new();
    for (name, q) in limits.chain(requests) {
        if is_gpu_resource(name) {
            out.entry(name.as_str()).or_insert_with(|| q.0.parse().ok());
        }
    }
    out
}

/// Sidecars: init containers that keep running beside the others (`restartPolicy: Always`).
fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// What the kubelet's answer says of one pod.
struct Known {
    /// The GPUs (indices) it holds devices of.
    held: BTreeSet<u32>,
    /// Whether that is all: every GPU device it asks for is reported and is a device of this
    /// node's GPUs.
    complete: bool,
}

fn known(pod: &Pod, spec: &PodSpec, holdings: &Holdings, gpus: &[GpuStatus]) -> Known {
    let key = PodRef {
        namespace: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
    };
    // Not reported: not admitted yet, or the kubelet's view is older than the API server's.
    let Some(listed) = holdings.pods.get(&key) else {
        return Known {
            held: BTreeSet::new(),
            complete: false,
        };
    };
    let mut out = Known {
        held: BTreeSet::new(),
        complete: true,
    };
    for d in listed.values().flatten().filter(|d| is_gpu_resource(&d.resource)) {
        match DeviceId::parse(&d.id).gpu(gpus) {
            Some(i) => {
                out.held.insert(i);
            }
            // A device of a GPU or instance this status does not know (gone since, renamed):
            // it may be the busy GPU under another name.
            None => out.complete = false,
        }
    }
    // The kubelet lists a pod before its devices are allocated (it adds the pod, then admits
    // it), so a reported container must hold as many devices as it asks for.
    let empty: Vec<DeviceRef> = vec![];
    let init = spec.init_containers.iter().flatten();
    for c in spec.containers.iter().chain(init.clone().filter(|c| is_sidecar(c))) {
        let reported = listed.get(&c.name).unwrap_or(&empty);
        for (resource, count) in gpu_requests(c) {
            let n = reported.iter().filter(|d| d.resource == resource).count() as u64;
            if count != Some(n) {
                out.complete = false;
            }
        }
    }
    // The kubelet does not report init containers that run to completion: one asking for a GPU
    // that has not finished may hold it.
    let statuses = pod.status.as_ref().and_then(|s| s.init_container_statuses.as_ref());
    for c in init.filter(|c| !is_sidecar(c) && !gpu_requests(c).is_empty()) {
        let finished = statuses
            .into_iter()
            .flatten()
            .any(|s| s.name == c.name && s.state.as_ref().is_some_and(|st| st.terminated.is_some()));
        if !finished {
            out.complete = false;
        }
    }
    out
}

/// The pods of `pods` (this node's) to ask to evict so that the GPUs `busy` (indices into
/// `gpus`, the node's status) can change, each with the busy GPUs it holds or may hold.
/// `holdings`: what the kubelet's pod-resources API says (`None`: it could not be read). Pure.
pub fn select(pods: &[Pod], gpus: &[GpuStatus], busy: &[u32], holdings: Option<&Holdings>) -> Vec<EvictionRequest> {
    let busy: Vec<&GpuStatus> = gpus.iter().filter(|g| busy.contains(&g.index)).collect();
    let mut out = Vec::new();
    for pod in pods {
        let Some(spec) = &pod.spec else { continue };
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) || pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let asked: BTreeSet<&str> = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .flat_map(|c| gpu_requests(c).into_keys())
            .collect();
        let known = holdings.map(|h| known(pod, spec, h, gpus));
        let evict_for: Vec<u32> = busy
            .iter()
            .filter(|g| {
                let by_names = resource_names(g).iter().any(|n| asked.contains(n.as_str()));
                match &known {
                    None => by_names,
                    Some(k) => k.held.contains(&g.index) || (by_names && !k.complete),
                }
            })
            .map(|g| g.index)
            .collect();
        if evict_for.is_empty() {
            continue;
        }
        out.push(EvictionRequest {
            namespace: pod.namespace().unwrap_or_default(),
            name: pod.name_any(),
            uid: pod.uid().unwrap_or_default(),
            gpus: evict_for,
        });
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests;
