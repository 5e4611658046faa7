//! The kubelet's pod-resources API for tests (`v1.PodResourcesLister`, the kubelet's own message
//! types): it answers `List` with what the test last said, on a unix socket (an agent's
//! `--pod-resources-socket`), until dropped. There is no kubelet here, so the test says which
//! pod holds which device.

use gpu_tenancy::agent::pod_resources::proto::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
pub use gpu_tenancy::agent::pod_resources::proto::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices, ContainerResources,
    GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesRequest, ListPodResourcesResponse, PodResources,
};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tonic::{Request, Response, Status};

struct Lister(Arc<Mutex<ListPodResourcesResponse>>);

#[tonic::async_trait]
impl PodResourcesLister for Lister {
    async fn list(&self, _: Request<ListPodResourcesRequest>) -> Result<Response<ListPodResourcesResponse>, Status> {
        Ok(Response::new(self.0.lock().expect("the answer's lock").clone()))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        Err(Status::unimplemented("the test kubelet answers List only"))
    }

    async fn get(&self, _: Request<GetPodResourcesRequest>) -> Result<Response<GetPodResourcesResponse>, Status> {
        Err(Status::unimplemented("the test kubelet answers List only"))
    }
}

/// A serving pod-resources socket; removed when dropped.
pub struct PodResourcesServer {
    socket: PathBuf,
    answer: Arc<Mutex<ListPodResourcesResponse>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl PodResourcesServer {
    /// Serves `socket` (its directory created), answering no pods until [`Self::set`]. Needs a
    /// tokio runtime.
    pub fn start(socket: &Path) -> PodResourcesServer {
        if let Some(dir) = socket.parent() {
            std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        }
        let _ = std::fs::remove_file(socket);
        let listener =
            tokio::net::UnixListener::bind(socket).unwrap_or_else(|e| panic!("listening on {}: {e}", socket.display()));
        let answer = Arc::new(Mutex::new(ListPodResourcesResponse::default()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tonic::transport::Server::builder()
            .add_service(PodResourcesListerServer::new(Lister(answer.clone())))
            .serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(listener), async {
                let _ = stopped.await;
            });
        tokio::spawn(server);
        PodResourcesServer {
            socket: socket.into(),
            answer,
            stop: Some(stop),
        }
    }

    /// What `List` answers from now on.
    pub fn set(&self, answer: ListPodResourcesResponse) {
        *self.answer.lock().expect("the answer's lock") = answer;
    }
}

impl Drop for PodResourcesServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// A pod whose one container `container` holds `ids` of `resource`, as `List` reports it.
pub fn pod_holding(namespace: &str, pod: &str, container: &str, resource: &str, ids: &[&str]) -> PodResources {
    PodResources {
        name: pod.into(),
        namespace: namespace.into(),
        containers: vec![ContainerResources {
            name: container.into(),
            devices: vec![ContainerDevices {
                resource_name: resource.into(),
                device_ids: ids.iter().map(|s| s.to_string()).collect(),
                topology: None,
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}
