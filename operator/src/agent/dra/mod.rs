//! The node agent's DRA mode: the agent is also a DRA kubelet plugin for driver
//! `gpu.gputenancy.io` (docs/design.md#dra-mode). Beside the common loop (which applies the GpuNode spec to
//! the GPUs and publishes their status, as in the device-plugin mode, and supervises its own MPS
//! daemon), it
//!
//! - publishes the node's pool as ResourceSlices ([`slices`], [`publish`]): every whole GPU, MIG
//!   instance and share of its GpuNode ([`devices`]) with the tenant the spec binds it to, a device
//!   not safe to hand over carrying a device taint instead of the whole node being tainted;
//! - serves the kubelet's registration and `DRAPlugin` services ([`server`]): Prepare refuses a
//!   device of another tenant and hands a device to a new tenant only after its memory was
//!   scrubbed and verified, checkpointed across restarts ([`prepare`], [`state`],
//!   [`checkpoint`]), with one CDI spec per claim ([`cdi`]), and refuses a claim whose pod
//!   holds more than its tenant allows or has a container that would get two memory caps
//!   ([`pods`], [`container_caps`]);
//! - says what each hand-over did where the tenant reads it, in the ResourceClaim's
//!   `status.devices` ([`evidence`], [`claim_status`]), and in the GpuNode's `status.claims`;
//! - streams its devices' health to the kubelet ([`health`]).
//!
//! Like NVIDIA's DRA driver, the plugin is a mode of its own over shared parts (their kubelet
//! plugin is a command of its own; here the same process also drives the GPUs, because Prepare's
//! scrubs and the layout's changes must not race and share one GPU backend).

pub mod authority;
pub mod caps;
pub mod cdi;
pub mod checkpoint;
pub mod claim_status;
pub mod container_caps;
pub mod devices;
pub mod evidence;
pub mod health;
pub mod pod_claims;
pub mod pods;
pub mod prepare;
pub mod publish;
pub mod refusal;
pub mod reservations;
pub mod scrubs;
pub mod server;
pub mod slices;
pub mod state;

use super::mode::{NodeMode, PassView};
use super::pod_resources::{self, Holdings};
use super::watches::Watches;
use crate::api::{GpuNode, GpuNodeStatus};
use crate::gpu::Gpus;
use crate::gpu::mps::MpsConfig;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use server::Sockets;
use std::path::PathBuf;
use std::sync::Arc;

/// What the DRA mode needs beyond the common loop's options.
#[derive(Clone, Debug)]
pub struct DraOptions {
    pub sockets: Sockets,
    /// Where the checkpoint lives (a host directory that survives the agent's pod).
    pub state_dir: PathBuf,
    pub cdi: cdi::CdiContext,
    /// Where the memory caps' probe looks ([`caps`]).
    pub caps_probe: caps::ProbeOptions,
    /// The driver's `mig-minors` file, read for MIG instances' capability device nodes.
    pub mig_minors_file: PathBuf,
    /// The agent's own MPS daemon (MPS shares need one; NVIDIA's device plugin is not there).
    pub mps: Option<crate::gpu::mps::MpsConfig>,
}

impl NodeMode for DraOptions {
    /// The agent's own daemon serves the MPS claims it prepares.
    fn mps(&self) -> Option<MpsConfig> {
        self.mps.clone()
    }

    /// How the node caps its shares' memory (`status.memoryCaps`, which the published devices
    /// and their CDI specs follow); no holdings: Prepare knows each claim's devices, and
    /// publishes them itself (`status.claims`, [`CLAIMS_FIELD_MANAGER`]).
    fn observe<'a>(&'a self, pass: PassView<'a>, status: &'a mut GpuNodeStatus) -> BoxFuture<'a, Option<Holdings>> {
        pod_resources::clear(status);
        async move {
            let (opts, ctk) = (self.caps_probe.clone(), self.cdi.nvidia_ctk.clone());
            let driver = status.driver.as_ref().map(|d| d.driver_version.clone());
            // A failed probe task knows nothing: every part counts as missing.
            let probe = tokio::task::spawn_blocking(move || caps::probe(&opts, &ctk, driver.as_deref()))
                .await
                .unwrap_or_default();
            caps::report(pass.spec, &probe, status);
            None
        }
        .boxed()
    }

    fn passed<'a>(&'a self, _pass: PassView<'a>, _status: &'a GpuNodeStatus) -> BoxFuture<'a, ()> {
        futures::future::ready(()).boxed()
    }
}

/// Why the DRA mode stopped.
#[derive(Debug, thiserror::Error)]
pub enum DraError {
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::CheckpointError),
    #[error(transparent)]
    Serve(#[from] server::ServeError),
}

/// The field manager of `status.claims`: the pass applies the rest of the status under its own
/// ([`super::status_part`]), so neither removes the other's fields.
pub const CLAIMS_FIELD_MANAGER: &str = "gpu-tenancy-agent-dra";

/// Keeps the GpuNode's `status.claims` what the checkpoint says: written after a change, changes
/// within half a second coalesced into one write, and never when nothing changed. Nothing is
/// written before the agent's watch has seen the GpuNode (the pass creates it at start): a status
/// write to a GpuNode not there yet only fails.
async fn publish_claims(
    client: Client,
    node: String,
    mut saved: tokio::sync::watch::Receiver<checkpoint::Checkpoint>,
    mut gpu_node: tokio::sync::watch::Receiver<Option<GpuNode>>,
) {
    if gpu_node.wait_for(Option::is_some).await.is_err() {
        return;
    }
    let api: Api<GpuNode> = Api::all(client);
    // What the API server holds already (a restart with the same claims writes nothing).
    let mut written: Option<Vec<crate::api::DeviceClaim>> = api
        .get_status(&node)
        .await
        .ok()
        .map(|n| n.status.map(|s| s.claims).unwrap_or_default());
    let mut backoff = crate::runtime::backoff::Backoff::for_api_errors();
    loop {
        let claims = saved.borrow_and_update().device_claims();
        if written.as_ref() != Some(&claims) {
            let body = serde_json::json!({
                "apiVersion": GpuNode::api_version(&()), "kind": GpuNode::kind(&()),
                "status": {"claims": claims},
            });
            let pp = crate::runtime::client::apply_params(CLAIMS_FIELD_MANAGER);
            match api.patch_status(&node, &pp, &kube::api::Patch::Apply(body)).await {
                Ok(_) => {
                    backoff.reset();
                    written = Some(claims);
                }
                Err(e) => {
                    let wait = backoff.next();
                    tracing::warn!(node = %node, error = %e, retry_in = ?wait, "publishing the prepared claims failed");
                    tokio::time::sleep(wait).await;
                    continue;
                }
            }
        }
        if saved.changed().await.is_err() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// What wakes the slice publisher.
enum Wake {
    /// The GpuNode, with the devices it says.
    Node(Box<GpuNode>),
    /// Something happened to the node's slices: the kubelet wipes a node's slices when it starts,
    /// and a driver's 30 s after its plugin's last connection drops.
    Slices,
}

/// Keeps the node's ResourceSlices what its GpuNode says: written when the devices change, and
/// again when the slices were changed or deleted by someone else, as the upstream resourceslice
/// controller does. [`publish::publish`] writes nothing when the slices are as they should be.
async fn publish_slices<G: Gpus + 'static>(
    client: Client,
    node: String,
    state: Arc<state::DraState<G>>,
    gpu_node: tokio::sync::watch::Receiver<Option<GpuNode>>,
) {
    let nodes = tokio_stream::wrappers::WatchStream::new(gpu_node)
        .filter_map(|n| futures::future::ready(n.map(|n| Wake::Node(Box::new(n)))));
    let slices = watcher(
        Api::<ResourceSlice>::all(client.clone()),
        watcher::Config::default().fields(&format!("spec.nodeName={node},spec.driver={}", devices::DRIVER)),
    )
    .default_backoff()
    .filter_map(|ev| {
        futures::future::ready(match ev {
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone) => Some(Wake::Slices),
            _ => None,
        })
    });
    let mut wakes = std::pin::pin!(futures::stream::select(nodes, slices));
    // The slices are owned by the Node (deleted with it); a node not registered yet gets them
    // unowned until the next write after it is.
    let mut owner: Option<slices::NodeOwner> = None;
    let mut devs: Option<Vec<devices::DraDevice>> = None;
    let mut backoff = crate::runtime::backoff::Backoff::for_api_errors();
    while let Some(wake) = wakes.next().await {
        match wake {
            Wake::Node(gn) => {
                let now = devices::devices(&gn);
                state.set_devices(now.clone()).await;
                if devs.as_ref() == Some(&now) {
                    continue;
                }
                devs = Some(now);
            }
            // Nothing to write back before the GpuNode is read.
            Wake::Slices if devs.is_none() => continue,
            Wake::Slices => {}
        }
        let Some(devs) = devs.as_ref() else { continue };
        if owner.is_none()
            && let Ok(Some(n)) = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
                .get_opt(&node)
                .await
        {
            owner = n.metadata.uid.map(|uid| slices::NodeOwner {
                name: node.clone(),
                uid,
            });
        }
        loop {
            match publish::publish(&client, &node, owner.as_ref(), devs).await {
                Ok(p) => {
                    if p.writes > 0 {
                        tracing::info!(node = %node, devices = devs.len(), generation = p.generation, writes = p.writes, "ResourceSlices published");
                    }
                    backoff.reset();
                    break;
                }
                Err(e) => {
                    let wait = backoff.next();
                    tracing::warn!(node = %node, error = %e, retry_in = ?wait, "publishing the ResourceSlices failed");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }
}

/// Runs the DRA side until `shutdown`: the slices and claims it publishes from the agent's shared
/// watches (the GpuNode's devices, the tenants that own namespaces), and the kubelet plugin's
/// sockets.
pub async fn run<G: Gpus + 'static>(
    client: Client,
    metrics: Option<std::sync::Arc<crate::agent::metrics::AgentMetrics>>,
    node: String,
    gpus: Arc<G>,
    opts: DraOptions,
    watches: &Watches,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), DraError> {
    let tenants = watches.tenants.clone();

    let mut cdi = opts.cdi.clone();
    // Read at start: the driver writes it once, when it loads.
    if let Ok(text) = std::fs::read_to_string(&opts.mig_minors_file) {
        cdi.mig_minors = cdi::parse_mig_minors(&text);
    }
    let state = Arc::new(state::DraState::new(
        node.clone(),
        gpus,
        client.clone(),
        tenants,
        checkpoint::CheckpointFile::new(&opts.state_dir),
        cdi,
    )?);

    tokio::spawn(publish_slices(
        client.clone(),
        node.clone(),
        state.clone(),
        watches.gpu_node.clone(),
    ));
    if let Some(m) = metrics {
        tokio::spawn(crate::agent::metrics::follow_caps(state.subscribe(), m));
    }
    tokio::spawn(publish_claims(
        client.clone(),
        node.clone(),
        state.subscribe(),
        watches.gpu_node.clone(),
    ));
    tokio::spawn(claim_status::publish(client.clone(), node.clone(), state.subscribe()));
    server::serve(state, &opts.sockets, shutdown).await?;
    Ok(())
}
