//! The simulated node the metrics scenarios measure, and what its simulator was told to run: the
//! figures the scenarios expect come from the constants here and the wall clock, never from the
//! agent's own tables.
//!
//! Four GPUs: three H100s (GPM per MIG instance) and an A100 (none: Ampere).
//! - GPU 0, MIG: a 3g.40gb of tenant a, a process of 2000 MiB keeping 40% of its SMs busy.
//! - GPU 1, Exclusive for b: a process of 1000 MiB at 50%.
//! - GPU 2, time-sliced in 4 replicas, 2 each for a and b: a process of a's pod at 30%, one of b's
//!   pod at 10%, and one of no pod (a host process) at 20%.
//! - GPU 3 (the A100), MIG: a 3g.20gb of a, a process at 20% that NVML cannot report.

use crate::observe::*;
use gpu_tenancy::api::{GpuNode, GpuTenant};
use gpu_tenancy_e2e::Cleanup;
use gpu_tenancy_e2e::kubelet::pod_resources::{ListPodResourcesResponse, PodResources, pod_holding};
use gpu_tenancy_e2e::procs::SimAgent;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use std::net::SocketAddr;
use std::time::Duration;

/// SM use the simulator was told each process keeps busy, as a fraction.
pub const A_INSTANCE_SM: f64 = 0.40;
pub const B_GPU_SM: f64 = 0.50;
pub const A_SHARED_SM: f64 = 0.30;
pub const B_SHARED_SM: f64 = 0.10;
pub const HOST_SHARED_SM: f64 = 0.20;
/// The H100's 3g.40gb and the A100's 3g.20gb: 3 of 7 compute slices each.
pub const INSTANCE: f64 = 3.0 / 7.0;
/// The time-sliced GPU's replicas, and how many each of a and b holds.
pub const REPLICAS: f64 = 4.0;
pub const SHARES_EACH: f64 = 2.0;
pub const GPUS: f64 = 4.0;

/// What each tenant holds, in GPUs: a the two instances and half the time-sliced GPU, b its GPU
/// and the other half; the rest of both MIG GPUs is unallocated.
pub fn allocated(tenant: &str) -> f64 {
    match tenant {
        "a" => 2.0 * INSTANCE + SHARES_EACH / REPLICAS,
        "b" => 1.0 + SHARES_EACH / REPLICAS,
        "unallocated" => 2.0 * (1.0 - INSTANCE),
        _ => 0.0,
    }
}

/// The simulated node and its agent serving metrics.
pub struct Work {
    pub agent: SimAgent,
    pub addr: SocketAddr,
    /// The namespaces of tenants a and b (GpuTenants a and b list one each).
    pub ns_a: String,
    pub ns_b: String,
}

/// The pods go when the node does, at once: with no kubelet to confirm a graceful deletion they
/// would stay, and their namespaces (deleted by the test's cleanup, dropped after this) with them.
impl Drop for Work {
    fn drop(&mut self) {
        for ns in [&self.ns_a, &self.ns_b] {
            let out = gpu_tenancy_e2e::kubectl(["delete", "pods", "--all", "-n", ns, "--force", "--grace-period=0"]);
            if !out.success {
                eprintln!("{}: {}", out.command, out.stderr);
            }
        }
    }
}

/// Tenant `name` listing only `namespace`, which is created (again, once an earlier run's is gone).
async fn tenant_with_namespace(client: &Client, cleanup: &Cleanup, name: &str, namespace: &str) {
    cleanup.add("GpuTenant", name);
    cleanup.add_resource("namespaces", namespace);
    let body = json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuTenant", "metadata": {"name": name},
        "spec": {"tier": "internal", "namespaces": [namespace], "resources": []}});
    Api::<GpuTenant>::all(client.clone())
        .patch(name, &PatchParams::apply("e2e-metrics").force(), &Patch::Apply(body))
        .await
        .expect("the test writes the GpuTenant");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": namespace}})).expect("a Namespace");
    for _ in 0..300 {
        match namespaces.create(&PostParams::default(), &ns).await {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let terminating = namespaces
                    .get_opt(namespace)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|n| n.status?.phase)
                    .is_some_and(|p| p == "Terminating");
                if !terminating {
                    return;
                }
            }
            Err(e) => panic!("creating namespace {namespace}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("namespace {namespace} of an earlier run is still terminating");
}

/// A pod of `node` in `namespace` (never run: there is no kubelet), its UID. Created without a
/// node and then bound to it, as the scheduler binds pods (`pods/binding`): the admission rules an
/// earlier scenario's controller left refuse pods that name their node themselves. Retried while
/// the namespace's default service account does not exist yet (its controller makes it).
async fn pod_on(client: &Client, namespace: &str, name: &str, node: &str) -> String {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": name}, "spec": {
        "containers": [{"name": "main", "image": "registry.invalid/cuda:12"}]}}))
    .expect("a Pod");
    let mut last = String::new();
    for _ in 0..100 {
        let created = match api.create(&PostParams::default(), &pod).await {
            Ok(p) => Ok(p),
            Err(kube::Error::Api(e)) if e.code == 409 => api.get(name).await,
            Err(e) => Err(e),
        };
        match created {
            Ok(p) if p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node) => {
                return p.uid().expect("a UID");
            }
            Ok(_) => {
                let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": node}});
                if let Err(e) = api
                    .create_subresource::<_, serde_json::Value>("binding", name, &PostParams::default(), &binding)
                    .await
                {
                    last = format!("binding: {e}");
                }
            }
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("creating pod {namespace}/{name} on {node}: {last}");
}

/// Starts the node of this module's header, its spec applied and its processes running.
pub async fn start(client: &Client, cleanup: &Cleanup, name: &str) -> Work {
    let (ns_a, ns_b) = (format!("{name}-a"), format!("{name}-b"));
    tenant_with_namespace(client, cleanup, "a", &ns_a).await;
    tenant_with_namespace(client, cleanup, "b", &ns_b).await;
    let uid_a = pod_on(client, &ns_a, "ts", name).await;
    let uid_b = pod_on(client, &ns_b, "ts", name).await;

    let config = "gpus:\n- {pciDeviceId: \"0x233010DE\", count: 3}\n- {pciDeviceId: \"0x20B010DE\"}\n";
    let mut agent = SimAgent::start_config(client, cleanup, name, "metrics", config).await;
    let addr = agent.serve_metrics();
    let spec = json!({"gpus": [
        {"index": 0, "mode": "MIG", "migInstances": [
            {"profile": "3g.40gb", "placement": {"start": 4, "size": 4}, "tenant": "a"}]},
        {"index": 1, "mode": "Exclusive", "tenants": ["b"]},
        {"index": 2, "mode": "TimeSlicing", "timeSlicing": {"replicas": REPLICAS as u32}, "tenants": ["a", "b"],
         "shares": [{"tenant": "a", "count": SHARES_EACH as u32}, {"tenant": "b", "count": SHARES_EACH as u32}]},
        {"index": 3, "mode": "MIG", "migInstances": [
            {"profile": "3g.20gb", "placement": {"start": 4, "size": 4}, "tenant": "a"}]}]});
    let api: Api<GpuNode> = Api::all(client.clone());
    wait_nodes(client, &[name.to_string()], 30, "the agent's GpuNode", |_| true).await;
    api.patch(
        name,
        &PatchParams::apply("e2e-metrics").force(),
        &Patch::Apply(json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuNode", "metadata": {"name": name}, "spec": spec})),
    )
    .await
    .expect("the test writes the GpuNode spec");
    wait_nodes(client, &[name.to_string()], 60, "the spec applied", applied).await;

    // The kernel's view of the time-sliced GPU's processes: a's and b's pods' containers (the
    // cgroupfs and the systemd driver's paths), and a host process.
    agent.fake_process(503, &format!("0::/kubepods/burstable/pod{uid_a}/0123abcd\n"));
    let systemd = uid_b.replace('-', "_");
    agent.fake_process(
        504,
        &format!("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{systemd}.slice/cri-containerd-4567.scope\n"),
    );
    agent.fake_process(505, "0::/system.slice/someones-job.service\n");
    let percent = |f: f64| format!("{}", (f * 100.0).round() as u32);
    for (gpu, start, pid, tenant, mib, sm) in [
        ("0", Some("4"), "501", Some("a"), "2000", A_INSTANCE_SM),
        ("1", None, "502", Some("b"), "1000", B_GPU_SM),
        ("2", None, "503", Some("a"), "500", A_SHARED_SM),
        ("2", None, "504", Some("b"), "500", B_SHARED_SM),
        ("2", None, "505", None, "100", HOST_SHARED_SM),
        ("3", Some("4"), "506", Some("a"), "300", 0.20),
    ] {
        let sm = percent(sm);
        let mut args = vec!["attach", "--gpu", gpu, "--pid", pid, "--mib", mib, "--sm-util", &sm];
        if let Some(s) = start {
            args.extend(["--start", s]);
        }
        if let Some(t) = tenant {
            args.extend(["--tenant", t]);
        }
        agent.sim_ctl(&args);
    }
    Work {
        agent,
        addr,
        ns_a,
        ns_b,
    }
}

/// The kubelet's answer where every device with processes is held: a's pods hold its H100 and
/// A100 instances and one replica of the time-sliced GPU, b's its GPU and two replicas.
pub async fn kubelet_answer(client: &Client, w: &Work) -> Vec<PodResources> {
    let api: Api<GpuNode> = Api::all(client.clone());
    let status = api
        .get(&w.agent.name)
        .await
        .expect("the GpuNode")
        .status
        .expect("a status");
    let mig = |gpu: usize| status.gpus[gpu].instances[0].uuid.clone().expect("a MIG device UUID");
    let (h100_mig, a100_mig, gpu1, gpu2) = (mig(0), mig(3), status.gpus[1].uuid.clone(), status.gpus[2].uuid.clone());
    let r = |n: u32| format!("{gpu2}::{n}");
    vec![
        pod_holding(&w.ns_a, "train", "main", "nvidia.com/mig-3g.40gb", &[&h100_mig]),
        pod_holding(&w.ns_a, "small", "main", "nvidia.com/mig-3g.20gb", &[&a100_mig]),
        pod_holding(&w.ns_a, "ts", "main", "nvidia.com/gpu.shared", &[&r(0)]),
        pod_holding(&w.ns_b, "serve", "main", "nvidia.com/gpu", &[&gpu1]),
        pod_holding(&w.ns_b, "ts", "main", "nvidia.com/gpu.shared", &[&r(2), &r(3)]),
    ]
}

/// That answer without b's `serve` pod.
pub fn without_serve(pods: &[PodResources]) -> ListPodResourcesResponse {
    ListPodResourcesResponse {
        pod_resources: pods.iter().filter(|p| p.name != "serve").cloned().collect(),
    }
}
