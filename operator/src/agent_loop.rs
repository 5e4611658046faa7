//! `gpu-tenancy agent run`: the node agent's Kubernetes loop, around the GPU layer of [`crate::agent`].
//!
//! It creates its node's GpuNode if missing, watches it, and on every change of the spec (and every
//! `poll` interval, to find drift: a reboot, someone with nvidia-smi) applies the spec to the GPUs
//! with the published status as the previous state, so who had each GPU and when it was scrubbed
//! survives restarts. The status is written with server-side apply (field manager
//! `gpu-tenancy-agent`) only when it changed, and the node's `gputenancy.io/config.state` label says
//! `pending`, `success` or `failed` as mig-manager users expect. After a MIG change the device
//! plugin's pod on this node is deleted so it re-reads the devices. Under `busyGpuPolicy: Evict`, the
//! pods that may hold a busy GPU are listed in the status (`evictionRequests`) for the controller
//! to evict: an agent cannot be kept to its own node's pods if it may evict (an Eviction names no
//! node), so it may not; the controller checks each pod's node before it evicts.
//!
//! The loop is generic over the GPU backend ([`Gpus`]) and over where spec changes come from, so a
//! simulated fleet (`e2e/fleet`) runs this very loop for each of its nodes: [`run`] is the
//! production agent (NVML, a watch on its own GpuNode), [`run_node`] the loop itself.

use crate::agent::apply::{ApplyOptions, apply};
use crate::agent::gpu::Gpus;
use crate::agent::gpu::nvml::NvmlGpus;
use crate::agent::plugin_mps::{self, MpsRoot};
use crate::agent::scrub::CudaLib;
use crate::api::{BusyGpuPolicy, ConditionSet, EvictionRequest, GpuNode, GpuNodeStatus, GpuStatus, condition_status};
use crate::device_plugin::{RESOURCE_GPU, RESOURCE_SHARED, mig_resource};
use crate::labels::CONFIG_STATE;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Field manager of what the agent writes.
pub const FIELD_MANAGER: &str = "gpu-tenancy-agent";

#[derive(Clone, Debug)]
pub struct Options {
    pub node: String,
    /// The NVML and CUDA libraries of [`run`]'s backend (other backends ignore them).
    pub nvml_lib: Option<OsString>,
    pub cuda_lib: Option<PathBuf>,
    /// How often the GPUs are read again without a spec change (drift).
    pub poll: Duration,
    /// Namespace and label selector of NVIDIA's device plugin pods (restarted after a MIG change).
    pub device_plugin_namespace: String,
    pub device_plugin_selector: String,
    /// The device plugin's MPS root, whose daemon this node's `MpsDaemonReady` condition reports;
    /// `None` reports nothing (backends without a device plugin).
    pub mps_root: Option<PathBuf>,
}

/// `pending`, `success` or `failed` from the published conditions.
fn config_state(status: &GpuNodeStatus) -> &'static str {
    if condition_status(&status.conditions, ConditionSet::STALLED) == Some(true) {
        "failed"
    } else if condition_status(&status.conditions, ConditionSet::READY) == Some(true) {
        "success"
    } else {
        "pending"
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

/// One pass: read the GpuNode, apply its spec, publish what changed.
pub async fn pass<G: Gpus + 'static>(client: &Client, gpus: &Arc<G>, opts: &Options) -> Result<(), String> {
    let api: Api<GpuNode> = Api::all(client.clone());
    let node = match api
        .get_opt(&opts.node)
        .await
        .map_err(|e| format!("reading GpuNode {}: {e}", opts.node))?
    {
        Some(n) => n,
        None => {
            let created = api
                .create(&PostParams::default(), &GpuNode::new(&opts.node, Default::default()))
                .await;
            match created {
                Ok(n) => n,
                Err(kube::Error::Api(e)) if e.code == 409 => api
                    .get(&opts.node)
                    .await
                    .map_err(|e| format!("reading GpuNode {}: {e}", opts.node))?,
                Err(e) => return Err(format!("creating GpuNode {}: {e}", opts.node)),
            }
        }
    };
    let spec = node.spec.clone();
    let prev = node.status.clone();
    let generation = node.metadata.generation;
    let apply_opts = ApplyOptions {
        // In a cluster the device plugin's own MPS daemon serves pods (README, "MPS"); a second
        // daemon would fight it, so the agent supervises none.
        mps: None,
        dry_run: false,
    };
    let g = gpus.clone();
    let prev_for_apply = prev.clone();
    let applied = match tokio::task::spawn_blocking(move || apply(&*g, &spec, prev_for_apply.as_ref(), &apply_opts))
        .await
        .map_err(|e| format!("the GPU pass stopped: {e}"))?
    {
        Ok(applied) => applied,
        Err(e) => {
            // NVML failed for the whole node (a system query, the device count): without this
            // the GpuNode would keep its last Ready=True while nothing is applied or watched.
            report_nvml_failure(&api, opts, prev.as_ref(), &e).await;
            return Err(e);
        }
    };
    let mut status = applied.status;
    status.observed_generation = generation;
    // The GPU layer builds conditions before it knows the spec's generation; they describe this one.
    for c in &mut status.conditions {
        c.observed_generation = generation;
    }
    if let Some(root) = &opts.mps_root {
        let root = MpsRoot(root.clone());
        let found = plugin_mps::observe(&root);
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now());
        plugin_mps::report(&mut status, &node.spec, &root, &found, &now);
    }
    if node.spec.busy_gpu_policy == BusyGpuPolicy::Evict {
        let busy: Vec<&GpuStatus> = status
            .gpus
            .iter()
            .filter(|g| g.reason.as_deref() == Some(BUSY) && node.spec.gpus.iter().any(|s| s.index == g.index))
            .collect();
        status.eviction_requests = if busy.is_empty() {
            vec![]
        } else {
            // A failed list keeps the requests last published (nothing asked is better than
            // nothing known): they are made again on the next pass.
            eviction_requests(client, opts, &busy)
                .await
                .unwrap_or_else(|| prev.as_ref().map(|p| p.eviction_requests.clone()).unwrap_or_default())
        };
    }
    if prev.as_ref() != Some(&status) {
        api.patch_status(
            &opts.node,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuNode", "status": status})),
        )
        .await
        .map_err(|e| format!("writing GpuNode {} status: {e}", opts.node))?;
        tracing::info!(node = %opts.node, layout = status.layout.as_deref().unwrap_or(""), "status published");
    }
    let mig_changed = prev.as_ref().is_some_and(|p| mig_layout(p) != mig_layout(&status));
    if mig_changed {
        restart_device_plugin(client, opts).await;
    }
    label_config_state(client, opts, config_state(&status)).await;
    Ok(())
}

/// Marks the GpuNode Ready=False (reason `NvmlFailed`) with the error, keeping the rest of its
/// last status (the GPUs as last seen, the generation last applied). Best effort: the pass is
/// retried with backoff either way.
async fn report_nvml_failure(api: &Api<GpuNode>, opts: &Options, prev: Option<&GpuNodeStatus>, error: &str) {
    let mut status = prev.cloned().unwrap_or_default();
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now());
    let message = format!(
        "NVML failed for the whole node, nothing was applied: {error}; the agent retries with backoff (check the driver with nvidia-smi)"
    );
    let generation = status.observed_generation;
    crate::api::set_condition(
        &mut status.conditions,
        ConditionSet::READY,
        false,
        "NvmlFailed",
        message,
        generation,
        &now,
    );
    if prev == Some(&status) {
        return;
    }
    let patch = json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuNode", "status": status});
    if let Err(e) = api
        .patch_status(
            &opts.node,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(patch),
        )
        .await
    {
        tracing::warn!(node = %opts.node, error = %e, "cannot report the NVML failure in the GpuNode status");
    }
}

/// The reason the GPU layer gives a GPU it leaves alone because processes run on it.
const BUSY: &str = "Busy";

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
async fn eviction_requests(client: &Client, opts: &Options, busy: &[&GpuStatus]) -> Option<Vec<EvictionRequest>> {
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
async fn restart_device_plugin(client: &Client, opts: &Options) {
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

/// Keeps `gputenancy.io/config.state` on the node; written only when it changes.
async fn label_config_state(client: &Client, opts: &Options, state: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    let current = match nodes.get_opt(&opts.node).await {
        Ok(Some(n)) => n.labels().get(CONFIG_STATE).cloned(),
        Ok(None) => return, // no Node object (outside a cluster's node set): nothing to label
        Err(e) => {
            tracing::warn!(error = %e, "could not read the node");
            return;
        }
    };
    if current.as_deref() == Some(state) {
        return;
    }
    let patch = json!({"metadata": {"labels": {CONFIG_STATE: state}}});
    if let Err(e) = nodes
        .patch(&opts.node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        tracing::warn!(error = %e, "could not label the node");
    }
}

/// The production agent: NVML (and CUDA for scrubs) from `opts`, a watch on this node's GpuNode;
/// runs [`run_node`] until `shutdown`.
pub async fn run(client: Client, opts: Options, shutdown: impl std::future::Future<Output = ()>) -> Result<(), String> {
    let nvml_lib = opts.nvml_lib.clone();
    let cuda = CudaLib(opts.cuda_lib.clone());
    let gpus = tokio::task::spawn_blocking(move || NvmlGpus::open(nvml_lib.as_deref()))
        .await
        .map_err(|e| e.to_string())??
        .with_cuda(cuda);
    let api: Api<GpuNode> = Api::all(client.clone());
    let generations = watcher(
        api,
        watcher::Config::default().fields(&format!("metadata.name={}", opts.node)),
    )
    .default_backoff()
    .applied_objects()
    .map(|ev| {
        ev.map(|n| n.metadata.generation)
            .map_err(|e| format!("watching the GpuNode failed: {e}"))
    });
    run_node(client, Arc::new(gpus), opts, generations, shutdown).await
}

/// Runs until `shutdown`: a pass at once, on every new spec generation `generations` brings (the
/// GpuNode's `metadata.generation` as it changes) and every `poll`; failed passes are retried
/// with backoff. Writes go to this node's objects only, as a real agent's do.
pub async fn run_node<G: Gpus + 'static>(
    client: Client,
    gpus: Arc<G>,
    opts: Options,
    generations: impl Stream<Item = Result<Option<i64>, String>>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), String> {
    let mut changes = std::pin::pin!(generations);
    let mut backoff = crate::controller::retry::Backoff::for_api_errors();
    let mut wait = Duration::ZERO;
    tokio::pin!(shutdown);
    let mut last_generation: Option<i64> = None;
    loop {
        tokio::select! {
            _ = &mut shutdown => return Ok(()),
            _ = tokio::time::sleep(wait) => {}
            ev = changes.next() => {
                match ev {
                    // Our own status writes come back as events; only a new spec is worth a pass.
                    Some(Ok(g)) if g == last_generation => continue,
                    Some(Ok(g)) => last_generation = g,
                    Some(Err(e)) => { tracing::warn!(node = %opts.node, error = %e, "retrying"); continue }
                    None => return Err(format!("the watch of GpuNode {} ended", opts.node)),
                }
            }
        }
        match pass(&client, &gpus, &opts).await {
            Ok(()) => {
                backoff.reset();
                wait = opts.poll;
            }
            Err(e) => {
                wait = backoff.next();
                tracing::warn!(node = %opts.node, error = %e, retry_in = ?wait, "agent pass failed");
            }
        }
    }
}
