//! `deploy/`: the kustomize base and the Helm chart install on the real API server (server-side
//! dry runs, the way a person would apply them), and the chart renders exactly the objects of the
//! base. The chart is rendered by e2e/bin/helm-render, Helm's own loader and template engine
//! (e2e/helm-render, built by `make e2e-build`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use gpu_tenancy_e2e::{Cleanup, client, ensure_crds, kubectl_async, repo_root};
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::Value;

/// The operator's namespace (deploy/base/namespace.yaml, the chart's test release namespace).
const NAMESPACE: &str = "gpu-tenancy-system";
/// The device plugin's namespace, where the operator's Roles live (the plugin chart creates it).
const DEVICE_PLUGIN_NAMESPACE: &str = "nvidia-device-plugin";
const CHART: &str = "deploy/helm/gpu-tenancy";

/// A dry run persists nothing, so the namespaces of namespaced objects must exist and be Active.
/// The device plugin's namespace is shared with other tests (they write its ConfigMap) and is
/// never deleted here; the operator's namespace is registered with `cleanup` when created here.
async fn ensure_namespaces(client: &Client, cleanup: &Cleanup) {
    let api: Api<Namespace> = Api::all(client.clone());
    for (ns, shared) in [(DEVICE_PLUGIN_NAMESPACE, true), (NAMESPACE, false)] {
        let mut waited = Duration::ZERO;
        loop {
            match api
                .get_opt(ns)
                .await
                .unwrap_or_else(|e| panic!("get namespace {ns}: {e}"))
            {
                None => {
                    let mut n = Namespace::default();
                    n.metadata.name = Some(ns.to_owned());
                    match api.create(&PostParams::default(), &n).await {
                        Ok(_) => {
                            if !shared {
                                cleanup.add_resource("namespaces", ns);
                            }
                            break;
                        }
                        Err(kube::Error::Api(e)) if e.code == 409 => {} // another test was faster
                        Err(e) => panic!("creating namespace {ns}: {e}"),
                    }
                }
                Some(n) if n.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Terminating") => {
                    // Another test deleted it; a namespace controller finishes that shortly.
                    assert!(
                        waited < Duration::from_secs(60),
                        "namespace {ns} is still Terminating after 60s; a dry run cannot create objects in it"
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    waited += Duration::from_millis(200);
                }
                Some(_) => break,
            }
        }
    }
}

/// e2e/bin/helm-render (built by `make e2e-build`).
fn helm_render_path() -> PathBuf {
    let path = repo_root().join("e2e/bin/helm-render");
    assert!(
        path.is_file(),
        "{} is missing: build it with `make e2e-build` (e2e/run.sh builds it from e2e/helm-render)",
        path.display()
    );
    path
}

/// The chart rendered with its default values plus `sets` (Helm's --set syntax), release
/// `gpu-tenancy` in namespace gpu-tenancy-system, as `helm template` prints it.
fn render_chart(sets: &[&str]) -> String {
    let mut cmd = Command::new(helm_render_path());
    for s in sets {
        cmd.arg("--set").arg(s);
    }
    cmd.args(["--name", "gpu-tenancy", "--namespace", NAMESPACE, CHART]);
    let out = cmd
        .current_dir(repo_root())
        .output()
        .unwrap_or_else(|e| panic!("running helm-render: {e}"));
    assert!(
        out.status.success(),
        "helm-render {sets:?} {CHART} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("helm-render prints UTF-8")
}

/// Every document of a YAML stream (empty ones skipped).
fn docs(text: &str, what: &str) -> Vec<Value> {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(text).unwrap_or_else(|e| panic!("{what} is not a YAML stream: {e}\n{text}"));
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

/// `kind namespace/name` of an object, its key in the comparisons below.
fn key(o: &Value) -> String {
    let m = &o["metadata"];
    format!(
        "{} {}/{}",
        o["kind"].as_str().unwrap_or("?"),
        m["namespace"].as_str().unwrap_or(""),
        m["name"].as_str().unwrap_or("?")
    )
}

fn by_key(objects: Vec<Value>) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for o in objects {
        let k = key(&o);
        assert!(out.insert(k.clone(), o).is_none(), "{k} twice");
    }
    out
}

/// What `kubectl kustomize deploy/base` builds.
async fn kustomize_base() -> Vec<Value> {
    let text = kubectl_async(vec!["kustomize".into(), "deploy/base".into()]).await.ok();
    docs(&text, "kubectl kustomize deploy/base")
}

/// Applies `args` with a server-side dry run and checks that kubectl reports one accepted object
/// per object of `expected` and that nothing warned but `allowed_warning`.
async fn dry_run(args: &[&str], expected: &BTreeMap<String, Value>, allowed_warning: Option<&str>) {
    let mut all = vec!["apply".to_owned(), "--dry-run=server".to_owned()];
    all.extend(args.iter().map(|a| a.to_string()));
    let out = kubectl_async(all).await;
    let command = out.command.clone();
    let stderr = out.stderr.clone();
    let stdout = out.ok();
    let accepted = stdout.lines().filter(|l| l.ends_with("(server dry run)")).count();
    assert_eq!(
        accepted,
        expected.len(),
        "`{command}`: one line per object expected ({:?})\n{stdout}",
        expected.keys().collect::<Vec<_>>()
    );
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("Warning:"))
        .filter(|l| allowed_warning.is_none_or(|a| !l.contains(a)))
        .collect();
    assert!(
        warnings.is_empty(),
        "`{command}`: the API server warned:\n{}",
        warnings.join("\n")
    );
}

/// `kubectl apply -k deploy/base` and the rendered chart pass the API server's validation and
/// admission: schemas, RBAC (creating a role needs every permission it grants), the CRDs.
#[tokio::test]
async fn deploy_base_and_helm_chart_pass_a_server_side_dry_run() {
    let client = client().await;
    let cleanup = Cleanup::new();
    ensure_namespaces(&client, &cleanup).await;
    ensure_crds(&client).await;

    let base = by_key(kustomize_base().await);
    // Client-side apply (kubectl's default) warns that objects made by other tools (the CRDs,
    // the namespaces created above) lack its last-applied annotation; nothing else may warn.
    dry_run(&["-k", "deploy/base"], &base, Some("last-applied-configuration")).await;
    // Server-side apply, the way docs/install.md installs it.
    dry_run(&["--server-side", "-k", "deploy/base"], &base, None).await;

    let rendered = render_chart(&[]);
    let chart = by_key(docs(&rendered, "the rendered chart"));
    let file = std::env::temp_dir().join(format!("gt-e2e-helm-{}.yaml", std::process::id()));
    std::fs::write(&file, &rendered).unwrap();
    let path = file.display().to_string();
    dry_run(&["-f", &path], &chart, Some("last-applied-configuration")).await;
    dry_run(&["--server-side", "-f", &path], &chart, None).await;
    std::fs::remove_file(&file).ok();
}

/// Labels and annotations only the chart has: Helm's release bookkeeping.
const HELM_ONLY: [&str; 5] = [
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
    "helm.sh/resource-policy",
];

fn without_helm_bookkeeping(mut o: Value) -> Value {
    for field in ["labels", "annotations"] {
        if let Some(map) = o["metadata"][field].as_object_mut() {
            for k in HELM_ONLY {
                map.remove(k);
            }
            if map.is_empty() {
                o["metadata"].as_object_mut().unwrap().remove(field);
            }
        }
    }
    o
}

/// The JSON paths where `a` and `b` differ, with both values.
fn diff(a: &Value, b: &Value, path: &str, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for k in x.keys().chain(y.keys().filter(|k| !x.contains_key(*k))) {
                let null = Value::Null;
                diff(
                    x.get(k).unwrap_or(&null),
                    y.get(k).unwrap_or(&null),
                    &format!("{path}/{k}"),
                    out,
                );
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (x, y)) in x.iter().zip(y).enumerate() {
                diff(x, y, &format!("{path}/{i}"), out);
            }
        }
        // crds/ writes `maximum: 63.0`, kustomize re-prints it as 63: the same number.
        (Value::Number(x), Value::Number(y)) if x.as_f64() == y.as_f64() => {}
        _ if a != b => out.push(format!("{path}: {a} | {b}")),
        _ => {}
    }
}

/// With its default values the chart renders the objects of deploy/base, field for field, but
/// the Namespace (a chart installs into its release namespace) and Helm's own labels: the two
/// are written by hand and must not drift.
#[tokio::test]
async fn helm_chart_renders_the_objects_of_the_kustomize_base() {
    let base: BTreeMap<String, Value> = by_key(
        kustomize_base()
            .await
            .into_iter()
            .filter(|o| o["kind"] != "Namespace")
            .collect(),
    );
    let chart: BTreeMap<String, Value> = by_key(
        docs(&render_chart(&[]), "the rendered chart")
            .into_iter()
            .map(without_helm_bookkeeping)
            .collect(),
    );
    assert_eq!(
        base.keys().collect::<Vec<_>>(),
        chart.keys().collect::<Vec<_>>(),
        "deploy/base and the chart hold different objects"
    );
    for (k, want) in &base {
        let mut differences = Vec::new();
        diff(want, &chart[k], "", &mut differences);
        assert!(
            differences.is_empty(),
            "{k} differs between deploy/base and {CHART} (path: base | chart):\n{}",
            differences.join("\n")
        );
    }
    // The CRDs the chart installs are crds/, kept on uninstall.
    let crds: Vec<Value> = docs(&render_chart(&[]), "the rendered chart")
        .into_iter()
        .filter(|o| o["kind"] == "CustomResourceDefinition")
        .collect();
    assert_eq!(crds.len(), 4);
    for crd in crds {
        assert_eq!(
            crd["metadata"]["annotations"]["helm.sh/resource-policy"],
            "keep",
            "{}",
            key(&crd)
        );
    }
}

/// The chart's values reach the objects they name.
#[tokio::test]
async fn helm_chart_values_reach_the_objects() {
    let objects = by_key(docs(
        &render_chart(&[
            "image.repository=example/gpu-tenancy",
            "image.tag=1.2.3",
            "image.pullPolicy=Always",
            "namespace=ops",
            "devicePlugin.namespace=gpu-plugin",
            "devicePlugin.configMapName=plugin-configs",
            "controller.replicas=3",
            "agent.nodeSelector.pool=gpu",
            "agent.runtimeClassName=nvidia",
        ]),
        "the rendered chart",
    ));
    let deploy = &objects["Deployment ops/gpu-tenancy-controller"];
    assert_eq!(deploy["spec"]["replicas"], 3);
    let c = &deploy["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "example/gpu-tenancy:1.2.3");
    assert_eq!(c["imagePullPolicy"], "Always");
    let args: Vec<&str> = c["args"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(args.contains(&"--device-plugin-namespace=gpu-plugin"), "{args:?}");
    assert!(args.contains(&"--device-plugin-config-map=plugin-configs"), "{args:?}");
    for k in [
        "Role gpu-plugin/gpu-tenancy-controller",
        "RoleBinding gpu-plugin/gpu-tenancy-controller",
        "Role gpu-plugin/gpu-tenancy-agent",
        "RoleBinding gpu-plugin/gpu-tenancy-agent",
        "PodDisruptionBudget ops/gpu-tenancy-controller",
        "Role ops/gpu-tenancy-controller-leader-election",
    ] {
        assert!(
            objects.contains_key(k),
            "{k} missing: {:?}",
            objects.keys().collect::<Vec<_>>()
        );
    }
    assert_eq!(
        objects["ClusterRoleBinding /gpu-tenancy-controller"]["subjects"][0]["namespace"],
        "ops"
    );
    let ds = &objects["DaemonSet ops/gpu-tenancy-agent"]["spec"]["template"]["spec"];
    assert_eq!(ds["nodeSelector"]["pool"], "gpu");
    assert_eq!(ds["runtimeClassName"], "nvidia");
    assert_eq!(ds["containers"][0]["image"], "example/gpu-tenancy:1.2.3");

    // No agent, one controller replica (then no PodDisruptionBudget: minAvailable 1 would block
    // every drain), no CRDs.
    let objects = by_key(docs(
        &render_chart(&["agent.enabled=false", "controller.replicas=1", "crds.install=false"]),
        "the rendered chart",
    ));
    let kinds: Vec<&String> = objects.keys().collect();
    assert!(
        objects.keys().all(|k| !k.contains("agent")
            && !k.starts_with("PodDisruptionBudget")
            && !k.starts_with("CustomResourceDefinition")),
        "{kinds:?}"
    );
    assert!(
        objects.contains_key("Deployment gpu-tenancy-system/gpu-tenancy-controller"),
        "{kinds:?}"
    );
}
