//! Which pod holds which device: the kubelet's pod-resources API (`v1.PodResourcesLister`, served
//! by the kubelet on `/var/lib/kubelet/pod-resources/kubelet.sock`), compiled from the kubelet's
//! own .proto file (`operator/proto/`). Both modes of the agent can use it; the device-plugin mode
//! does, to ask for the eviction of only the pods that hold a busy GPU.
//!
//! [`holdings`] is the pure part, from a `List` answer to typed maps: device-plugin device IDs to
//! the containers that hold them, DRA claim devices (driver, pool, device) to their claims and
//! containers, and every pod the kubelet reported. [`read`] is the client over the unix socket;
//! [`report`] turns its outcome into the GpuNode condition `PodResources`.
//!
//! What the kubelet reports (`pkg/kubelet/apis/podresources/server_v1.go`, Kubernetes 1.37): its
//! active pods, and per pod its regular containers and its restartable init containers (sidecars)
//! only, each with the device IDs the device plugin advertised (by resource name) and its DRA
//! claims' devices. An init container that runs to completion is not reported at all, so a pod
//! still initialising may hold a device the answer does not show: [`Holdings`] says what was
//! reported, and callers count what it does not say as unknown.
//!
//! NVIDIA's device plugin names its devices (k8s-device-plugin v0.20.0, `internal/rm/devices.go`
//! `BuildDevice`, `NewAnnotatedID`; `internal/rm/device_map.go` `updateDeviceMapWithReplicas`):
//! a whole GPU by its UUID (`GPU-<uuid>`), a MIG device by its MIG UUID (`MIG-<uuid>`), and a
//! time-slicing or MPS replica by the device's ID, `::` and the replica number (`GPU-<uuid>::3`).
//! Its `deviceIDStrategy` (uuid or index) changes only what a container's environment gets, not
//! these IDs. [`DeviceId`] reads the three forms.

#[cfg(test)]
mod tests;

use crate::api::{GpuNodeStatus, GpuStatus, set_condition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The generated code of the kubelet's `podresources/v1/api.proto` (its package is `v1`).
pub use crate::agent::kubelet_api::v1 as proto;

use proto::pod_resources_lister_client::PodResourcesListerClient;
use proto::{ListPodResourcesRequest, ListPodResourcesResponse};

/// Where the kubelet serves the API (`<root-dir>/pod-resources/kubelet.sock`, root dir
/// `/var/lib/kubelet`: `pkg/kubelet/kubelet_getters.go` `getPodResourcesDir`, `podresources.Socket`).
pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
/// The GpuNode condition that says whether the agent could read the API.
pub const CONDITION: &str = "PodResources";
/// The largest answer taken, as the kubelet's own tests read it (`test/e2e_node/util.go`
/// `defaultPodResourcesMaxSize`): a node's pods with their CPUs and devices fit well within.
const MAX_MESSAGE: usize = 16 * 1024 * 1024;
/// How long a call may take: the kubelet answers from memory, so a socket that does not answer
/// within this is as good as absent (the pass must not hang on it).
const TIMEOUT: Duration = Duration::from_secs(10);

/// A pod as the kubelet names it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
}

/// A container that holds a device.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Holder {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

/// A device-plugin device, by its ID as the plugin advertised it, and who holds it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeldDevice {
    /// The extended resource it was allocated as (`nvidia.com/mig-1g.10gb`).
    pub resource: String,
    pub holders: Vec<Holder>,
}

/// A DRA device, as the kubelet reports a claim's allocation: driver, pool and device name
/// identify it; `share_id` tells shares of one device apart (consumable capacity).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClaimDevice {
    pub driver: String,
    pub pool: String,
    pub device: String,
    pub share_id: Option<String>,
}

/// A container that uses a DRA device, and through which claim.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClaimHolder {
    pub claim_namespace: String,
    pub claim_name: String,
    pub holder: Holder,
}

/// A device as a container of a reported pod holds it: its resource name and ID.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceRef {
    pub resource: String,
    pub id: String,
}

/// What one `List` says: who holds which device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holdings {
    /// Device-plugin devices by ID (`GPU-...`, `MIG-...`, `GPU-...::2`).
    pub devices: BTreeMap<String, HeldDevice>,
    /// DRA devices with the claims and containers that use them.
    pub claims: BTreeMap<ClaimDevice, Vec<ClaimHolder>>,
    /// Every pod reported, with each reported container's device-plugin devices (none: it holds
    /// none), so "reported, holds nothing" can be told from "not reported".
    pub pods: BTreeMap<PodRef, BTreeMap<String, Vec<DeviceRef>>>,
}

/// The pure mapping of a `List` answer.
pub fn holdings(list: &ListPodResourcesResponse) -> Holdings {
    let mut out = Holdings::default();
    for pod in &list.pod_resources {
        let key = PodRef {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
        };
        let containers = out.pods.entry(key).or_default();
        for c in &pod.containers {
            let holder = Holder {
                namespace: pod.namespace.clone(),
                pod: pod.name.clone(),
                container: c.name.clone(),
            };
            let held = containers.entry(c.name.clone()).or_default();
            for d in &c.devices {
                for id in &d.device_ids {
                    held.push(DeviceRef {
                        resource: d.resource_name.clone(),
                        id: id.clone(),
                    });
                    let device = out.devices.entry(id.clone()).or_insert_with(|| HeldDevice {
                        resource: d.resource_name.clone(),
                        holders: vec![],
                    });
                    if !device.holders.contains(&holder) {
                        device.holders.push(holder.clone());
                    }
                }
            }
            for dr in &c.dynamic_resources {
                for r in &dr.claim_resources {
                    let device = ClaimDevice {
                        driver: r.driver_name.clone(),
                        pool: r.pool_name.clone(),
                        device: r.device_name.clone(),
                        share_id: r.share_id.clone(),
                    };
                    let claim = ClaimHolder {
                        claim_namespace: dr.claim_namespace.clone(),
                        claim_name: dr.claim_name.clone(),
                        holder: holder.clone(),
                    };
                    let holders = out.claims.entry(device).or_default();
                    if !holders.contains(&claim) {
                        holders.push(claim);
                    }
                }
            }
        }
    }
    for d in out.devices.values_mut() {
        d.holders.sort();
    }
    for c in out.claims.values_mut() {
        c.sort();
    }
    out
}

/// A device-plugin device ID read as NVIDIA's plugin writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceId<'a> {
    /// The GPU's or MIG device's UUID (`GPU-...`, `MIG-...`).
    pub uuid: &'a str,
    /// The replica of a time-sliced or MPS-shared device (`::N`).
    pub replica: Option<u32>,
}

impl<'a> DeviceId<'a> {
    /// Splits at the first `::`, as the plugin's `AnnotatedID.Split` does; a suffix that is not a
    /// number keeps the whole ID as the UUID (no device of ours is named so, so it matches none).
    pub fn parse(id: &'a str) -> DeviceId<'a> {
        match id.split_once("::") {
            Some((uuid, n)) => match n.parse() {
                Ok(n) => DeviceId { uuid, replica: Some(n) },
                Err(_) => DeviceId {
                    uuid: id,
                    replica: None,
                },
            },
            None => DeviceId {
                uuid: id,
                replica: None,
            },
        }
    }

    /// The index of the GPU of `gpus` this device is (the GPU itself, one of its MIG instances, or
    /// a replica of either); `None` if it is none of them (another node's, or gone since).
    pub fn gpu(&self, gpus: &[GpuStatus]) -> Option<u32> {
        if self.uuid.is_empty() {
            return None;
        }
        gpus.iter()
            .find(|g| g.uuid == self.uuid || g.instances.iter().any(|i| i.uuid.as_deref() == Some(self.uuid)))
            .map(|g| g.index)
    }
}

/// Why the API could not be read. Each message names the socket and what to do.
#[derive(Debug, thiserror::Error)]
pub enum PodResourcesError {
    #[error(
        "the kubelet's pod-resources socket {} is not there ({source}): mount the kubelet's pod-resources directory into the agent (hostPath /var/lib/kubelet/pod-resources) or pass its path with --pod-resources-socket",
        path.display()
    )]
    Missing { path: PathBuf, source: std::io::Error },
    #[error(
        "cannot connect to the kubelet's pod-resources socket {}: {reason}; is the kubelet running on this node, and is the socket the agent mounted the kubelet's?",
        path.display()
    )]
    Connect { path: PathBuf, reason: String },
    #[error(
        "the kubelet's pod-resources List on {} failed: {}: {}; check the kubelet's log",
        path.display(),
        status.code(),
        status.message()
    )]
    List { path: PathBuf, status: tonic::Status },
    #[error(
        "the kubelet's pod-resources socket {} did not answer within {}s; check the kubelet",
        path.display(),
        TIMEOUT.as_secs()
    )]
    Timeout { path: PathBuf },
}

impl PodResourcesError {
    /// Which step failed: `missing`, `connect`, `list` or `timeout` (for logs and metrics).
    pub fn kind(&self) -> &'static str {
        match self {
            PodResourcesError::Missing { .. } => "missing",
            PodResourcesError::Connect { .. } => "connect",
            PodResourcesError::List { .. } => "list",
            PodResourcesError::Timeout { .. } => "timeout",
        }
    }
}

/// An error and its sources on one line (tonic's transport error says only "transport error").
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// Calls `List` on the kubelet's socket `socket`.
pub async fn list(socket: &Path) -> Result<ListPodResourcesResponse, PodResourcesError> {
    // A missing socket is the common case (not mounted): say so rather than "connection failed".
    if let Err(source) = std::fs::metadata(socket) {
        return Err(PodResourcesError::Missing {
            path: socket.to_path_buf(),
            source,
        });
    }
    let path = socket.to_path_buf();
    let call = async {
        let connector_path = path.clone();
        // The URI is not used: every connection goes to the socket.
        let channel = tonic::transport::Endpoint::from_static("http://kubelet.invalid")
            .connect_timeout(TIMEOUT)
            .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                let p = connector_path.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(p).await?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                }
            }))
            .await
            .map_err(|e| PodResourcesError::Connect {
                path: path.clone(),
                reason: chain(&e),
            })?;
        let mut client = PodResourcesListerClient::new(channel).max_decoding_message_size(MAX_MESSAGE);
        client
            .list(ListPodResourcesRequest {})
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| PodResourcesError::List {
                path: path.clone(),
                status,
            })
    };
    tokio::time::timeout(TIMEOUT, call)
        .await
        .unwrap_or_else(|_| Err(PodResourcesError::Timeout { path: path.clone() }))
}

/// Reads who holds which device from the kubelet's socket `socket`.
pub async fn read(socket: &Path) -> Result<Holdings, PodResourcesError> {
    list(socket).await.map(|l| holdings(&l))
}

/// Sets `PodResources` from what reading `socket` gave: True when it answered, False with reason
/// `Unavailable` and the error otherwise. Neither message carries what changes between passes
/// (pod counts), so an unchanged outcome writes nothing.
pub fn report(status: &mut GpuNodeStatus, socket: &Path, read: &Result<Holdings, PodResourcesError>, now: &Time) {
    let (ok, reason, message) = match read {
        Ok(_) => (
            true,
            "Read",
            format!(
                "the kubelet's pod-resources API answers on {}: busyGpuPolicy Evict asks only for the pods that hold a busy GPU",
                socket.display()
            ),
        ),
        Err(e) => (
            false,
            "Unavailable",
            format!(
                "{e}; until it answers, busyGpuPolicy Evict asks for every pod of this node that requests a busy GPU's resource names"
            ),
        ),
    };
    set_condition(
        &mut status.conditions,
        CONDITION,
        ok,
        reason,
        message,
        status.observed_generation,
        now,
    );
}

/// Removes `PodResources` (an agent that does not read the API: no socket configured, DRA mode).
pub fn clear(status: &mut GpuNodeStatus) {
    status.conditions.retain(|c| c.type_ != CONDITION);
}
