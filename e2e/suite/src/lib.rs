//! Harness for the gpu-tenancy end-to-end tests.
//!
//! The tests talk to a real Kubernetes API server: the one `e2e/run.sh` starts (embedded etcd
//! and kube-apiserver built from the Kubernetes Go modules, on 127.0.0.1), or any cluster named
//! by `GPU_TENANCY_E2E_KUBECONFIG`. Without that variable every test fails with a message saying
//! how to run them; nothing is skipped.
//!
//! The custom resources are cluster-scoped, so tests never share object names: each test takes
//! a [`Names`] with a prefix of its own and deletes what it created when it ends (also when it
//! panics), through [`Cleanup`].

pub mod access;
pub mod auditor;
pub mod kubelet;
pub mod kueue;
pub mod node;
pub mod procs;
pub mod prometheus;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, Config};
use serde_json::Value;

/// The API group of every gpu-tenancy resource.
pub const GROUP: &str = "gputenancy.io";
/// The served (and stored) version.
pub const VERSION: &str = "v1alpha1";
/// The category that `kubectl get gputenancy` lists.
pub const CATEGORY: &str = "gputenancy";
/// Environment variable naming the kubeconfig of the cluster under test.
pub const KUBECONFIG_ENV: &str = "GPU_TENANCY_E2E_KUBECONFIG";
/// Environment variable naming the kubectl to use (e2e/run.sh sets it to e2e/bin/kubectl).
pub const KUBECTL_ENV: &str = "GPU_TENANCY_E2E_KUBECTL";

/// The four kinds, with their plural and short names (docs/design.md#resources).
pub const KINDS: [(&str, &str, &str); 4] = [
    ("SharingPolicy", "sharingpolicies", "gsp"),
    ("GpuTenant", "gputenants", "gt"),
    ("GpuPartitionPlan", "gpupartitionplans", "gpp"),
    ("GpuNode", "gpunodes", "gn"),
];

/// Root of the repository (two levels above this crate).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

/// The kubeconfig of the cluster under test. Panics (fails the test) when none is configured.
pub fn kubeconfig_path() -> PathBuf {
    match std::env::var_os(KUBECONFIG_ENV) {
        Some(p) if !p.is_empty() => {
            let p = PathBuf::from(p);
            assert!(
                p.is_file(),
                "{KUBECONFIG_ENV}={} is not a file; run `make e2e` (starts a local control plane) \
                 or point it at a cluster's kubeconfig",
                p.display()
            );
            p
        }
        _ => panic!(
            "this test needs a Kubernetes API server and {KUBECONFIG_ENV} is not set: run `make e2e` \
             (builds and starts a local kube-apiserver + etcd, then runs these tests), or set \
             {KUBECONFIG_ENV} to the kubeconfig of a cluster (kind, k3d, real) and run \
             `cargo test -p gpu-tenancy-e2e`"
        ),
    }
}

/// A kube client for the cluster under test.
pub async fn client() -> Client {
    let path = kubeconfig_path();
    let kubeconfig =
        Kubeconfig::read_from(&path).unwrap_or_else(|e| panic!("reading kubeconfig {}: {e}", path.display()));
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("loading kubeconfig {}: {e}", path.display()));
    Client::try_from(config).expect("building a kube client")
}

// ------------------------------------------------------------------------------------------
// kubectl

/// The kubectl binary: `$GPU_TENANCY_E2E_KUBECTL`, else e2e/bin/kubectl, else `kubectl` on PATH.
pub fn kubectl_path() -> PathBuf {
    if let Some(p) = std::env::var_os(KUBECTL_ENV).filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let local = repo_root().join("e2e/bin/kubectl");
    if local.exists() {
        return local;
    }
    PathBuf::from("kubectl")
}

/// What a kubectl run printed.
#[derive(Debug)]
pub struct KubectlOutput {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
    pub command: String,
}

impl KubectlOutput {
    /// Panics with the command and both outputs unless kubectl succeeded.
    #[track_caller]
    pub fn ok(self) -> String {
        assert!(
            self.success,
            "`{}` failed\n--- stdout\n{}--- stderr\n{}",
            self.command, self.stdout, self.stderr
        );
        self.stdout
    }
}

/// Runs kubectl against the cluster under test (from the repository root), blocking.
pub fn kubectl<I, S>(args: I) -> KubectlOutput
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let args: Vec<String> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
    let kubeconfig = kubeconfig_path();
    let bin = kubectl_path();
    let out: Output = Command::new(&bin)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(&args)
        .current_dir(repo_root())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {} ({e}); build it with `make e2e-build` or set {KUBECTL_ENV}",
                bin.display()
            )
        });
    KubectlOutput {
        success: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        command: format!("kubectl {}", args.join(" ")),
    }
}

/// Runs kubectl from async code without blocking the runtime.
pub async fn kubectl_async(args: Vec<String>) -> KubectlOutput {
    tokio::task::spawn_blocking(move || kubectl(args))
        .await
        .expect("kubectl task")
}

/// `kubectl apply --server-side --force-conflicts -f FILE` (a path from the repository root), as
/// a person applies a manifest of the repository (kubectl's field manager); fails the test if
/// kubectl does.
pub async fn apply_file(file: &str) {
    kubectl_async(vec![
        "apply".into(),
        "--server-side".into(),
        "--force-conflicts".into(),
        "-f".into(),
        file.into(),
    ])
    .await
    .ok();
}

/// Applies `docs` server-side with kubectl, under kubectl's own field manager, as a person
/// installing deploy/base does: the deploy test's server-side dry run of the same objects then
/// shares their fields instead of conflicting on them. `what` names the temporary file.
pub async fn apply_docs_as_kubectl(docs: &[Value], what: &str) {
    // Unique per call: tests of one binary run at the same time and may pass the same `what`.
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let file = std::env::temp_dir().join(format!(
        "gt-e2e-{what}-{}-{}.yaml",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let text: Vec<String> = docs
        .iter()
        .map(|d| serde_json::to_string(d).expect("a JSON value serialises"))
        .collect();
    std::fs::write(&file, text.join("\n---\n")).unwrap_or_else(|e| panic!("writing {}: {e}", file.display()));
    let out = kubectl_async(vec![
        "apply".into(),
        "--server-side".into(),
        "--field-manager=kubectl".into(),
        "--force-conflicts".into(),
        "-f".into(),
        file.display().to_string(),
    ])
    .await;
    std::fs::remove_file(&file).ok();
    out.ok();
}

// ------------------------------------------------------------------------------------------
// CRDs

/// Parses every YAML document of a file into JSON values (empty documents skipped).
pub fn yaml_docs(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("parsing {} as YAML: {e}", path.display()));
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

/// The YAML files (sorted) of a directory of the repository.
pub fn yaml_files(dir: &str) -> Vec<PathBuf> {
    let dir = repo_root().join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
        .collect();
    files.sort();
    files
}

/// The CRDs committed in crds/, by plural name.
pub fn crds() -> BTreeMap<String, CustomResourceDefinition> {
    let mut out = BTreeMap::new();
    for file in yaml_files("crds") {
        for doc in yaml_docs(&file) {
            if doc.get("kind").and_then(Value::as_str) != Some("CustomResourceDefinition") {
                continue;
            }
            let crd: CustomResourceDefinition = serde_json::from_value(doc)
                .unwrap_or_else(|e| panic!("{}: not a CustomResourceDefinition: {e}", file.display()));
            out.insert(crd.spec.names.plural.clone(), crd);
        }
    }
    out
}

/// The CRD of a plural name, from crds/.
pub fn crd(plural: &str) -> CustomResourceDefinition {
    crds()
        .remove(plural)
        .unwrap_or_else(|| panic!("crds/ has no CRD with plural {plural:?}"))
}

/// The `ApiResource` of one of our kinds.
pub fn api_resource(kind: &str) -> ApiResource {
    let plural = KINDS
        .iter()
        .find(|(k, _, _)| *k == kind)
        .unwrap_or_else(|| panic!("unknown kind {kind}"))
        .1;
    ApiResource {
        group: GROUP.into(),
        version: VERSION.into(),
        api_version: format!("{GROUP}/{VERSION}"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// A dynamic API for one of our (cluster-scoped) kinds.
pub fn api(client: &Client, kind: &str) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &api_resource(kind))
}

/// Installs crds/ with `kubectl apply --server-side` and waits until every CRD is Established.
pub async fn apply_crds(client: &Client) {
    kubectl_async(vec![
        "apply".into(),
        "--server-side".into(),
        "--field-manager=gpu-tenancy-e2e".into(),
        "--force-conflicts".into(),
        "-f".into(),
        "crds/".into(),
    ])
    .await
    .ok();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (_, crd) in self::crds() {
        let name = crd.metadata.name.clone().expect("CRD name");
        tokio::time::timeout(
            Duration::from_secs(60),
            await_condition(crds.clone(), &name, conditions::is_crd_established()),
        )
        .await
        .unwrap_or_else(|_| panic!("CRD {name} not Established within 60s"))
        .unwrap_or_else(|e| panic!("watching CRD {name}: {e}"));
    }
}

/// [`apply_crds`] once per test process: tests that only need the CRDs call this.
pub async fn ensure_crds(client: &Client) {
    // The cell is runtime-agnostic and the init future runs to completion in the caller's
    // runtime, so using the caller's client in it is fine; concurrent callers wait for it.
    static DONE: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    DONE.get_or_init(|| apply_crds(client)).await;
    // The API server may take a moment to serve a freshly established resource in discovery.
    wait_served(client).await;
}

/// Waits until every one of our kinds answers a list request.
async fn wait_served(client: &Client) {
    for (kind, _, _) in KINDS {
        let api = api(client, kind);
        let mut last = String::new();
        for _ in 0..100 {
            match api.list(&Default::default()).await {
                Ok(_) => {
                    last.clear();
                    break;
                }
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(last.is_empty(), "{kind} not served after CRD install: {last}");
    }
}

// ------------------------------------------------------------------------------------------
// Names and cleanup

/// Unique object names for one test: `e2e-<test>-<run>-<n>`.
pub struct Names {
    prefix: String,
    n: AtomicU32,
}

impl Names {
    /// `test` is a short, DNS-label-safe name of the test.
    pub fn new(test: &str) -> Self {
        static RUN: OnceLock<String> = OnceLock::new();
        let run = RUN.get_or_init(|| {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            format!("{:x}", (std::process::id() ^ nanos) & 0xffffff)
        });
        Names {
            prefix: format!("e2e-{test}-{run}"),
            n: AtomicU32::new(0),
        }
    }

    /// The next unique name.
    pub fn next(&self) -> String {
        format!("{}-{}", self.prefix, self.n.fetch_add(1, Ordering::Relaxed))
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }
}

/// Deletes the objects registered with it when dropped (also on panic), with kubectl.
#[derive(Default)]
pub struct Cleanup {
    objects: Mutex<Vec<(String, String)>>,
}

impl Cleanup {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `kind`/`name` (one of our cluster-scoped kinds) for deletion.
    pub fn add(&self, kind: &str, name: &str) {
        let plural = api_resource(kind).plural;
        self.objects
            .lock()
            .unwrap()
            .push((format!("{plural}.{GROUP}"), name.to_owned()));
    }

    /// Registers any cluster-scoped object by resource (`namespaces`, `clusterroles.rbac.authorization.k8s.io`).
    pub fn add_resource(&self, resource: &str, name: &str) {
        self.objects
            .lock()
            .unwrap()
            .push((resource.to_owned(), name.to_owned()));
    }

    /// Registers every object a manifest file creates (`kubectl delete -f` semantics).
    pub fn add_docs(&self, docs: &[Value]) {
        for d in docs {
            let (Some(api_version), Some(kind), Some(name)) = (
                d["apiVersion"].as_str(),
                d["kind"].as_str(),
                d["metadata"]["name"].as_str(),
            ) else {
                continue;
            };
            if api_version == format!("{GROUP}/{VERSION}") {
                self.add(kind, name);
            }
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let objects = std::mem::take(&mut *self.objects.lock().unwrap());
        let mut by_resource: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (res, name) in objects {
            by_resource.entry(res).or_default().push(name);
        }
        for (res, names) in by_resource {
            let mut args = vec![
                "delete".to_owned(),
                res,
                "--ignore-not-found".into(),
                "--wait=false".into(),
            ];
            args.extend(names);
            let out = kubectl(&args);
            if !out.success {
                eprintln!("cleanup: `{}` failed: {}", out.command, out.stderr);
            }
        }
    }
}

// ------------------------------------------------------------------------------------------
// Namespaces

/// Creates namespace `name` (with `labels`) and makes sure its `default` ServiceAccount exists
/// when this returns, registering the namespace with `cleanup`.
///
/// Any cluster's serviceaccount controller creates `default` shortly after the namespace (the
/// local control plane runs it too, with the garbage collector and namespace controller), but
/// not at once, and without it the ServiceAccount admission plugin refuses every pod: so this
/// creates it as well, and a 409 means the controller was first.
pub async fn create_namespace(client: &Client, cleanup: &Cleanup, name: &str, labels: &[(&str, &str)]) {
    use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
    use kube::api::PostParams;
    let mut ns = Namespace::default();
    ns.metadata.name = Some(name.to_owned());
    ns.metadata.labels = Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
    cleanup.add_resource("namespaces", name);
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
    let mut sa = ServiceAccount::default();
    sa.metadata.name = Some("default".into());
    match Api::<ServiceAccount>::namespaced(client.clone(), name)
        .create(&PostParams::default(), &sa)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {} // the serviceaccount controller was first
        Err(e) => panic!("creating serviceaccount {name}/default: {e}"),
    }
}

/// Creates the namespaces of the operator (`gpu-tenancy-system`, its Lease's) and of the device
/// plugin (the controller writes its ConfigMap there) unless they exist. They are kept for the
/// scenarios that follow: deleting them would leave them Terminating for the next one.
pub async fn ensure_operator_namespaces(client: &Client) {
    let keep = Cleanup::new();
    for ns in [
        gpu_tenancy::desired::Settings::default().device_plugin_namespace,
        gpu_tenancy::desired::Settings::default().operator_namespace,
    ] {
        if !kubectl_async(vec!["get".into(), "namespace".into(), ns.clone()])
            .await
            .success
        {
            create_namespace(client, &keep, &ns, &[]).await;
        }
    }
    std::mem::forget(keep);
}

// ------------------------------------------------------------------------------------------
// JSON helpers

/// Sets `path` (dot-separated; numbers index arrays) in `v` to `value`, creating objects on the way.
pub fn set_path(v: &mut Value, path: &str, value: Value) {
    let mut cur = v;
    let parts: Vec<&str> = path.split('.').collect();
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        cur = match part.parse::<usize>() {
            Ok(idx) if cur.is_array() => {
                let arr = cur.as_array_mut().unwrap();
                assert!(idx < arr.len(), "{path}: index {idx} out of range");
                &mut arr[idx]
            }
            _ => {
                if !cur.is_object() {
                    *cur = Value::Object(Default::default());
                }
                cur.as_object_mut()
                    .unwrap()
                    .entry(part.to_string())
                    .or_insert(Value::Null)
            }
        };
        if last {
            *cur = value;
            return;
        }
    }
}

/// Removes `path` (dot-separated) from `v`; panics if the parent does not exist.
pub fn remove_path(v: &mut Value, path: &str) {
    let (parent, key) = path.rsplit_once('.').unwrap_or(("", path));
    let p = if parent.is_empty() {
        v
    } else {
        v.pointer_mut(&format!("/{}", parent.replace('.', "/")))
            .unwrap_or_else(|| panic!("{path}: no parent {parent}"))
    };
    match p {
        Value::Object(m) => {
            m.remove(key);
        }
        Value::Array(a) => {
            a.remove(key.parse::<usize>().expect("array index"));
        }
        _ => panic!("{path}: parent is not an object or array"),
    }
}
