//! A tenant's user against the queues, by impersonation.

use super::*;
use gpu_tenancy_e2e::access::{eventually, impersonating, outcome};

const X: &str = "kq-x";
const Y: &str = "kq-y";
const NONE: &str = "kq-none";

fn dry() -> PostParams {
    PostParams {
        dry_run: true,
        ..PostParams::default()
    }
}

/// Kueue's `kind`, in `ns` or cluster-wide.
fn kueue_api(client: &Client, ns: Option<&str>, kind: &str) -> Api<DynamicObject> {
    let r = ApiResource::from_gvk(&GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", kind));
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &r),
        None => Api::all_with(client.clone(), &r),
    }
}

fn object(kind: &str, ns: Option<&str>, spec: serde_json::Value) -> DynamicObject {
    serde_json::from_value(json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": kind,
        "metadata": {"name": "mine", "namespace": ns}, "spec": spec}))
    .unwrap()
}

fn local_queue(ns: &str, target: &str) -> DynamicObject {
    object("LocalQueue", Some(ns), json!({"clusterQueue": target}))
}

fn workload(class: &str) -> DynamicObject {
    object(
        "Workload",
        Some(X),
        json!({"queueName": "gpu-tenancy", "priority": 0,
            "priorityClassRef": {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": class},
            "podSets": [{"name": "main", "count": 1, "template": {"spec": {"containers": [{"name": "c", "image": "pause"}]}}}]}),
    )
}

fn job(class: &str) -> Job {
    serde_json::from_value(json!({"metadata": {"name": "mine", "namespace": X, "labels": {
            "kueue.x-k8s.io/queue-name": "gpu-tenancy", "kueue.x-k8s.io/priority-class": class}},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "pause",
            "resources": {"requests": {GPU: 1}, "limits": {GPU: 1}}}]}}}}))
    .unwrap()
}

fn bind(user: &str, name: &str, role: &str) -> serde_json::Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": X},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})
}

/// What was wrong, case by case.
#[derive(Default)]
struct Verdicts(Vec<String>);

impl Verdicts {
    /// `case` got `got`: admitted when `says` is `None`, else refused with every word of `says`.
    fn expect(&mut self, case: &str, got: Result<(), String>, says: Option<&[&str]>) {
        let ok = match (says, &got) {
            (None, Ok(())) => true,
            (Some(words), Err(e)) => words.iter().all(|w| e.contains(w)),
            _ => false,
        };
        if !ok {
            let wanted = says.map_or("admitted".into(), |w| format!("refused saying {w:?}"));
            self.0.push(format!("{case}: got {got:?}, wanted {wanted}"));
        }
    }
}

/// A tenant user with Kubernetes' `edit` role in its namespace (impersonated), with Kueue's own
/// roles aggregated into it, against the queues the controller wrote: it cannot write
/// ClusterQueues, Cohorts, WorkloadPriorityClasses or LocalQueues (Kueue gives `edit` read
/// access only), and its workloads may name only its own tenant's WorkloadPriorityClass. Where a
/// cluster grants more (LocalQueues and Workloads), the operator's admission policy still keeps a
/// LocalQueue to its own tenant's ClusterQueue and a Workload to its own priority; a namespace of
/// no tenant names none of the operator's queues.
#[tokio::test]
async fn kueue_manager_a_tenant_user_names_only_its_own_queue_and_priority() {
    let cleanup = Cleanup::new();
    let client = setup(&cleanup).await;
    let kueue = KueueManager::start(&client, &KueueSettings::default()).await;
    fleet(
        &client,
        &cleanup,
        &kueue,
        &[(X, "solo", &[X], 2, 1), (Y, "solo", &[Y], 2, 1)],
    )
    .await;
    create_namespace(&client, &cleanup, NONE, &[]).await;
    let user = format!("dev@{X}");
    apply_docs_as_kubectl(&[bind(&user, "kq-developers", "edit")], "kueue-developers").await;
    let dev = impersonating(&user, &["system:authenticated"], None).await;
    let mut verdicts = Verdicts::default();
    edit_writes_none_of_kueue_s_kinds(&dev, &user, &mut verdicts).await;
    jobs_name_only_their_own_priority(&dev, &mut verdicts).await;

    // A cluster that grants more: LocalQueues and Workloads in the tenant's namespace.
    let writer = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "kq-queue-writer"},
        "rules": [{"apiGroups": ["kueue.x-k8s.io"], "resources": ["localqueues", "workloads"], "verbs": ["create"]}]});
    cleanup.add_resource("clusterroles.rbac.authorization.k8s.io", "kq-queue-writer");
    apply_docs_as_kubectl(
        &[writer, bind(&user, "kq-queue-writers", "kq-queue-writer")],
        "kueue-queue-writers",
    )
    .await;
    granted_queues_and_workloads_stay_the_tenant_s(&dev, &mut verdicts).await;

    // A namespace of no tenant names none of the operator's queues, even as the admin.
    let stray = local_queue(NONE, &format!("gpu-tenancy-{X}"));
    let got = outcome(
        kueue_api(&client, Some(NONE), "LocalQueue")
            .create(&dry(), &stray)
            .await,
    );
    verdicts.expect(
        "a LocalQueue of a namespace of no tenant naming a tenant's ClusterQueue (admin)",
        got,
        Some(&["of no GpuTenant", "gpu-tenancy-*"]),
    );
    assert!(verdicts.0.is_empty(), "{:#?}", verdicts.0);
    drop(kueue);
}

/// RBAC: the edit role writes none of Kueue's kinds, and reads them.
async fn edit_writes_none_of_kueue_s_kinds(dev: &Client, user: &str, verdicts: &mut Verdicts) {
    let rbac = ["forbidden", user];
    let other = format!("gpu-tenancy-{Y}");
    let got = outcome(
        kueue_api(dev, Some(X), "LocalQueue")
            .create(&dry(), &local_queue(X, &other))
            .await,
    );
    verdicts.expect(
        "a LocalQueue naming another tenant's ClusterQueue (edit)",
        got,
        Some(&rbac),
    );
    for (kind, spec) in [
        ("ClusterQueue", json!({"namespaceSelector": {}})),
        ("Cohort", json!({})),
    ] {
        let got = outcome(
            kueue_api(dev, None, kind)
                .create(&dry(), &object(kind, None, spec))
                .await,
        );
        verdicts.expect(&format!("a {kind} (edit)"), got, Some(&rbac));
    }
    let wpc: DynamicObject = serde_json::from_value(
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
        "metadata": {"name": "mine"}, "value": 1000}),
    )
    .unwrap();
    let got = outcome(kueue_api(dev, None, "WorkloadPriorityClass").create(&dry(), &wpc).await);
    verdicts.expect("a WorkloadPriorityClass (edit)", got, Some(&rbac));
    let own = format!("gpu-tenancy-{X}");
    let got = outcome(
        kueue_api(dev, Some(X), "Workload")
            .create(&dry(), &workload(&own))
            .await,
    );
    verdicts.expect("a Workload (edit)", got, Some(&rbac));
    // The aggregated view reached the edit role.
    let got = eventually(
        "Kueue's view roles aggregated into edit",
        || async { outcome(kueue_api(dev, Some(X), "LocalQueue").get("gpu-tenancy").await) },
        |r| r.is_ok(),
    )
    .await;
    verdicts.expect("reading its LocalQueue (edit)", got, None);
}

/// Admission: a Job may name only its own tenant's priority.
async fn jobs_name_only_their_own_priority(dev: &Client, verdicts: &mut Verdicts) {
    let jobs: Api<Job> = Api::namespaced(dev.clone(), X);
    let (own, other) = (format!("gpu-tenancy-{X}"), format!("gpu-tenancy-{Y}"));
    let refused = [
        "GpuTenant kq-x",
        "kueue.x-k8s.io/priority-class",
        "gpu-tenancy-kq-y",
        "name gpu-tenancy-kq-x",
    ];
    let got = eventually(
        "the queue policy bound",
        || async { outcome(jobs.create(&dry(), &job(&other)).await) },
        |r| r.is_err(),
    )
    .await;
    verdicts.expect("a Job with another tenant's priority class", got, Some(&refused));
    let got = outcome(jobs.create(&PostParams::default(), &job(&own)).await);
    verdicts.expect("a Job with its own priority class", got, None);
    // Another verb: the label changed on the Job once created.
    let relabel = json!({"metadata": {"labels": {"kueue.x-k8s.io/priority-class": other}}});
    let got = outcome(
        jobs.patch("mine", &PatchParams::default(), &Patch::Merge(relabel))
            .await,
    );
    verdicts.expect(
        "a Job relabelled with another tenant's priority class",
        got,
        Some(&refused),
    );
    let _ = jobs.delete("mine", &Default::default()).await;
}

/// With LocalQueues and Workloads granted, the admission policy keeps them to the tenant's own
/// ClusterQueue and priority.
async fn granted_queues_and_workloads_stay_the_tenant_s(dev: &Client, verdicts: &mut Verdicts) {
    let (own, other) = (format!("gpu-tenancy-{X}"), format!("gpu-tenancy-{Y}"));
    let locals = kueue_api(dev, Some(X), "LocalQueue");
    let got = eventually(
        "the queue writer role bound",
        || async { outcome(locals.create(&dry(), &local_queue(X, &own)).await) },
        |r| r.is_ok(),
    )
    .await;
    verdicts.expect("a LocalQueue naming its own ClusterQueue (granted)", got, None);
    let got = outcome(locals.create(&dry(), &local_queue(X, &other)).await);
    verdicts.expect(
        "a LocalQueue naming another tenant's ClusterQueue (granted)",
        got,
        Some(&[
            "GpuTenant kq-x",
            "spec.clusterQueue gpu-tenancy-kq-y",
            "name gpu-tenancy-kq-x",
        ]),
    );
    let workloads = kueue_api(dev, Some(X), "Workload");
    let got = outcome(workloads.create(&dry(), &workload(&other)).await);
    verdicts.expect(
        "a Workload with another tenant's priority class (granted)",
        got,
        Some(&["GpuTenant kq-x", "spec.priorityClassRef gpu-tenancy-kq-y"]),
    );
    let got = outcome(workloads.create(&dry(), &workload(&own)).await);
    verdicts.expect("a Workload with its own priority class (granted)", got, None);
}
