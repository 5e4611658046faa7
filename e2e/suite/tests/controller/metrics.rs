//! The agent's metrics on the simulator: a real `gpu-tenancy agent run` (its production NVML path
//! on the simulated library) applies a GpuNode spec, the simulator is told to run processes with
//! a known memory use and SM use, and its `/metrics` is scraped twice. The expected figures come
//! from what the simulator was told and from the wall clock, not from the agent's own tables: the
//! processes and memory of each device, the busy time of the whole GPU, and allocated GPU-seconds
//! that add up to GPUs × elapsed time (a 3g.40gb counting 3/7 of its GPU).

use crate::observe::*;
use crate::support::*;
use gpu_tenancy::api::GpuNode;
use gpu_tenancy_e2e::kubelet::pod_resources::{ListPodResourcesResponse, PodResourcesServer, pod_holding};
use gpu_tenancy_e2e::procs::{SimAgent, http_get};
use gpu_tenancy_e2e::prometheus::PrometheusProcess;
use gpu_tenancy_e2e::{Cleanup, repo_root};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
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

/// An agent on two simulated H100s serving its metrics: GPU 0 in MIG mode with a 3g.40gb of
/// tenant a (a process using 2000 MiB), GPU 1 tenant b's whole GPU (a process using 1000 MiB and
/// half its SMs).
async fn agent_with_work(client: &kube::Client, cleanup: &Cleanup, name: &str) -> (SimAgent, SocketAddr) {
    let name = name.to_string();
    let mut agent = SimAgent::start_with(client, cleanup, &name, "metrics", 2).await;
    let addr = agent.serve_metrics();
    let spec = json!({"gpus": [
        {"index": 0, "mode": "MIG", "migInstances": [
            {"profile": "3g.40gb", "placement": {"start": 4, "size": 4}, "tenant": "a"}]},
        {"index": 1, "mode": "Exclusive", "tenants": ["b"]}]});
    let api: Api<GpuNode> = Api::all(client.clone());
    wait_nodes(client, std::slice::from_ref(&name), 30, "the agent's GpuNode", |_| true).await;
    api.patch(
        &name,
        &PatchParams::apply("e2e-metrics").force(),
        &Patch::Apply(json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuNode", "metadata": {"name": name}, "spec": spec})),
    )
    .await
    .expect("the test writes the GpuNode spec");
    wait_nodes(client, std::slice::from_ref(&name), 60, "the spec applied", applied).await;
    agent.sim_ctl(&[
        "attach", "--gpu", "0", "--start", "4", "--pid", "501", "--tenant", "a", "--mib", "2000",
    ]);
    agent.sim_ctl(&[
        "attach",
        "--gpu",
        "1",
        "--pid",
        "502",
        "--tenant",
        "b",
        "--mib",
        "1000",
        "--sm-util",
        "50",
    ]);
    (agent, addr)
}

#[tokio::test]
async fn agent_metrics_match_what_the_simulator_ran() {
    let cleanup = Cleanup::new();
    let client = setup(&cleanup).await;
    let (agent, addr) = agent_with_work(&client, &cleanup, "metrics-0").await;
    // Two polls (1 s each): the agent has read the processes and the utilization since.
    tokio::time::sleep(Duration::from_millis(2500)).await;
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
    let b_gpu = [r#"gpu="1""#, r#"GPU_I_ID="""#, r#"mode="Exclusive""#, r#"tenant="b""#];
    assert_eq!(
        sum(&second, "gpu_tenancy_device_memory_used_bytes", &b_gpu),
        1000.0 * mib
    );
    assert_eq!(sum(&second, "gpu_tenancy_device_utilization_ratio", &b_gpu), 0.5);
    assert_eq!(
        sum(&second, "gpu_tenancy_device_utilization_ratio", &[r#"gpu="0""#]),
        0.0,
        "NVML reports no utilization for a GPU in MIG mode"
    );
    assert_eq!(sum(&second, "gpu_tenancy_node_gpus", &[]), 2.0);

    // Allocated GPU-seconds between the scrapes: 2 GPUs × the time between them, which lies
    // between the end of the first scrape and the start of the second, and their starts and ends.
    let delta = |name: &str, want: &[&str]| sum(&second, name, want) - sum(&first, name, want);
    let (shortest, longest) = ((b2 - a1).as_secs_f64(), (a2 - b1).as_secs_f64());
    let allocated = delta("gpu_tenancy_allocated_gpu_seconds_total", &[]);
    assert!(
        2.0 * shortest - 1e-6 <= allocated && allocated <= 2.0 * longest + 1e-6,
        "allocated {allocated} GPU-s in {shortest}..{longest} s on 2 GPUs"
    );
    let share = |tenant: &str| {
        delta(
            "gpu_tenancy_allocated_gpu_seconds_total",
            &[&format!("tenant=\"{tenant}\"")],
        ) / allocated
    };
    assert!(
        (share("a") - 3.0 / 14.0).abs() < 1e-6,
        "a holds 3/7 of one of 2 GPUs: {}",
        share("a")
    );
    assert!((share("b") - 0.5).abs() < 1e-6, "b holds one of 2 GPUs: {}", share("b"));
    assert!(
        (share("unallocated") - 4.0 / 14.0).abs() < 1e-6,
        "{}",
        share("unallocated")
    );
    // b's GPU ran at 50% the whole time; use is counted at each pass (1 s), so within one pass.
    let used = delta("gpu_tenancy_used_gpu_seconds_total", &[r#"tenant="b""#]);
    assert!(
        (used - 0.5 * shortest).abs() <= 0.5 * 1.5 + 0.5 * (longest - shortest),
        "b used {used} GPU-s at 50% over about {shortest} s"
    );
    assert_eq!(delta("gpu_tenancy_used_gpu_seconds_total", &[r#"tenant="a""#]), 0.0);
    let (code, _) = http_get(addr, "/readyz").await.expect("/readyz");
    assert_eq!(code, 200);

    // Without the kubelet's pod-resources answer the device plugin's node cannot tell whose the
    // processes are: not known, and no ungranted-use rows.
    let name = "metrics-0".to_string();
    let api: Api<GpuNode> = Api::all(client.clone());
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
    // The kubelet says a's pod holds its instance and b's pod its GPU: every process explained.
    let status = api.get(&name).await.expect("the GpuNode").status.expect("a status");
    let gpu1 = status.gpus[1].uuid.clone();
    let a_mig = status.gpus[0].instances[0].uuid.clone().expect("a MIG device UUID");
    let kubelet = PodResourcesServer::start(&agent.pod_resources_socket());
    let a_pod = pod_holding("a", "train", "main", "nvidia.com/mig-3g.40gb", &[&a_mig]);
    let b_pod = pod_holding("b", "serve", "main", "nvidia.com/gpu", &[&gpu1]);
    kubelet.set(ListPodResourcesResponse {
        pod_resources: vec![a_pod.clone(), b_pod],
    });
    wait_nodes(&client, std::slice::from_ref(&name), 30, "UngrantedUse False", |n| {
        ungranted(n).is_some_and(|(s, r, _)| s == "False" && r == "None")
    })
    .await;
    // b's pod ends, its process stays (a process the kubelet gave no device to): ungranted use, in
    // the condition and in the metric deploy/prometheus's GpuTenancyUngrantedGpuInUse alerts on.
    kubelet.set(ListPodResourcesResponse {
        pod_resources: vec![a_pod],
    });
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
/// second: the window's GPU-hours are 2 GPUs × the window, a's 3/14 of them, b used half of its
/// own; and the plot is drawn (target/e2e/report.png, to look at).
#[tokio::test]
async fn report_from_a_real_prometheus_adds_up() {
    let cleanup = Cleanup::new();
    let client = setup(&cleanup).await;
    let (_agent, addr) = agent_with_work(&client, &cleanup, "metrics-1").await;
    let prom = PrometheusProcess::start("report", &[addr]).await;
    // Scrapes for longer than the window, so the window lies wholly after the first sample.
    tokio::time::sleep(Duration::from_secs(25)).await;
    let (code, body) = http_get(prom.addr, "/api/v1/query?query=gpu_tenancy_node_gpus")
        .await
        .expect("Prometheus answers");
    assert!(
        code == 200 && body.contains(r#""value":["#) && body.contains(r#","2"]"#),
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
    // increase() extrapolates each series to the window's edges: within about a scrape (1 s).
    let total = hours(&json["totalGpuHours"]);
    assert!(
        (total - 2.0 * 15.0).abs() <= 2.0 * 1.5,
        "{total} GPU-s allocated in 15 s on 2 GPUs: {json}"
    );
    let a = hours(&tenant("a")["allocatedGpuHours"]);
    assert!((a / total - 3.0 / 14.0).abs() < 0.02, "a: {a} of {total}");
    let b = tenant("b");
    let (b_alloc, b_used) = (hours(&b["allocatedGpuHours"]), hours(&b["usedGpuHours"]));
    assert!((b_alloc / total - 0.5).abs() < 0.02, "b: {b_alloc} of {total}");
    assert!((b_used / b_alloc - 0.5).abs() < 0.05, "b used {b_used} of {b_alloc}");
    assert!((b["efficiency"].as_f64().unwrap() - 0.5).abs() < 0.05, "{b}");
    assert!(
        tenant("a")["usedGpuHours"].is_null(),
        "no utilization on a MIG GPU: {json}"
    );

    let table = report(&["--since", "15s"]);
    assert!(
        table.lines().any(|l| l.starts_with("b ") && l.contains("Exclusive")),
        "{table}"
    );
    assert!(
        table.lines().all(|l| l.len() <= 80),
        "fits an 80-column terminal:\n{table}"
    );
    let csv = report(&["--since", "15s", "-o", "csv"]);
    assert!(csv.starts_with("tenant,mode,allocated_gpu_hours"), "{csv}");

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
            "MEASURE agent scrape (2 GPUs): {q} = {}",
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
