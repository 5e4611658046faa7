//! The kubelet's side of a DRA kubelet plugin, for tests: it asks the registration socket what the
//! plugin is (as the plugin watcher does), then calls `NodePrepareResources` and
//! `NodeUnprepareResources` on the socket the plugin named, with the kubelet's own message types
//! (the generated code of k8s.io/kubelet's .proto files). [`pod_resources`]: the kubelet's
//! pod-resources API, answering what a test says.

pub mod pod_resources;

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

/// What [`FakeKubelet::sync`] did for a pod.
#[derive(Clone, Debug)]
pub enum Synced {
    /// Every claim of the pod prepared: it is Running, with these devices (per claim).
    Started(PodRun),
    /// The plugin refused a claim of the pod: it stays Pending, as with the real kubelet.
    Refused {
        namespace: String,
        pod: String,
        claim: String,
        error: String,
    },
}

/// A pod the fake kubelet started.
#[derive(Clone, Debug)]
pub struct PodRun {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Its claims, and the devices prepared for each.
    pub claims: Vec<(Claim, Vec<String>)>,
}

impl PodRun {
    pub fn devices(&self) -> impl Iterator<Item = &String> {
        self.claims.iter().flat_map(|(_, d)| d)
    }
}

/// The kubelet of one fake node, for the DRA plugin only: for each pod the scheduler bound to the
/// node whose claims are allocated and reserved for it, it calls `NodePrepareResources` claim by
/// claim, as the kubelet does before it starts containers, and marks the pod Running once all are
/// prepared; [`FakeKubelet::finish`] unprepares a pod's claims, marks it Succeeded and deletes it.
pub struct FakeKubelet {
    pub node: String,
    pub socket: PathBuf,
    client: kube::Client,
    /// Pods started, by UID.
    pub running: std::collections::BTreeMap<String, PodRun>,
}

impl FakeKubelet {
    pub fn new(client: &kube::Client, node: &str, socket: &Path) -> FakeKubelet {
        FakeKubelet {
            node: node.into(),
            socket: socket.into(),
            client: client.clone(),
            running: Default::default(),
        }
    }

    /// The claim names of `pod`, as the kubelet resolves them; `None` while one is not known yet
    /// (the claim controller has not made a template's claim, the scheduler not its own).
    fn claim_names(pod: &k8s_openapi::api::core::v1::Pod) -> Option<Vec<String>> {
        let spec = pod.spec.as_ref()?;
        let status = pod.status.clone().unwrap_or_default();
        let mut out = Vec::new();
        for c in spec.resource_claims.iter().flatten() {
            match &c.resource_claim_name {
                Some(n) => out.push(n.clone()),
                None => out.push(
                    status
                        .resource_claim_statuses
                        .iter()
                        .flatten()
                        .find(|s| s.name == c.name)?
                        .resource_claim_name
                        .clone()?,
                ),
            }
        }
        let extended = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .any(|c| {
                c.resources
                    .as_ref()
                    .and_then(|r| r.limits.as_ref())
                    .is_some_and(|l| l.keys().any(|k| k.contains('/') && !k.starts_with("kubernetes.io/")))
            });
        if extended {
            out.push(status.extended_resource_claim_status?.resource_claim_name);
        }
        Some(out)
    }

    /// One pass over the pods bound to the node that it has not started.
    pub async fn sync(&mut self) -> Vec<Synced> {
        use k8s_openapi::api::core::v1::Pod;
        use k8s_openapi::api::resource::v1::ResourceClaim;
        use kube::ResourceExt;
        use kube::api::{Api, ListParams, Patch, PatchParams};
        // A failed list or write is made again on the next pass (Prepare is idempotent).
        let Ok(pods) = Api::<Pod>::all(self.client.clone())
            .list(&ListParams::default().fields(&format!("spec.nodeName={}", self.node)))
            .await
        else {
            return vec![];
        };
        let mut out = Vec::new();
        'pods: for pod in pods.items {
            let uid = pod.uid().unwrap_or_default();
            let phase = pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
            if self.running.contains_key(&uid) || phase != "Pending" || pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let ns = pod.namespace().unwrap_or_default();
            let Some(names) = Self::claim_names(&pod) else { continue };
            let claims_api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &ns);
            let mut run = PodRun {
                namespace: ns.clone(),
                name: pod.name_any(),
                uid: uid.clone(),
                claims: vec![],
            };
            for name in names {
                let Ok(claim) = claims_api.get(&name).await else {
                    continue 'pods;
                };
                let st = claim.status.clone().unwrap_or_default();
                // The kubelet prepares a claim only once it is allocated and reserved for the pod.
                if st.allocation.is_none() || !st.reserved_for.iter().flatten().any(|r| r.uid == uid) {
                    continue 'pods;
                }
                let c = self::claim(&ns, &name, &claim.uid().unwrap_or_default());
                match prepare(&self.socket, &c).await {
                    Ok(Ok(devices)) => run.claims.push((c, devices.into_iter().map(|(d, _)| d).collect())),
                    Ok(Err(error)) => {
                        out.push(Synced::Refused {
                            namespace: ns.clone(),
                            pod: pod.name_any(),
                            claim: name,
                            error,
                        });
                        continue 'pods;
                    }
                    Err(e) => panic!("the DRA plugin of {} did not answer: {e}", self.node),
                }
            }
            let status = serde_json::json!({"status": {"phase": "Running",
                "conditions": [{"type": "Ready", "status": "True"}]}});
            if Api::<Pod>::namespaced(self.client.clone(), &ns)
                .patch_status(&pod.name_any(), &PatchParams::default(), &Patch::Merge(status))
                .await
                .is_err()
            {
                continue;
            }
            self.running.insert(uid, run.clone());
            out.push(Synced::Started(run));
        }
        out
    }

    /// Ends a started pod as the kubelet would once its containers exit: its claims unprepared,
    /// the pod Succeeded, then deleted.
    pub async fn finish(&mut self, uid: &str) -> PodRun {
        use k8s_openapi::api::core::v1::Pod;
        use kube::api::{Api, DeleteParams, Patch, PatchParams};
        let run = self.running.remove(uid).expect("a pod this kubelet started");
        for (c, _) in &run.claims {
            match unprepare(&self.socket, c).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => panic!("unpreparing claim {}/{}: {e}", c.namespace, c.name),
                Err(e) => panic!("the DRA plugin of {} did not answer: {e}", self.node),
            }
        }
        let api = Api::<Pod>::namespaced(self.client.clone(), &run.namespace);
        let status = serde_json::json!({"status": {"phase": "Succeeded"}});
        api.patch_status(&run.name, &PatchParams::default(), &Patch::Merge(status))
            .await
            .expect("marking the pod Succeeded");
        let _ = api.delete(&run.name, &DeleteParams::default().grace_period(0)).await;
        run
    }
}
