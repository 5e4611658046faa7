//! Kueue's manager on the test control plane: the binary and manifests `e2e/run.sh build-kueue`
//! builds from Kueue's Go module (e2e/kueue/go.mod pins the release) into e2e/bin/.
//!
//! Installed as Kueue's own kustomization installs it, with three differences the test control
//! plane needs (it runs no pods, no kubelet mounts volumes, no Service proxy):
//! - the manager runs here as a process, with the cluster's admin kubeconfig;
//! - its webhook Service is an `ExternalName` Service naming 127.0.0.1: the API server resolves
//!   a webhook's Service to its external name and checks the serving certificate against the
//!   Service's DNS name (`kueue-webhook-service.kueue-system.svc`), which is the name Kueue's
//!   own certificate manager signs, so its CA bundle injection is tested as in a cluster;
//! - the certificate Secret Kueue writes is copied into the manager's certificate directory, as
//!   the kubelet would mount it.
//!
//! Of the webhooks, those of Kueue's own kinds and of batch Jobs are installed: the others are
//! for integrations (pods, Deployments, Ray, Kubeflow) the manager is not configured for, and a
//! webhook whose path the manager does not serve would refuse every such object in the cluster.

use crate::{kubeconfig_path, kubectl, repo_root, yaml_docs};
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::Api;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Kueue's namespace (its Configuration's `namespace`).
pub const NAMESPACE: &str = "kueue-system";
/// The webhook Service, and the certificate it is signed for.
const SERVICE: &str = "kueue-webhook-service";
/// The Secret Kueue's certificate manager writes the CA and serving certificate into.
const CERT_SECRET: &str = "kueue-webhook-server-cert";
/// The CRDs whose versions Kueue's webhook converts (Kueue's `config/components/crd/patches`).
const CONVERTED: [&str; 5] = [
    "localqueues",
    "clusterqueues",
    "cohorts",
    "workloads",
    "multikueueclusters",
];
/// The kinds Kueue's manager puts finalizers on.
const FINALIZED: [&str; 5] = [
    "workloads.kueue.x-k8s.io",
    "localqueues.kueue.x-k8s.io",
    "clusterqueues.kueue.x-k8s.io",
    "cohorts.kueue.x-k8s.io",
    "resourceflavors.kueue.x-k8s.io",
];
/// The API groups whose webhooks are installed.
const WEBHOOK_GROUPS: [&str; 2] = ["kueue.x-k8s.io", "batch"];
/// The webhook configurations, by the names Kueue's certificate manager injects its CA into.
const WEBHOOK_CONFIGS: [(&str, &str); 2] = [
    ("mutatingwebhookconfigurations", "kueue-mutating-webhook-configuration"),
    (
        "validatingwebhookconfigurations",
        "kueue-validating-webhook-configuration",
    ),
];

/// What the tests set in Kueue's Configuration besides what the harness needs.
#[derive(Clone, Debug, Default)]
pub struct KueueSettings {
    /// `fairSharing` on, with Kueue's default preemption strategies.
    pub fair_sharing: bool,
    /// `resources.deviceClassMappings`: a logical resource name and the DeviceClasses it counts.
    pub device_class_mappings: Vec<(String, Vec<String>)>,
}

/// Kueue's manager process; when dropped it is stopped and everything it was installed with is
/// removed (its webhooks first, so that nothing calls a webhook that no longer answers).
pub struct KueueManager {
    child: Option<Child>,
    dir: PathBuf,
    /// Where its metrics are served (HTTPS, to a bearer token allowed `get` on `/metrics`).
    pub metrics_addr: std::net::SocketAddr,
}

/// The ServiceAccount, and its ClusterRole and binding, whose token reads Kueue's metrics.
const METRICS_READER: &str = "kueue-e2e-metrics-reader";

fn manifests() -> PathBuf {
    repo_root().join("e2e/bin/kueue-manifests")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on 127.0.0.1")
}

fn sorted_files(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {} ({e}): run `e2e/run.sh build-kueue`", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    files.sort();
    files
}

/// Every document to apply: Kueue's CRDs (with the conversion webhook of the converted ones),
/// its ClusterRoles aggregated into Kubernetes' admin, edit and view roles, its namespace, the Secret its certificate manager fills, the webhook Service, and the webhook
/// configurations of [`WEBHOOK_GROUPS`], all pointing at `port`.
fn install_docs(port: u16) -> Vec<Value> {
    let service = json!({"namespace": NAMESPACE, "name": SERVICE, "port": port});
    let mut docs = Vec::new();
    for f in sorted_files(&manifests().join("crds")) {
        for mut crd in yaml_docs(&f) {
            let plural = crd["spec"]["names"]["plural"].as_str().unwrap_or_default().to_string();
            if CONVERTED.contains(&plural.as_str()) {
                let mut svc = service.clone();
                svc["path"] = json!("/convert");
                crd["spec"]["conversion"] = json!({"strategy": "Webhook", "webhook": {
                    "conversionReviewVersions": ["v1"], "clientConfig": {"service": svc}}});
            }
            docs.push(crd);
        }
    }
    // Kueue's roles aggregated into Kubernetes' own, named as its kustomization names them.
    for f in sorted_files(&manifests().join("rbac")) {
        for mut role in yaml_docs(&f) {
            let name = format!("kueue-{}", role["metadata"]["name"].as_str().unwrap_or_default());
            role["metadata"]["name"] = json!(name);
            docs.push(role);
        }
    }
    docs.push(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}));
    docs.push(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": CERT_SECRET, "namespace": NAMESPACE}}));
    docs.push(
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": SERVICE, "namespace": NAMESPACE},
        "spec": {"type": "ExternalName", "externalName": "127.0.0.1"}}),
    );
    for mut config in yaml_docs(&manifests().join("webhooks.yaml")) {
        let name = format!("kueue-{}", config["metadata"]["name"].as_str().unwrap_or_default());
        config["metadata"]["name"] = json!(name);
        let webhooks: Vec<Value> = config["webhooks"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|w| {
                w["rules"].as_array().into_iter().flatten().all(|r| {
                    r["apiGroups"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .all(|g| WEBHOOK_GROUPS.contains(&g.as_str().unwrap_or_default()))
                })
            })
            .map(|mut w| {
                let path = w["clientConfig"]["service"]["path"].clone();
                let mut svc = service.clone();
                svc["path"] = path;
                w["clientConfig"] = json!({"service": svc});
                w
            })
            .collect();
        config["webhooks"] = json!(webhooks);
        docs.push(config);
    }
    docs
}

/// Kueue's Configuration for a manager serving webhooks, probes and metrics on `ports`, its
/// webhook certificates in `cert_dir`.
fn configuration(settings: &KueueSettings, ports: (u16, u16, u16), cert_dir: &std::path::Path) -> Value {
    let (webhook_port, probe_port, metrics_port) = ports;
    let mut config = json!({
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": format!("127.0.0.1:{probe_port}")},
        // Over HTTPS, to clients Kueue authenticates and authorizes through the API server.
        "metrics": {"bindAddress": format!("127.0.0.1:{metrics_port}")},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": cert_dir},
        "leaderElection": {"leaderElect": false},
        "internalCertManagement": {"enable": true},
        "integrations": {"frameworks": ["batch/job"]},
    });
    if settings.fair_sharing {
        config["fairSharing"] =
            json!({"preemptionStrategies": ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]});
    }
    if !settings.device_class_mappings.is_empty() {
        let mappings: Vec<Value> = settings
            .device_class_mappings
            .iter()
            .map(|(name, classes)| json!({"name": name, "deviceClassNames": classes}))
            .collect();
        config["resources"] = json!({"deviceClassMappings": mappings});
    }
    config
}

impl KueueManager {
    /// Installs Kueue and starts its manager; returns once the manager is ready (its webhooks
    /// answer). Panics, with the end of its log, if it is not within 90 s.
    pub async fn start(client: &Client, settings: &KueueSettings) -> KueueManager {
        let dir = repo_root().join(format!("target/kueue-{}-{}", std::process::id(), free_port()));
        let cert_dir = dir.join("certs");
        std::fs::create_dir_all(&cert_dir).unwrap_or_else(|e| panic!("creating {}: {e}", cert_dir.display()));
        let (webhook_port, probe_port, metrics_port) = (free_port(), free_port(), free_port());
        crate::apply_docs_as_kubectl(&install_docs(webhook_port), "kueue-install").await;
        let config_file = dir.join("config.yaml");
        let config = configuration(settings, (webhook_port, probe_port, metrics_port), &cert_dir);
        std::fs::write(&config_file, serde_json::to_string(&config).expect("JSON")).expect("writing Kueue's config");
        let log = std::fs::File::create(dir.join("kueue.log")).expect("creating kueue.log");
        let bin = repo_root().join("e2e/bin/kueue");
        let child = Command::new(&bin)
            .arg("--config")
            .arg(&config_file)
            // The visibility API is an aggregated API server of its own; not used here.
            .arg("--feature-gates=VisibilityOnDemand=false")
            .env("KUBECONFIG", kubeconfig_path())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {} ({e}): run `e2e/run.sh build-kueue`", bin.display()));
        let mut manager = KueueManager {
            child: Some(child),
            dir,
            metrics_addr: std::net::SocketAddr::from(([127, 0, 0, 1], metrics_port)),
        };
        manager.mount_certs(client, &cert_dir).await;
        manager.wait_ready(probe_port).await;
        manager
    }

    /// Copies the serving certificate Kueue writes into its Secret to `cert_dir`, as the kubelet
    /// mounts it in a cluster.
    async fn mount_certs(&mut self, client: &Client, cert_dir: &std::path::Path) {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let data = secrets
                .get(CERT_SECRET)
                .await
                .ok()
                .and_then(|s| s.data)
                .unwrap_or_default();
            if ["tls.crt", "tls.key"].iter().all(|k| data.contains_key(*k)) {
                for (k, v) in data {
                    std::fs::write(cert_dir.join(&k), v.0).expect("writing a certificate file");
                }
                return;
            }
            self.assert_running("writing its certificate");
            assert!(
                Instant::now() < deadline,
                "Kueue wrote no certificate into Secret {NAMESPACE}/{CERT_SECRET} within 60 s\n{}",
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn wait_ready(&mut self, probe_port: u16) {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], probe_port));
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if let Some((200, _)) = crate::procs::http_get(addr, "/readyz").await {
                return;
            }
            self.assert_running("becoming ready");
            assert!(
                Instant::now() < deadline,
                "Kueue's manager was not ready within 90 s\n{}",
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    #[track_caller]
    fn assert_running(&mut self, doing: &str) {
        let exited = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
        assert!(
            exited.is_none(),
            "Kueue's manager exited ({exited:?}) while {doing}\n{}",
            self.log_tail()
        );
    }

    /// A bearer token allowed to read the manager's metrics (a ServiceAccount's, through RBAC on
    /// the non-resource URL `/metrics`, which Kueue checks with the API server).
    pub async fn metrics_token(&self) -> String {
        let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": METRICS_READER, "namespace": NAMESPACE}});
        let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": METRICS_READER},
            "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]});
        let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": METRICS_READER},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": METRICS_READER},
            "subjects": [{"kind": "ServiceAccount", "name": METRICS_READER, "namespace": NAMESPACE}]});
        crate::apply_docs_as_kubectl(&[sa, role, binding], "kueue-metrics-reader").await;
        crate::kubectl_async(
            ["create", "token", METRICS_READER, "-n", NAMESPACE, "--duration=1h"]
                .map(String::from)
                .to_vec(),
        )
        .await
        .ok()
        .trim()
        .to_string()
    }

    /// A Prometheus scrape job (a `scrape_configs` item) for the manager's metrics with `token`.
    pub fn scrape_job(&self, token: &str) -> String {
        format!(
            "- job_name: kueue\n  scheme: https\n  tls_config: {{insecure_skip_verify: true}}\n  authorization: {{credentials: {token}}}\n  static_configs:\n  - targets: [\"{}\"]\n",
            self.metrics_addr
        )
    }

    /// The last lines of the manager's log, its errors first.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("kueue.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().filter(|l| !l.contains("\"level\":\"debug\"")).collect();
        let errors: Vec<&str> = lines
            .iter()
            .copied()
            .filter(|l| l.contains("\"level\":\"error\""))
            .collect();
        let tail = lines.len().saturating_sub(15);
        format!(
            "--- Kueue's errors (log: {}):\n{}\n--- its last lines:\n{}",
            self.dir.join("kueue.log").display(),
            errors[errors.len().saturating_sub(10)..].join("\n"),
            lines[tail..].join("\n")
        )
    }
}

impl Drop for KueueManager {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for (resource, name) in WEBHOOK_CONFIGS {
            let out = kubectl(["delete", resource, name, "--ignore-not-found"]);
            if !out.success {
                eprintln!("removing Kueue's {resource} {name} failed: {}", out.stderr);
            }
        }
        // Kueue puts finalizers on its objects that only its manager removes: without it, they
        // would keep their CRDs (and namespaces) from ever going.
        let listed = kubectl([
            "get",
            &FINALIZED.join(","),
            "-A",
            "-o",
            "jsonpath={range .items[*]}{.kind} {.metadata.namespace} {.metadata.name}{\"\\n\"}{end}",
        ]);
        for line in listed.stdout.lines() {
            let parts: Vec<&str> = line.split(' ').collect();
            let [kind, namespace, name] = parts[..] else { continue };
            let mut args = vec![
                "patch".to_string(),
                format!("{}.kueue.x-k8s.io", kind.to_lowercase()),
                name.into(),
                "--type=merge".into(),
                "-p".into(),
                r#"{"metadata":{"finalizers":null}}"#.into(),
            ];
            if !namespace.is_empty() {
                args.extend(["-n".to_string(), namespace.to_string()]);
            }
            let out = kubectl(&args);
            if !out.success && !out.stderr.contains("NotFound") && !out.stderr.contains("not found") {
                eprintln!(
                    "removing the finalizers of {kind} {namespace}/{name} failed: {}",
                    out.stderr
                );
            }
        }
        let installed = install_docs(0);
        let named = |kind: &str| -> Vec<String> {
            installed
                .iter()
                .filter(|d| d["kind"] == kind)
                .filter_map(|d| d["metadata"]["name"].as_str().map(String::from))
                .collect()
        };
        let _ = kubectl(["delete", "clusterrolebinding", METRICS_READER, "--ignore-not-found"]);
        let mut args = vec!["delete".to_string(), "clusterrole".into(), "--ignore-not-found".into()];
        args.extend(named("ClusterRole"));
        args.push(METRICS_READER.into());
        let out = kubectl(&args);
        if !out.success {
            eprintln!("removing Kueue's ClusterRoles failed: {}", out.stderr);
        }
        let crds = named("CustomResourceDefinition");
        let mut args = vec![
            "delete".to_string(),
            "crd".into(),
            "--ignore-not-found".into(),
            "--timeout=120s".into(),
        ];
        args.extend(crds);
        let out = kubectl(&args);
        if !out.success {
            eprintln!("removing Kueue's CRDs failed: {}", out.stderr);
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
