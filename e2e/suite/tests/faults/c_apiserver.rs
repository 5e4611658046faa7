//! The API server and etcd stopped, then started again with their data at the same address: the
//! controller and agents, left running, recover on their own; no status is lost and no NVML
//! mutation is made again (the simulator's counters); a change after it makes only the mutations
//! its layout diff needs.

use crate::common::*;
use gpu_tenancy::api::{GpuNode, GpuTenant};
use gpu_tenancy_e2e::Cleanup;
use gpu_tenancy_e2e::auditor::{AuditConfig, Auditor};
use gpu_tenancy_e2e::procs::{ControllerProcess, controller_lease, lease_holder};
use kube::api::Api;
use kube::{Client, ResourceExt};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Environment variable naming the state directory of the control plane `e2e/run.sh` started.
pub const CONTROLPLANE_DIR_ENV: &str = "GPU_TENANCY_E2E_CONTROLPLANE_DIR";

fn controlplane_dir() -> PathBuf {
    let dir = std::env::var_os(CONTROLPLANE_DIR_ENV).filter(|d| !d.is_empty()).unwrap_or_else(|| {
        panic!("{CONTROLPLANE_DIR_ENV} is not set: this scenario stops and restarts the local control plane, so it runs under `e2e/run.sh test` (make e2e), not against another cluster")
    });
    PathBuf::from(dir)
}

fn controlplane(args: &[&str]) -> std::process::Output {
    let bin = gpu_tenancy_e2e::repo_root().join("e2e/bin/controlplane");
    std::process::Command::new(bin)
        .args(args)
        .output()
        .expect("e2e/bin/controlplane runs")
}

/// The statuses people and the planner read: per GpuNode its GPUs, per tenant its grants.
async fn statuses(client: &Client, pool: &str) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let mut nodes = BTreeMap::new();
    for n in Api::<GpuNode>::all(client.clone())
        .list(&Default::default())
        .await
        .unwrap()
    {
        if n.name_any().starts_with(&format!("{pool}-")) {
            let st = n.status.clone().unwrap_or_default();
            nodes.insert(
                n.name_any(),
                format!(
                    "gen {:?} {:?} {}",
                    st.observed_generation,
                    st.layout,
                    serde_json::to_string(&st.gpus).unwrap()
                ),
            );
        }
    }
    let mut tenants = BTreeMap::new();
    for t in Api::<GpuTenant>::all(client.clone())
        .list(&Default::default())
        .await
        .unwrap()
    {
        let st = t.status.clone().unwrap_or_default();
        tenants.insert(t.name_any(), serde_json::to_string(&st.grants).unwrap());
    }
    (nodes, tenants)
}

#[tokio::test]
async fn c_the_api_server_and_etcd_restart_with_their_data_and_everything_recovers() {
    let dir = controlplane_dir();
    let cleanup = Cleanup::new();
    let client = setup().await;
    let auditor = Auditor::start(&client, AuditConfig::default()).await;
    set_tenant(&client, &cleanup, "rs-a", &[("3g.40gb", 2), ("2g.20gb", 1)]).await;
    set_tenant(&client, &cleanup, "rs-b", &[("3g.40gb", 1), ("2g.20gb", 1)]).await;
    let agents = mig_pool(&client, &cleanup, "rs", 2, two_3g()).await;
    let _controller = ControllerProcess::start("replica-r", 5);
    wait_converged(&client, "rs", &two_3g(), Duration::from_secs(120)).await;
    tokio::time::sleep(Duration::from_secs(2)).await; // a poll or two of every agent
    let before = statuses(&client, "rs").await;
    let mutations: Vec<u64> = agents.iter().map(|a| a.mutations()).collect();

    // Stop (SIGTERM: etcd closes its data cleanly) and start again on the same data and port.
    let out = controlplane(&["down", "--dir", dir.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "controlplane down: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stopped = Instant::now();
    tokio::time::sleep(Duration::from_secs(5)).await; // agents poll and controllers retry meanwhile
    let log = std::fs::File::create(dir.join("controlplane-restart.log")).unwrap();
    // Its own session, not this test's thread's child for PR_SET_PDEATHSIG: e2e/run.sh stops it
    // with `controlplane down` at the end, as the first one. Reaped by a thread when it ends.
    let mut restarted = std::process::Command::new("setsid")
        .arg(gpu_tenancy_e2e::repo_root().join("e2e/bin/controlplane"))
        .args([
            "up",
            "--dir",
            dir.to_str().unwrap(),
            "--keep",
            "--die-with-parent=false",
        ])
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .stdin(std::process::Stdio::null())
        .spawn()
        .expect("the control plane starts again");
    std::thread::spawn(move || restarted.wait());
    let restarting = Instant::now();
    while !dir.join("ready").exists() {
        assert!(
            restarting.elapsed() < Duration::from_secs(120),
            "the control plane did not come back within 120 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let up = restarting.elapsed();
    eprintln!(
        "MEASURE control plane down for {:?}; restart with its data took {up:?}",
        stopped.elapsed()
    );

    // Recovered: the controller holds its lease again and every agent reports again (its watch
    // re-established: a spec change reaches it). No status lost, no NVML mutation repeated.
    let t0 = Instant::now();
    let renewed_at = lease_renewed(&client).await;
    while lease_holder(&client).await.as_deref() != Some("replica-r") || lease_renewed(&client).await == renewed_at {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the controller did not renew its lease within 60 s of the restart"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "MEASURE the controller renewed its lease {:?} after the API server was back",
        t0.elapsed()
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = statuses(&client, "rs").await;
    assert_eq!(after, before, "statuses changed across the restart");
    let again: Vec<u64> = agents.iter().map(|a| a.mutations()).collect();
    assert_eq!(
        again,
        mutations,
        "NVML mutations after the restart with nothing to change: {:?}",
        agents
            .iter()
            .zip(&mutations)
            .map(|(a, m)| a.log_since(*m))
            .collect::<Vec<_>>()
    );

    // A change after recovery: 3g+3g to 3g+2g+2g. The oracle is the GpuNode statuses before and
    // after: each instance gone costs its compute and GPU instance destroys, each new one its
    // GPU and compute instance creates; nothing else may touch the GPUs.
    let layouts_before: BTreeMap<String, Vec<(u32, String)>> = instances(&client).await;
    set_plan(&client, "rs", one_3g_two_2g()).await;
    let converged_in = wait_converged(&client, "rs", &one_3g_two_2g(), Duration::from_secs(120)).await;
    eprintln!("MEASURE a layout change on 2 nodes after the restart converged in {converged_in:?}");
    let layouts_after = instances(&client).await;
    for (a, m) in agents.iter().zip(&mutations) {
        let b = &layouts_before[&a.name];
        let c = &layouts_after[&a.name];
        let gone = b.iter().filter(|i| !c.contains(i)).count();
        let new = c.iter().filter(|i| !b.contains(i)).count();
        let log = a.log_since(*m);
        assert_eq!(
            log.len(),
            2 * (gone + new),
            "{}: {gone} instances gone and {new} new need {} mutations; the simulator logged {log:#?}",
            a.name,
            2 * (gone + new)
        );
    }
    assert_consistent_now(&client, &auditor).await;
}

/// When the controller's Lease was last renewed.
async fn lease_renewed(client: &Client) -> Option<String> {
    let renewed = controller_lease(client).await?.spec?.renew_time?;
    Some(format!("{:?}", renewed.0))
}

/// Per node of pool `rs`, its instances (placement start, profile) as its agent reports them.
async fn instances(client: &Client) -> BTreeMap<String, Vec<(u32, String)>> {
    let mut out = BTreeMap::new();
    for n in Api::<GpuNode>::all(client.clone())
        .list(&Default::default())
        .await
        .unwrap()
    {
        if n.name_any().starts_with("rs-") {
            let st = n.status.clone().unwrap_or_default();
            out.insert(
                n.name_any(),
                st.gpus
                    .iter()
                    .flat_map(|g| g.instances.iter().map(|i| (i.placement.start, i.profile.clone())))
                    .collect(),
            );
        }
    }
    out
}
