//! A DRA tenant's claims, counted by Kueue against its queue by their DeviceClass.

use super::*;

/// A Job of one pod whose GPU is a ResourceClaim from template `template`.
async fn submit_claiming(client: &Client, ns: &str, name: &str, template: &str) {
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "labels": {"kueue.x-k8s.io/queue-name": "gpu-tenancy"}},
        "spec": {"template": {"spec": {"restartPolicy": "Never",
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [{"name": "train", "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": {"cpu": "100m"}, "claims": [{"name": "gpu"}]}}]}}}}))
    .unwrap();
    Api::<Job>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &job)
        .await
        .unwrap_or_else(|e| panic!("creating Job {ns}/{name}: {e}"));
}

/// On a DRA pool, a tenant's ResourceClaims count against its queue by their DeviceClass: Kueue,
/// configured with the mappings `gpu-tenancy plan -o kueue-config` prints for the live cluster,
/// counts each claim of the tenant's class as one unit of the resource the queue holds its two
/// GPUs under, so two Jobs run and the third waits for one of them to end.
#[tokio::test]
async fn kueue_manager_counts_a_dra_claim_against_the_tenant_s_queue_by_its_device_class() {
    let cleanup = Cleanup::new();
    let client = setup(&cleanup).await;
    let (tenant, class, resource) = ("kq-e", "kq-e.gpu.gputenancy.io", "kq-e.gputenancy.io/gpu");
    let settings = KueueSettings {
        device_class_mappings: vec![(resource.to_string(), vec![class.to_string()])],
        ..KueueSettings::default()
    };
    let kueue = KueueManager::start(&client, &settings).await;
    fleet_of(&client, &cleanup, &kueue, &[(tenant, "solo", &[tenant], 2, 1)], true).await;
    // What Kueue was configured with is what `plan -o kueue-config` says of this cluster.
    let out = crate::plan_live::plan_as(&crate::plan_live::export().await, "kueue-config");
    let printed: serde_json::Value =
        serde_saphyr::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap_or_else(|e| {
            panic!(
                "plan -o kueue-config printed no YAML ({e}): {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    assert_eq!(
        printed["resources"]["deviceClassMappings"],
        json!([{"name": resource, "deviceClassNames": [class]}])
    );

    let template: k8s_openapi::api::resource::v1::ResourceClaimTemplate = serde_json::from_value(json!({
        "metadata": {"name": "one-gpu", "namespace": tenant},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": class, "count": 1}}]}}}}))
    .unwrap();
    // The API server applies a changed admission binding a moment after it is written.
    let templates: Api<k8s_openapi::api::resource::v1::ResourceClaimTemplate> = Api::namespaced(client.clone(), tenant);
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Err(e) = templates.create(&PostParams::default(), &template).await {
        assert!(
            Instant::now() < deadline,
            "creating the claim template in {tenant}: {e}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for i in 0..3 {
        submit_claiming(&client, tenant, &format!("e-{i}"), "one-gpu").await;
    }
    let mut runner = JobRunner::new(&client, &[tenant], None);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut names = Vec::new();
    while names.len() < 2 {
        assert!(
            Instant::now() < deadline,
            "running {names:?}, not two Jobs\n{}",
            kueue.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        names = runner.tick().await.1;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let names = runner.tick().await.1;
    assert_eq!(names.len(), 2, "the queue holds two GPUs: {names:?}");
    // Kueue's admission of each counts the claim as one unit of the tenant's resource.
    let admitted = admitted_usage(&client, tenant).await;
    assert_eq!(admitted.len(), 2, "{admitted:?}");
    for usage in &admitted {
        assert_eq!(usage[resource], "1", "{usage}");
    }
    // One ends: the third runs.
    let jobs: Api<Job> = Api::namespaced(client.clone(), tenant);
    complete(&jobs, names[0].rsplit('/').next().unwrap()).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now_running = runner.tick().await.1;
        if now_running.iter().any(|n| !names.contains(n)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the third Job never ran: {now_running:?}\n{}",
            kueue.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(kueue);
}

/// What Kueue's admission of each admitted Workload of `ns` counts (its first pod set's usage).
async fn admitted_usage(client: &Client, ns: &str) -> Vec<serde_json::Value> {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", "Workload"));
    let workloads: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource);
    workloads
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter_map(|w| {
            let usage = &w.data["status"]["admission"]["podSetAssignments"][0]["resourceUsage"];
            (!usage.is_null()).then(|| usage.clone())
        })
        .collect()
}
