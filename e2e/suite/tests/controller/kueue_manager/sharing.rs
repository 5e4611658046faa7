//! One grant over a tenant's namespaces; lending, reclaiming and fair sharing in a tier; the
//! showback of queue waits.

use super::*;

/// One grant, one queue: a tenant's two namespaces share its four GPUs. One namespace takes all
/// four while the other is idle (the even split without Kueue gives each two), and the other's
/// Job is admitted as soon as the first frees a GPU. Each namespace's ResourceQuota is the
/// ceiling at the whole grant.
#[tokio::test]
async fn kueue_manager_one_grant_is_shared_by_the_tenants_namespaces() {
    let cleanup = Cleanup::new();
    let client = setup(&cleanup).await;
    let kueue = KueueManager::start(&client, &KueueSettings::default()).await;
    let (a, b) = ("kq-solo-a", "kq-solo-b");
    fleet(&client, &cleanup, &kueue, &[("kq-solo", "solo", &[a, b], 4, 1)]).await;
    for ns in [a, b] {
        let quota: ResourceQuota = Api::namespaced(client.clone(), ns).get("gpu-tenancy").await.unwrap();
        assert_eq!(
            quota.spec.unwrap().hard.unwrap()[&format!("requests.{GPU}")].0,
            "4",
            "{ns}"
        );
    }

    let mut runner = JobRunner::new(&client, &[a, b], None);
    for i in 0..5 {
        submit(&client, a, &format!("a-{i}"), 1).await;
    }
    let mut running = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while running.get(a).copied().unwrap_or(0) < 4 {
        assert!(
            Instant::now() < deadline,
            "namespace {a} ran {running:?} GPUs, not its tenant's 4\n{}",
            kueue.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        running = runner.tick().await.0;
    }
    submit(&client, b, "b-0", 1).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (running, names) = runner.tick().await;
    assert_eq!(
        running,
        BTreeMap::from([(a.to_string(), 4)]),
        "the grant is used up: nothing more runs ({names:?})"
    );

    // Two of a's Jobs end: one GPU goes to a's fifth Job (queued first), the other to b's.
    let jobs: Api<Job> = Api::namespaced(client.clone(), a);
    for name in names.iter().take(2) {
        complete(&jobs, name.rsplit('/').next().unwrap()).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (running, names) = runner.tick().await;
        if running.get(b) == Some(&1) {
            assert_eq!(running.get(a), Some(&3), "{names:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "b's Job never ran: {running:?}\n{}",
            kueue.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(kueue);
}

/// A lending tier: what a tenant leaves idle, another borrows, and the lender takes it back by
/// preemption when its own Jobs come. Then two tenants of weights 2 and 1, each with a backlog,
/// contend for a third tenant's idle GPUs: Kueue's fair sharing splits them about 2:1, while each
/// keeps its own grant.

#[tokio::test]
async fn kueue_manager_lends_idle_gpus_takes_them_back_and_shares_them_by_weight() {
    let cleanup = Cleanup::new();
    let client = setup(&cleanup).await;
    let settings = KueueSettings {
        fair_sharing: true,
        ..KueueSettings::default()
    };
    let kueue = KueueManager::start(&client, &settings).await;
    // A real Prometheus scraping Kueue's metrics, for the showback report's queue figures.
    let token = kueue.metrics_token().await;
    let prom =
        gpu_tenancy_e2e::prometheus::PrometheusProcess::start_with_jobs("kueue", &[], &kueue.scrape_job(&token)).await;
    let (b, c, d) = ("kq-b", "kq-c", "kq-d");
    fleet(
        &client,
        &cleanup,
        &kueue,
        &[
            ("kq-b", "lending", &[b], 3, 2),
            ("kq-c", "lending", &[c], 3, 1),
            ("kq-d", "lending", &[d], 3, 1),
        ],
    )
    .await;

    lend_and_reclaim(&client, &kueue, (b, c, d)).await;
    let window_start = fair_share(&client, &kueue, (b, c, d)).await;
    showback(&client, &prom, window_start, &[b, c]).await;
    drop(kueue);
}

/// c runs its own three GPUs; b its three and three more, borrowed from d, which is idle. Then d's
/// own Jobs come, and Kueue preempts b's three borrowed Jobs to run them.
async fn lend_and_reclaim(client: &Client, kueue: &KueueManager, (b, c, d): (&str, &str, &str)) {
    let mut runner = JobRunner::new(client, &[b, c, d], None);
    for i in 0..3 {
        submit(client, c, &format!("c-{i}"), 1).await;
    }
    for i in 0..6 {
        submit(client, b, &format!("b-{i}"), 1).await;
    }
    runner.until_running(&[(b, 6), (c, 3)], kueue).await;
    // d's own Jobs come: Kueue preempts b's three borrowed Jobs to run them.
    let reclaim_started = Instant::now();
    for i in 0..3 {
        submit(client, d, &format!("d-{i}"), 1).await;
    }
    runner.until_running(&[(b, 3), (c, 3), (d, 3)], kueue).await;
    let reclaimed_in = reclaim_started.elapsed();
    let mut preempted = Vec::new();
    for i in 0..6 {
        let job = format!("b-{i}");
        if let Some(reason) = eviction_reason(client, b, &job).await {
            preempted.push((job, reason));
        }
    }
    assert_eq!(preempted.len(), 3, "b's borrowed Jobs preempted: {preempted:?}");
    assert!(preempted.iter().all(|(_, r)| r == "Preempted"), "{preempted:?}");
    eprintln!("lend and reclaim: d's 3 GPUs back in {reclaimed_in:?}; preempted {preempted:?}");
}

/// Everything ends; then b (weight 2) and c (weight 1) each keep a backlog of one-GPU Jobs of 3 s,
/// while d stays idle: the GPU-seconds each borrows are measured. Returns when the window of the
/// showback began.
async fn fair_share(client: &Client, kueue: &KueueManager, (b, c, d): (&str, &str, &str)) -> Instant {
    for ns in [b, c, d] {
        let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
        for job in jobs.list(&ListParams::default()).await.unwrap() {
            jobs.delete(&job.name_any(), &Default::default()).await.unwrap();
        }
    }
    // The report's window starts here: Kueue's series of b's and c's queues exist by now (a
    // counter's first sample is the base of its increase), and nothing is admitted for 3 s.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let window_start = Instant::now();
    let mut runner = JobRunner::new(client, &[b, c], Some(Duration::from_secs(3)));
    let mut submitted = BTreeMap::from([(b, 0usize), (c, 0usize)]);
    let mut borrowed_seconds = BTreeMap::from([(b, 0f64), (c, 0f64)]);
    let mut seconds = BTreeMap::from([(b, 0f64), (c, 0f64)]);
    let started = Instant::now();
    let mut last = Instant::now();
    while started.elapsed() < Duration::from_secs(45) {
        // Each keeps 8 Jobs queued or running.
        let (running, _) = runner.tick().await;
        let dt = last.elapsed().as_secs_f64();
        last = Instant::now();
        for ns in [b, c] {
            let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
            let live = jobs
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .iter()
                .filter(|j| !finished(j))
                .count();
            for _ in live..8 {
                let n = submitted.get_mut(ns).unwrap();
                submit(client, ns, &format!("{ns}-w{n}"), 1).await;
                *n += 1;
            }
            let gpus = running.get(ns).copied().unwrap_or(0) as f64;
            // The first 10 s are the queues filling; the split is measured after.
            if started.elapsed() > Duration::from_secs(10) {
                *seconds.get_mut(ns).unwrap() += gpus * dt;
                *borrowed_seconds.get_mut(ns).unwrap() += (gpus - 3.0).max(0.0) * dt;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ratio = borrowed_seconds[b] / borrowed_seconds[c].max(0.001);
    eprintln!(
        "fair sharing over 35 s: GPU-seconds {seconds:?}, of them borrowed {borrowed_seconds:?}: {ratio:.2} to 1 (weights 2:1)"
    );
    assert!(
        (1.5..=2.7).contains(&ratio),
        "borrowed GPU-seconds {borrowed_seconds:?}: {ratio:.2}, not about 2\n{}",
        kueue.log_tail()
    );
    for ns in [b, c] {
        assert!(seconds[ns] >= 3.0 * 30.0, "{ns} kept its own grant: {seconds:?}");
    }

    window_start
}

/// Showback: `gpu-tenancy report` counts the workloads each queue admitted since `window_start`,
/// from Kueue's own histogram in Prometheus, with their mean wait; the Workloads say how many.
async fn showback(
    client: &Client,
    prom: &gpu_tenancy_e2e::prometheus::PrometheusProcess,
    window_start: Instant,
    tenants: &[&str],
) {
    let (b, c) = (tenants[0], tenants[1]);
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Whole seconds, reaching back into the idle seconds before the window's start.
    let window = window_start.elapsed().as_secs() + 2;
    let out = std::process::Command::new(gpu_tenancy_e2e::repo_root().join("target/debug/gpu-tenancy"))
        .args([
            "report",
            "--prometheus",
            &prom.url(),
            "--since",
            &format!("{window}s"),
            "-o",
            "json",
        ])
        .output()
        .expect("gpu-tenancy report runs");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("report printed no JSON ({e}): {}", String::from_utf8_lossy(&out.stderr)));
    let row = |t: &str| {
        report["tenants"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["tenant"] == t)
            .cloned()
            .unwrap_or_else(|| panic!("no row of {t} in {report:#}"))
    };
    for ns in [b, c] {
        let r = row(ns);
        let admitted = r["admittedWorkloads"].as_f64().unwrap_or(-1.0);
        let seen = admissions(client, ns, "-w").await as f64;
        eprintln!(
            "showback over {window} s: {ns} admitted {admitted:.1} (its Workloads show {seen}), mean wait {} s",
            r["meanQueueWaitSeconds"]
        );
        // Prometheus' increase() extrapolates to the window's edges: about a scrape interval's
        // worth of admissions (about one a second here) at each.
        assert!(
            (admitted - seen).abs() <= 3.0 + seen * 0.05,
            "{ns}: report says {admitted:.1} admitted, its Workloads {seen}\n{report:#}"
        );
        assert!(
            r["meanQueueWaitSeconds"].as_f64().is_some_and(|w| w > 0.0),
            "{report:#}"
        );
    }
    let out = std::process::Command::new(gpu_tenancy_e2e::repo_root().join("target/debug/gpu-tenancy"))
        .args(["report", "--prometheus", &prom.url(), "--since", &format!("{window}s")])
        .output()
        .expect("gpu-tenancy report runs");
    let table = String::from_utf8_lossy(&out.stdout);
    eprintln!("MEASURE report table with Kueue:\n{table}");
    let queues = table.split("Queues (Kueue)").nth(1).unwrap_or_default();
    for ns in [b, c] {
        assert!(queues.lines().any(|l| l.starts_with(ns)), "{table}");
    }
    assert!(
        table.lines().all(|l| l.len() <= 80),
        "fits an 80-column terminal:\n{table}"
    );
}
