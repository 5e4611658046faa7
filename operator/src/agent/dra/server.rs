//! The kubelet's two gRPC services, over unix sockets: plugin registration (the kubelet's plugin
//! watcher finds `<registry>/<driver>-reg.sock`, asks `GetInfo`, and reports the outcome) and
//! `DRAPlugin` v1 (`<plugins>/<driver>/dra.sock`, with the optional `DRAResourceHealth` beside it:
//! [`super::health`]), compiled from the kubelet's own .proto files.

use super::devices::DRIVER;
use super::state::DraState;
use crate::agent::kubelet_api::{v1, v1alpha1};
use crate::gpu::Gpus;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tonic::{Request, Response, Status};

/// The generated code of the kubelet's .proto files.
pub mod proto {
    pub mod dra {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
    }
    pub mod registration {
        tonic::include_proto!("pluginregistration");
    }
}

use proto::dra::dra_plugin_server::{DraPlugin, DraPluginServer};
use proto::dra::{
    Device, NodePrepareResourceResponse, NodePrepareResourcesRequest, NodePrepareResourcesResponse,
    NodeUnprepareResourceResponse, NodeUnprepareResourcesRequest, NodeUnprepareResourcesResponse,
};
use proto::registration::registration_server::{Registration, RegistrationServer};
use proto::registration::{InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse};

/// The plugin type and API version the kubelet's DRA manager accepts (k8s.io/kubelet
/// pkg/apis/dra/v1; k8s.io/dynamic-resource-allocation kubeletplugin).
pub const PLUGIN_TYPE: &str = "DRAPlugin";
pub const SUPPORTED_VERSION: &str = "v1.DRAPlugin";
/// The optional health services served beside it ([`super::health`]), listed at registration as
/// the kubelet chooses among them by these names.
pub const HEALTH_SERVICES: [&str; 2] = ["v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"];

/// Where the two sockets are.
#[derive(Clone, Debug)]
pub struct Sockets {
    /// The kubelet's plugin registry directory (`/var/lib/kubelet/plugins_registry`).
    pub registry_dir: PathBuf,
    /// The kubelet's plugins directory (`/var/lib/kubelet/plugins`).
    pub plugins_dir: PathBuf,
}

impl Sockets {
    pub fn registration(&self) -> PathBuf {
        self.registry_dir.join(format!("{DRIVER}-reg.sock"))
    }

    pub fn dra(&self) -> PathBuf {
        self.plugins_dir.join(DRIVER).join("dra.sock")
    }
}

struct Registrar {
    endpoint: String,
    registered: Arc<AtomicBool>,
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: PLUGIN_TYPE.into(),
            name: DRIVER.into(),
            endpoint: self.endpoint.clone(),
            supported_versions: std::iter::once(SUPPORTED_VERSION)
                .chain(HEALTH_SERVICES)
                .map(String::from)
                .collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let s = request.into_inner();
        self.registered.store(s.plugin_registered, Ordering::SeqCst);
        if s.plugin_registered {
            tracing::info!(driver = DRIVER, "registered with the kubelet");
        } else {
            tracing::error!(driver = DRIVER, error = %s.error, "the kubelet refused the registration");
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

struct Plugin<G: Gpus> {
    state: Arc<DraState<G>>,
}

#[tonic::async_trait]
impl<G: Gpus + 'static> DraPlugin for Plugin<G> {
    async fn node_prepare_resources(
        &self,
        request: Request<NodePrepareResourcesRequest>,
    ) -> Result<Response<NodePrepareResourcesResponse>, Status> {
        // The claims of one call (a pod's) are prepared at once, like those of other calls.
        let answers = request.into_inner().claims.into_iter().map(|c| async move {
            let started = std::time::Instant::now();
            let answer = match self.state.prepare(&c.namespace, &c.name, &c.uid).await {
                Ok(devices) => {
                    tracing::info!(claim = %format!("{}/{}", c.namespace, c.name), uid = %c.uid, devices = devices.len(), took = ?started.elapsed(), "prepared");
                    NodePrepareResourceResponse {
                        devices: devices
                            .into_iter()
                            .map(|d| Device {
                                request_names: vec![base_request(&d.request).to_string()],
                                pool_name: self.state.node.clone(),
                                device_name: d.device,
                                cdi_device_ids: d.cdi_device_ids,
                                share_id: None,
                            })
                            .collect(),
                        error: String::new(),
                    }
                }
                Err(e) => {
                    tracing::warn!(claim = %format!("{}/{}", c.namespace, c.name), uid = %c.uid, error = %e, "not prepared");
                    NodePrepareResourceResponse {
                        devices: vec![],
                        error: e.to_string(),
                    }
                }
            };
            (c.uid, answer)
        });
        let claims: HashMap<_, _> = futures::future::join_all(answers).await.into_iter().collect();
        Ok(Response::new(NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<NodeUnprepareResourcesRequest>,
    ) -> Result<Response<NodeUnprepareResourcesResponse>, Status> {
        let mut claims = HashMap::new();
        for c in request.into_inner().claims {
            let error = match self.state.unprepare(&c.uid).await {
                Ok(()) => String::new(),
                Err(e) => {
                    tracing::warn!(uid = %c.uid, error = %e, "not unprepared");
                    e.to_string()
                }
            };
            claims.insert(c.uid, NodeUnprepareResourceResponse { error });
        }
        Ok(Response::new(NodeUnprepareResourcesResponse { claims }))
    }
}

/// The request a device was allocated for as the kubelet matches it against a container's
/// `resources.claims[].request`: a subrequest's (`gpu/mine`, from `firstAvailable`) is its
/// request's (`gpu`); the kubelet stores request names with the suffix stripped and would give
/// the container none of the claim's devices otherwise.
fn base_request(request: &str) -> &str {
    request.split_once('/').map_or(request, |(base, _)| base)
}

/// Why a socket could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("preparing the socket {path}: {source}")]
    Socket { path: PathBuf, source: std::io::Error },
    #[error("serving {path}: {source}")]
    Serve {
        path: PathBuf,
        source: tonic::transport::Error,
    },
}

/// The connections to `path`, each through the relay that gives its requests an authority h2
/// accepts ([`super::authority`]).
fn listen(
    path: &Path,
) -> Result<impl tokio_stream::Stream<Item = std::io::Result<super::authority::Relayed>> + use<>, ServeError> {
    let err = |source| ServeError::Socket {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    // A socket left by an earlier run of this plugin: nobody serves it any more.
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let listener = tokio::net::UnixListener::bind(path).map_err(err)?;
    Ok(tokio_stream::StreamExt::map(
        tokio_stream::wrappers::UnixListenerStream::new(listener),
        |conn| conn.map(super::authority::relay),
    ))
}

/// Serves both sockets until `shutdown`. The DRA socket is up before the registration socket, so
/// the kubelet never finds a plugin it cannot call.
pub async fn serve<G: Gpus + 'static>(
    state: Arc<DraState<G>>,
    sockets: &Sockets,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let dra_path = sockets.dra();
    let reg_path = sockets.registration();
    let dra = listen(&dra_path)?;
    let reg = listen(&reg_path)?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|v| *v).await;
    };
    let health = super::health::Health {
        pool: state.node.clone(),
        devices: state.watch_devices(),
    };
    let health_alpha = super::health::Health {
        pool: state.node.clone(),
        devices: state.watch_devices(),
    };
    let dra_server = tonic::transport::Server::builder()
        .add_service(DraPluginServer::new(Plugin { state }))
        .add_service(v1::dra_resource_health_server::DraResourceHealthServer::new(health))
        .add_service(v1alpha1::dra_resource_health_server::DraResourceHealthServer::new(
            health_alpha,
        ))
        .serve_with_incoming_shutdown(dra, stopped(stop_rx.clone()));
    let registrar = Registrar {
        endpoint: dra_path.display().to_string(),
        registered: Arc::new(AtomicBool::new(false)),
    };
    let reg_server = tonic::transport::Server::builder()
        .add_service(RegistrationServer::new(registrar))
        .serve_with_incoming_shutdown(reg, stopped(stop_rx));
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    tracing::info!(dra = %dra_path.display(), registration = %reg_path.display(), "serving the kubelet plugin");
    let (a, b) = tokio::join!(dra_server, reg_server);
    // A clean stop removes both sockets, the registration's first: the kubelet's plugin watcher
    // deregisters a plugin when its socket goes, and keeps a dead endpoint registered otherwise.
    for path in [&reg_path, &dra_path] {
        if let Err(e) = std::fs::remove_file(path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(socket = %path.display(), error = %e, "removing the socket on stop");
        }
    }
    a.map_err(|source| ServeError::Serve { path: dra_path, source })?;
    b.map_err(|source| ServeError::Serve { path: reg_path, source })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_subrequest_is_answered_as_its_request() {
        assert_eq!(super::base_request("gpu/mine"), "gpu");
        assert_eq!(super::base_request("gpu"), "gpu");
    }
}
