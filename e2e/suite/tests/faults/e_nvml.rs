//! An agent whose simulated NVML fails calls at random: its GpuNode goes Ready=False with a
//! reason, the other node carries on untouched, and it recovers once the faults stop.

use crate::common::*;
use gpu_tenancy::api::GpuNode;
use gpu_tenancy_e2e::Cleanup;
use gpu_tenancy_e2e::auditor::{AuditConfig, Auditor};
use gpu_tenancy_e2e::procs::ControllerProcess;
use kube::Client;
use kube::api::Api;
use std::time::{Duration, Instant};

async fn ready(client: &Client, node: &str) -> Option<(String, String, String)> {
    let n = Api::<GpuNode>::all(client.clone()).get(node).await.ok()?;
    let c = n.status?.conditions.into_iter().find(|c| c.type_ == "Ready")?;
    Some((c.status, c.reason, c.message))
}

#[tokio::test]
async fn e_an_agent_whose_nvml_fails_at_random_reports_not_ready_and_nothing_else_is_affected() {
    let cleanup = Cleanup::new();
    let client = setup().await;
    let auditor = Auditor::start(&client, AuditConfig::default()).await;
    set_tenant(&client, &cleanup, "nf-a", &[("3g.40gb", 2)]).await;
    let agents = mig_pool(&client, &cleanup, "nf", 2, two_3g()).await;
    let _controller = ControllerProcess::start("replica-n", 5);
    wait_converged(&client, "nf", &two_3g(), Duration::from_secs(120)).await;
    let healthy_mutations = agents[0].mutations();

    agents[1].sim_ctl(&["fail-random", "--rate", "0.3", "--error", "UNKNOWN", "--seed", "11"]);
    let t0 = Instant::now();
    let (status, reason, message) = loop {
        if let Some(r) = ready(&client, "nf-1").await.filter(|r| r.0 == "False") {
            break r;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "nf-1 did not go Ready=False within 60 s of its NVML failing"
        );
        // The healthy node stays Ready throughout.
        assert_eq!(
            ready(&client, "nf-0").await.map(|r| r.0).as_deref(),
            Some("True"),
            "nf-0 was affected"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!(
        "MEASURE NVML failing at random (30%): nf-1 Ready={status} after {:?}: {reason}: {message}",
        t0.elapsed()
    );
    assert!(!reason.is_empty() && !message.is_empty(), "Ready=False says why");
    // A while of failures: nf-0 untouched (no NVML mutation, still Ready), nf-1 stays up.
    let watch = Instant::now();
    while watch.elapsed() < Duration::from_secs(5) {
        assert_eq!(
            ready(&client, "nf-0").await.map(|r| r.0).as_deref(),
            Some("True"),
            "nf-0 was affected"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(
        agents[0].mutations(),
        healthy_mutations,
        "the healthy node's GPUs were touched"
    );
    let mut agents = agents;
    assert!(
        agents[1].is_running(),
        "the agent whose NVML fails exited instead of reporting"
    );

    // The faults stop: the node comes back Ready on its own.
    agents[1].sim_ctl(&["clear-faults"]);
    let t1 = Instant::now();
    wait_converged(&client, "nf", &two_3g(), Duration::from_secs(60)).await;
    eprintln!(
        "MEASURE nf-1 Ready again {:?} after its NVML stopped failing",
        t1.elapsed()
    );
    assert_consistent_now(&client, &auditor).await;
}
