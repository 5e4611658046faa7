//! The controller leader killed (SIGKILL: no lease release) mid-rollout: the follower takes over
//! once the lease expires and finishes the rollout; no grant is lost or doubled.

use crate::common::*;
use gpu_tenancy::api::GpuNode;
use gpu_tenancy_e2e::Cleanup;
use gpu_tenancy_e2e::auditor::{AuditConfig, Auditor};
use gpu_tenancy_e2e::procs::{ControllerProcess, wait_for_leader};
use kube::ResourceExt;
use kube::api::Api;
use std::time::{Duration, Instant};

pub const LEASE_SECONDS: u32 = 5;

#[tokio::test]
async fn b_the_leader_killed_mid_rollout_is_replaced_and_nothing_is_lost() {
    let cleanup = Cleanup::new();
    let client = setup().await;
    let auditor = Auditor::start(&client, AuditConfig::default()).await;
    set_tenant(&client, &cleanup, "lk-a", &[("3g.40gb", 2), ("2g.20gb", 2)]).await;
    set_tenant(&client, &cleanup, "lk-b", &[("3g.40gb", 1), ("2g.20gb", 2)]).await;
    let _agents = mig_pool(&client, &cleanup, "lk", 3, two_3g()).await;
    let mut a = ControllerProcess::start("replica-a", LEASE_SECONDS);
    wait_for_leader(&client, "replica-a", Duration::from_secs(30)).await;
    let _b = ControllerProcess::start("replica-b", LEASE_SECONDS);
    let took = wait_converged(&client, "lk", &two_3g(), Duration::from_secs(120)).await;
    eprintln!("MEASURE leader scenario: 3 real agents converged on 3g+3g in {took:?}");

    // A new layout on the three nodes, one at a time; kill the leader once the first has started.
    set_plan(&client, "lk", one_3g_two_2g()).await;
    let gn: Api<GpuNode> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let nodes = gn.list(&Default::default()).await.unwrap();
        if nodes
            .iter()
            .any(|n| n.name_any().starts_with("lk-") && n.spec.gpus.iter().any(|g| g.mig_instances.len() == 3))
        {
            break;
        }
        assert!(Instant::now() < deadline, "the rollout did not start within 60 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let killed = Instant::now();
    a.kill();
    wait_for_leader(&client, "replica-b", Duration::from_secs(60)).await;
    let takeover = killed.elapsed();
    eprintln!("MEASURE takeover after SIGKILL of the leader (lease {LEASE_SECONDS} s): {takeover:?}");
    let finished = wait_converged(&client, "lk", &one_3g_two_2g(), Duration::from_secs(120)).await;
    eprintln!("MEASURE rollout finished {finished:?} after the takeover");
    assert_consistent_now(&client, &auditor).await;
}
