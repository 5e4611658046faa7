//! DRA mode, cluster side, on the real API server with the real kube-scheduler and
//! ResourceClaim controller (e2e/run.sh gives this binary a control plane started with
//! `--scheduler`): the real controller writes the tenants' DeviceClasses, quotas and admission
//! policies; real agents in DRA mode publish simulated GPUs; the test plays the kubelet of the
//! fake Ready nodes ([`FakeKubelet`]) for the pods the scheduler binds there: those scenarios
//! need pods that end (a workload finishing frees its device for the next), which the real
//! kubelet's runtime here cannot do, as it runs no containers. The real kubelet runs the rest
//! ([`real_kubelet`], [`real_kubelet_burst`], [`real_kubelet_caps`]).
//!
//! The oracles are not this project's code: which device the scheduler allocated (the claims'
//! status), what the ResourceSlices say of its tenant, the API server's refusals (quota, the
//! admission policies), and the simulator's memory marks for scrubs.

mod partitionable;
mod real_kubelet;
mod real_kubelet_burst;
mod real_kubelet_caps;
mod scenarios;
mod support;

use support::{Cluster, setup};

#[tokio::test]
async fn the_scheduler_gives_each_tenant_only_its_own_devices() {
    let mut c: Cluster = setup().await;
    scenarios::random_pods_on_a_shared_mig_node(&mut c, 100).await;
    scenarios::claims_beyond_the_quota_are_refused(&mut c).await;
    scenarios::cross_tenant_claims_get_nothing(&mut c).await;
    scenarios::device_plugin_style_pods(&mut c).await;
    scenarios::numa_constraint(&mut c).await;
    scenarios::hand_over_waits_for_the_scrub(&mut c).await;
    scenarios::no_tenant_pods_stay_off_dra_nodes(&mut c).await;
    real_kubelet::pods_run_on_a_real_kubelet(&mut c).await;
    real_kubelet_burst::a_hundred_pods_at_once(&mut c).await;
    real_kubelet_caps::two_30_gib_jobs_on_a_40_gb_gpu(&mut c).await;
}
