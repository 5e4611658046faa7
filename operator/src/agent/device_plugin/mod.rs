//! The node agent's device-plugin mode: what it does for NVIDIA's device plugin on its node. It
//! restarts the plugin's pod after a MIG change (the plugin reads devices only at start), reports
//! the plugin's MPS daemon ([`mps`]), and lists the pods that hold a busy GPU for the controller to
//! evict ([`evict`]; the plugin cannot say which pod holds which device, the kubelet's
//! pod-resources API can).

pub mod evict;
pub mod mps;

use super::mode::{NodeMode, PassView};
use super::pod_resources::{self, Holdings};
use crate::api::{BusyGpuPolicy, EvictionRequest, GpuNodeStatus, GpuReason, GpuStatus, condition_status};
use crate::gpu::mps::MpsConfig;
use futures::FutureExt;
use futures::future::BoxFuture;
use gpu_tenancy_core::memory_caps;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, ListParams};
use kube::{Client, ResourceExt};
use mps::MpsRoot;
use std::path::PathBuf;

/// The device-plugin mode's settings.
#[derive(Clone, Debug)]
pub struct DevicePluginOptions {
    /// Namespace and label selector of NVIDIA's device plugin pods (restarted after a MIG change).
    pub namespace: String,
    pub selector: String,
    /// The device plugin's MPS root, whose daemon this node's `MpsDaemonReady` condition reports;
    /// `None` reports nothing (backends without a device plugin).
    pub mps_root: Option<PathBuf>,
    /// The kubelet's pod-resources socket, read for which pod holds which device (condition
    /// `PodResources`); `None` reads nothing (backends without a kubelet), and evictions go by
    /// resource names.
    pub pod_resources_socket: Option<PathBuf>,
}

/// The namespace and selector of NVIDIA's Helm chart and static manifests.
impl Default for DevicePluginOptions {
    fn default() -> Self {
        DevicePluginOptions {
            namespace: DEFAULT_NAMESPACE.into(),
            selector: DEFAULT_SELECTOR.into(),
            mps_root: None,
            pod_resources_socket: None,
        }
    }
}

/// The device plugin's namespace by default (`--device-plugin-namespace`).
pub const DEFAULT_NAMESPACE: &str = "nvidia-device-plugin";
/// The device plugin pods' label selector by default (`--device-plugin-selector`).
pub const DEFAULT_SELECTOR: &str = "app.kubernetes.io/name=nvidia-device-plugin";

impl NodeMode for DevicePluginOptions {
    /// None: the plugin's own MPS daemon serves pods (docs/concepts/isolation.md#mps).
    fn mps(&self) -> Option<MpsConfig> {
        None
    }

    fn observe<'a>(&'a self, pass: PassView<'a>, status: &'a mut GpuNodeStatus) -> BoxFuture<'a, Option<Holdings>> {
        observe(pass, self, status).boxed()
    }

    /// The plugin reads devices only at start: after a MIG change its pod on this node restarts.
    fn passed<'a>(&'a self, pass: PassView<'a>, status: &'a GpuNodeStatus) -> BoxFuture<'a, ()> {
        async move {
            if pass.prev.is_some_and(|p| mig_layout(p) != mig_layout(status)) {
                restart_device_plugin(pass.client, pass.node, self).await;
            }
        }
        .boxed()
    }
}

/// Per GPU index, its MIG instances as (profile, start, size).
type MigLayout = Vec<(u32, Vec<(String, u32, u32)>)>;

/// The MIG layout of a status, to tell whether a pass changed it.
fn mig_layout(status: &GpuNodeStatus) -> MigLayout {
    status
        .gpus
        .iter()
        .map(|g| {
            (
                g.index,
                g.instances
                    .iter()
                    .map(|i| (i.profile.clone(), i.placement.start, i.placement.size))
                    .collect(),
            )
        })
        .collect()
}

/// What the device-plugin mode adds to a pass's status: how its shares are capped in memory
/// (`memoryCaps`: the plugin sets no driver cap, so its MPS daemon's limit or none), the plugin's
/// MPS daemon (`MpsDaemonReady`), whether the kubelet's pod-resources API answers (`PodResources`), and
/// under `busyGpuPolicy: Evict` the pods to evict from busy GPUs (`evictionRequests`).
async fn observe(pass: PassView<'_>, opts: &DevicePluginOptions, status: &mut GpuNodeStatus) -> Option<Holdings> {
    let PassView {
        client,
        node,
        spec,
        prev,
    } = pass;
    let now = Time(jiff::Timestamp::now());
    status.memory_caps = memory_caps::statuses(spec.gpus.iter(), &Err(memory_caps::DEVICE_PLUGIN));
    if let Some(root) = &opts.mps_root {
        let root = MpsRoot(root.clone());
        let found = mps::observe(&root);
        mps::report(status, spec, &root, &found, &now);
    }
    let holdings = match &opts.pod_resources_socket {
        Some(socket) => {
            let read = pod_resources::read(socket).await;
            if let Err(e) = &read {
                // Said once, when it starts failing; the condition keeps saying it.
                let was_failing =
                    prev.is_some_and(|p| condition_status(&p.conditions, pod_resources::CONDITION) == Some(false));
                if !was_failing {
                    tracing::warn!(step = e.kind(), error = %e, "cannot read which pod holds which device");
                }
            }
            pod_resources::report(status, socket, &read, &now);
            read.ok()
        }
        None => {
            pod_resources::clear(status);
            None
        }
    };
    if spec.busy_gpu_policy != BusyGpuPolicy::Evict {
        return holdings;
    }
    let busy: Vec<u32> = status
        .gpus
        .iter()
        .filter(|g| g.reason == Some(GpuReason::Busy) && spec.gpus.iter().any(|s| s.index == g.index))
        .map(|g| g.index)
        .collect();
    status.eviction_requests = if busy.is_empty() {
        vec![]
    } else {
        // A failed list keeps the requests last published (nothing asked is better than
        // nothing known): they are made again on the next pass.
        eviction_requests(client, node, &status.gpus, &busy, holdings.as_ref())
            .await
            .unwrap_or_else(|| prev.map(|p| p.eviction_requests.clone()).unwrap_or_default())
    };
    holdings
}

/// `busyGpuPolicy: Evict`: the pods of this node to evict from the busy GPUs `busy` ([`evict`]
/// decides which). `None` when the pods cannot be listed.
async fn eviction_requests(
    client: &Client,
    node: &str,
    gpus: &[GpuStatus],
    busy: &[u32],
    holdings: Option<&Holdings>,
) -> Option<Vec<EvictionRequest>> {
    let all: Api<Pod> = Api::all(client.clone());
    match all
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
    {
        Ok(pods) => Some(evict::select(&pods.items, gpus, busy, holdings)),
        Err(e) => {
            tracing::warn!(error = %e, "cannot list this node's pods to ask for their eviction from busy GPUs");
            None
        }
    }
}

/// Deletes the device plugin's pod on this node so its DaemonSet starts one that re-reads the devices.
async fn restart_device_plugin(client: &Client, node: &str, opts: &DevicePluginOptions) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &opts.namespace);
    let lp = ListParams::default()
        .labels(&opts.selector)
        .fields(&format!("spec.nodeName={node}"));
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
