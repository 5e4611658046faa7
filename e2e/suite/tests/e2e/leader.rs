//! Leader election on a real Lease (operator/src/controller/leader.rs): one holder at a time, a
//! released lease is taken over at once, a dead holder's lease after its duration.

use std::time::{Duration, Instant};

use gpu_tenancy::controller::leader::{self, Election};
use gpu_tenancy_e2e::{Cleanup, Names, client, create_namespace};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, PostParams};

/// Short, so the tests are quick: renew every 3 s (grace 1 s).
const DURATION: Duration = Duration::from_secs(4);

/// Waits until `election` is leader; returns how long that took, or panics after `limit`.
async fn until_leader(election: &Election, limit: Duration) -> Duration {
    let started = Instant::now();
    let mut rx = election.is_leader.clone();
    tokio::time::timeout(limit, rx.wait_for(|leader| *leader))
        .await
        .unwrap_or_else(|_| panic!("not leader after {limit:?}"))
        .expect("the election task ended");
    started.elapsed()
}

async fn holder(client: &kube::Client, ns: &str, lease: &str) -> Option<String> {
    let l = Api::<Lease>::namespaced(client.clone(), ns)
        .get(lease)
        .await
        .expect("the lease");
    l.spec.and_then(|s| s.holder_identity)
}

#[tokio::test]
async fn leader_one_holder_and_a_released_lease_passes_to_the_follower_at_once() {
    let client = client().await;
    let cleanup = Cleanup::new();
    let names = Names::new("leader");
    let ns = names.next();
    create_namespace(&client, &cleanup, &ns, &[]).await;
    let lease = "gpu-tenancy-controller";

    let a = leader::start(client.clone(), &ns, lease, "replica-a", DURATION)
        .await
        .expect("a starts");
    let took = until_leader(&a, DURATION * 2).await;
    eprintln!("leader: a free lease was taken in {took:?}");
    assert_eq!(holder(&client, &ns, lease).await.as_deref(), Some("replica-a"));

    // b competes for longer than a lease term: a keeps renewing, so b never leads.
    let b = leader::start(client.clone(), &ns, lease, "replica-b", DURATION)
        .await
        .expect("b starts");
    let watch_until = Instant::now() + DURATION + Duration::from_secs(2);
    while Instant::now() < watch_until {
        assert!(a.is_leader(), "a lost the lease it renews");
        assert!(!b.is_leader(), "two leaders at once");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(holder(&client, &ns, lease).await.as_deref(), Some("replica-a"));

    // a shuts down gracefully: b takes over well before a's lease would have expired.
    let mut a_rx = a.is_leader.clone();
    let released = Instant::now();
    a.release().await.expect("a releases");
    assert!(!*a_rx.borrow_and_update(), "a stops leading when it releases");
    let took = until_leader(&b, DURATION).await;
    let failover = released.elapsed();
    eprintln!("leader: graceful failover in {failover:?} (release to follower leading: {took:?})");
    assert!(failover < DURATION / 2, "failover took {failover:?}");
    assert_eq!(holder(&client, &ns, lease).await.as_deref(), Some("replica-b"));

    b.release().await.expect("b releases");
    assert_eq!(holder(&client, &ns, lease).await, None, "released on shutdown");
}

#[tokio::test]
async fn leader_a_crashed_holder_is_replaced_within_the_lease_duration() {
    let client = client().await;
    let cleanup = Cleanup::new();
    let names = Names::new("leader-crash");
    let ns = names.next();
    create_namespace(&client, &cleanup, &ns, &[]).await;
    let lease = "gpu-tenancy-controller";

    // A holder that renewed just now and then died: it never renews nor releases.
    let dead: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": lease},
        "spec": {
            "holderIdentity": "crashed-replica",
            "leaseDurationSeconds": DURATION.as_secs(),
            "acquireTime": MicroTime(jiff::Timestamp::now()),
            "renewTime": MicroTime(jiff::Timestamp::now()),
        }
    }))
    .unwrap();
    let crashed_at = Instant::now();
    Api::<Lease>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &dead)
        .await
        .expect("the dead holder's lease");

    let b = leader::start(client.clone(), &ns, lease, "replica-b", DURATION)
        .await
        .expect("b starts");
    assert!(!b.is_leader());
    until_leader(&b, DURATION * 3).await;
    let failover = crashed_at.elapsed();
    eprintln!("leader: crash failover in {failover:?} (lease duration {DURATION:?})");
    // Not before the dead holder's lease expired, and within it plus the library's ≤ 1 s random
    // back-off and a few requests.
    assert!(
        failover >= DURATION - Duration::from_millis(500),
        "took a live lease after {failover:?}"
    );
    assert!(
        failover < DURATION + Duration::from_secs(3),
        "failover took {failover:?}"
    );
    assert_eq!(holder(&client, &ns, lease).await.as_deref(), Some("replica-b"));
    b.release().await.expect("b releases");
}
