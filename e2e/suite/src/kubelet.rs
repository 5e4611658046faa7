//! The kubelet's side of a DRA kubelet plugin, for tests: it asks the registration socket what the
//! plugin is (as the plugin watcher does), then calls `NodePrepareResources` and
//! `NodeUnprepareResources` on the socket the plugin named, with the kubelet's own message types
//! (the generated code of k8s.io/kubelet's .proto files).

pub use gpu_tenancy::agent::dra::server::proto::dra::Claim;
use gpu_tenancy::agent::dra::server::proto::dra::dra_plugin_client::DraPluginClient;
use gpu_tenancy::agent::dra::server::proto::dra::{NodePrepareResourcesRequest, NodeUnprepareResourcesRequest};
use gpu_tenancy::agent::dra::server::proto::registration::registration_client::RegistrationClient;
use gpu_tenancy::agent::dra::server::proto::registration::{InfoRequest, PluginInfo, RegistrationStatus};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tonic::transport::{Channel, Endpoint, Uri};

async fn channel(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    let path: PathBuf = socket.to_path_buf();
    // The URI is not used: every connection goes to the socket.
    Endpoint::try_from("http://kubelet.invalid")
        .expect("a valid URI")
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
}

/// Waits (up to 30 s) for the registration socket to answer `GetInfo`, then reports the
/// registration as the kubelet does; the plugin's answer.
pub async fn register(registration_socket: &Path) -> PluginInfo {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(ch) = channel(registration_socket).await {
            let mut client = RegistrationClient::new(ch);
            if let Ok(info) = client.get_info(InfoRequest {}).await {
                client
                    .notify_registration_status(RegistrationStatus {
                        plugin_registered: true,
                        error: String::new(),
                    })
                    .await
                    .expect("the plugin takes its registration status");
                return info.into_inner();
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the plugin's registration socket {} did not answer within 30 s",
            registration_socket.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A claim as the kubelet names it.
pub fn claim(namespace: &str, name: &str, uid: &str) -> Claim {
    Claim {
        namespace: namespace.into(),
        name: name.into(),
        uid: uid.into(),
    }
}

/// The answer for one claim: its CDI device IDs per device, or the plugin's error for it.
pub type Prepared = Result<Vec<(String, Vec<String>)>, String>;

/// `NodePrepareResources` for one claim on the plugin's socket; `Err` with the transport error
/// when the plugin is gone (a killed agent).
pub async fn prepare(dra_socket: &Path, c: &Claim) -> Result<Prepared, String> {
    let ch = channel(dra_socket).await.map_err(|e| e.to_string())?;
    let mut client = DraPluginClient::new(ch);
    let resp = client
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![c.clone()],
        })
        .await
        .map_err(|e| e.to_string())?
        .into_inner();
    let r = resp.claims.get(&c.uid).unwrap_or_else(|| {
        panic!(
            "the plugin's answer has no entry for claim {} (the kubelet requires one)",
            c.uid
        )
    });
    if !r.error.is_empty() {
        return Ok(Err(r.error.clone()));
    }
    Ok(Ok(r
        .devices
        .iter()
        .map(|d| (d.device_name.clone(), d.cdi_device_ids.clone()))
        .collect()))
}

/// `NodeUnprepareResources` for one claim; the plugin's error for it, if any.
pub async fn unprepare(dra_socket: &Path, c: &Claim) -> Result<Result<(), String>, String> {
    let ch = channel(dra_socket).await.map_err(|e| e.to_string())?;
    let mut client = DraPluginClient::new(ch);
    let resp = client
        .node_unprepare_resources(NodeUnprepareResourcesRequest {
            claims: vec![c.clone()],
        })
        .await
        .map_err(|e| e.to_string())?
        .into_inner();
    let r = resp
        .claims
        .get(&c.uid)
        .unwrap_or_else(|| panic!("the plugin's answer has no entry for claim {}", c.uid));
    Ok(if r.error.is_empty() {
        Ok(())
    } else {
        Err(r.error.clone())
    })
}
