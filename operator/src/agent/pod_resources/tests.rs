use super::proto::pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer};
use super::proto::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, CdiDevice, ClaimResource, ContainerDevices,
    ContainerResources, DynamicResource, GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesRequest,
    PodResources,
};
use super::*;
use crate::api::MigInstanceStatus;
use std::collections::BTreeSet;
use tonic::{Request, Response, Status};

/// The pods that hold a device of GPU `gpu` (itself, its MIG instances, their replicas).
fn pods_holding(h: &Holdings, gpu: &GpuStatus) -> BTreeSet<PodRef> {
    let gpus = std::slice::from_ref(gpu);
    h.devices
        .iter()
        .filter(|(id, _)| DeviceId::parse(id).gpu(gpus).is_some())
        .flat_map(|(_, d)| d.holders.iter())
        .map(|h| PodRef {
            namespace: h.namespace.clone(),
            name: h.pod.clone(),
        })
        .collect()
}

const GPU0: &str = "GPU-0a1b2c3d-0000-0000-0000-000000000000";
const GPU1: &str = "GPU-0a1b2c3d-1111-1111-1111-111111111111";
const MIG0A: &str = "MIG-5e6f7a8b-0000-0000-0000-00000000000a";
const MIG0B: &str = "MIG-5e6f7a8b-0000-0000-0000-00000000000b";

fn devices(resource: &str, ids: &[&str]) -> ContainerDevices {
    ContainerDevices {
        resource_name: resource.into(),
        device_ids: ids.iter().map(|s| s.to_string()).collect(),
        topology: None,
    }
}

fn container(name: &str, devs: Vec<ContainerDevices>) -> ContainerResources {
    ContainerResources {
        name: name.into(),
        devices: devs,
        ..Default::default()
    }
}

fn pod(namespace: &str, name: &str, containers: Vec<ContainerResources>) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: namespace.into(),
        containers,
        ..Default::default()
    }
}

fn holder(namespace: &str, pod: &str, container: &str) -> Holder {
    Holder {
        namespace: namespace.into(),
        pod: pod.into(),
        container: container.into(),
    }
}

fn pod_ref(namespace: &str, name: &str) -> PodRef {
    PodRef {
        namespace: namespace.into(),
        name: name.into(),
    }
}

/// GPU 0 with two MIG instances, GPU 1 whole.
fn gpus() -> Vec<GpuStatus> {
    let instance = |uuid: &str| MigInstanceStatus {
        uuid: Some(uuid.into()),
        ..Default::default()
    };
    vec![
        GpuStatus {
            index: 0,
            uuid: GPU0.into(),
            instances: vec![instance(MIG0A), instance(MIG0B)],
            ..Default::default()
        },
        GpuStatus {
            index: 1,
            uuid: GPU1.into(),
            ..Default::default()
        },
    ]
}

/// The three forms NVIDIA's plugin advertises: a GPU UUID, a MIG UUID, and either with `::N`.
#[test]
fn device_ids_read_as_the_plugin_writes_them() {
    assert_eq!(
        DeviceId::parse(GPU1),
        DeviceId {
            uuid: GPU1,
            replica: None
        }
    );
    assert_eq!(
        DeviceId::parse(&format!("{GPU1}::7")),
        DeviceId {
            uuid: GPU1,
            replica: Some(7)
        }
    );
    let mig_replica = format!("{MIG0B}::0");
    assert_eq!(
        DeviceId::parse(&mig_replica),
        DeviceId {
            uuid: MIG0B,
            replica: Some(0)
        }
    );
    let g = gpus();
    assert_eq!(DeviceId::parse(GPU1).gpu(&g), Some(1));
    assert_eq!(DeviceId::parse(&format!("{GPU1}::3")).gpu(&g), Some(1));
    assert_eq!(DeviceId::parse(MIG0A).gpu(&g), Some(0), "a MIG instance is its GPU's");
    assert_eq!(DeviceId::parse(&mig_replica).gpu(&g), Some(0));
    // Not a device of this node (or gone since), nor a suffix the plugin writes.
    assert_eq!(DeviceId::parse("GPU-ffff").gpu(&g), None);
    assert_eq!(DeviceId::parse(&format!("{GPU1}::x")).gpu(&g), None);
    assert_eq!(DeviceId::parse("").gpu(&g), None);
    // A GPU whose instance has no UUID yet matches no empty ID.
    let mut no_uuid = gpus();
    no_uuid[0].instances[0].uuid = None;
    assert_eq!(DeviceId::parse(MIG0B).gpu(&no_uuid), Some(0));
}

/// Devices to their holders: replicas of one GPU in two pods, a pod with devices of two GPUs,
/// MIG instances, a sidecar (restartable init container, which the kubelet reports as a
/// container), a pod holding nothing, and another resource's device (a NIC).
fn pods_of_three_teams() -> ListPodResourcesResponse {
    ListPodResourcesResponse {
        pod_resources: vec![
            pod(
                "team-a",
                "train",
                vec![
                    container(
                        "main",
                        vec![
                            devices("nvidia.com/mig-3g.40gb", &[MIG0A]),
                            devices("nvidia.com/gpu", &[GPU1]),
                        ],
                    ),
                    container("sidecar", vec![devices("nvidia.com/mig-3g.40gb", &[MIG0B])]),
                ],
            ),
            pod(
                "team-b",
                "infer-1",
                vec![container(
                    "c",
                    vec![
                        devices("nvidia.com/gpu.shared", &[&format!("{GPU1}::0")]),
                        devices("example.com/nic", &["0000:3b:00.1"]),
                    ],
                )],
            ),
            pod(
                "team-b",
                "infer-2",
                vec![container(
                    "c",
                    vec![devices("nvidia.com/gpu.shared", &[&format!("{GPU1}::1")])],
                )],
            ),
            pod("team-c", "cpu-only", vec![container("c", vec![])]),
        ],
    }
}

#[test]
fn list_maps_devices_to_their_holders() {
    let list = pods_of_three_teams();
    let h = holdings(&list);
    let held = |id: &str| h.devices.get(id).cloned().unwrap_or_default();
    assert_eq!(
        held(MIG0A),
        HeldDevice {
            resource: "nvidia.com/mig-3g.40gb".into(),
            holders: vec![holder("team-a", "train", "main")]
        }
    );
    assert_eq!(held(MIG0B).holders, [holder("team-a", "train", "sidecar")]);
    assert_eq!(held(GPU1).holders, [holder("team-a", "train", "main")]);
    assert_eq!(held(&format!("{GPU1}::0")).holders, [holder("team-b", "infer-1", "c")]);
    assert_eq!(held(&format!("{GPU1}::1")).resource, "nvidia.com/gpu.shared");
    assert_eq!(held("0000:3b:00.1").resource, "example.com/nic");
    assert_eq!(h.devices.len(), 6);
    // Every pod reported, also the one holding nothing.
    assert_eq!(
        h.pods.keys().cloned().collect::<Vec<_>>(),
        [
            pod_ref("team-a", "train"),
            pod_ref("team-b", "infer-1"),
            pod_ref("team-b", "infer-2"),
            pod_ref("team-c", "cpu-only")
        ]
    );
    assert_eq!(h.pods[&pod_ref("team-c", "cpu-only")]["c"], []);
    assert_eq!(
        h.pods[&pod_ref("team-a", "train")]["main"],
        [
            DeviceRef {
                resource: "nvidia.com/mig-3g.40gb".into(),
                id: MIG0A.into()
            },
            DeviceRef {
                resource: "nvidia.com/gpu".into(),
                id: GPU1.into()
            }
        ]
    );
    // Per GPU: the pod of two GPUs holds both; GPU 1's replicas are held by both infer pods.
    let g = gpus();
    assert_eq!(pods_holding(&h, &g[0]), [pod_ref("team-a", "train")].into());
    assert_eq!(
        pods_holding(&h, &g[1]),
        [
            pod_ref("team-a", "train"),
            pod_ref("team-b", "infer-1"),
            pod_ref("team-b", "infer-2")
        ]
        .into()
    );
    assert!(h.claims.is_empty());
}

/// DRA claims: each device (driver, pool, device, share) to the claims and containers using it;
/// one claim shared by two containers is one holder each.
#[test]
fn list_maps_claim_devices_to_their_claims() {
    let claim = |name: &str, device: &str, share: Option<&str>| DynamicResource {
        claim_name: name.into(),
        claim_namespace: "team-a".into(),
        claim_resources: vec![ClaimResource {
            cdi_devices: vec![CdiDevice {
                name: format!("gputenancy.io/gpu={device}"),
            }],
            driver_name: "gpu.gputenancy.io".into(),
            pool_name: "node-1".into(),
            device_name: device.into(),
            share_id: share.map(Into::into),
        }],
    };
    let with_claims = |name: &str, claims: Vec<DynamicResource>| ContainerResources {
        name: name.into(),
        dynamic_resources: claims,
        ..Default::default()
    };
    let list = ListPodResourcesResponse {
        pod_resources: vec![pod(
            "team-a",
            "p",
            vec![
                with_claims("a", vec![claim("mig", "gpu-0-mig-0-4", None)]),
                with_claims(
                    "b",
                    vec![
                        claim("mig", "gpu-0-mig-0-4", None),
                        claim("share", "gpu-1", Some("7c1f")),
                    ],
                ),
            ],
        )],
    };
    let h = holdings(&list);
    let device = |name: &str, share: Option<&str>| ClaimDevice {
        driver: "gpu.gputenancy.io".into(),
        pool: "node-1".into(),
        device: name.into(),
        share_id: share.map(Into::into),
    };
    let by = |claim: &str, container: &str| ClaimHolder {
        claim_namespace: "team-a".into(),
        claim_name: claim.into(),
        holder: holder("team-a", "p", container),
    };
    assert_eq!(
        h.claims[&device("gpu-0-mig-0-4", None)],
        [by("mig", "a"), by("mig", "b")]
    );
    assert_eq!(h.claims[&device("gpu-1", Some("7c1f"))], [by("share", "b")]);
    assert_eq!(h.claims.len(), 2);
    assert!(h.devices.is_empty(), "DRA devices are not device-plugin devices");
    assert_eq!(h.pods[&pod_ref("team-a", "p")].len(), 2);
}

/// The kubelet's side: serves a canned `List` on a unix socket.
struct Kubelet(ListPodResourcesResponse);

#[tonic::async_trait]
impl PodResourcesLister for Kubelet {
    async fn list(&self, _: Request<ListPodResourcesRequest>) -> Result<Response<ListPodResourcesResponse>, Status> {
        Ok(Response::new(self.0.clone()))
    }
    async fn get_allocatable_resources(
        &self,
        _: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn get(&self, _: Request<GetPodResourcesRequest>) -> Result<Response<GetPodResourcesResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gt-podres-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The agent's client against a real tonic server on a unix socket, as the kubelet serves it.
#[tokio::test]
async fn the_client_reads_a_kubelet_on_a_unix_socket() {
    let dir = temp_dir("served");
    let socket = dir.join("kubelet.sock");
    let canned = ListPodResourcesResponse {
        pod_resources: vec![pod(
            "team-a",
            "train",
            vec![container("main", vec![devices("nvidia.com/mig-3g.40gb", &[MIG0A])])],
        )],
    };
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(PodResourcesListerServer::new(Kubelet(canned.clone())))
            .serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(listener), async {
                let _ = stopped.await;
            }),
    );
    assert_eq!(list(&socket).await.unwrap(), canned);
    let h = read(&socket).await.unwrap();
    assert_eq!(h, holdings(&canned));
    assert_eq!(pods_holding(&h, &gpus()[0]), [pod_ref("team-a", "train")].into());
    // Reported as read.
    let mut status = GpuNodeStatus::default();
    let now = Time(jiff::Timestamp::UNIX_EPOCH);
    report(&mut status, &socket, &Ok(h), &now);
    let c = &status.conditions[0];
    assert_eq!(
        (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
        (CONDITION, "True", "Read")
    );
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
    // The kubelet gone, its socket left behind: refused, said so with the socket's path.
    let e = read(&socket).await.unwrap_err();
    assert_eq!(e.kind(), "connect", "{e}");
    assert!(e.to_string().contains(&socket.display().to_string()), "{e}");
    std::fs::remove_dir_all(dir).ok();
}

/// No socket (not mounted): an error naming the socket and the fix, and the condition False,
/// reason Unavailable; written again only when something changes.
#[tokio::test]
async fn a_missing_socket_is_reported_unavailable() {
    let dir = temp_dir("missing");
    let socket = dir.join("kubelet.sock");
    let outcome = read(&socket).await;
    let e = outcome.as_ref().unwrap_err();
    assert_eq!(e.kind(), "missing");
    let text = e.to_string();
    assert!(
        text.contains(&socket.display().to_string())
            && text.contains("hostPath /var/lib/kubelet/pod-resources")
            && text.contains("--pod-resources-socket"),
        "{text}"
    );
    let mut status = GpuNodeStatus::default();
    let now = Time(jiff::Timestamp::UNIX_EPOCH);
    report(&mut status, &socket, &outcome, &now);
    let c = status.conditions[0].clone();
    assert_eq!(
        (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
        (CONDITION, "False", "Unavailable")
    );
    assert!(
        c.message.starts_with(&text) && c.message.contains("every pod"),
        "{}",
        c.message
    );
    // The next pass finds the same: the same status, to the byte (no write).
    let before = status.clone();
    let later = Time(jiff::Timestamp::from_second(60).unwrap());
    report(&mut status, &socket, &read(&socket).await, &later);
    assert_eq!(status, before);
    clear(&mut status);
    assert!(status.conditions.is_empty());
    std::fs::remove_dir_all(dir).ok();
}
