//! GitOps health, checked with the tools' own code (e2e/gitops, built into e2e/bin/gitops by
//! e2e/run.sh):
//! - the Argo CD health scripts in deploy/argocd pass their health_test.yaml run the way Argo CD
//!   runs them (gopher-lua, with and without the standard libraries), and those tests cover, per
//!   kind, every state docs/install.md promises;
//! - kstatus (what Flux waits with) reads every one of those test objects the way we document,
//!   so our conditions mean to Flux what they mean to Argo CD, with the differences named;
//! - live: statuses written through /status as the controller writes them (computed by
//!   `desired`, not by a running controller) make Flux's own apply-and-wait finish, a tenant
//!   Current and an invalid plan Failed instead of hanging InProgress, make it wait while a new
//!   generation is unobserved, and Argo CD's scripts judge the same objects Healthy and Degraded.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use gpu_tenancy::api::{GpuPartitionPlan, GpuTenant, SharingPolicy};
use gpu_tenancy::desired::{Desired, Settings, desired};
use gpu_tenancy::inventory::InventoryFile;
use gpu_tenancy::planner::PlanInput;
use gpu_tenancy_e2e::{
    Cleanup, GROUP, KINDS, Names, VERSION, api, client, ensure_crds, kubeconfig_path, kubectl_async, repo_root,
    yaml_docs,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// The field manager the controller writes statuses with.
const CONTROLLER: &str = "gpu-tenancy-controller";

fn gitops_bin() -> PathBuf {
    let bin = repo_root().join("e2e/bin/gitops");
    assert!(
        bin.is_file(),
        "{} is missing: build it with `make e2e-build` (e2e/run.sh builds it from e2e/gitops)",
        bin.display()
    );
    bin
}

/// Runs e2e/bin/gitops from the repository root, feeding `stdin`.
fn gitops(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(gitops_bin())
        .args(args)
        .current_dir(repo_root())
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running e2e/bin/gitops: {e}"));
    if let Some(input) = stdin {
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    }
    child.wait_with_output().expect("e2e/bin/gitops")
}

fn show(args: &[&str], out: &Output) -> String {
    format!(
        "`gitops {}` exited {:?}\n--- stdout\n{}--- stderr\n{}",
        args.join(" "),
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// JSON lines printed by `gitops kstatus` and `gitops flux-apply-wait`.
fn json_lines(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

fn argo_dir(kind: &str) -> PathBuf {
    repo_root().join("deploy/argocd").join(GROUP).join(kind)
}

fn condition<'a>(o: &'a Value, type_: &str) -> Option<&'a Value> {
    o["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

fn is_true(o: &Value, type_: &str) -> bool {
    condition(o, type_).is_some_and(|c| c["status"] == "True")
}

fn generation_behind(o: &Value) -> bool {
    matches!(
        (o["metadata"]["generation"].as_i64(), o["status"]["observedGeneration"].as_i64()),
        (Some(g), Some(seen)) if g != seen
    )
}

/// What kstatus makes of an object (sigs.k8s.io/cli-utils pkg/kstatus/status: Compute), written
/// down from its documented rules rather than from its code, so that running kstatus on our
/// objects checks that our conditions say to Flux what we mean:
/// 1. `metadata.generation` differs from `status.observedGeneration` (both present): InProgress;
/// 2. the first condition, in list order, that is `Reconciling=True` (InProgress) or
///    `Stalled=True` (Failed) decides, with its message; the controller sorts conditions by type,
///    so Reconciling is read before Stalled;
/// 3. `Ready=True`: Current; `Ready=False` or `Unknown`: InProgress, with its message;
/// 4. otherwise, an object with no status at all included: Current.
fn documented_kstatus(o: &Value) -> (&'static str, Option<String>) {
    if generation_behind(o) {
        return ("InProgress", None);
    }
    let conditions = o["status"]["conditions"].as_array().cloned().unwrap_or_default();
    let message = |c: &Value| Some(c["message"].as_str().unwrap_or_default().to_string());
    for c in &conditions {
        match (c["type"].as_str(), c["status"].as_str()) {
            (Some("Reconciling"), Some("True")) => return ("InProgress", message(c)),
            (Some("Stalled"), Some("True")) => return ("Failed", message(c)),
            _ => {}
        }
    }
    match condition(o, "Ready").and_then(|c| c["status"].as_str()) {
        Some("True") => ("Current", None),
        Some("False" | "Unknown") => ("InProgress", message(condition(o, "Ready").unwrap())),
        _ => ("Current", None),
    }
}

/// One Argo CD health test of a kind: its object and the expected health.
struct Case {
    file: PathBuf,
    object: Value,
    status: String,
    message: String,
}

fn argo_cases(kind: &str) -> Vec<Case> {
    let dir = argo_dir(kind);
    let tests = yaml_docs(&dir.join("health_test.yaml"));
    let tests = tests[0]["tests"]
        .as_array()
        .unwrap_or_else(|| panic!("{kind}/health_test.yaml has no tests list"));
    tests
        .iter()
        .map(|t| {
            let file = dir.join(t["inputPath"].as_str().expect("inputPath"));
            let object = yaml_docs(&file).remove(0);
            Case {
                file,
                object,
                status: t["healthStatus"]["status"].as_str().unwrap_or_default().into(),
                message: t["healthStatus"]["message"].as_str().unwrap_or_default().into(),
            }
        })
        .collect()
}

/// Argo CD's own test procedure over deploy/argocd: every health_test.yaml passes, and the
/// runner does fail a wrong expectation (so a pass means something).
#[test]
fn argo_cd_health_scripts_pass_their_tests() {
    let args = ["argocd-health-test", "deploy/argocd"];
    let out = gitops(&args, None);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{}", show(&args, &out));
    let total: usize = KINDS.iter().map(|(kind, _, _)| argo_cases(kind).len()).sum();
    assert!(
        stdout.contains(&format!("{total} passed, 0 failed")),
        "expected every one of the {total} cases to run: {}",
        show(&args, &out)
    );

    // A copy with one expectation changed must fail, naming the case.
    let tmp = std::env::temp_dir().join(format!("gt-e2e-argocd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    copy_dir(&repo_root().join("deploy/argocd"), &tmp);
    let test_file = tmp.join(GROUP).join("GpuTenant/health_test.yaml");
    let text = std::fs::read_to_string(&test_file).unwrap();
    let changed = text.replacen("status: Healthy", "status: Progressing", 1);
    assert_ne!(text, changed, "GpuTenant/health_test.yaml has no Healthy case");
    std::fs::write(&test_file, changed).unwrap();
    let dir = tmp.display().to_string();
    let args = ["argocd-health-test", dir.as_str()];
    let out = gitops(&args, None);
    std::fs::remove_dir_all(&tmp).ok();
    assert_eq!(out.status.code(), Some(1), "{}", show(&args, &out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("FAIL gputenancy.io/GpuTenant/testdata/"),
        "{}",
        show(&args, &out)
    );
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

/// The health tests cover, for each of the four kinds, every state the brief of the scripts
/// names, with the health docs/install.md documents: no status yet, a generation not yet observed,
/// Reconciling=True, Stalled=True, Ready=True, and Ready=False without Stalled.
#[test]
fn argo_cd_health_tests_cover_every_state_of_every_kind() {
    for (kind, _, _) in KINDS {
        let cases = argo_cases(kind);
        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        for c in &cases {
            let o = &c.object;
            let name = c.file.display();
            assert_eq!(o["kind"], kind, "{name}: an object of another kind");
            let state = if o["status"].is_null() {
                assert_eq!(c.status, "Progressing", "{name}: no status yet");
                assert!(c.message.starts_with("waiting for the"), "{name}: {}", c.message);
                "no status"
            } else if generation_behind(o) {
                assert_eq!(c.status, "Progressing", "{name}: generation not observed");
                assert!(c.message.contains("generation"), "{name}: {}", c.message);
                "generation behind"
            } else if is_true(o, "Stalled") {
                let stalled = condition(o, "Stalled").unwrap()["message"].as_str().unwrap_or_default();
                assert_eq!(c.status, "Degraded", "{name}: Stalled=True");
                assert!(
                    c.message.starts_with(stalled),
                    "{name}: {:?} lacks {stalled:?}",
                    c.message
                );
                "stalled"
            } else if is_true(o, "Reconciling") {
                let msg = condition(o, "Reconciling").unwrap()["message"]
                    .as_str()
                    .unwrap_or_default();
                assert_eq!(c.status, "Progressing", "{name}: Reconciling=True");
                assert_eq!(c.message, msg, "{name}: Progressing with the Reconciling message");
                "reconciling"
            } else if is_true(o, "Ready") {
                assert_eq!(c.status, "Healthy", "{name}: Ready=True");
                "ready"
            } else if condition(o, "Ready").is_some_and(|r| r["status"] == "False") {
                // Per kind (see each health.lua): a tenant short of capacity is Degraded, every
                // other Ready=False without Stalled is Progressing.
                let expected = if kind == "GpuTenant" && is_true(o, "CapacityShort") {
                    "Degraded"
                } else {
                    "Progressing"
                };
                assert_eq!(c.status, expected, "{name}: Ready=False without Stalled");
                "not ready"
            } else {
                assert_eq!(c.status, "Progressing", "{name}: neither Ready nor Stalled");
                "other"
            };
            *seen.entry(state).or_default() += 1;
        }
        for state in [
            "no status",
            "generation behind",
            "reconciling",
            "stalled",
            "ready",
            "not ready",
        ] {
            assert!(
                seen.contains_key(state),
                "deploy/argocd/{GROUP}/{kind}: no health test of state {state:?} (have {seen:?})"
            );
        }
    }
}

/// kstatus, run on every Argo CD test object, gives what `documented_kstatus` says; and the two
/// tools agree where they should: Healthy is Current, Failed is Degraded. Where they differ it
/// is by design and named here: an object without a status is Current to kstatus (it cannot
/// tell a resource nobody reconciles yet from one that needs no reconciling); a tenant short of
/// capacity and a plan with a failed node that still rolls out are Degraded to Argo CD but
/// InProgress to kstatus.
#[test]
fn kstatus_reads_our_conditions_as_documented() {
    let mut cases = Vec::new();
    for (kind, _, _) in KINDS {
        cases.extend(argo_cases(kind));
    }
    let files: Vec<String> = cases.iter().map(|c| c.file.display().to_string()).collect();
    let mut args = vec!["kstatus"];
    args.extend(files.iter().map(String::as_str));
    let out = gitops(&args, None);
    assert!(out.status.success(), "{}", show(&args, &out));
    let lines = json_lines(&out);
    assert_eq!(lines.len(), cases.len(), "{}", show(&args, &out));
    let mut table = String::new();
    for (c, got) in cases.iter().zip(&lines) {
        let name = c
            .file
            .strip_prefix(repo_root())
            .unwrap_or(&c.file)
            .display()
            .to_string();
        assert_eq!(got["source"].as_str(), Some(c.file.display().to_string().as_str()));
        let (status, message) = documented_kstatus(&c.object);
        assert_eq!(got["status"], status, "{name}: kstatus said {got}");
        if let Some(m) = message {
            assert_eq!(got["message"], m.as_str(), "{name}: kstatus message");
        }
        match (c.status.as_str(), status) {
            ("Healthy", "Current") | ("Progressing", "InProgress") | ("Degraded", "Failed") => {}
            ("Progressing", "Current") => assert!(
                c.object["status"].is_null(),
                "{name}: only an object without a status is Progressing to Argo CD and Current to kstatus"
            ),
            ("Degraded", "InProgress") => assert!(
                is_true(&c.object, "CapacityShort")
                    || (is_true(&c.object, "Stalled") && is_true(&c.object, "Reconciling")),
                "{name}: Degraded to Argo CD but InProgress to kstatus, and not a documented case"
            ),
            (argo, ks) => panic!("{name}: Argo CD {argo} but kstatus {ks}: not a documented pairing"),
        }
        table.push_str(&format!("{:<70} Argo CD {:<12} kstatus {}\n", name, c.status, status));
    }
    println!("{table}");
}

fn now() -> Time {
    Time(jiff::Timestamp::now())
}

fn example(file: &str) -> String {
    std::fs::read_to_string(repo_root().join("examples").join(file)).unwrap()
}

/// What the controller would write for these live objects, with the examples' policy, plans
/// and fleet around them.
fn statuses(tenants: &[GpuTenant], extra_plans: &[GpuPartitionPlan]) -> Desired {
    let root = repo_root();
    let policies: Vec<SharingPolicy> = serde_saphyr::from_multiple(&example("policy.yaml")).unwrap();
    let mut plans: Vec<GpuPartitionPlan> = serde_saphyr::from_multiple(&example("plans.yaml")).unwrap();
    plans.extend_from_slice(extra_plans);
    let inventory: InventoryFile =
        serde_saphyr::from_str(&std::fs::read_to_string(root.join("examples/inventory.yaml")).unwrap()).unwrap();
    let nodes = inventory.resolve().unwrap();
    desired(
        &PlanInput {
            policies: &policies,
            tenants: &tenants.iter().cloned().map(std::sync::Arc::new).collect::<Vec<_>>(),
            plans: &plans,
            nodes: &nodes,
        },
        &Settings::default(),
        &now(),
    )
}

fn cond<'a>(conditions: &'a [Condition], type_: &str) -> &'a Condition {
    conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {conditions:?}"))
}

/// Writes `status` to /status with server-side apply, as the controller does.
async fn write_status(client: &kube::Client, kind: &str, name: &str, status: Value) {
    let body = json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": kind,
        "metadata": {"name": name},
        "status": status,
    });
    api(client, kind)
        .patch_status(name, &PatchParams::apply(CONTROLLER).force(), &Patch::Apply(&body))
        .await
        .unwrap_or_else(|e| panic!("{kind}/{name}: writing the status: {e}"));
}

fn tenant_manifest(name: &str, priority: i32) -> Value {
    json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": "GpuTenant",
        "metadata": {"name": name},
        "spec": {
            "tier": "internal",
            "policyRef": "default",
            "namespaces": [format!("{name}-ns")],
            "priority": priority,
            "resources": [{"mode": "MIG", "profile": "1g.10gb", "count": 2}]
        }
    })
}

/// A plan the schema accepts and the planner refuses: two 7g.80gb instances cannot share an H100.
/// Its selector matches none of the examples' nodes: an invalid plan still conflicts with a valid
/// one of the same priority on the nodes both select, which would take the tenant's MIG capacity.
fn invalid_plan_manifest(name: &str) -> Value {
    json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": "GpuPartitionPlan",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"matchLabels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "gputenancy.io/pool": name}},
            "gpus": [{"devices": "all", "mode": "MIG", "mig": {"profiles": ["7g.80gb", "7g.80gb"]}}]
        }
    })
}

fn write_manifests(path: &Path, docs: &[&Value]) {
    let text = docs
        .iter()
        .map(|d| serde_saphyr::to_string(d).unwrap())
        .collect::<Vec<_>>()
        .join("---\n");
    std::fs::write(path, text).unwrap();
}

/// Flux's apply-and-wait on statuses written as the controller writes them: it finishes with the
/// tenant Current and the invalid plan Failed (it does not hang InProgress), it waits while a
/// new generation is not yet observed, and Argo CD's scripts judge the live objects.
#[tokio::test]
async fn flux_waits_for_and_argo_cd_judges_live_statuses() {
    let client = client().await;
    ensure_crds(&client).await;
    let cleanup = Cleanup::new();
    let names = Names::new("gitops");
    let (tenant, plan) = (names.next(), names.next());
    cleanup.add("GpuTenant", &tenant);
    cleanup.add("GpuPartitionPlan", &plan);
    let tenants: Api<GpuTenant> = Api::all(client.clone());
    let plans: Api<GpuPartitionPlan> = Api::all(client.clone());
    let kubeconfig = kubeconfig_path().display().to_string();
    let dir = std::env::temp_dir().join(format!("gt-e2e-gitops-{}-{}", std::process::id(), names.prefix()));
    std::fs::create_dir_all(&dir).unwrap();
    let manifests = dir.join("objects.yaml");
    let (tenant_v1, plan_doc) = (tenant_manifest(&tenant, 0), invalid_plan_manifest(&plan));
    write_manifests(&manifests, &[&tenant_v1, &plan_doc]);

    // The objects exist before the controller has written anything. (Flux would call them
    // Current right away: kstatus cannot tell "no status yet" from "needs none"; the offline
    // kstatus test pins that down. So the statuses are written before Flux's wait here.)
    tenants
        .create(
            &PostParams::default(),
            &serde_json::from_value(tenant_v1.clone()).unwrap(),
        )
        .await
        .unwrap_or_else(|e| panic!("creating GpuTenant {tenant}: {e}"));
    plans
        .create(
            &PostParams::default(),
            &serde_json::from_value(plan_doc.clone()).unwrap(),
        )
        .await
        .unwrap_or_else(|e| panic!("creating GpuPartitionPlan {plan}: {e}"));

    // The statuses the controller computes for the live objects (their generations included).
    let live_tenant = tenants.get(&tenant).await.unwrap();
    let live_plan = plans.get(&plan).await.unwrap();
    let d = statuses(&[live_tenant], &[live_plan]);
    let tenant_status = d
        .tenants
        .iter()
        .find(|t| t.metadata.name.as_deref() == Some(&tenant))
        .unwrap();
    let tenant_status = tenant_status.status.clone().expect("a tenant status");
    let plan_status = d
        .plans
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some(&plan))
        .unwrap();
    let plan_status = plan_status.status.clone().expect("a plan status");
    let ready = cond(&tenant_status.conditions, "Ready").clone();
    assert_eq!(
        ready.status, "True",
        "test setup: the tenant should be granted in full: {ready:?}"
    );
    let stalled = cond(&plan_status.conditions, "Stalled").clone();
    assert_eq!(
        stalled.status, "True",
        "test setup: the plan should be invalid: {stalled:?}"
    );
    let valid = cond(&plan_status.conditions, "Valid").clone();
    write_status(
        &client,
        "GpuTenant",
        &tenant,
        serde_json::to_value(&tenant_status).unwrap(),
    )
    .await;
    write_status(
        &client,
        "GpuPartitionPlan",
        &plan,
        serde_json::to_value(&plan_status).unwrap(),
    )
    .await;

    // 1. Flux applies the same manifests (nothing changes) and waits: the tenant is Current, the
    //    plan Failed with the Stalled message, and the wait ends without running into its timeout.
    let files = manifests.display().to_string();
    let args = [
        "flux-apply-wait",
        "--kubeconfig",
        kubeconfig.as_str(),
        "--timeout",
        "60s",
        "--interval",
        "500ms",
        files.as_str(),
    ];
    let started = Instant::now();
    let out = gitops(&args, None);
    let took = started.elapsed();
    println!("{}", show(&args, &out));
    assert_eq!(out.status.code(), Some(1), "some object Failed: {}", show(&args, &out));
    assert!(
        took < Duration::from_secs(30),
        "Flux's wait took {took:?}: {}",
        show(&args, &out)
    );
    let by_kind: BTreeMap<String, Value> = json_lines(&out)
        .into_iter()
        .map(|l| (l["kind"].as_str().unwrap().to_string(), l))
        .collect();
    assert_eq!(by_kind["GpuTenant"]["name"], tenant.as_str());
    assert_eq!(by_kind["GpuTenant"]["status"], "Current", "{}", show(&args, &out));
    assert_eq!(by_kind["GpuPartitionPlan"]["name"], plan.as_str());
    assert_eq!(by_kind["GpuPartitionPlan"]["status"], "Failed", "{}", show(&args, &out));
    assert_eq!(by_kind["GpuPartitionPlan"]["message"], stalled.message.as_str());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("failed early due to stalled resources"),
        "Flux's wait should stop at the Failed plan: {}",
        show(&args, &out)
    );
    let unchanged = tenants.get(&tenant).await.unwrap();
    assert_eq!(
        unchanged.metadata.generation,
        Some(1),
        "re-applying the same spec bumped the generation"
    );

    // 2. A spec change: Flux applies generation 2 and waits; the status is still of generation 1,
    //    so the tenant is InProgress and the wait goes on, until the controller's status for
    //    generation 2 arrives.
    let tenant_v2 = tenant_manifest(&tenant, 5);
    let tenant_file = dir.join("tenant.yaml");
    write_manifests(&tenant_file, &[&tenant_v2]);
    let tenant_files = tenant_file.display().to_string();
    let mut child = Command::new(gitops_bin())
        .args([
            "flux-apply-wait",
            "--kubeconfig",
            kubeconfig.as_str(),
            "--timeout",
            "60s",
            "--interval",
            "500ms",
            tenant_files.as_str(),
        ])
        .current_dir(repo_root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("e2e/bin/gitops");
    let deadline = Instant::now() + Duration::from_secs(30);
    let applied = loop {
        let t = tenants.get(&tenant).await.unwrap();
        if t.metadata.generation == Some(2) {
            break t;
        }
        if let Some(code) = child.try_wait().unwrap() {
            panic!("flux-apply-wait exited ({code}) before it applied generation 2");
        }
        assert!(Instant::now() < deadline, "Flux never applied the new spec");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(applied.spec.priority, 5);
    tokio::time::sleep(Duration::from_secs(2)).await; // several polls of Flux's wait
    if let Some(code) = child.try_wait().unwrap() {
        let out = child.wait_with_output().unwrap();
        panic!(
            "flux-apply-wait exited ({code}) while generation 2 was unobserved\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let d = statuses(&[applied], &[]);
    let status_v2 = d.tenants[0].status.clone().unwrap();
    assert_eq!(status_v2.observed_generation, Some(2));
    let written = Instant::now();
    write_status(&client, "GpuTenant", &tenant, serde_json::to_value(&status_v2).unwrap()).await;
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let args = ["flux-apply-wait", "(generation 2)"];
    println!("{}", show(&args, &out));
    assert_eq!(out.status.code(), Some(0), "{}", show(&args, &out));
    assert!(
        written.elapsed() < Duration::from_secs(20),
        "Flux's wait took {:?} after the status arrived",
        written.elapsed()
    );
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 1, "{}", show(&args, &out));
    assert_eq!(lines[0]["status"], "Current", "{}", show(&args, &out));

    // 3. Argo CD's health scripts on the live objects, as `kubectl get -o json` returns them.
    let listed = kubectl_async(vec![
        "get".into(),
        format!("gputenants.{GROUP}/{tenant}"),
        format!("gpupartitionplans.{GROUP}/{plan}"),
        "-o".into(),
        "json".into(),
    ])
    .await
    .ok();
    let args = ["argocd-health", "-"];
    let out = gitops(&args, Some(&listed));
    println!("{}", show(&args, &out));
    assert!(out.status.success(), "{}", show(&args, &out));
    let health: Vec<Value> =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", show(&args, &out)));
    let of = |kind: &str| {
        health
            .iter()
            .find(|h| h["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind} in {health:?}"))
    };
    let ready_v2 = cond(&status_v2.conditions, "Ready");
    assert_eq!(of("GpuTenant")["status"], "Healthy", "{health:?}");
    assert_eq!(of("GpuTenant")["message"], ready_v2.message.as_str());
    assert_eq!(of("GpuPartitionPlan")["status"], "Degraded", "{health:?}");
    assert_eq!(
        of("GpuPartitionPlan")["message"],
        format!("{}: {}", stalled.message, valid.message).as_str(),
        "Degraded with what to fix"
    );
    std::fs::remove_dir_all(&dir).ok();
}
