//! What the controller writes (`gpu-tenancy plan -o yaml`, the `desired` function) is accepted by
//! the real API server, and the admission policies it renders refuse and admit the right pods.

use gpu_tenancy::api::{
    GpuPartitionPlan, GpuTenant, GpuTenantSpec, Mode, ResourceRequest, SharingPolicy, TenantLimits,
};
use gpu_tenancy::cli::plan::{compute, manifests_yaml};
use gpu_tenancy::desired::{Desired, POLICY_PREFIX, Settings, TENANTS_POLICY, desired};
use gpu_tenancy::inventory::InventoryFile;
use gpu_tenancy::planner::PlanInput;
use gpu_tenancy_e2e::{Cleanup, Names, client, create_namespace, ensure_crds, kubectl_async, repo_root};
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

fn now() -> Time {
    Time(jiff::Timestamp::now())
}

/// The examples' plan, as `plan -o yaml` prints it, passes a server-side dry run: every object is
/// well-formed for the API server (schemas, CEL of the policies' expressions, our CRDs).
#[tokio::test]
async fn the_plan_of_the_examples_applies_with_a_server_side_dry_run() {
    let client = client().await;
    ensure_crds(&client).await;
    let root = repo_root();
    let (desired, problems) = compute(
        &[root.join("examples")],
        Some(&root.join("examples/inventory.yaml")),
        now(),
    )
    .expect("the examples load");
    assert_eq!(problems, Vec::<String>::new());
    // A dry run persists nothing, so namespaced objects need their namespaces to exist already.
    let settings = Settings::default();
    let mut namespaces: Vec<String> = desired.namespaces.iter().map(|n| n.name_any()).collect();
    namespaces.push(settings.device_plugin_namespace.clone());
    for ns in &namespaces {
        if kubectl_async(vec!["get".into(), "namespace".into(), ns.clone()])
            .await
            .success
        {
            continue;
        }
        // Never deleted: other tests (and the controller scenarios) use the same namespace.
        let keep = Cleanup::new();
        create_namespace(&client, &keep, ns, &[]).await;
        std::mem::forget(keep);
    }
    let file = std::env::temp_dir().join(format!("gt-e2e-plan-{}.yaml", std::process::id()));
    std::fs::write(&file, manifests_yaml(&desired)).unwrap();
    let out = kubectl_async(vec![
        "apply".into(),
        "--dry-run=server".into(),
        "--server-side".into(),
        "--field-manager=gpu-tenancy-controller".into(),
        // As the controller applies (`force`): the tenants' policies, every tenant's, may have
        // been applied by another test.
        "--force-conflicts".into(),
        "-f".into(),
        file.display().to_string(),
    ])
    .await;
    std::fs::remove_file(&file).ok();
    let stdout = out.ok();
    // One line per object, each "serverside-applied (server dry run)".
    let expected = desired.nodes.len()
        + desired.namespaces.len()
        + desired.resource_quotas.len()
        + desired.config_maps.len()
        + desired.node_labels.len()
        + desired.device_classes.len()
        + desired.admission_policies.len()
        + desired.admission_bindings.len()
        + desired.mutating_policies.len()
        + desired.mutating_bindings.len();
    assert_eq!(
        stdout.lines().filter(|l| l.contains("(server dry run)")).count(),
        expected,
        "{stdout}"
    );
}

fn tenant(name: &str, tier: &str, ns: &str, resources: Vec<ResourceRequest>, max_per_pod: Option<u32>) -> GpuTenant {
    GpuTenant::new(
        name,
        GpuTenantSpec {
            tier: tier.into(),
            policy_ref: "default".into(),
            namespaces: vec![ns.into()],
            priority: 0,
            weight: 1,
            resources,
            limits: max_per_pod.map(|m| TenantLimits {
                max_gpus_per_pod: Some(m),
                memory: None,
            }),
        },
    )
}

fn pod(name: &str, limits: serde_json::Value, tolerations: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "c", "image": "registry.invalid/cuda:latest", "resources": {"limits": limits}}],
            "tolerations": tolerations,
        }
    }))
    .unwrap()
}

/// The rendered admission policies, applied for real, refuse a pod that breaks its tenant's
/// isolation with the policy's message and admit one that keeps to it.
#[tokio::test]
async fn tenant_admission_policies_refuse_and_admit_pods() {
    let client = client().await;
    ensure_crds(&client).await;
    let cleanup = Cleanup::new();
    let names = Names::new("admission");
    let root = repo_root();
    let policies: Vec<SharingPolicy> =
        serde_saphyr::from_multiple(&std::fs::read_to_string(root.join("examples/policy.yaml")).unwrap()).unwrap();
    let plans: Vec<GpuPartitionPlan> =
        serde_saphyr::from_multiple(&std::fs::read_to_string(root.join("examples/plans.yaml")).unwrap()).unwrap();
    let inventory: InventoryFile =
        serde_saphyr::from_str(&std::fs::read_to_string(root.join("examples/inventory.yaml")).unwrap()).unwrap();
    let nodes = inventory.resolve().unwrap();
    let (ext, exp) = (names.next(), names.next());
    let (ext_ns, exp_ns) = (format!("{ext}-ns"), format!("{exp}-ns"));
    let tenants = [
        tenant(
            &ext,
            "external",
            &ext_ns,
            vec![ResourceRequest {
                mode: Mode::Mig,
                profile: Some("1g.10gb".into()),
                count: 2,
            }],
            Some(1),
        ),
        tenant(
            &exp,
            "experimental",
            &exp_ns,
            vec![ResourceRequest {
                mode: Mode::TimeSlicing,
                profile: None,
                count: 2,
            }],
            None,
        ),
    ];
    let d: Desired = desired(
        &PlanInput {
            policies: &policies,
            tenants: &tenants.iter().cloned().map(std::sync::Arc::new).collect::<Vec<_>>(),
            plans: &plans,
            nodes: &nodes,
        },
        &Settings::default(),
        &now(),
    );
    for (t, ns) in [(&ext, &ext_ns), (&exp, &exp_ns)] {
        create_namespace(&client, &cleanup, ns, &[("gputenancy.io/tenant", t)]).await;
    }
    // Only these tenants' bindings and the tenants' policy they name: the policy for namespaces of
    // no tenant would judge every other test's pods. The tenants' policy, every tenant's (other
    // tests bind it too), is left in place: it judges nothing without a binding.
    let mine: Vec<serde_json::Value> = d
        .admission_policies
        .iter()
        .filter(|p| p.name_any() == TENANTS_POLICY)
        .map(|p| serde_json::to_value(p).unwrap())
        .chain(
            d.admission_bindings
                .iter()
                .filter(|b| b.name_any().starts_with(POLICY_PREFIX))
                .map(|b| serde_json::to_value(b).unwrap()),
        )
        .collect();
    for o in mine.iter().filter(|o| o["kind"] == "ValidatingAdmissionPolicyBinding") {
        cleanup.add_resource(
            "validatingadmissionpolicybindings.admissionregistration.k8s.io",
            o["metadata"]["name"].as_str().unwrap(),
        );
    }
    let file = std::env::temp_dir().join(format!("gt-e2e-adm-{}.yaml", std::process::id()));
    std::fs::write(
        &file,
        mine.iter()
            .map(|o| serde_saphyr::to_string(o).unwrap())
            .collect::<Vec<_>>()
            .join("---\n"),
    )
    .unwrap();
    kubectl_async(vec![
        "apply".into(),
        "--server-side".into(),
        "-f".into(),
        file.display().to_string(),
    ])
    .await
    .ok();
    std::fs::remove_file(&file).ok();
    // The policies' parameter: each tenant with the status the controller writes
    // (`status.admission`, what its pods may ask for).
    let gpu_tenants: Api<GpuTenant> = Api::all(client.clone());
    for name in [&ext, &exp] {
        let t = d.tenants.iter().find(|t| &t.name_any() == name).unwrap();
        cleanup.add_resource("gputenants.gputenancy.io", name);
        gpu_tenants
            .create(&PostParams::default(), &GpuTenant::new(name, t.spec.clone()))
            .await
            .unwrap();
        write_status(
            &gpu_tenants,
            name,
            serde_json::to_value(t.status.as_ref().unwrap()).unwrap(),
        )
        .await;
    }

    let pods = |ns: &str| Api::<Pod>::namespaced(client.clone(), ns);
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    // (namespace, pod, refused with a message containing ..., or admitted)
    let cases: Vec<(&str, Pod, Option<String>)> = vec![
        (
            &ext_ns,
            pod("mig", json!({"nvidia.com/mig-1g.10gb": "1"}), json!([])),
            None,
        ),
        (
            &ext_ns,
            pod("shared", json!({"nvidia.com/gpu.shared": "1"}), json!([])),
            Some(format!(
                "GpuTenant {ext} (tier external) may not use nvidia.com/gpu.shared: it was granted nvidia.com/mig-1g.10gb"
            )),
        ),
        (
            &ext_ns,
            pod("two", json!({"nvidia.com/mig-1g.10gb": "2"}), json!([])),
            Some(format!(
                "GpuTenant {ext} (tier external) allows at most 1 GPUs per pod (spec.limits.maxGpusPerPod); this pod holds 2 at once"
            )),
        ),
        (
            &ext_ns,
            pod(
                "steal",
                json!({}),
                json!([{"key": "gputenancy.io/dedicated", "operator": "Equal", "value": "someone-else", "effect": "NoSchedule"}]),
            ),
            Some("may tolerate only its own dedicated nodes".into()),
        ),
        (
            &ext_ns,
            pod("everything", json!({}), json!([{"operator": "Exists"}])),
            Some("a toleration without a key tolerates every taint".into()),
        ),
        (
            &exp_ns,
            pod(
                "ts",
                json!({"nvidia.com/gpu.shared": "1"}),
                json!([{"key": "gputenancy.io/sharing", "operator": "Equal", "value": "TimeSlicing", "effect": "NoSchedule"}]),
            ),
            None,
        ),
        (&exp_ns, pod("cpu", json!({"cpu": "1"}), json!([])), None),
    ];
    // A new policy and its parameter take a moment to reach the admission plugin: retry the first
    // refusal until it bites, and the first admission until the tenant's status is read (while
    // the plugin has not seen the tenant, its binding refuses everything).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if pods(&ext_ns).create(&dry, &cases[1].1).await.is_err()
            && pods(&ext_ns).create(&dry, &cases[0].1).await.is_ok()
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the tenant's admission policy never took effect"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    for (ns, p, refusal) in cases {
        let result = pods(ns).create(&dry, &p).await;
        match (refusal, result) {
            (None, Ok(_)) => {}
            (None, Err(e)) => panic!("pod {} in {ns} was refused: {e}", p.name_any()),
            (Some(m), Ok(_)) => panic!(
                "pod {} in {ns} was admitted; expected a refusal with {m:?}",
                p.name_any()
            ),
            (Some(m), Err(e)) => assert!(e.to_string().contains(&m), "pod {}: {e} lacks {m:?}", p.name_any()),
        }
    }
    the_grants_are_read_from_the_tenant(&client, &gpu_tenants, &ext, &ext_ns, &d).await;
}

/// Writes `status` as the controller does (server-side apply on /status, its field manager).
async fn write_status(tenants: &Api<GpuTenant>, name: &str, status: serde_json::Value) {
    tenants
        .patch_status(
            name,
            &PatchParams::apply("gpu-tenancy-controller").force(),
            &Patch::Apply(json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuTenant", "status": status})),
        )
        .await
        .unwrap();
}

/// The tenant's policy reads what it was granted from the tenant's status, its parameter: a
/// grant written to the status admits its name with no policy written; a status without
/// `admission` (a tenant not valid, or not yet reconciled) gets no GPU; a deleted tenant's
/// namespaces get nothing at all until the controller moves them to the no-tenant rules.
async fn the_grants_are_read_from_the_tenant(
    client: &kube::Client,
    tenants: &Api<GpuTenant>,
    name: &str,
    ns: &str,
    d: &Desired,
) {
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let version = policies.get(TENANTS_POLICY).await.unwrap().resource_version();
    let until = |what: &'static str, p: Pod, done: fn(&Result<Pod, kube::Error>) -> bool| {
        let (pods, dry) = (pods.clone(), dry.clone());
        async move {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            loop {
                let got = pods.create(&dry, &p).await;
                if done(&got) {
                    return got;
                }
                assert!(std::time::Instant::now() < deadline, "{what}: {got:?}");
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            }
        }
    };
    let status = d
        .tenants
        .iter()
        .find(|t| t.name_any() == name)
        .unwrap()
        .status
        .clone()
        .unwrap();
    let shared = pod("shared", json!({"nvidia.com/gpu.shared": "1"}), json!([]));
    let mig = pod("mig", json!({"nvidia.com/mig-1g.10gb": "1"}), json!([]));

    // A name added to the status is admitted.
    let mut grown = serde_json::to_value(&status).unwrap();
    grown["admission"]["resourceNames"] = json!(["nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb"]);
    write_status(tenants, name, grown.clone()).await;
    let _admitted = until("a name granted in the status is admitted", shared.clone(), |r| {
        r.is_ok()
    })
    .await;
    assert_eq!(
        policies.get(TENANTS_POLICY).await.unwrap().resource_version(),
        version,
        "the policy itself was not written"
    );

    // The PriorityClasses its pods may name are read from the status too.
    let class = format!("{name}-batch");
    let classes = Cleanup::new();
    classes.add_resource("priorityclasses.scheduling.k8s.io", &class);
    Api::<PriorityClass>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": class}, "value": 100})).unwrap(),
        )
        .await
        .unwrap();
    let mut classed = pod("classed", json!({}), json!([]));
    classed.spec.as_mut().unwrap().priority_class_name = Some(class.clone());
    // Refused by the tenant's policy, not by the Priority admission plugin, which answers "no
    // PriorityClass with name ..." until its informer has seen the class just created.
    let got = until(
        "a PriorityClass the status does not list is refused",
        classed.clone(),
        |r| {
            r.as_ref()
                .is_err_and(|e| !e.to_string().contains("no PriorityClass with name"))
        },
    )
    .await;
    let e = got.unwrap_err().to_string();
    assert!(
        e.contains("may name only the PriorityClasses its tier lists (none: leave priorityClassName unset)"),
        "{e}"
    );
    grown["admission"]["priorityClassNames"] = json!([class]);
    write_status(tenants, name, grown).await;
    let _admitted = until("a PriorityClass the status lists is admitted", classed.clone(), |r| {
        r.is_ok()
    })
    .await;

    // Without `admission`, every GPU is refused, and says why.
    let mut invalid = serde_json::to_value(&status).unwrap();
    invalid.as_object_mut().unwrap().remove("admission");
    write_status(tenants, name, invalid).await;
    let got = until("a status without admission refuses every GPU", mig.clone(), |r| {
        r.is_err()
    })
    .await;
    let e = got.unwrap_err().to_string();
    assert!(
        e.contains(&format!(
            "GpuTenant {name} (tier external) is not valid, so its pods get no GPUs"
        )),
        "{e}"
    );
    // Nor may it name a PriorityClass (fail closed: a higher class could preempt other tenants).
    let got = pods.create(&dry, &classed).await;
    let e = got.unwrap_err().to_string();
    assert!(e.contains("(a tenant that is not valid may name none)"), "{e}");

    // The tenant deleted: its binding's parameter is gone, and everything it matches is refused.
    tenants.delete(name, &Default::default()).await.unwrap();
    let cpu = pod("cpu", json!({"cpu": "1"}), json!([]));
    let got = until("a deleted tenant's namespace admits nothing", cpu, |r| r.is_err()).await;
    let e = got.as_ref().unwrap_err().to_string();
    let binding = format!("{POLICY_PREFIX}{name}");
    assert!(e.contains(&binding), "the refusal names the tenant's binding: {e}");
    eprintln!(
        "MEASURE a deleted tenant's namespace refuses a CPU pod: {:?}",
        got.as_ref().err()
    );
}
