//! `gpu-tenancy agent run`: the node agent, the Kubernetes loop around the GPU layer ([`crate::gpu`]).
//!
//! It creates its node's GpuNode if missing (declaring the GPUs it found where they hold nothing,
//! so the controller plans the node before a first status: [`join`]), watches it, and on every
//! change of the spec (and every `poll` interval, to find drift: a reboot, someone with
//! nvidia-smi) applies the spec to the GPUs with the published status as the previous state, so
//! who had each GPU and when it was scrubbed survives restarts. The status is written with server-side apply (field manager
//! `gpu-tenancy-agent`) only when it changed, and the node's `gputenancy.io/config.state` label says
//! `pending`, `success` or `failed` as mig-manager users expect. After a MIG change the device
//! plugin's pod on this node is deleted so it re-reads the devices. Under `busyGpuPolicy: Evict`, the
//! pods that hold a busy GPU (by the kubelet's pod-resources API, [`pod_resources`]; without it,
//! every pod that may) are listed in the status (`evictionRequests`) for the controller
//! to evict: an agent cannot be kept to its own node's pods if it may evict (an Eviction names no
//! node), so it may not; the controller checks each pod's node before it evicts.
//!
//! The loop is generic over the GPU backend ([`Gpus`]) and over where spec changes come from, so a
//! simulated fleet (`e2e/fleet`) runs this very loop for each of its nodes: [`run`] is the
//! production agent (NVML, a watch on its own GpuNode), [`run_node`] the loop itself.

pub mod attribution;
pub mod device_plugin;
pub mod dra;
mod field_manager;
mod health;
mod join;
mod known;
pub mod kubelet_api;
pub mod metrics;
pub mod mode;
mod options;
mod pass_error;
pub mod pod_resources;
pub mod signals;
mod spec_changes;
pub mod watches;

pub use field_manager::FIELD_MANAGER;
pub use options::{AgentMode, Options};
pub use pass_error::PassError;

use crate::api::{ConditionSet, GpuNode, GpuNodeStatus, GpuReason, condition_status};
use crate::gpu::Gpus;
use crate::gpu::apply::{ApplyOptions, apply};
use crate::gpu::nvml::NvmlGpus;
use crate::gpu::scrub::CudaLib;
use crate::labels::{CONFIG_STATE, ConfigState};
use crate::runtime::client::apply_params;
use futures::{Stream, StreamExt};
use health::HealthWatch;
use k8s_openapi::api::core::v1::Node;
use known::Known;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};
use mode::PassView;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
pub use watches::Watches;

/// The node's reconfiguration state from the published conditions.
fn config_state(status: &GpuNodeStatus) -> ConfigState {
    if condition_status(&status.conditions, ConditionSet::STALLED) == Some(true) {
        ConfigState::Failed
    } else if condition_status(&status.conditions, ConditionSet::READY) == Some(true) {
        ConfigState::Success
    } else {
        ConfigState::Pending
    }
}

/// The part of the GpuNode status the pass writes. The status has two writers, merged by
/// server-side apply: the pass applies every field but `claims` under [`FIELD_MANAGER`], and the
/// DRA mode applies `claims` (the claims it prepared) under [`dra::CLAIMS_FIELD_MANAGER`]. So the
/// pass compares and writes this part only, never the other writer's.
fn status_part(status: &GpuNodeStatus) -> GpuNodeStatus {
    GpuNodeStatus {
        claims: vec![],
        ..status.clone()
    }
}

/// The server-side apply body of a GpuNode status.
fn status_body(status: &GpuNodeStatus) -> serde_json::Value {
    json!({"apiVersion": GpuNode::api_version(&()), "kind": GpuNode::kind(&()), "status": status})
}

/// Why the agent stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The NVML library could not be loaded or initialised.
    #[error("{0}")]
    Nvml(crate::gpu::nvml::OpenError),
    #[error("loading NVML stopped: {0}")]
    Stopped(tokio::task::JoinError),
    /// The source of spec changes ended (a watch is restarted by its backoff, so only a test's
    /// finite stream ends).
    #[error("the watch of GpuNode {0} ended")]
    WatchEnded(String),
    #[error("the DRA kubelet plugin stopped: {0}")]
    Dra(dra::DraError),
}

/// When the next pass is due after one that succeeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// At the next poll (or spec change).
    Poll,
    /// Soon, with backoff: an NVML call or a scrub failed on some GPU
    /// ([`crate::api::GpuReason::retries_soon`]), and waiting a whole poll would keep that GPU
    /// from its spec (and, for a scrub, its node tainted) for nothing.
    Retry,
}

/// What a pass that succeeded did: which spec it applied, and when the next is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Passed {
    /// The GpuNode's `metadata.generation` the pass read and applied.
    pub generation: Option<i64>,
    pub next: Next,
}

/// One pass: apply the GpuNode's spec, publish what changed. The GpuNode and the node's label
/// are read only where `known` does not have them ([`known`]): a poll reads neither. What differs
/// by mode comes from the mode ([`mode::NodeMode`]).
async fn pass<G: Gpus + 'static>(
    client: &Client,
    gpus: &Arc<G>,
    opts: &Options,
    known: &mut Known,
    health: &HealthWatch,
) -> Result<Passed, PassError> {
    let api: Api<GpuNode> = Api::all(client.clone());
    let node = match node_to_apply(&api, gpus, opts, known).await? {
        ToApply::Node(n) => *n,
        ToApply::Nothing(passed) => return Ok(passed),
    };
    let mode = opts.mode.node_mode();
    let prev = node.status.clone();
    let generation = node.metadata.generation;
    let view = PassView {
        client,
        node: &opts.node,
        spec: &node.spec,
        prev: prev.as_ref(),
    };
    let apply_opts = ApplyOptions {
        mps: mode.mps(),
        dry_run: false,
    };
    let sampled = apply_and_sample(
        gpus,
        node.spec.clone(),
        prev.clone(),
        apply_opts,
        opts.metrics.is_some(),
    );
    let (applied, usage) = match sampled.await.map_err(PassError::Stopped)? {
        Ok(applied) => applied,
        Err(e) => {
            // NVML failed for the whole node (a system query, the device count): without this
            // the GpuNode would keep its last Ready=True while nothing is applied or watched.
            report_nvml_failure(&api, opts, prev.as_ref(), &e).await;
            return Err(PassError::Apply(e));
        }
    };
    let mut status = applied.status.clone();
    health.annotate(&mut status);
    stamp(&mut status, generation, prev.as_ref());
    let holders = mode.observe(view, &mut status).await;
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now());
    let signals = signals::report(&mut status, &node.spec, holders.as_ref(), &now);
    if let Some(m) = &opts.metrics {
        let (busy, namespaces) = attribute(client, opts, &node.spec, &status, usage, holders.as_ref()).await;
        m.observe(&node.spec, &status, busy, &applied.events);
        m.namespaces(namespaces);
        m.holders(&status, holders.as_ref());
        m.ungranted(&status, &signals);
        share_memory(client, opts, m, &status).await;
    }
    publish(&api, opts, prev.as_ref(), &status).await?;
    mode.passed(view, &status).await;
    label_config_state(client, opts, config_state(&status), known).await;
    let retry = status
        .gpus
        .iter()
        .any(|g| g.reason.is_some_and(GpuReason::retries_soon));
    // What the API server now holds (`claims` aside: the DRA mode's, never read here).
    known.keep_gpu_node(node, status);
    Ok(Passed {
        generation,
        next: if retry { Next::Retry } else { Next::Poll },
    })
}

/// The GpuNode a pass applies, or why it has nothing to apply.
enum ToApply {
    Node(Box<GpuNode>),
    Nothing(Passed),
}

/// The GpuNode to apply: as `known` has it, or read (created, with the GPUs found declared, if
/// missing). Nothing to apply while the declaration still says all the controller needs.
async fn node_to_apply<G: Gpus + 'static>(
    api: &Api<GpuNode>,
    gpus: &Arc<G>,
    opts: &Options,
    known: &mut Known,
) -> Result<ToApply, PassError> {
    if let Some(declared) = known.awaiting_spec(opts.poll.saturating_mul(join::SPEC_PATIENCE_POLLS))
        && join::still_as_declared(gpus, declared).await
    {
        // A poll before the spec: the declaration still says all the controller needs.
        return Ok(ToApply::Nothing(Passed {
            generation: declared.metadata.generation,
            next: Next::Poll,
        }));
    }
    if let Some(n) = known.take_gpu_node() {
        return Ok(ToApply::Node(Box::new(n)));
    }
    match join::read_or_create(api, gpus, opts).await? {
        join::Joined::Read(n) => Ok(ToApply::Node(Box::new(n))),
        join::Joined::Declared(n) => {
            // Its first status comes with the spec planned from what it declared, or at a poll
            // that finds the GPUs changed or the spec late ([`join`]): nothing to apply (an empty
            // spec) and nothing to publish yet.
            tracing::info!(node = %opts.node, "GpuNode created with the GPUs found declared");
            let generation = n.metadata.generation;
            known.keep_declared(n);
            Ok(ToApply::Nothing(Passed {
                generation,
                next: Next::Poll,
            }))
        }
    }
}

/// Marks a status just read from the GPUs with the spec's generation it describes, and shares
/// each GPU model's MIG profiles as published before.
fn stamp(status: &mut GpuNodeStatus, generation: Option<i64>, prev: Option<&GpuNodeStatus>) {
    status.observed_generation = generation;
    // Published with each GPU model's MIG profiles once, as every later read sees it.
    status.share_profiles(prev.map_or(&[], |p| p.mig_profiles.as_slice()));
    // The GPU layer builds conditions before it knows the spec's generation; they describe this one.
    for c in &mut status.conditions {
        c.observed_generation = generation;
    }
}

/// Writes the pass's part of the status ([`status_part`]) where it differs from `prev`.
async fn publish(
    api: &Api<GpuNode>,
    opts: &Options,
    prev: Option<&GpuNodeStatus>,
    status: &GpuNodeStatus,
) -> Result<(), PassError> {
    let status = status_part(status);
    if prev.is_some_and(|p| status_part(p) == status) {
        return Ok(());
    }
    api.patch_status(
        &opts.node,
        &apply_params(FIELD_MANAGER),
        &Patch::Apply(status_body(&status)),
    )
    .await
    .map_err(|source| PassError::Publish {
        node: opts.node.clone(),
        source,
    })?;
    tracing::info!(node = %opts.node, layout = status.layout.as_deref().unwrap_or(""), "status published");
    Ok(())
}

/// What an apply did, and how busy the devices were afterwards (where known).
type Sampled = (crate::gpu::apply::Applied, crate::gpu::Usage);

/// Applies `spec` on a blocking thread (NVML calls block) and, for the metrics, reads how busy
/// the devices are afterwards.
fn apply_and_sample<G: Gpus + 'static>(
    gpus: &Arc<G>,
    spec: crate::api::GpuNodeSpec,
    prev: Option<GpuNodeStatus>,
    apply_opts: ApplyOptions,
    sample: bool,
) -> tokio::task::JoinHandle<Result<Sampled, crate::gpu::DiscoverError>> {
    let g = gpus.clone();
    tokio::task::spawn_blocking(move || {
        let applied = apply(&*g, &spec, prev.as_ref(), &apply_opts)?;
        let usage = match sample {
            true => g.usage(&applied.status),
            false => Default::default(),
        };
        Ok((applied, usage))
    })
}

/// The accounting's view of a pass's reading ([`attribution::busy`]) and what each tenant's
/// namespaces hold of its devices. Without [`Options::attribution`] nothing is attributed: the
/// processes' samples are dropped (a shared GPU's use stays `shared`) and no namespace is told.
async fn attribute(
    client: &Client,
    opts: &Options,
    spec: &crate::api::GpuNodeSpec,
    status: &GpuNodeStatus,
    mut usage: crate::gpu::Usage,
    holders: Option<&pod_resources::Holdings>,
) -> (crate::accounting::Busy, BTreeMap<(String, String), f64>) {
    let Some(a) = &opts.attribution else {
        usage.processes.clear();
        return (
            attribution::busy(spec, status, &usage, &BTreeMap::new()),
            BTreeMap::new(),
        );
    };
    let pids = attribution::sampled_pids(spec, status, &usage);
    let tenant_of = match pids.is_empty() {
        true => BTreeMap::new(),
        false => a.tenants_of(client, &opts.node, &pids).await,
    };
    let found: Vec<u32> = status.gpus.iter().map(|g| g.index).collect();
    let holdings = crate::accounting::holdings(spec, &found);
    let namespaces = attribution::namespaces(spec, &holdings, status, holders, |ns| a.owner(ns));
    (attribution::busy(spec, status, &usage, &tenant_of), namespaces)
}

/// The memory each tenant uses against its caps on the GPUs where the DRA mode prepared capped
/// shares ([`metrics::share_memory_rows`]). Without attribution the use cannot be told, and no
/// rows are exported rather than rows at 0.
async fn share_memory(client: &Client, opts: &Options, m: &metrics::AgentMetrics, status: &GpuNodeStatus) {
    let caps = m.caps();
    let (Some(a), false) = (&opts.attribution, caps.is_empty()) else {
        m.share_memory(&[]);
        return;
    };
    let pids = metrics::capped_pids(status, &caps);
    let tenant_of = match pids.is_empty() {
        true => BTreeMap::new(),
        false => a.tenants_of(client, &opts.node, &pids).await,
    };
    m.share_memory(&metrics::share_memory_rows(status, &caps, &tenant_of));
}

/// Marks the GpuNode Ready=False (reason `NvmlFailed`) with the error, keeping the rest of its
/// last status (the GPUs as last seen, the generation last applied). Best effort: the pass is
/// retried with backoff either way.
async fn report_nvml_failure(
    api: &Api<GpuNode>,
    opts: &Options,
    prev: Option<&GpuNodeStatus>,
    error: &crate::gpu::DiscoverError,
) {
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
    if let Err(e) = api
        .patch_status(
            &opts.node,
            &apply_params(FIELD_MANAGER),
            &Patch::Apply(status_body(&status)),
        )
        .await
    {
        tracing::warn!(node = %opts.node, error = %e, "cannot report the NVML failure in the GpuNode status");
    }
}

/// Keeps `gputenancy.io/config.state` on the node; written only when it changes. The label as
/// last read or written is kept in `known`: only this agent writes it, so it is read once, and
/// again after a write that failed.
async fn label_config_state(client: &Client, opts: &Options, state: ConfigState, known: &mut Known) {
    let state = state.as_str();
    if known.config_state() == Some(state) {
        return;
    }
    let nodes: Api<Node> = Api::all(client.clone());
    if known.config_state().is_none() {
        let current = match nodes.get_opt(&opts.node).await {
            Ok(Some(n)) => n.labels().get(CONFIG_STATE).cloned(),
            Ok(None) => return, // no Node object (outside a cluster's node set): nothing to label
            Err(e) => {
                tracing::warn!(error = %e, "could not read the node");
                return;
            }
        };
        if current.as_deref() == Some(state) {
            known.set_config_state(current);
            return;
        }
    }
    let patch = json!({"metadata": {"labels": {CONFIG_STATE: state}}});
    match nodes
        .patch(&opts.node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => known.set_config_state(Some(state.to_string())),
        Err(e) => {
            known.set_config_state(None);
            tracing::warn!(error = %e, "could not label the node");
        }
    }
}

/// The production agent: NVML (and CUDA for scrubs) from `opts`, the agent's shared watches
/// ([`Watches`]); runs [`run_node`] and the mode's own work ([`AgentMode::serve`]) until
/// `shutdown`.
pub async fn run(
    client: Client,
    opts: Options,
    watches: Watches,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let nvml_lib = opts.nvml_lib.clone();
    let cuda = CudaLib(opts.cuda_lib.clone());
    let gpus = tokio::task::spawn_blocking(move || NvmlGpus::open(nvml_lib.as_deref()))
        .await
        .map_err(RunError::Stopped)?
        .map_err(RunError::Nvml)?
        .with_cuda(cuda);
    let gpus = Arc::new(gpus);
    // Both halves stop on the one shutdown.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|v| *v).await;
    };
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let serving = opts.mode.clone().serve(
        client.clone(),
        opts.metrics.clone(),
        opts.node.clone(),
        gpus.clone(),
        watches.clone(),
        stopped(stop_rx.clone()),
    );
    let common = run_node(client, gpus, opts, watches.gpu_node_changes(), stopped(stop_rx));
    let (served, ran) = tokio::join!(serving, common);
    served?;
    ran
}

/// Runs until `shutdown`: a pass at once, on every new spec generation `seen` brings (the GpuNode
/// as the watch sees it; `None` for the GpuNode gone) and every `poll`; failed passes are retried
/// with backoff. A pass starts from what the last pass read and wrote ([`known`]), with a new
/// generation's spec; the GpuNode is read at start, after a failed pass and when it is gone.
/// Writes go to this node's objects only, as a real agent's do.
pub async fn run_node<G: Gpus + 'static>(
    client: Client,
    gpus: Arc<G>,
    opts: Options,
    seen: impl Stream<Item = Option<GpuNode>>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), RunError> {
    let mut changes = std::pin::pin!(seen);
    let mut backoff = crate::runtime::backoff::Backoff::for_api_errors();
    // Passes that left a GPU failed: from a second apart up to a poll apart.
    let mut repair = crate::runtime::backoff::Backoff::new(Duration::from_secs(1), opts.poll);
    let mut wait = Duration::ZERO;
    tokio::pin!(shutdown);
    let mut last_generation: Option<i64> = None;
    let mut known = Known::default();
    let mut health = HealthWatch::start(gpus.clone());
    loop {
        tokio::select! {
            _ = &mut shutdown => return Ok(()),
            _ = tokio::time::sleep(wait) => {}
            _ = health.changed() => tracing::info!(node = %opts.node, "a device's health changed"),
            ev = changes.next() => {
                match ev {
                    // Our own status writes come back as events; only a new spec is worth a pass.
                    Some(Some(n)) if n.metadata.generation == last_generation => continue,
                    Some(Some(n)) => {
                        last_generation = n.metadata.generation;
                        known.new_generation(n);
                    }
                    Some(None) => {
                        last_generation = None;
                        known.forget_gpu_node();
                    }
                    None => return Err(RunError::WatchEnded(opts.node.clone())),
                }
            }
        }
        let passed = pass(&client, &gpus, &opts, &mut known, &health).await;
        // The watch's event for the generation a pass just read and applied (the GpuNode this
        // pass created, or the one found at start) brings nothing new: no second pass for it.
        // Why: that pass re-read both objects, one more read of each per node the API server
        // serves while a fleet joins. A newer generation still differs, and so starts a pass.
        if let Ok(p) = &passed {
            last_generation = p.generation;
        }
        match passed.map(|p| p.next) {
            Ok(Next::Poll) => {
                backoff.reset();
                repair.reset();
                wait = opts.poll;
            }
            Ok(Next::Retry) => {
                backoff.reset();
                wait = repair.next().min(opts.poll);
                tracing::info!(node = %opts.node, retry_in = ?wait, "a GPU's NVML call or scrub failed: applying again");
            }
            Err(e) => {
                // Whatever failed (a read, NVML, a write), the next pass reads everything again.
                known = Known::default();
                wait = backoff.next();
                tracing::warn!(node = %opts.node, step = e.step(), error = %e, retry_in = ?wait, "agent pass failed");
            }
        }
    }
}
