//! The agent's metrics on the simulator: a real `gpu-tenancy agent run` (its production NVML path
//! on the simulated library) applies a GpuNode spec, the simulator is told to run processes with
//! a known memory use and SM use ([`crate::metrics_work`]), and its `/metrics` is scraped twice.
//! The expected figures come from what the simulator was told and from the wall clock, not from
//! the agent's own tables: the processes and memory of each device, the busy time of a whole GPU,
//! of a MIG instance (GPM) and of each tenant on a time-sliced GPU (per-process samples, PIDs
//! attributed through their cgroups), and allocated GPU-seconds that add up to GPUs × elapsed
//! time (a 3g.40gb counting 3/7 of its GPU).

use crate::metrics_work as work;
use crate::observe::*;
use crate::support::*;
use gpu_tenancy::api::GpuNode;
use gpu_tenancy_e2e::kubelet::pod_resources::{ListPodResourcesResponse, PodResourcesServer};
use gpu_tenancy_e2e::procs::http_get;
use gpu_tenancy_e2e::prometheus::PrometheusProcess;
use gpu_tenancy_e2e::{Cleanup, repo_root};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Every sample of a scrape: `name{labels}` → value.
fn parse(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// The sum of the samples of `name` whose labels contain every `want` (`key="value"`).
fn sum(samples: &BTreeMap<String, f64>, name: &str, want: &[&str]) -> f64 {
    samples
        .iter()
        .filter(|(s, _)| s.starts_with(&format!("{name}{{")) && want.iter().all(|w| s.contains(w)))
        .map(|(_, v)| v)
        .sum()
}

/// A scrape and the wall-clock window it happened in.
async fn scrape(addr: SocketAddr) -> (Instant, BTreeMap<String, f64>, Instant) {
    let before = Instant::now();
    let (code, body) = http_get(addr, "/metrics").await.expect("the agent serves /metrics");
    let after = Instant::now();
    assert_eq!(code, 200, "{body}");
    (before, parse(&body), after)
}

/// Whether `used` GPU-seconds are `ratio` GPUs busy over the time between two scrapes: use is
/// counted at each pass (every second) at that pass's reading, so it may lag up to one pass at
/// either end (1.5 s with the pass's own time), on top of the scrapes' own spread.
fn about(used: f64, ratio: f64, shortest: f64, longest: f64) -> bool {
    (used - ratio * shortest).abs() <= ratio * 1.5 + ratio * (longest - shortest) + 1e-9
}

#[tokio::test]
async fn agent_metrics_match_what_the_simulator_ran() {
    let cleanup = Cleanup::new();
    let client = setup(&cleanup).await;
    let w = work::start(&client, &cleanup, "metrics-0").await;
    let addr = w.addr;
    // Three polls (1 s each): the agent has read the processes, and GPM has two samples of each
    // instance since they started.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let (b1, first, a1) = scrape(addr).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (b2, second, a2) = scrape(addr).await;

    let mib = 1024.0 * 1024.0;
    let a_instance = [r#"gpu="0""#, r#"GPU_I_PROFILE="3g.40gb""#, r#"tenant="a""#];
    assert_eq!(
        sum(&second, "gpu_tenancy_device_memory_used_bytes", &a_instance),
        2000.0 * mib
    );
    assert_eq!(sum(&second, "gpu_tenancy_device_processes", &a_instance), 1.0);
    // GPM on the H100's instance: its process' 40% between two samples, exactly (the load is
    // steady); nothing on the A100's, where NVML has no GPM.
    let util = sum(&second, "gpu_tenancy_device_utilization_ratio", &a_instance);
    assert!((util - work::A_INSTANCE_SM).abs() < 1e-6, "GPM gave {util}");
    eprintln!(
        "MEASURE GPM utilization of the 3g.40gb: {util} (the simulator was told {})",
        work::A_INSTANCE_SM
    );
    assert!(
        !second
            .keys()
            .any(|k| k.starts_with("gpu_tenancy_device_utilization_ratio{") && k.contains(r#"gpu="3""#)),
        "no utilization for the A100's instance: {second:?}"
    );
    let b_gpu = [r#"gpu="1""#, r#"GPU_I_ID="""#, r#"mode="Exclusive""#, r#"tenant="b""#];
    assert_eq!(
        sum(&second, "gpu_tenancy_device_memory_used_bytes", &b_gpu),
        1000.0 * mib
    );
    assert_eq!(
        sum(&second, "gpu_tenancy_device_utilization_ratio", &b_gpu),
        work::B_GPU_SM
    );
    let shared_gpu = [r#"gpu="2""#, r#"mode="TimeSlicing""#, r#"tenant="shared""#];
    let shared_busy = work::A_SHARED_SM + work::B_SHARED_SM + work::HOST_SHARED_SM;
    assert!((sum(&second, "gpu_tenancy_device_utilization_ratio", &shared_gpu) - shared_busy).abs() < 1e-9);
    assert_eq!(sum(&second, "gpu_tenancy_node_gpus", &[]), work::GPUS);

    // Allocated GPU-seconds between the scrapes: 4 GPUs × the time between them, which lies
    // between the end of the first scrape and the start of the second, and their starts and ends.
    let delta = |name: &str, want: &[&str]| sum(&second, name, want) - sum(&first, name, want);
    let (shortest, longest) = ((b2 - a1).as_secs_f64(), (a2 - b1).as_secs_f64());
    let allocated = delta("gpu_tenancy_allocated_gpu_seconds_total", &[]);
    assert!(
        work::GPUS * shortest - 1e-6 <= allocated && allocated <= work::GPUS * longest + 1e-6,
        "allocated {allocated} GPU-s in {shortest}..{longest} s on 4 GPUs"
    );
    for tenant in ["a", "b", "unallocated"] {
        let share = delta(
            "gpu_tenancy_allocated_gpu_seconds_total",
            &[&format!("tenant=\"{tenant}\"")],
        ) / allocated;
        let want = work::allocated(tenant) / work::GPUS;
        assert!(
            (share - want).abs() < 1e-6,
            "{tenant} holds {want} of the GPUs: {share}"
        );
    }
    // Busy GPU-seconds, per tenant and mode, from what each process was told to keep busy: b's
    // GPU; a's H100 instance, weighted by its 3/7; the time-sliced GPU split by its processes'
    // pods, the host process' part unattributed, none left to `shared`.
    let used = |tenant: &str, mode: &str| {
        delta(
            "gpu_tenancy_used_gpu_seconds_total",
            &[&format!("tenant=\"{tenant}\""), &format!("mode=\"{mode}\"")],
        )
    };
    for (tenant, mode, ratio) in [
        ("b", "Exclusive", work::B_GPU_SM),
        ("a", "MIG", work::A_INSTANCE_SM * work::INSTANCE),
        ("a", "TimeSlicing", work::A_SHARED_SM),
        ("b", "TimeSlicing", work::B_SHARED_SM),
        ("unattributed", "TimeSlicing", work::HOST_SHARED_SM),
    ] {
        let u = used(tenant, mode);
        assert!(
            about(u, ratio, shortest, longest),
            "{tenant} {mode} used {u} GPU-s at {ratio} GPUs over about {shortest} s"
        );
        eprintln!(
            "MEASURE used GPU-s {tenant} {mode}: {u:.3} over {shortest:.2}..{longest:.2} s (told {ratio:.3} GPUs busy: {:.3}..{:.3})",
            ratio * shortest,
            ratio * longest
        );
    }
    assert_eq!(
        used("shared", "TimeSlicing"),
        0.0,
        "every sampled process is someone's or unattributed"
    );
    let (code, _) = http_get(addr, "/readyz").await.expect("/readyz");
    assert_eq!(code, 200);

    // Without the kubelet's pod-resources answer the device plugin's node cannot tell whose the
    // processes are: not known, and no ungranted-use rows.
    let name = "metrics-0".to_string();
    let ungranted =
        |n: &GpuNode| condition(n, "UngrantedUse").map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()));
    wait_nodes(
        &client,
        std::slice::from_ref(&name),
        30,
        "UngrantedUse not known",
        |n| ungranted(n).is_some_and(|(s, r, _)| s == "False" && r == "NotKnown"),
    )
    .await;
    assert_eq!(
        sum(&scrape(addr).await.1, "gpu_tenancy_device_ungranted_processes", &[]),
        0.0
    );
    // The kubelet says which pods hold every device with processes: every process explained.
    let kubelet = PodResourcesServer::start(&w.agent.pod_resources_socket());
    let pods = work::kubelet_answer(&client, &w).await;
    kubelet.set(ListPodResourcesResponse {
        pod_resources: pods.clone(),
    });
    wait_nodes(&client, std::slice::from_ref(&name), 30, "UngrantedUse False", |n| {
        ungranted(n).is_some_and(|(s, r, _)| s == "False" && r == "None")
    })
    .await;
    // b's pod ends, its process stays (a process the kubelet gave no device to): ungranted use, in
    // the condition and in the metric deploy/prometheus's GpuTenancyUngrantedGpuInUse alerts on.
    kubelet.set(work::without_serve(&pods));
    wait_nodes(&client, std::slice::from_ref(&name), 30, "UngrantedUse on GPU 1", |n| {
        ungranted(n).is_some_and(|(s, _, m)| s == "True" && m.contains("on GPU 1 that"))
    })
    .await;
    let (_, now, _) = scrape(addr).await;
    assert_eq!(
        sum(&now, "gpu_tenancy_device_ungranted_processes", &[r#"gpu="1""#]),
        1.0
    );
    assert_eq!(
        sum(&now, "gpu_tenancy_device_ungranted_processes", &[r#"gpu="0""#]),
        0.0
    );
}

/// `gpu-tenancy report` as a person runs it, against a real Prometheus scraping the agent every
/// second, the kubelet saying which pods hold the devices: the window's GPU-hours are 4 GPUs × the
/// window, each tenant's its share of them, the busy ones what its processes were told, the top
/// namespaces what its pods hold; and the plot is drawn (target/e2e/report.png, to look at).
#[tokio::test]
async fn report_from_a_real_prometheus_adds_up() {
    let cleanup = Cleanup::new();
    let client = setup(&cleanup).await;
    let w = work::start(&client, &cleanup, "metrics-1").await;
    let kubelet = PodResourcesServer::start(&w.agent.pod_resources_socket());
    kubelet.set(ListPodResourcesResponse {
        pod_resources: work::kubelet_answer(&client, &w).await,
    });
    let prom = PrometheusProcess::start("report", &[w.addr]).await;
    // Scrapes for longer than the window, so the window lies wholly after the first sample (and
    // after the agent's first passes with the kubelet's answer and two GPM samples).
    tokio::time::sleep(Duration::from_secs(25)).await;
    let (code, body) = http_get(prom.addr, "/api/v1/query?query=gpu_tenancy_node_gpus")
        .await
        .expect("Prometheus answers");
    assert!(
        code == 200 && body.contains(r#""value":["#) && body.contains(r#","4"]"#),
        "{body}"
    );

    let report = |args: &[&str]| {
        let out = std::process::Command::new(repo_root().join("target/debug/gpu-tenancy"))
            .args(["report", "--prometheus", &prom.url()])
            .args(args)
            .output()
            .expect("gpu-tenancy report runs");
        assert!(
            out.status.success(),
            "report {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("UTF-8")
    };
    let json: serde_json::Value = serde_json::from_str(&report(&["--since", "15s", "-o", "json"])).expect("JSON");
    let hours = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN) * 3600.0;
    let tenant = |t: &str| {
        json["tenants"]
            .as_array()
            .and_then(|ts| ts.iter().find(|x| x["tenant"] == t).cloned())
            .unwrap_or_else(|| panic!("no tenant {t} in {json}"))
    };
    // increase() extrapolates each series to the window's edges: within about a scrape (1 s) of
    // 15 s, so shares within 2% and busy fractions within 5%.
    let total = hours(&json["totalGpuHours"]);
    assert!(
        (total - work::GPUS * 15.0).abs() <= work::GPUS * 1.5,
        "{total} GPU-s allocated in 15 s on 4 GPUs: {json}"
    );
    for t in ["a", "b"] {
        let alloc = hours(&tenant(t)["allocatedGpuHours"]);
        let want = work::allocated(t) / work::GPUS;
        assert!(
            (alloc / total - want).abs() < 0.02,
            "{t}: {alloc} of {total}, want {want}"
        );
    }
    let b = tenant("b");
    let (b_alloc, b_used) = (hours(&b["allocatedGpuHours"]), hours(&b["usedGpuHours"]));
    let b_busy = (work::B_GPU_SM + work::B_SHARED_SM) / work::allocated("b");
    assert!((b_used / b_alloc - b_busy).abs() < 0.05, "b used {b_used} of {b_alloc}");
    assert!((b["efficiency"].as_f64().unwrap() - b_busy).abs() < 0.05, "{b}");
    let a_used = hours(&tenant("a")["usedGpuHours"]);
    let a_busy = work::A_INSTANCE_SM * work::INSTANCE + work::A_SHARED_SM;
    assert!(
        (a_used / 15.0 - a_busy).abs() < 0.05,
        "a used {a_used} GPU-s in 15 s: {json}"
    );
    let unattributed = hours(&tenant("unattributed")["usedGpuHours"]);
    assert!(
        (unattributed / 15.0 - work::HOST_SHARED_SM).abs() < 0.05,
        "{unattributed}: {json}"
    );
    // Top namespaces: what the tenants' pods hold, by the kubelet. a's pods hold its H100
    // instance, its A100 instance and one of its two replicas; b's everything b holds.
    let ns = |t: &str, ns: &str| {
        tenant(t)["namespaces"]
            .as_array()
            .and_then(|v| v.iter().find(|x| x["namespace"] == ns).cloned())
            .map(|x| hours(&x["allocatedGpuHours"]))
            .unwrap_or_else(|| panic!("no namespace {ns} of {t}: {json}"))
    };
    eprintln!(
        "MEASURE report over 15 s: {total:.2} GPU-s in all (told {}); a used {a_used:.2} (told {:.2}), unattributed {unattributed:.2} (told {:.2}), b efficiency {} (told {b_busy:.3})",
        work::GPUS * 15.0,
        a_busy * 15.0,
        work::HOST_SHARED_SM * 15.0,
        b["efficiency"]
    );
    let a_held = 2.0 * work::INSTANCE + 1.0 / work::REPLICAS;
    assert!((ns("a", &w.ns_a) / total - a_held / work::GPUS).abs() < 0.02, "{json}");
    assert!(
        (ns("b", &w.ns_b) / total - work::allocated("b") / work::GPUS).abs() < 0.02,
        "{json}"
    );

    let table = report(&["--since", "15s"]);
    eprintln!("MEASURE report table:\n{table}");
    assert!(
        table.lines().any(|l| l.starts_with("b ") && l.contains("all")),
        "{table}"
    );
    assert!(
        table.lines().any(|l| l.contains(&w.ns_a) && l.starts_with("a ")),
        "top namespaces: {table}"
    );
    assert!(
        table.lines().all(|l| l.len() <= 80),
        "fits an 80-column terminal:\n{table}"
    );
    let csv = report(&["--since", "15s", "-o", "csv"]);
    assert!(csv.starts_with("tenant,mode,allocated_gpu_hours"), "{csv}");
    assert!(
        csv.lines().any(|l| l.starts_with("a,") && l.ends_with(&w.ns_a)),
        "{csv}"
    );

    let png = repo_root().join("target/e2e/report.png");
    let svg = repo_root().join("target/e2e/report.svg");
    report(&["--since", "30s", "--plot", png.to_str().unwrap()]);
    report(&["--since", "30s", "--plot", svg.to_str().unwrap()]);
    let bytes = std::fs::read(&png).expect("the PNG plot");
    assert!(
        bytes.starts_with(b"\x89PNG") && bytes.len() > 10_000,
        "{} bytes",
        bytes.len()
    );
    let text = std::fs::read_to_string(&svg).expect("the SVG plot");
    assert!(
        text.contains("<svg") && text.contains("b allocated") && text.contains("b busy"),
        "{}",
        &text[..200]
    );

    grafana_panels_return_series(&prom).await;
    for q in [
        "scrape_samples_scraped",
        "scrape_duration_seconds",
        "scrape_response_size_bytes",
    ] {
        let (_, body) = http_get(prom.addr, &format!("/api/v1/query?query={q}"))
            .await
            .expect("Prometheus answers");
        let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        eprintln!(
            "MEASURE agent scrape (4 GPUs): {q} = {}",
            v["data"]["result"][0]["value"][1]
        );
    }
}

/// Percent-encodes a query parameter.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Every query of deploy/grafana/gpu-tenancy.json, with Grafana's variables set as a person
/// viewing all nodes would have them, is accepted by Prometheus, and every one on the agents'
/// metrics returns series (the controller is not scraped here: its panel's queries must parse).
async fn grafana_panels_return_series(prom: &PrometheusProcess) {
    let path = repo_root().join("deploy/grafana/gpu-tenancy.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("the dashboard")).expect("JSON");
    let mut checked = 0;
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("an expr");
            let q = expr
                .replace("$node", ".*")
                .replace("$__rate_interval", "20s")
                .replace("$__range", "20s");
            let (code, body) = http_get(prom.addr, &format!("/api/v1/query?query={}", encode(&q)))
                .await
                .expect("Prometheus answers");
            assert_eq!(code, 200, "panel {:?}: {q}: {body}", panel["title"]);
            let answer: serde_json::Value = serde_json::from_str(&body).expect("JSON");
            let empty = answer["data"]["result"].as_array().is_none_or(|r| r.is_empty());
            assert!(
                !empty || q.contains("gpu_tenancy_controller_"),
                "panel {:?} returns no series: {q}",
                panel["title"]
            );
            checked += 1;
        }
    }
    assert!(checked >= 10, "{checked} queries");
    let (_, nodes) = http_get(prom.addr, "/api/v1/label/Hostname/values?match[]=gpu_tenancy_node_gpus")
        .await
        .expect("Prometheus answers");
    assert!(nodes.contains("metrics-1"), "the node variable lists the node: {nodes}");
}
