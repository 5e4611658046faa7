use super::*;
use crate::agent::pod_resources::holdings;
use crate::agent::pod_resources::proto::{
    ContainerDevices, ContainerResources, ListPodResourcesResponse, PodResources,
};
use crate::api::MigInstanceStatus;
use serde_json::{Value, json};

const GPU0: &str = "GPU-00000000-0000-0000-0000-000000000000";
const GPU1: &str = "GPU-11111111-1111-1111-1111-111111111111";
const GPU2: &str = "GPU-22222222-2222-2222-2222-222222222222";
const MIG1A: &str = "MIG-1a1a1a1a-0000-0000-0000-000000000000";
const MIG1B: &str = "MIG-1b1b1b1b-0000-0000-0000-000000000000";

/// GPU 0 whole (shared by replicas), GPU 1 cut in two 3g.40gb, GPU 2 whole.
fn gpus() -> Vec<GpuStatus> {
    let instance = |uuid: &str| MigInstanceStatus {
        uuid: Some(uuid.into()),
        profile: "3g.40gb".into(),
        ..Default::default()
    };
    vec![
        GpuStatus {
            index: 0,
            uuid: GPU0.into(),
            ..Default::default()
        },
        GpuStatus {
            index: 1,
            uuid: GPU1.into(),
            instances: vec![instance(MIG1A), instance(MIG1B)],
            ..Default::default()
        },
        GpuStatus {
            index: 2,
            uuid: GPU2.into(),
            ..Default::default()
        },
    ]
}

fn limits(resources: &[(&str, &str)]) -> Value {
    let m: serde_json::Map<String, Value> = resources.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
    json!({"limits": m})
}

/// A pod `name` of namespace `ns` with one container `c` asking for `resources`.
fn pod(name: &str, resources: &[(&str, &str)]) -> Pod {
    pod_with(
        name,
        json!({"containers": [{"name": "c", "image": "cuda", "resources": limits(resources)}]}),
        json!({}),
    )
}

fn pod_with(name: &str, spec: Value, status: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
        "spec": spec, "status": status}))
    .unwrap()
}

/// A container as the kubelet reports it: its name, and its devices as (resource, IDs).
type Listed<'a> = (&'a str, &'a [(&'a str, &'a [&'a str])]);

/// The kubelet's answer: per pod, its containers.
fn listed(pods: &[(&str, &[Listed])]) -> Holdings {
    holdings(&ListPodResourcesResponse {
        pod_resources: pods
            .iter()
            .map(|(name, containers)| PodResources {
                name: name.to_string(),
                namespace: "ns".into(),
                containers: containers
                    .iter()
                    .map(|(c, devices)| ContainerResources {
                        name: c.to_string(),
                        devices: devices
                            .iter()
                            .map(|(r, ids)| ContainerDevices {
                                resource_name: r.to_string(),
                                device_ids: ids.iter().map(|s| s.to_string()).collect(),
                                topology: None,
                            })
                            .collect(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
    })
}

/// `(pod name, GPUs)` of each request.
fn asked(requests: &[EvictionRequest]) -> Vec<(&str, Vec<u32>)> {
    requests.iter().map(|r| (r.name.as_str(), r.gpus.clone())).collect()
}

const SHARED: &str = "nvidia.com/gpu.shared";
const MIG: &str = "nvidia.com/mig-3g.40gb";

/// Without the kubelet's answer: every live pod asking for a busy GPU's resource names, as before.
#[test]
fn without_pod_resources_every_pod_asking_for_the_names_is_asked_for() {
    let mut done = pod("done", &[(SHARED, "1")]);
    done.status = serde_json::from_value(json!({"phase": "Succeeded"})).unwrap();
    let mut leaving = pod("leaving", &[(SHARED, "1")]);
    leaving.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        jiff::Timestamp::UNIX_EPOCH,
    ));
    let pods = [
        pod("shared-a", &[(SHARED, "1")]),
        pod("shared-b", &[(SHARED, "1")]),
        pod("mig", &[(MIG, "1")]),
        pod("cpu", &[("cpu", "1")]),
        done,
        leaving,
    ];
    assert_eq!(
        asked(&select(&pods, &gpus(), &[0], None)),
        [("shared-a", vec![0]), ("shared-b", vec![0])]
    );
    assert_eq!(asked(&select(&pods, &gpus(), &[1], None)), [("mig", vec![1])]);
    // GPUs 0 and 2 have the same names: both pods may hold either.
    assert_eq!(
        asked(&select(&pods, &gpus(), &[0, 2], None)),
        [("shared-a", vec![0, 2]), ("shared-b", vec![0, 2])]
    );
    assert_eq!(select(&pods, &gpus(), &[0], None)[0].uid, "uid-shared-a");
}

/// With it: only the pods that hold the busy GPU, by GPU UUID, MIG UUID or replica ID; a pod
/// holding devices of two GPUs is asked for the busy one only.
#[test]
fn with_pod_resources_only_the_holders_of_the_busy_gpu_are_asked_for() {
    let pods = [
        pod("on-gpu0", &[(SHARED, "1")]),
        pod("on-gpu2", &[(SHARED, "1")]),
        pod("mig-a", &[(MIG, "1")]),
        pod("mig-b", &[(MIG, "1")]),
        pod("two-gpus", &[(SHARED, "1"), ("nvidia.com/gpu", "1")]),
        pod("cpu", &[("cpu", "1")]),
    ];
    let r0 = format!("{GPU0}::3");
    let r2 = format!("{GPU2}::0");
    let r2b = format!("{GPU2}::1");
    let h = listed(&[
        ("on-gpu0", &[("c", &[(SHARED, &[&r0])])]),
        ("on-gpu2", &[("c", &[(SHARED, &[&r2])])]),
        ("mig-a", &[("c", &[(MIG, &[MIG1A])])]),
        ("mig-b", &[("c", &[(MIG, &[MIG1B])])]),
        ("two-gpus", &[("c", &[(SHARED, &[&r2b]), ("nvidia.com/gpu", &[GPU0])])]),
        ("cpu", &[("c", &[])]),
    ]);
    let g = gpus();
    assert_eq!(
        asked(&select(&pods, &g, &[0], Some(&h))),
        [("on-gpu0", vec![0]), ("two-gpus", vec![0])]
    );
    assert_eq!(
        asked(&select(&pods, &g, &[2], Some(&h))),
        [("on-gpu2", vec![2]), ("two-gpus", vec![2])]
    );
    assert_eq!(
        asked(&select(&pods, &g, &[0, 2], Some(&h))),
        [("on-gpu0", vec![0]), ("on-gpu2", vec![2]), ("two-gpus", vec![0, 2])]
    );
    // A MIG GPU: the holders of its instances.
    assert_eq!(
        asked(&select(&pods, &g, &[1], Some(&h))),
        [("mig-a", vec![1]), ("mig-b", vec![1])]
    );
}

/// What the answer does not account for falls back to the names (fail closed): a pod not
/// reported, one reported with fewer devices than it asks for (listed before its allocation), a
/// device of no GPU this status knows, an init container asking for a GPU that has not finished.
#[test]
fn what_pod_resources_does_not_account_for_goes_by_names() {
    let init = |state: Value| {
        pod_with(
            "init",
            json!({
                "initContainers": [{"name": "warm", "image": "cuda", "resources": limits(&[(SHARED, "1")])}],
                "containers": [{"name": "c", "image": "cuda", "resources": limits(&[(SHARED, "1")])}]}),
            json!({"initContainerStatuses": [{"name": "warm", "image": "cuda", "imageID": "", "ready": false,
                "restartCount": 0, "state": state}]}),
        )
    };
    let r2 = format!("{GPU2}::0");
    let pods = [
        pod("unlisted", &[(SHARED, "1")]),
        pod("short", &[(SHARED, "2")]),
        pod("stale-id", &[(SHARED, "1")]),
        pod("bad-count", &[(SHARED, "one")]),
        init(json!({"running": {}})),
    ];
    let h = listed(&[
        ("short", &[("c", &[(SHARED, &[&r2])])]),
        ("stale-id", &[("c", &[(SHARED, &["GPU-99999999-gone::0"])])]),
        ("bad-count", &[("c", &[(SHARED, &[&r2])])]),
        ("init", &[("c", &[(SHARED, &[&r2])])]),
    ]);
    let g = gpus();
    assert_eq!(
        asked(&select(&pods, &g, &[0], Some(&h))),
        [
            ("bad-count", vec![0]),
            ("init", vec![0]),
            ("short", vec![0]),
            ("stale-id", vec![0]),
            ("unlisted", vec![0])
        ]
    );
    // Once the init container has finished, the answer accounts for the pod: it holds GPU 2.
    let done = [init(json!({"terminated": {"exitCode": 0}}))];
    assert!(select(&done, &g, &[0], Some(&h)).is_empty());
    assert_eq!(asked(&select(&done, &g, &[2], Some(&h))), [("init", vec![2])]);
}

/// A sidecar (restartable init container) is reported as a container: its devices count, and it
/// must hold what it asks for.
#[test]
fn sidecars_are_accounted_like_containers() {
    let spec = json!({
        "initContainers": [{"name": "side", "image": "cuda", "restartPolicy": "Always", "resources": limits(&[(MIG, "1")])}],
        "containers": [{"name": "c", "image": "busybox"}]});
    let pods = [pod_with("sidecar", spec, json!({}))];
    let g = gpus();
    let holding = listed(&[("sidecar", &[("side", &[(MIG, &[MIG1A])]), ("c", &[])])]);
    assert_eq!(asked(&select(&pods, &g, &[1], Some(&holding))), [("sidecar", vec![1])]);
    // Holding another GPU's device: not asked for GPU 1.
    let r0 = format!("{GPU0}::0");
    let elsewhere = listed(&[("sidecar", &[("side", &[(MIG, &[&r0])]), ("c", &[])])]);
    assert!(select(&pods, &g, &[1], Some(&elsewhere)).is_empty());
    // Its devices not reported yet: by names.
    let unallocated = listed(&[("sidecar", &[("side", &[]), ("c", &[])])]);
    assert_eq!(
        asked(&select(&pods, &g, &[1], Some(&unallocated))),
        [("sidecar", vec![1])]
    );
}
