//! The ways around tenant isolation, tried on the real API server as a tenant's user
//! would: a user with Kubernetes' own `edit` role in its namespace, impersonated, against what
//! the controller wrote, with the ResourceQuota controller and Pod Security admission running.
//! Every way is refused with a message naming the tenant (or the namespace of no tenant) and the
//! rule; legitimate pods of every tier are admitted.

use crate::support::*;
use gpu_tenancy::api::{EvictionRequest, GpuNode, GpuNodeStatus, GpuTenant};
use gpu_tenancy_e2e::access::{eventually, impersonating, outcome};
use gpu_tenancy_e2e::{Cleanup, apply_docs_as_kubectl, create_namespace, kubectl_async};
use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const NONE_NS: &str = "atk-none";
const FORGED_NS: &str = "atk-forged";

fn world() -> Vec<Value> {
    let tenant = |name: &str, tier: &str, resources: Value, limits: Value| {
        json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuTenant", "metadata": {"name": name},
            "spec": {"tier": tier, "policyRef": "atk", "namespaces": [name], "resources": resources, "limits": limits}})
    };
    let plan = |pool: &str, group: Value| {
        json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuPartitionPlan", "metadata": {"name": pool},
            "spec": {"nodeSelector": {"matchLabels": {"pool": pool}}, "gpus": [group],
                     "rollout": {"maxUnavailable": "100%", "busyGpuPolicy": if pool == "atk-mig" { "Evict" } else { "Wait" }}}})
    };
    vec![
        json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "SharingPolicy", "metadata": {"name": "atk"},
            "spec": {"tiers": [
                {"name": "external", "modes": ["MIG", "Exclusive"], "coLocation": "Forbidden", "scrubMemory": "Always"},
                {"name": "internal", "modes": ["MIG", "MPS", "Exclusive"], "priorityClassNames": ["atk-batch"]},
                {"name": "experimental", "modes": ["MIG", "MPS", "TimeSlicing", "Exclusive"], "podSecurity": "Restricted"}]}}),
        tenant(
            "atk-ext",
            "external",
            json!([{"mode": "MIG", "profile": "1g.10gb", "count": 2}]),
            json!({"maxGpusPerPod": 1}),
        ),
        tenant("atk-mps", "internal", json!([{"mode": "MPS", "count": 2}]), json!({})),
        tenant(
            "atk-ts",
            "experimental",
            json!([{"mode": "TimeSlicing", "count": 2}]),
            json!({}),
        ),
        tenant(
            "atk-ded",
            "internal",
            json!([{"mode": "Exclusive", "count": 1}]),
            json!({}),
        ),
        tenant(
            "atk-tmp",
            "internal",
            json!([{"mode": "MIG", "profile": "1g.10gb", "count": 1}]),
            json!({}),
        ),
        plan(
            "atk-mig",
            json!({"devices": "all", "mode": "MIG", "mig": {"profiles": ["1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb"]}}),
        ),
        plan(
            "atk-mps",
            json!({"devices": "all", "mode": "MPS", "mps": {"maxClients": 4}}),
        ),
        plan(
            "atk-ts",
            json!({"devices": "all", "mode": "TimeSlicing", "timeSlicing": {"replicas": 4}}),
        ),
        plan(
            "atk-ded",
            json!({"devices": "all", "mode": "Exclusive", "tenants": ["atk-ded"]}),
        ),
        json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "atk-batch"}, "value": 100}),
        json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "atk-high"}, "value": 1000000}),
        json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "nvidia"}),
    ]
}

fn api_of(client: &Client, ns: &str, kind: &str) -> Api<DynamicObject> {
    let gvk = match kind {
        "Pod" | "ConfigMap" | "Secret" => GroupVersionKind::gvk("", "v1", kind),
        _ => GroupVersionKind::gvk("resource.k8s.io", "v1", kind),
    };
    let plural = match kind {
        "ResourceClaim" => "resourceclaims",
        "ResourceClaimTemplate" => "resourceclaimtemplates",
        "ConfigMap" => "configmaps",
        "Secret" => "secrets",
        _ => "pods",
    };
    Api::namespaced_with(client.clone(), ns, &ApiResource::from_gvk_with_plural(&gvk, plural))
}

/// A pod of one container `c` with `container` merged into it and `spec` merged into its spec.
fn pod(container: Value, spec: Value) -> Value {
    let mut c = json!({"name": "c", "image": "registry.invalid/cuda:12",
        "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]},
                            "runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}}});
    merge(&mut c, container);
    let mut p = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"}, "spec": {"containers": [c]}});
    merge(&mut p["spec"], spec);
    p
}

/// A pod mounting host path `path`.
fn host_path(path: &str) -> Value {
    pod(
        json!({}),
        json!({"volumes": [{"name": "d", "hostPath": {"path": path}}]}),
    )
}

/// What the node-files rule says, after the namespace it names ([`files_of`]).
const FILES: &str = "a hostPath volume may not reach the files that decide which GPU a container gets";

fn files_of(ns: &'static str) -> &'static str {
    match ns {
        NONE_NS => "namespace atk-none: ",
        _ => "namespace kube-public: ",
    }
}

fn gpus(limits: Value) -> Value {
    json!({"resources": {"limits": limits}})
}

fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

fn toleration(key: &str, value: &str) -> Value {
    json!({"tolerations": [{"key": key, "operator": "Equal", "value": value, "effect": "NoSchedule"}]})
}

struct Case {
    what: &'static str,
    ns: &'static str,
    object: Value,
    /// `None`: admitted. Otherwise every one of these is in the refusal.
    refused: Option<Vec<&'static str>>,
}

fn refused(what: &'static str, ns: &'static str, object: Value, says: &[&'static str]) -> Case {
    Case {
        what,
        ns,
        object,
        refused: Some(says.to_vec()),
    }
}

fn admitted(what: &'static str, ns: &'static str, object: Value) -> Case {
    Case {
        what,
        ns,
        object,
        refused: None,
    }
}

fn cases() -> Vec<Case> {
    let ext = "GpuTenant atk-ext (tier external)";
    let mps = "GpuTenant atk-mps (tier internal)";
    let ts = "GpuTenant atk-ts (tier experimental)";
    let none = "belongs to no GpuTenant";
    let claim = |class: &str| {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "probe"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": class}}]}}})
    };
    vec![
        // Legitimate pods of every tier.
        admitted(
            "a MIG instance it was granted",
            "atk-ext",
            pod(gpus(json!({"nvidia.com/mig-1g.10gb": 1})), json!({})),
        ),
        admitted(
            "an MPS share on an MPS node",
            "atk-mps",
            pod(
                gpus(json!({"nvidia.com/gpu.shared": 1})),
                toleration("gputenancy.io/sharing", "MPS"),
            ),
        ),
        admitted(
            "a time-slicing share, restricted Pod Security",
            "atk-ts",
            pod(
                gpus(json!({"nvidia.com/gpu.shared": 1})),
                toleration("gputenancy.io/sharing", "TimeSlicing"),
            ),
        ),
        admitted(
            "a whole GPU on its dedicated node",
            "atk-ded",
            pod(
                gpus(json!({"nvidia.com/gpu": 1})),
                json!({"nodeSelector": {"gputenancy.io/dedicated": "atk-ded"},
                       "tolerations": [{"key": "gputenancy.io/dedicated", "operator": "Equal", "value": "atk-ded", "effect": "NoSchedule"}]}),
            ),
        ),
        admitted(
            "a priority class its tier lists",
            "atk-mps",
            pod(json!({}), json!({"priorityClassName": "atk-batch"})),
        ),
        admitted("a CPU pod of no tenant", NONE_NS, pod(json!({}), json!({}))),
        admitted(
            "a hostPath of no device in a namespace of no tenant",
            NONE_NS,
            pod(
                json!({}),
                json!({"volumes": [{"name": "d", "hostPath": {"path": "/data/models"}}]}),
            ),
        ),
        // 1. GPUs outside the resource names.
        refused(
            "NVIDIA_VISIBLE_DEVICES=all without a GPU request",
            "atk-ext",
            pod(
                json!({"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}),
                json!({}),
            ),
            &[ext, "device-selecting variables"],
        ),
        refused(
            "NVIDIA_VISIBLE_DEVICES in a namespace of no tenant",
            NONE_NS,
            pod(
                json!({"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}),
                json!({}),
            ),
            &[none, "device-selecting variables"],
        ),
        refused(
            "NVIDIA_VISIBLE_DEVICES in an init container",
            "atk-mps",
            pod(
                json!({}),
                json!({"initContainers": [{"name": "i", "image": "x", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]}),
            ),
            &[mps, "device-selecting variables"],
        ),
        refused(
            "an envFrom prefix that starts NVIDIA_VISIBLE_DEVICES",
            "atk-mps",
            pod(
                json!({"envFrom": [{"prefix": "NVIDIA_", "configMapRef": {"name": "anything"}}]}),
                json!({}),
            ),
            &[mps, "envFrom prefix"],
        ),
        refused(
            "a ConfigMap key named NVIDIA_VISIBLE_DEVICES (envFrom without a prefix)",
            "atk-mps",
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "probe"}, "data": {"NVIDIA_VISIBLE_DEVICES": "all"}}),
            &[
                "namespace atk-mps (labelled gputenancy.io/tenant=atk-mps)",
                "rename the key",
            ],
        ),
        refused(
            "a Secret key named NVIDIA_MIG_CONFIG_DEVICES",
            NONE_NS,
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "probe"}, "stringData": {"NVIDIA_MIG_CONFIG_DEVICES": "all"}}),
            &["namespace atk-none (no GpuTenant label)"],
        ),
        // 1b. Limits a pod could raise: the node sets them from the plan.
        refused(
            "NVIDIA_GPU_MEMORY_LIMIT with an MPS share (the toolkit's driver cap)",
            "atk-mps",
            pod(
                merge_into(
                    gpus(json!({"nvidia.com/gpu.shared": 1})),
                    json!({"env": [{"name": "NVIDIA_GPU_MEMORY_LIMIT", "value": "81920"}]}),
                ),
                toleration("gputenancy.io/sharing", "MPS"),
            ),
            &[mps, "GPU limits"],
        ),
        refused(
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT in an init container",
            "atk-mps",
            pod(
                json!({}),
                json!({"initContainers": [{"name": "i", "image": "x", "env": [{"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=80G"}]}]}),
            ),
            &[mps, "GPU limits"],
        ),
        refused(
            "CUDA_DEVICE_MEMORY_LIMIT_0 (HAMi's) in a namespace of no tenant",
            NONE_NS,
            pod(
                json!({"env": [{"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "80g"}]}),
                json!({}),
            ),
            &[none, "GPU limits"],
        ),
        refused(
            "an envFrom prefix CUDA_ that a key MPS_ACTIVE_THREAD_PERCENTAGE completes",
            "atk-ts",
            pod(
                json!({"envFrom": [{"prefix": "CUDA_", "secretRef": {"name": "anything"}}]}),
                json!({}),
            ),
            &["GPU limits"],
        ),
        refused(
            "an envFrom prefix that starts with NVIDIA_GPU_MEMORY_",
            "atk-ext",
            pod(
                json!({"envFrom": [{"prefix": "NVIDIA_GPU_MEMORY_LIMIT", "configMapRef": {"name": "anything"}}]}),
                json!({}),
            ),
            &[ext, "GPU limits"],
        ),
        refused(
            "a ConfigMap key named NVIDIA_GPU_MEMORY_LIMIT (envFrom without a prefix)",
            "atk-mps",
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "probe-limit"}, "data": {"NVIDIA_GPU_MEMORY_LIMIT": "81920"}}),
            &["GPU limit", "rename the key"],
        ),
        refused(
            "a Secret key named CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (binary data)",
            NONE_NS,
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "probe-limit"}, "data": {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "MTAw"}}),
            &["GPU limit"],
        ),
        admitted(
            "an envFrom prefix and a variable of its own that set no limit",
            "atk-mps",
            pod(
                json!({"env": [{"name": "CUDA_VISIBLE_ORDER", "value": "x"}], "envFrom": [{"prefix": "APP_", "configMapRef": {"name": "anything"}}]}),
                json!({}),
            ),
        ),
        refused(
            "a privileged container in a namespace of no tenant",
            NONE_NS,
            pod(
                json!({"securityContext": {"privileged": true, "allowPrivilegeEscalation": true}}),
                json!({}),
            ),
            &[none, "privileged"],
        ),
        refused(
            "SYS_ADMIN in a namespace of no tenant (the toolkit's test for privileged)",
            NONE_NS,
            pod(
                json!({"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}),
                json!({}),
            ),
            &[none, "SYS_ADMIN"],
        ),
        refused(
            "a privileged container in a tenant namespace (Pod Security baseline first)",
            "atk-mps",
            pod(
                json!({"securityContext": {"privileged": true, "allowPrivilegeEscalation": true}}),
                json!({}),
            ),
            &["violates PodSecurity \"baseline:latest\"", "privileged"],
        ),
        refused(
            "a hostPath of /dev in a namespace of no tenant",
            NONE_NS,
            pod(
                json!({}),
                json!({"volumes": [{"name": "d", "hostPath": {"path": "/dev"}}]}),
            ),
            &[none, "hostPath volume may not reach /dev"],
        ),
        // `/` and an alias are refused by the device rules and the node-files rule alike; the
        // API server answers with either's message.
        refused(
            "a hostPath of / in a namespace of no tenant",
            NONE_NS,
            host_path("/"),
            &["nor a directory above them"],
        ),
        refused(
            "the kubelet's device plugin socket, by an alias",
            NONE_NS,
            host_path("/var/lib//kubelet/device-plugins"),
            &["hostPath", "//"],
        ),
        // The files that decide which GPU a container gets and whether it is scrubbed first.
        refused(
            "the runtime's CDI specs",
            NONE_NS,
            host_path("/var/run/cdi"),
            &[files_of(NONE_NS), FILES],
        ),
        refused(
            "the runtime's CDI specs through /run",
            NONE_NS,
            host_path("/run/cdi"),
            &[files_of(NONE_NS), FILES],
        ),
        refused(
            "the static CDI specs, a trailing slash",
            NONE_NS,
            host_path("/etc/cdi/"),
            &[files_of(NONE_NS), FILES],
        ),
        refused(
            "the agent's state (the DRA checkpoint)",
            NONE_NS,
            host_path("/var/lib/gpu-tenancy"),
            &[files_of(NONE_NS), FILES],
        ),
        refused(
            "NVIDIA's container toolkit configuration",
            NONE_NS,
            host_path("/etc/nvidia-container-runtime"),
            &[files_of(NONE_NS), FILES],
        ),
        refused(
            "every host path again through /proc/1/root",
            NONE_NS,
            host_path("/proc/1/root/var/lib/kubelet"),
            &[files_of(NONE_NS), FILES],
        ),
        refused(
            "the CDI specs from a namespace exempt from the tenancy rules",
            "kube-public",
            host_path("/var/run/cdi"),
            &[files_of("kube-public"), FILES],
        ),
        admitted(
            "a hostPath beside the CDI specs in an exempt namespace",
            "kube-public",
            host_path("/var/log/pods"),
        ),
        refused(
            "a volume mounted where the toolkit reads device lists",
            "atk-ext",
            pod(
                json!({"volumeMounts": [{"name": "e", "mountPath": "/var/run/nvidia-container-devices/all"}]}),
                json!({"volumes": [{"name": "e", "emptyDir": {}}]}),
            ),
            &[ext, "nvidia-container-devices"],
        ),
        refused(
            "a CDI annotation NVIDIA's NRI plugin would honour",
            "atk-ext",
            merge_into(
                pod(json!({}), json!({})),
                json!({"metadata": {"annotations": {"nvidia.cdi.k8s.io/container.c": "nvidia.com/gpu=all"}}}),
            ),
            &[ext, "CDI device annotations"],
        ),
        refused(
            "NVIDIA's runtime class without a GPU",
            "atk-mps",
            pod(json!({}), json!({"runtimeClassName": "nvidia"})),
            &[mps, "runtime class"],
        ),
        // 2. Namespaces that escape every policy.
        refused(
            "a namespace labelled with a real tenant's name tolerating its dedicated nodes",
            FORGED_NS,
            pod(json!({}), toleration("gputenancy.io/dedicated", "atk-ded")),
            &[none, "may not tolerate the taints of GPU nodes"],
        ),
        refused(
            "a namespace labelled with a real tenant's name asking for its GPU",
            FORGED_NS,
            pod(gpus(json!({"nvidia.com/gpu": 8})), json!({})),
            &[none, "its pods get no GPUs"],
        ),
        // 3. Only the modes it was granted.
        refused(
            "a time-slicing tenant tolerating the MPS taint",
            "atk-ts",
            pod(
                gpus(json!({"nvidia.com/gpu.shared": 1})),
                toleration("gputenancy.io/sharing", "MPS"),
            ),
            &[ts, "a mode it holds shares of (TimeSlicing)"],
        ),
        refused(
            "an MPS tenant tolerating every sharing taint",
            "atk-mps",
            pod(
                gpus(json!({"nvidia.com/gpu.shared": 1})),
                json!({"tolerations": [{"key": "gputenancy.io/sharing", "operator": "Exists"}]}),
            ),
            &[mps, "only with operator Equal"],
        ),
        // 4. An allow-list of resource names.
        refused(
            "a MIG profile no one granted (and no quota lists)",
            "atk-ext",
            pod(gpus(json!({"nvidia.com/mig-7g.80gb": 1})), json!({})),
            &[
                ext,
                "may not use nvidia.com/mig-7g.80gb",
                "it was granted nvidia.com/mig-1g.10gb",
            ],
        ),
        refused(
            "the operator's own resource prefix",
            "atk-ext",
            pod(gpus(json!({"gputenancy.io/anything": 1})), json!({})),
            &[ext, "may not use gputenancy.io/anything"],
        ),
        // 5. maxGpusPerPod counts what the pod holds.
        refused(
            "a sidecar holding a second GPU",
            "atk-ext",
            pod(
                gpus(json!({"nvidia.com/mig-1g.10gb": 1})),
                json!({"initContainers": [{"name": "s", "image": "x", "restartPolicy": "Always", "resources": {"limits": {"nvidia.com/mig-1g.10gb": 1}}}]}),
            ),
            &[ext, "at most 1 GPUs per pod", "holds 2 at once"],
        ),
        admitted(
            "an init container that ends before the one GPU of the pod",
            "atk-ext",
            pod(
                gpus(json!({"nvidia.com/mig-1g.10gb": 1})),
                json!({"initContainers": [{"name": "i", "image": "x", "resources": {"limits": {"nvidia.com/mig-1g.10gb": 1}},
                    "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}]}),
            ),
        ),
        // 6. No preemption across tenants.
        refused(
            "system-node-critical",
            "atk-ext",
            pod(json!({}), json!({"priorityClassName": "system-node-critical"})),
            &[ext, "PriorityClasses its tier lists (none"],
        ),
        refused(
            "a class above the tier's",
            "atk-mps",
            pod(json!({}), json!({"priorityClassName": "atk-high"})),
            &[mps, "PriorityClasses its tier lists (atk-batch)"],
        ),
        // 7. DRA claims.
        refused(
            "a claim for NVIDIA's GPU class",
            "atk-ext",
            claim("gpu.nvidia.com"),
            &[
                ext,
                "may not name device class gpu.nvidia.com",
                "its own device classes are none",
            ],
        ),
        refused(
            "a claim in a namespace of no tenant",
            NONE_NS,
            claim("anything"),
            &[none, "may not name device class anything", "gets no GPU device"],
        ),
        refused(
            "a claim template with a first-available alternative",
            "atk-mps",
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "probe"},
                "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": [{"name": "a", "deviceClassName": "mig.nvidia.com"}]}]}}}}),
            &[mps, "device class mig.nvidia.com"],
        ),
        // 8. Namespaces with no tenant stay off GPU nodes.
        refused(
            "a node named by a pod of no tenant",
            NONE_NS,
            pod(json!({}), json!({"nodeName": "atk-mig-0"})),
            &[none, "may not name their node"],
        ),
        refused(
            "the scrub-pending taint tolerated by a pod of no tenant",
            NONE_NS,
            pod(json!({}), toleration("gputenancy.io/scrub-pending", "true")),
            &[none, "gputenancy.io/scrub-pending"],
        ),
        // Beyond the list: what else an edit-role user can write.
        refused(
            "tolerating every dedicated node",
            "atk-mps",
            pod(
                json!({}),
                json!({"tolerations": [{"key": "gputenancy.io/dedicated", "operator": "Exists"}]}),
            ),
            &[mps, "only its own dedicated nodes"],
        ),
        refused(
            "a toleration with an empty key",
            "atk-ded",
            pod(json!({}), json!({"tolerations": [{"key": "", "operator": "Exists"}]})),
            &["GpuTenant atk-ded", "tolerates every taint"],
        ),
        refused(
            "a tenant naming a node",
            "atk-ded",
            pod(gpus(json!({"nvidia.com/gpu": 1})), json!({"nodeName": "atk-ded-0"})),
            &["GpuTenant atk-ded", "may not name its node"],
        ),
    ]
}

fn merge_into(mut a: Value, b: Value) -> Value {
    merge(&mut a, b);
    a
}

/// Creates `object` in `ns` as `client`, as a dry run unless `real`.
async fn create(client: &Client, ns: &str, object: &Value, real: bool) -> Result<(), String> {
    let obj: DynamicObject = serde_json::from_value(object.clone()).unwrap();
    let kind = object["kind"].as_str().unwrap();
    let pp = PostParams {
        dry_run: !real,
        ..PostParams::default()
    };
    outcome(api_of(client, ns, kind).create(&pp, &obj).await)
}

/// What is wrong with the outcome of a case, if anything.
fn check(case: &str, ns: &str, got: &Result<(), String>, refused: Option<&[&str]>) -> Option<String> {
    match (refused, got) {
        (None, Ok(())) => None,
        (None, Err(e)) => Some(format!("{case} ({ns}): refused: {e}")),
        (Some(says), Err(e)) => {
            let missing: Vec<&&str> = says.iter().filter(|s| !e.contains(**s)).collect();
            (!missing.is_empty()).then(|| format!("{case} ({ns}): refused, but without {missing:?}: {e}"))
        }
        (Some(_), Ok(())) => Some(format!("{case} ({ns}): ADMITTED")),
    }
}

/// The edit role in `ns` for user `dev@<ns>`; returns a client acting as that user.
async fn developer(cleanup: &Cleanup, ns: &str) -> Client {
    let user = format!("dev@{ns}");
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "atk-developers", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]});
    apply_docs_as_kubectl(&[binding], "the developers' RoleBinding").await;
    let _ = cleanup;
    impersonating(&user, &["system:authenticated"], None).await
}

async fn wait_for_namespace(client: &Client, ns: &str) {
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    while api.get_opt(ns).await.unwrap().is_none() {
        assert!(Instant::now() < deadline, "namespace {ns} was not created");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn every_way_around_tenant_isolation_is_refused_by_the_api_server() {
    let cleanup = Cleanup::new();
    let client = setup(&cleanup).await;
    let docs = world();
    cleanup.add_docs(&docs);
    for pc in ["atk-batch", "atk-high"] {
        cleanup.add_resource("priorityclasses.scheduling.k8s.io", pc);
    }
    cleanup.add_resource("runtimeclasses.node.k8s.io", "nvidia");
    apply_docs_as_kubectl(&docs, "the attack world").await;
    for pool in ["atk-mig", "atk-mps", "atk-ts", "atk-ded"] {
        h100_pool(&client, &cleanup, pool, 1).await;
    }
    create_namespace(&client, &cleanup, NONE_NS, &[]).await;
    // Someone who may label namespaces gives one a real tenant's name (and one a ghost's).
    create_namespace(&client, &cleanup, FORGED_NS, &[("gputenancy.io/tenant", "atk-ded")]).await;
    let c = start_controller(&client).await;
    converge(&client, &c).await;
    for t in ["atk-ext", "atk-mps", "atk-ts", "atk-ded", "atk-tmp"] {
        cleanup.add_resource("namespaces", t);
        wait_for_namespace(&client, t).await;
    }
    let mut users = std::collections::BTreeMap::new();
    for ns in ["atk-ext", "atk-mps", "atk-ts", "atk-ded", "atk-tmp", NONE_NS, FORGED_NS] {
        users.insert(ns, developer(&cleanup, ns).await);
    }
    // An exempt namespace (no tenancy rule judges it) is still refused the node's hand-over files.
    let exempt = developer(&cleanup, "kube-public").await;
    let p = host_path("/var/run/cdi");
    eventually(
        "the node-files rule reaches kube-public",
        || {
            let (u, p) = (exempt.clone(), p.clone());
            async move { create(&u, "kube-public", &p, false).await }
        },
        |r| r.as_ref().is_err_and(|e| e.contains(FILES)),
    )
    .await
    .unwrap_err();
    users.insert("kube-public", exempt);
    // Policies and RoleBindings reach the API server's caches a moment after they are written.
    // A tenant namespace is reached once its tenant's rules judge it (they refuse the probe,
    // naming NVIDIA's device-selecting variables) and the no-tenant rules no longer do. The
    // refusal alone cannot show the second: while a namespace moves it is under both policies,
    // and the API server answers with the first denial in its own list of policies, an order the
    // test cannot know (a CI run got the tenant's message, then the no-tenant rules refused the
    // first legitimate cases).
    // So a tenant namespace must also admit, dry-run, a pod only the no-tenant rules refuse: one
    // tolerating its own tenant's dedicated nodes.
    let untenanted = "belongs to no GpuTenant";
    let probe = pod(
        json!({"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}),
        json!({}),
    );
    for ns in users.keys().filter(|ns| **ns != "kube-public") {
        let u = users[ns].clone();
        let p = probe.clone();
        eventually(
            &format!("the rules reach namespace {ns}"),
            || {
                let (u, p) = (u.clone(), p.clone());
                async move { create(&u, ns, &p, false).await }
            },
            |r| {
                r.as_ref().is_err_and(|e| {
                    e.contains("device-selecting") && (e.contains(untenanted) == [NONE_NS, FORGED_NS].contains(ns))
                })
            },
        )
        .await
        .unwrap_err();
        let own_nodes = pod(json!({}), toleration("gputenancy.io/dedicated", ns));
        let tenanted = ![NONE_NS, FORGED_NS].contains(ns);
        let _ = eventually(
            &format!("namespace {ns} under only its tenant's rules"),
            || {
                let (u, p) = (u.clone(), own_nodes.clone());
                async move { create(&u, ns, &p, false).await }
            },
            |r| match r {
                Ok(()) => tenanted,
                Err(e) => !tenanted && e.contains(untenanted),
            },
        )
        .await;
    }

    let mut failures = Vec::new();
    let cases = cases();
    for case in &cases {
        let got = create(&users[case.ns], case.ns, &case.object, false).await;
        eprintln!(
            "{:<9} {:<70} {}",
            if got.is_ok() { "admitted" } else { "refused" },
            format!("{} ({})", case.what, case.ns),
            got.as_ref()
                .err()
                .map(|e| e.chars().take(160).collect::<String>())
                .unwrap_or_default()
        );
        failures.extend(check(case.what, case.ns, &got, case.refused.as_deref()));
    }
    eprintln!("MEASURE {} attack and legitimate cases on the API server", cases.len());

    failures.extend(updates_and_ephemeral_containers(&client, &users).await);
    failures.extend(no_tenant_pods_keep_off_gpu_nodes(&client, &users, &c).await);
    failures.extend(quota_is_enforced(&client, &users["atk-mps"]).await);
    assert!(
        failures.is_empty(),
        "{} of the cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );

    agents_cannot_evict_and_the_controller_evicts_only_on_the_asking_node(&client, &cleanup, &c).await;
    a_deleted_tenant_keeps_its_rules_until_the_no_tenant_rules_hold(&client, &c, &users["atk-tmp"]).await;
}

/// What an update can add: a toleration, an annotation, an ephemeral container.
async fn updates_and_ephemeral_containers(
    admin: &Client,
    users: &std::collections::BTreeMap<&str, Client>,
) -> Vec<String> {
    let mut failures = Vec::new();
    let name = "atk-running";
    let running = merge_into(pod(json!({}), json!({})), json!({"metadata": {"name": name}}));
    create(&users["atk-ext"], "atk-ext", &running, true).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(users["atk-ext"].clone(), "atk-ext");
    let add = |p: Value| {
        let pods = pods.clone();
        async move { outcome(pods.patch(name, &PatchParams::default(), &Patch::Merge(p)).await) }
    };
    let got =
        add(json!({"spec": {"tolerations": [{"key": "gputenancy.io/scrub-pending", "operator": "Exists"}]}})).await;
    failures.extend(check(
        "a toleration added by an update",
        "atk-ext",
        &got,
        Some(&["scrub-pending"]),
    ));
    let got = add(json!({"metadata": {"annotations": {"cdi.k8s.io/gpu": "nvidia.com/gpu=all"}}})).await;
    failures.extend(check(
        "a CDI annotation added by an update",
        "atk-ext",
        &got,
        Some(&["CDI"]),
    ));
    let got = add(json!({"metadata": {"labels": {"app": "trainer"}}})).await;
    failures.extend(check("a label added by an update", "atk-ext", &got, None));
    // `kubectl debug`: an ephemeral container through its subresource.
    let admin_pods: Api<Pod> = Api::namespaced(admin.clone(), "atk-ext");
    for (container, variable, says) in [
        ("debug", "NVIDIA_VISIBLE_DEVICES", "device-selecting"),
        ("debug-limits", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "GPU limits"),
    ] {
        let debug = json!({"spec": {"ephemeralContainers": [{"name": container, "image": "x",
            "env": [{"name": variable, "value": "all"}]}]}});
        let got = outcome(
            admin_pods
                .patch_subresource(
                    "ephemeralcontainers",
                    name,
                    &PatchParams::default(),
                    &Patch::Strategic(debug),
                )
                .await,
        );
        failures.extend(check(
            &format!("an ephemeral container with {variable}"),
            "atk-ext",
            &got,
            Some(&[says]),
        ));
    }
    admin_pods.delete(name, &DeleteParams::default()).await.unwrap();
    failures.extend(gated_pods_and_other_updates(admin, &users["atk-ext"]).await);
    failures
}

/// A gated pod's node selector and affinity can still change, a resize can change resources,
/// and the binding subresource places a pod: each is judged as at creation, or refused.
async fn gated_pods_and_other_updates(admin: &Client, dev: &Client) -> Vec<String> {
    let mut failures = Vec::new();
    let name = "atk-gated";
    let gated = merge_into(
        pod(json!({}), json!({"schedulingGates": [{"name": "example.com/wait"}]})),
        json!({"metadata": {"name": name}}),
    );
    create(dev, "atk-ext", &gated, true).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(dev.clone(), "atk-ext");
    let patch = |p: Value| {
        let pods = pods.clone();
        async move { outcome(pods.patch(name, &PatchParams::default(), &Patch::Merge(p)).await) }
    };
    let got = patch(json!({"spec": {"nodeSelector": {"gputenancy.io/dedicated": "atk-ded"}}})).await;
    failures.extend(check(
        "a gated pod's update selecting another tenant's dedicated nodes",
        "atk-ext",
        &got,
        Some(&["GpuTenant atk-ext", "only its own dedicated nodes"]),
    ));
    let got = patch(json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
        {"nodeSelectorTerms": [{"matchExpressions": [{"key": "gputenancy.io/dedicated", "operator": "In", "values": ["atk-ded"]}]}]}}}}}))
    .await;
    failures.extend(check(
        "a gated pod's update requiring another tenant's dedicated nodes by affinity",
        "atk-ext",
        &got,
        Some(&["GpuTenant atk-ext", "only its own dedicated nodes"]),
    ));
    let got = patch(json!({"spec": {"nodeSelector": {"topology.kubernetes.io/zone": "a"}}})).await;
    failures.extend(check("a gated pod's update selecting a zone", "atk-ext", &got, None));
    let got = outcome(
        pods.patch_subresource(
            "resize",
            name,
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/mig-7g.80gb": 1}}}]}})),
        )
        .await,
    );
    failures.extend(check(
        "a resize adding a GPU no one granted",
        "atk-ext",
        &got,
        Some(&[]),
    ));
    // The scheduler's verb: Kubernetes' edit role does not grant it.
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "atk-ded-0"}});
    let got = outcome(
        pods.create_subresource::<Value, Value>("binding", name, &PostParams::default(), &binding)
            .await,
    );
    failures.extend(check(
        "binding a pod to another tenant's dedicated node",
        "atk-ext",
        &got,
        Some(&["forbidden"]),
    ));
    Api::<Pod>::namespaced(admin.clone(), "atk-ext")
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    failures
}

/// The required node affinity of `pod` as returned by the API server: per term, its expressions
/// as `key operator`.
fn required_terms(pod: &Pod) -> Vec<Vec<String>> {
    pod.spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref())
        .map(|r| {
            r.node_selector_terms
                .iter()
                .map(|t| {
                    t.match_expressions
                        .iter()
                        .flatten()
                        .map(|e| format!("{} {}", e.key, e.operator))
                        .collect()
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Pods of a namespace of no tenant get a required node affinity that keeps them off every GPU
/// node (every term, their own kept); a tenant's or an exempt namespace's pods are left alone;
/// without the mutating policy, a pod of no tenant is refused, not let onto GPU nodes.
async fn no_tenant_pods_keep_off_gpu_nodes(
    admin: &Client,
    users: &std::collections::BTreeMap<&str, Client>,
    c: &gpu_tenancy::controller::Controller,
) -> Vec<String> {
    let mut failures = Vec::new();
    let off = [
        "gputenancy.io/device-access DoesNotExist",
        "nvidia.com/gpu.present DoesNotExist",
    ];
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let returned = |client: &Client, ns: &str, p: Value| {
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        let dry = dry.clone();
        async move { api.create(&dry, &serde_json::from_value(p).unwrap()).await }
    };
    let plain = returned(&users[NONE_NS], NONE_NS, pod(json!({}), json!({})))
        .await
        .unwrap();
    if required_terms(&plain) != [off.map(String::from).to_vec()] {
        failures.push(format!(
            "a pod of no tenant was not kept off GPU nodes: {:?}",
            required_terms(&plain)
        ));
    }
    let own = pod(
        json!({}),
        json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["atk-mig-0"]}]}]}}}}),
    );
    let got = required_terms(&returned(&users[NONE_NS], NONE_NS, own).await.unwrap());
    let want = vec![
        vec![
            "topology.kubernetes.io/zone In".to_string(),
            off[0].into(),
            off[1].into(),
        ],
        off.map(String::from).to_vec(),
    ];
    if got != want {
        failures.push(format!(
            "a pod of no tenant with two node affinity terms (a DaemonSet's names its node by a field): {got:?}"
        ));
    }
    for (ns, client) in [("atk-mps", &users["atk-mps"]), ("kube-public", admin)] {
        let p = returned(client, ns, pod(json!({}), json!({}))).await.unwrap();
        if !required_terms(&p).is_empty() {
            failures.push(format!(
                "a pod of {ns} was given a node affinity: {:?}",
                required_terms(&p)
            ));
        }
    }
    // Fail closed: with the mutating policy's binding gone, the validating rule refuses.
    let bindings: Api<k8s_openapi::api::admissionregistration::v1::MutatingAdmissionPolicyBinding> =
        Api::all(admin.clone());
    bindings
        .delete(gpu_tenancy::desired::OFF_GPU_NODES, &DeleteParams::default())
        .await
        .unwrap();
    let dev = users[NONE_NS].clone();
    let plain = pod(json!({}), json!({}));
    let got = eventually(
        "a pod of no tenant refused without the mutating policy",
        || {
            let (d, p) = (dev.clone(), plain.clone());
            async move { create(&d, NONE_NS, &p, false).await }
        },
        |r| r.is_err(),
    )
    .await;
    failures.extend(check(
        "a pod of no tenant without the affinity that keeps it off GPU nodes",
        NONE_NS,
        &got,
        Some(&["belongs to no GpuTenant", "stay off GPU nodes"]),
    ));
    pass(c).await;
    let got = eventually(
        "the controller puts the mutating policy's binding back",
        || {
            let (d, p) = (dev.clone(), plain.clone());
            async move { create(&d, NONE_NS, &p, false).await }
        },
        |r| r.is_ok(),
    )
    .await;
    failures.extend(check(
        "a pod of no tenant once the binding is back",
        NONE_NS,
        &got,
        None,
    ));
    failures
}

/// The quota controller computes the quota's status, and the API server refuses what is beyond it.
async fn quota_is_enforced(admin: &Client, dev: &Client) -> Vec<String> {
    let quotas: Api<ResourceQuota> = Api::namespaced(admin.clone(), "atk-mps");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let q = quotas.get("gpu-tenancy").await.unwrap();
        let hard = q.status.and_then(|s| s.hard).unwrap_or_default();
        if hard.get("requests.nvidia.com/gpu.shared").map(|q| q.0.as_str()) == Some("2") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the quota controller never set the quota's status: {hard:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let share = |n: u32, name: &str| {
        merge_into(
            pod(
                gpus(json!({"nvidia.com/gpu.shared": n})),
                toleration("gputenancy.io/sharing", "MPS"),
            ),
            json!({"metadata": {"name": name}}),
        )
    };
    let mut failures = Vec::new();
    let got = create(dev, "atk-mps", &share(500, "atk-500"), false).await;
    failures.extend(check(
        "500 shares of a grant of 2",
        "atk-mps",
        &got,
        Some(&["exceeded quota: gpu-tenancy", "requests.nvidia.com/gpu.shared"]),
    ));
    let got = create(dev, "atk-mps", &share(1, "atk-one"), true).await;
    failures.extend(check("one share of two", "atk-mps", &got, None));
    // Usage is counted at once by the admission plugin; the controller's status follows.
    let got = create(dev, "atk-mps", &share(2, "atk-two"), true).await;
    failures.extend(check(
        "two more shares with one in use",
        "atk-mps",
        &got,
        Some(&["exceeded quota"]),
    ));
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "atk-mps");
    let _ = pods.delete("atk-one", &DeleteParams::default()).await;
    failures
}

/// Item 9: the agent may not evict at all; the controller evicts what an agent asks only if the
/// pod is on that agent's node.
async fn agents_cannot_evict_and_the_controller_evicts_only_on_the_asking_node(
    admin: &Client,
    cleanup: &Cleanup,
    c: &gpu_tenancy::controller::Controller,
) {
    let ns = "kube-system"; // exempt: a pod may name its node there
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let mk = |name: &str, node: &str| -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/mig-1g.10gb": 1}}}]}}))
        .unwrap()
    };
    let here = pods
        .create(&PostParams::default(), &mk("atk-here", "atk-mig-0"))
        .await
        .unwrap();
    let there = pods
        .create(&PostParams::default(), &mk("atk-there", "atk-mps-0"))
        .await
        .unwrap();
    let _ = cleanup;
    // The agent's token, bound to its pod on atk-mig-0: no Eviction at all.
    let extra = std::collections::HashMap::from([(
        "authentication.kubernetes.io/node-name".to_string(),
        vec!["atk-mig-0".to_string()],
    )]);
    let agent = impersonating(
        "system:serviceaccount:gpu-tenancy-system:gpu-tenancy-agent",
        &gpu_tenancy_e2e::access::OPERATOR_SA_GROUPS,
        Some(extra),
    )
    .await;
    apply_docs_as_kubectl(
        &gpu_tenancy_e2e::yaml_docs(&gpu_tenancy_e2e::repo_root().join("deploy/base/agent-rbac.yaml")),
        "the agent's RBAC",
    )
    .await;
    let as_agent: Api<Pod> = Api::namespaced(agent, ns);
    let refused = eventually(
        "the agent's RBAC is in place",
        || {
            let a = as_agent.clone();
            async move {
                match a.list(&Default::default()).await {
                    Ok(_) => outcome(a.evict("atk-here", &Default::default()).await),
                    // The agent's list grant has not reached the authorizer yet.
                    Err(_) => Ok(()),
                }
            }
        },
        |r| r.is_err(),
    )
    .await
    .unwrap_err();
    assert!(
        refused.contains("cannot create resource \"pods/eviction\"") && refused.contains("(403)"),
        "{refused}"
    );

    // Its agent asks the controller for both; atk-mig's plan says busyGpuPolicy Evict.
    let gn: Api<GpuNode> = Api::all(admin.clone());
    let mut status: GpuNodeStatus = gn.get("atk-mig-0").await.unwrap().status.unwrap();
    assert_eq!(
        gn.get("atk-mig-0").await.unwrap().spec.busy_gpu_policy,
        gpu_tenancy::api::BusyGpuPolicy::Evict
    );
    status.eviction_requests = [&here, &there]
        .iter()
        .map(|p| EvictionRequest {
            namespace: ns.into(),
            name: p.name_any(),
            uid: p.uid().unwrap(),
            gpus: vec![0],
        })
        .collect();
    write_status(admin, "atk-mig-0", &status).await;
    let writes = pass(c).await;
    eprintln!("MEASURE the pass after two eviction requests: {writes:?}");
    let gone = |name: &str| {
        let pods = pods.clone();
        let name = name.to_string();
        async move { pods.get(&name).await.unwrap().metadata.deletion_timestamp.is_some() }
    };
    assert!(gone("atk-here").await, "the pod on the asking node was not evicted");
    assert!(
        !gone("atk-there").await,
        "a pod on another node was evicted at atk-mig-0's request"
    );
    status.eviction_requests.clear();
    write_status(admin, "atk-mig-0", &status).await;
    for p in ["atk-here", "atk-there"] {
        let _ = pods
            .delete(
                p,
                &DeleteParams {
                    grace_period_seconds: Some(0),
                    ..DeleteParams::default()
                },
            )
            .await;
    }
}

/// Item 2: deleting a tenant with no controller running leaves its rules (and garbage collection,
/// which runs, takes nothing: they have no owner); the passes that follow move its namespace to
/// the no-tenant rules with a rule set in force after each.
async fn a_deleted_tenant_keeps_its_rules_until_the_no_tenant_rules_hold(
    admin: &Client,
    c: &gpu_tenancy::controller::Controller,
    dev: &Client,
) {
    let tenants: Api<GpuTenant> = Api::all(admin.clone());
    tenants.delete("atk-tmp", &DeleteParams::default()).await.unwrap();
    // The garbage collector's sync period is 2 s: give it several.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let everything = pod(json!({}), json!({"tolerations": [{"operator": "Exists"}]}));
    let got = create(dev, "atk-tmp", &everything, false).await;
    // Its policies' parameter (the tenant) is gone: its bindings refuse everything they match.
    assert!(
        got.as_ref().is_err_and(|e| e.contains("gputenancy.io-tenant-atk-tmp")),
        "with the tenant deleted and no controller pass, its bindings still refuse: {got:?}"
    );
    let cpu = pod(json!({"resources": {"requests": {"cpu": "10m"}}}), json!({}));
    let got = create(dev, "atk-tmp", &cpu, false).await;
    assert!(
        got.as_ref().is_err_and(|e| e.contains("gputenancy.io-tenant-atk-tmp")),
        "with the tenant deleted, even a pod asking for no GPU waits for the no-tenant rules: {got:?}"
    );
    eprintln!("MEASURE a deleted tenant's namespace before the controller's pass: {got:?}");
    let quota = Api::<ResourceQuota>::namespaced(admin.clone(), "atk-tmp")
        .get_opt("gpu-tenancy")
        .await
        .unwrap();
    assert!(
        quota.is_some(),
        "the deleted tenant's quota stays until the controller removes it"
    );
    let mut passes = 0;
    loop {
        let w = pass(c).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let got = create(dev, "atk-tmp", &everything, false).await;
        assert!(
            got.is_err(),
            "after pass {passes} ({w:?}) a pod tolerating every taint was admitted"
        );
        passes += 1;
        if w.is_empty() || passes > 6 {
            break;
        }
    }
    let mig = pod(gpus(json!({"nvidia.com/mig-1g.10gb": 1})), json!({}));
    let got = eventually(
        "the namespace is under the no-tenant rules",
        || {
            let (d, m) = (dev.clone(), mig.clone());
            async move { create(&d, "atk-tmp", &m, false).await }
        },
        |r| r.as_ref().is_err_and(|e| e.contains("belongs to no GpuTenant")),
    )
    .await;
    eprintln!("MEASURE a deleted tenant's namespace moved to the no-tenant rules in {passes} passes: {got:?}");
    let out = kubectl_async(vec!["get".into(), "validatingadmissionpolicybindings".into()])
        .await
        .ok();
    assert!(!out.contains("gputenancy.io-tenant-atk-tmp"), "{out}");
}
