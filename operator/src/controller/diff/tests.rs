//! Exactly which requests a pass makes, for a small fleet: a first pass writes everything, a pass
//! over what it wrote writes nothing, a change writes only what it changes.

use super::*;
use crate::api::{GpuNodeStatus, GpuStatus};
use crate::controller::desired_of;
use crate::controller::kinds::KUEUE_KINDS;
use crate::desired::Settings;
use crate::planner::fixtures::{TenantBuilder, mig_group, now, plan_for, policy};
use k8s_openapi::api::core::v1::{Node, NodeSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;
use std::sync::Arc;

pub(crate) fn cluster_node(name: &str, pool: &str, others_taint: bool) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([
                ("pool".to_string(), pool.to_string()),
                ("kubernetes.io/hostname".to_string(), name.to_string()),
            ])),
            resource_version: Some("7".into()),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            taints: others_taint.then(|| {
                vec![Taint {
                    key: "node.kubernetes.io/unschedulable".into(),
                    effect: "NoSchedule".into(),
                    ..Taint::default()
                }]
            }),
            ..NodeSpec::default()
        }),
        ..Node::default()
    }
}

/// A GpuNode as its agent publishes it: two H100s, nothing applied yet.
pub(crate) fn reported(name: &str) -> GpuNode {
    let mut n = GpuNode::new(name, Default::default());
    n.metadata.generation = Some(1);
    n.status = Some(GpuNodeStatus {
        gpu_count: Some(2),
        gpus: (0..2)
            .map(|i| GpuStatus {
                index: i,
                uuid: format!("GPU-{name}-{i}"),
                name: "NVIDIA H100 80GB HBM3".into(),
                pci_device_id: "0x233010DE".into(),
                memory_mib: 81559,
                ..GpuStatus::default()
            })
            .collect(),
        ..GpuNodeStatus::default()
    });
    n
}

pub(crate) fn snapshot() -> Snapshot {
    Snapshot {
        policies: vec![policy()],
        tenants: vec![Arc::new(
            TenantBuilder::new("acme", "external").mig("3g.40gb", 2).build(),
        )],
        plans: vec![plan_for("mig", "h100", vec![mig_group("all", &["3g.40gb", "3g.40gb"])])],
        gpu_nodes: vec![Arc::new(reported("n1"))],
        nodes: vec![Arc::new(cluster_node("n1", "h100", true))],
        // A cluster without Kueue, as most are; `with_kueue` serves its kinds.
        absent: KUEUE_KINDS.iter().copied().collect(),
        ..Snapshot::default()
    }
}

/// [`snapshot`] with Kueue's CRDs installed.
pub(crate) fn with_kueue(mut s: Snapshot) -> Snapshot {
    s.absent.retain(|k| !KUEUE_KINDS.contains(k));
    s
}

pub(crate) fn writes(d: &Diff) -> Vec<String> {
    d.writes.iter().map(ToString::to_string).collect()
}

/// What the API server would hold after the writes: applied objects stored as sent, statuses
/// set, patches merged. Good enough to feed a second pass.
pub(crate) fn apply(s: &mut Snapshot, d: &Diff) {
    for w in &d.writes {
        match w {
            Write::Apply { kind, object, .. } => apply_object(s, *kind, object),
            Write::Status { kind, name, object } => apply_status(s, *kind, name, object),
            Write::NodePatch(p) => {
                // As the API server applies it (RFC 6902, the json-patch crate).
                let n = Arc::make_mut(s.nodes.iter_mut().find(|n| n.name_any() == p.name).unwrap());
                let mut value = serde_json::to_value(&*n).unwrap();
                let ops: json_patch::Patch = serde_json::from_value(p.operations()).unwrap();
                json_patch::patch(&mut value, &ops).unwrap_or_else(|e| panic!("{w}: {e}"));
                *n = serde_json::from_value(value).unwrap();
            }
            Write::Patch {
                kind: Kind::Namespace,
                name,
                patch,
            } => merge_labels(s, name, patch),
            Write::Patch { .. } => panic!("unexpected patch {w}"),
            Write::Evict { .. } => {}
            Write::Delete { kind, namespace, name } => delete(s, *kind, namespace, name),
        }
    }
}

/// Stores `object` as the live object of its name (a new resourceVersion).
fn put<T: serde::de::DeserializeOwned + ResourceExt>(list: &mut Vec<Arc<T>>, object: &Value) {
    let mut o: T = serde_json::from_value(object.clone()).unwrap();
    o.meta_mut().resource_version = Some(next_version());
    list.retain(|x| !(x.name_any() == o.name_any() && x.namespace() == o.namespace()));
    list.push(Arc::new(o));
}

/// A server-side apply as the API server stores it; a GpuNode's spec only (its status is its
/// agent's), its generation moved.
fn apply_object(s: &mut Snapshot, kind: Kind, object: &Value) {
    match kind {
        Kind::GpuNode => {
            let mut o: GpuNode = serde_json::from_value(object.clone()).unwrap();
            let live = s.gpu_nodes.iter_mut().find(|n| n.name_any() == o.name_any());
            match live.map(Arc::make_mut) {
                Some(l) => {
                    l.spec = o.spec;
                    l.metadata.generation = l.metadata.generation.map(|g| g + 1);
                }
                None => {
                    o.metadata.generation = Some(1);
                    s.gpu_nodes.push(Arc::new(o));
                }
            }
        }
        Kind::Namespace => put(&mut s.namespaces, object),
        Kind::ResourceQuota => put(&mut s.quotas, object),
        Kind::ConfigMap => put(&mut s.config_maps, object),
        Kind::ValidatingAdmissionPolicy => put(&mut s.admission_policies, object),
        Kind::ValidatingAdmissionPolicyBinding => put(&mut s.admission_bindings, object),
        Kind::MutatingAdmissionPolicy => put(&mut s.mutating_policies, object),
        Kind::MutatingAdmissionPolicyBinding => put(&mut s.mutating_bindings, object),
        Kind::DeviceClass => put(&mut s.device_classes, object),
        Kind::ResourceFlavor => put(&mut s.resource_flavors, object),
        Kind::Cohort => put(&mut s.cohorts, object),
        Kind::ClusterQueue => put(&mut s.cluster_queues, object),
        Kind::LocalQueue => put(&mut s.local_queues, object),
        Kind::WorkloadPriorityClass => put(&mut s.workload_priority_classes, object),
        other => panic!("unexpected apply of {other}"),
    }
}

fn apply_status(s: &mut Snapshot, kind: Kind, name: &str, object: &Value) {
    fn status<T: serde::de::DeserializeOwned>(object: &Value) -> T {
        serde_json::from_value(object["status"].clone()).unwrap()
    }
    match kind {
        Kind::GpuTenant => {
            Arc::make_mut(s.tenants.iter_mut().find(|t| t.name_any() == name).unwrap()).status = status(object);
        }
        Kind::GpuPartitionPlan => {
            s.plans.iter_mut().find(|p| p.name_any() == name).unwrap().status = status(object);
        }
        Kind::SharingPolicy => {
            s.policies.iter_mut().find(|p| p.name_any() == name).unwrap().status = status(object);
        }
        other => panic!("unexpected status of {other}"),
    }
}

/// A merge patch of a Namespace's labels.
fn merge_labels(s: &mut Snapshot, name: &str, patch: &Value) {
    let n = Arc::make_mut(s.namespaces.iter_mut().find(|n| n.name_any() == name).unwrap());
    let labels = n.metadata.labels.get_or_insert_with(Default::default);
    for (k, v) in patch["metadata"]["labels"].as_object().unwrap() {
        match v.as_str() {
            Some(v) => labels.insert(k.clone(), v.into()),
            None => labels.remove(k),
        };
    }
}

fn delete(s: &mut Snapshot, kind: Kind, namespace: &Option<String>, name: &str) {
    match kind {
        Kind::ResourceQuota => s
            .quotas
            .retain(|q| !(q.name_any() == name && &q.namespace() == namespace)),
        Kind::ValidatingAdmissionPolicy => s.admission_policies.retain(|p| p.name_any() != name),
        Kind::ValidatingAdmissionPolicyBinding => s.admission_bindings.retain(|p| p.name_any() != name),
        Kind::MutatingAdmissionPolicy => s.mutating_policies.retain(|p| p.name_any() != name),
        Kind::MutatingAdmissionPolicyBinding => s.mutating_bindings.retain(|p| p.name_any() != name),
        Kind::DeviceClass => s.device_classes.retain(|p| p.name_any() != name),
        _ => {}
    }
}

/// A resourceVersion as the API server gives each write: new every time.
fn next_version() -> String {
    static LAST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(100);
    (LAST.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1).to_string()
}

fn pass(s: &Snapshot) -> Diff {
    diff(&desired_of(s, &Settings::default(), &now()), s)
}

/// Passes until one writes nothing (at most three), each applied: the state a cluster settles in.
fn settle(s: &mut Snapshot) {
    for _ in 0..3 {
        let d = pass(s);
        if d.writes.is_empty() {
            return;
        }
        apply(s, &d);
    }
    panic!("not settled after three passes: {:?}", writes(&pass(s)));
}

/// The first pass over [`snapshot`], in order.
const FIRST_PASS: [&str; 22] = [
    "apply ConfigMap nvidia-device-plugin/gpu-tenancy-device-plugin-configs",
    "patch Node n1",
    "apply GpuNode n1",
    "status SharingPolicy default",
    "status GpuTenant acme",
    "status GpuPartitionPlan mig",
    "apply Namespace acme",
    "apply ResourceQuota acme/gpu-tenancy",
    "apply MutatingAdmissionPolicy gputenancy.io-off-gpu-nodes",
    "apply MutatingAdmissionPolicyBinding gputenancy.io-off-gpu-nodes",
    "apply ValidatingAdmissionPolicy gputenancy.io-claims-no-tenant",
    "apply ValidatingAdmissionPolicy gputenancy.io-claims-tenants",
    "apply ValidatingAdmissionPolicy gputenancy.io-device-env-keys",
    "apply ValidatingAdmissionPolicy gputenancy.io-no-tenant",
    "apply ValidatingAdmissionPolicy gputenancy.io-node-files",
    "apply ValidatingAdmissionPolicy gputenancy.io-tenants",
    "apply ValidatingAdmissionPolicyBinding gputenancy.io-claims-no-tenant",
    "apply ValidatingAdmissionPolicyBinding gputenancy.io-claims-tenant-acme",
    "apply ValidatingAdmissionPolicyBinding gputenancy.io-device-env-keys",
    "apply ValidatingAdmissionPolicyBinding gputenancy.io-no-tenant",
    "apply ValidatingAdmissionPolicyBinding gputenancy.io-node-files",
    "apply ValidatingAdmissionPolicyBinding gputenancy.io-tenant-acme",
];

/// The first pass's node patch (its second write).
fn node_patch_of(d: &Diff) -> &NodePatch {
    let Write::NodePatch(patch) = &d.writes[1] else {
        panic!("{:?}", writes(d))
    };
    patch
}

/// The agent of n1 reports its spec applied, MIG instances and all.
fn agent_reports_instances(s: &mut Snapshot) {
    agent_applies(s);
    let n = Arc::make_mut(&mut s.gpu_nodes[0]);
    let spec = n.spec.clone();
    for g in &mut n.status.as_mut().unwrap().gpus {
        let want = spec.gpus.iter().find(|x| x.index == g.index).unwrap();
        g.instances = want
            .mig_instances
            .iter()
            .map(|i| crate::api::MigInstanceStatus {
                profile: i.profile.clone(),
                placement: i.placement,
                tenant: i.tenant.clone(),
                ..Default::default()
            })
            .collect();
    }
}

#[test]
fn a_first_pass_writes_everything_in_order_and_a_second_writes_nothing() {
    let mut s = snapshot();
    let d = pass(&s);
    assert_eq!(writes(&d), FIRST_PASS);
    // The node patch keeps the other writer's taint and is conditional on the taints it read.
    let patch = node_patch_of(&d);
    assert_eq!(
        patch.labels["nvidia.com/device-plugin.config"].as_deref(),
        Some("mig-mixed")
    );
    let (read, taints) = patch.taints.clone().unwrap();
    assert_eq!(read.unwrap()[0].key, "node.kubernetes.io/unschedulable");
    assert_eq!(taints[0].key, "node.kubernetes.io/unschedulable");
    let ops = patch.operations();
    assert!(
        ops.as_array()
            .unwrap()
            .iter()
            .any(|o| o["op"] == "test" && o["path"] == "/spec/taints"),
        "{ops}"
    );
    apply(&mut s, &d);
    // acme's namespace stays under the no-tenant rules too until acme's binding is live: then
    // the no-tenant binding lets it go, and nothing more is written.
    let narrow = pass(&s);
    assert_eq!(
        writes(&narrow),
        [
            "apply ValidatingAdmissionPolicyBinding gputenancy.io-claims-no-tenant",
            "apply ValidatingAdmissionPolicyBinding gputenancy.io-no-tenant"
        ]
    );
    apply(&mut s, &narrow);
    let again = pass(&s);
    assert_eq!(
        writes(&again),
        Vec::<String>::new(),
        "a pass over its own writes writes nothing"
    );
    assert_eq!(again.notes, []);
}

/// acme's instances changed hands (from nobody known): the node took no new pods until its agent
/// scrubbed them. The agent reports the hand-over applied: the taint goes.
#[test]
fn the_scrub_pending_taint_goes_once_the_agent_applied_the_hand_over() {
    let mut s = snapshot();
    let d = pass(&s);
    assert_eq!(
        node_patch_of(&d).taints.clone().unwrap().1[1].key,
        "gputenancy.io/scrub-pending"
    );
    apply(&mut s, &d);
    let narrow = pass(&s);
    apply(&mut s, &narrow);
    agent_reports_instances(&mut s);
    let after = pass(&s);
    let node_patch = after.writes.iter().find_map(|w| match w {
        Write::NodePatch(p) => Some(p.clone()),
        _ => None,
    });
    let taints = node_patch
        .expect("the scrub-pending taint is removed")
        .taints
        .unwrap()
        .1;
    assert_eq!(taints.len(), 1, "{taints:?}");
}

#[test]
fn a_tenant_change_writes_only_what_changes() {
    let mut s = snapshot();
    settle(&mut s);
    // acme asks for one instance fewer: its status, its quota, its instance binding in the GpuNode spec.
    Arc::make_mut(&mut s.tenants[0]).spec.resources[0].count = 1;
    Arc::make_mut(&mut s.tenants[0]).metadata.generation = Some(2);
    let d = pass(&s);
    assert_eq!(
        writes(&d),
        [
            "apply GpuNode n1",
            "status GpuTenant acme",
            "apply ResourceQuota acme/gpu-tenancy"
        ]
    );
}

/// A removed tenant's bindings are deleted; the tenants' policies stay (every tenant's bindings
/// name them, and none may be left naming a policy that is gone).
#[test]
fn objects_no_longer_desired_are_deleted_but_the_tenants_policies() {
    let mut s = snapshot();
    let d = pass(&s);
    apply(&mut s, &d);
    s.tenants.clear();
    let d = pass(&s);
    let w = writes(&d);
    for deleted in [
        "delete ValidatingAdmissionPolicyBinding gputenancy.io-tenant-acme",
        "delete ValidatingAdmissionPolicyBinding gputenancy.io-claims-tenant-acme",
    ] {
        assert!(w.contains(&deleted.to_string()), "{w:?}");
    }
    assert!(
        !w.iter().any(|x| x.starts_with("delete ValidatingAdmissionPolicy ")),
        "{w:?}"
    );
    assert!(
        w.contains(&"delete ResourceQuota acme/gpu-tenancy".to_string()),
        "{w:?}"
    );
    // The namespace stays (it holds the tenant's workloads) and loses our labels.
    assert!(w.contains(&"patch Namespace acme".to_string()), "{w:?}");
    assert!(!w.iter().any(|x| x.starts_with("delete Namespace")));
}

#[test]
fn a_node_that_leaves_every_plan_keeps_only_the_unplanned_config() {
    let mut s = snapshot();
    let d = pass(&s);
    apply(&mut s, &d);
    s.plans.clear();
    let d = pass(&s);
    let patch = d
        .writes
        .iter()
        .find_map(|w| match w {
            Write::NodePatch(p) => Some(p.clone()),
            _ => None,
        })
        .expect("a node patch");
    // The device plugin is pointed at the config it refuses (it advertises none of the GPUs);
    // our taints go, the other writer's stays.
    assert_eq!(
        patch.labels["nvidia.com/device-plugin.config"].as_deref(),
        Some("default")
    );
    let taints = patch.taints.unwrap().1;
    assert_eq!(taints.len(), 1);
    assert_eq!(taints[0].key, "node.kubernetes.io/unschedulable");
}

#[test]
fn a_node_waiting_for_its_agent_gets_no_gpunode() {
    let mut s = snapshot();
    s.gpu_nodes.clear();
    Arc::make_mut(&mut s.nodes[0])
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(GPU_PRESENT_FOR_TEST.into(), "true".into());
    let w = writes(&pass(&s));
    assert!(!w.iter().any(|x| x.contains("GpuNode")), "{w:?}");
}

const GPU_PRESENT_FOR_TEST: &str = crate::labels::GPU_PRESENT;

#[test]
fn flipping_conditions_make_events() {
    let mut s = snapshot();
    let d = pass(&s);
    apply(&mut s, &d);
    Arc::make_mut(&mut s.tenants[0]).spec.resources[0].count = 5; // more 3g.40gb than the two GPUs hold
    let d = pass(&s);
    let short: Vec<&Note> = d.notes.iter().filter(|n| n.reason == "CapacityShort").collect();
    assert_eq!(short.len(), 1, "{:?}", d.notes);
    assert_eq!(
        (short[0].kind, short[0].name.as_str(), short[0].warning),
        (Kind::GpuTenant, "acme", true)
    );
    assert!(short[0].message.contains("granted 4 of 5"), "{}", short[0].message);
    // The same state again: no new event (events mark transitions, not states).
    apply(&mut s, &d);
    assert_eq!(pass(&s).notes, []);
}

#[test]
fn contains_ignores_what_the_server_adds() {
    let live = json!({"a": 1, "b": {"c": [ {"x": 1, "default": true} ], "d": "added"}});
    assert!(contains(&live, &json!({"b": {"c": [{"x": 1}]}})));
    assert!(!contains(&live, &json!({"b": {"c": [{"x": 2}]}})));
    assert!(!contains(&live, &json!({"b": {"c": []}})));
    assert!(contains(&live, &json!({"e": null})));
}

/// The simulated agent: reports the current spec applied.
pub(crate) fn agent_applies(s: &mut Snapshot) {
    for n in s.gpu_nodes.iter_mut().map(Arc::make_mut) {
        let mut st = n.status.clone().unwrap_or_default();
        if st.observed_generation == n.metadata.generation {
            continue;
        }
        for g in &mut st.gpus {
            if let Some(spec) = n.spec.gpus.iter().find(|x| x.index == g.index) {
                g.applied_mode = Some(spec.mode);
                g.applied_tenants = spec.tenants.clone();
                g.applied = Some(true);
            }
        }
        st.observed_generation = n.metadata.generation;
        crate::api::set_condition(
            &mut st.conditions,
            ConditionSet::READY,
            true,
            "Applied",
            "",
            n.metadata.generation,
            &now(),
        );
        n.status = Some(st);
    }
}

/// A hand-over from a tenant that no longer exists is written with the strictest scrub (its policy
/// is unknown); once the agent reports it applied, the GPU goes back to its tenants' own policy:
/// one more spec write, then nothing.
#[test]
fn a_hand_over_from_a_removed_tenant_scrubs_then_settles() {
    let mut s = snapshot();
    s.plans = vec![plan_for(
        "mps",
        "h100",
        vec![crate::planner::fixtures::group("all", crate::api::Mode::Mps)],
    )];
    s.tenants = crate::planner::fixtures::shared(&[
        TenantBuilder::new("a", "internal")
            .want(crate::api::Mode::Mps, 5)
            .build(),
        TenantBuilder::new("b", "internal")
            .want(crate::api::Mode::Mps, 2)
            .build(),
    ]);
    for _ in 0..3 {
        let d = pass(&s);
        apply(&mut s, &d);
        agent_applies(&mut s);
    }
    assert_eq!(writes(&pass(&s)), Vec::<String>::new());
    s.tenants.retain(|t| t.name_any() == "a");
    let spec = |d: &Diff| -> Option<Value> {
        d.writes.iter().find_map(|w| match w {
            Write::Apply {
                kind: Kind::GpuNode,
                object,
                ..
            } => Some(object["spec"]["gpus"][1].clone()),
            _ => None,
        })
    };
    let first = pass(&s);
    assert_eq!(
        spec(&first).unwrap()["scrub"],
        "Always",
        "the hand-over scrubs: b's policy is unknown"
    );
    assert_eq!(spec(&first).unwrap()["tenants"], json!(["a"]));
    apply(&mut s, &first);
    agent_applies(&mut s);
    let second = pass(&s);
    assert_eq!(
        spec(&second).unwrap()["scrub"],
        "OnTenantChange",
        "back to a's own policy"
    );
    apply(&mut s, &second);
    agent_applies(&mut s);
    let third = pass(&s);
    assert_eq!(
        writes(&third),
        ["status GpuPartitionPlan mps"],
        "the plan reports the node applied"
    );
    apply(&mut s, &third);
    assert_eq!(writes(&pass(&s)), Vec::<String>::new());
}

/// An agent's eviction requests become evictions only under `busyGpuPolicy: Evict`, each naming
/// the node that asked (the writer checks the pod runs there).
#[test]
fn eviction_requests_are_evicted_only_under_the_evict_policy() {
    let mut s = snapshot();
    settle(&mut s);
    let n = Arc::make_mut(&mut s.gpu_nodes[0]);
    n.status.as_mut().unwrap().eviction_requests = vec![crate::api::EvictionRequest {
        namespace: "acme".into(),
        name: "trainer".into(),
        uid: "u-1".into(),
        gpus: vec![0],
    }];
    let w = writes(&diff(&desired_of(&s, &Settings::default(), &now()), &s));
    assert!(!w.iter().any(|x| x.starts_with("evict")), "{w:?}");
    Arc::make_mut(&mut s.gpu_nodes[0]).spec.busy_gpu_policy = crate::api::BusyGpuPolicy::Evict;
    let d = diff(&desired_of(&s, &Settings::default(), &now()), &s);
    let evictions: Vec<&Write> = d.writes.iter().filter(|w| matches!(w, Write::Evict { .. })).collect();
    assert_eq!(
        evictions,
        [&Write::Evict {
            namespace: "acme".into(),
            name: "trainer".into(),
            uid: "u-1".into(),
            node: "n1".into()
        }]
    );
}

/// The desired state of `s` diffed with `seen` (what earlier passes found already so), checked
/// equal to the diff that compares every object.
fn pass_seen(s: &Snapshot, seen: &mut Seen) -> Diff {
    let d = desired_of(s, &Settings::default(), &now());
    // Only the owned findings are under test here: the bookkeeping held back is `hold`'s.
    seen.recent = Default::default();
    let with = diff_with(&d, s, seen, std::time::Instant::now());
    assert_eq!(
        writes(&with),
        writes(&diff(&d, s)),
        "the kept findings changed the pass"
    );
    assert_eq!(with, diff(&d, s));
    with
}

#[test]
fn owned_objects_found_already_so_are_compared_again_only_when_either_side_changes() {
    let mut s = snapshot();
    let mut seen = Seen::default();
    for _ in 0..3 {
        let d = pass_seen(&s, &mut seen);
        apply(&mut s, &d);
    }
    assert_eq!(writes(&pass_seen(&s, &mut seen)), Vec::<String>::new());
    let owned = s.quotas.len()
        + s.namespaces.len()
        + s.config_maps.len()
        + s.admission_policies.len()
        + s.admission_bindings.len()
        + s.mutating_policies.len()
        + s.mutating_bindings.len();
    assert_eq!(seen.len(), owned, "every owned object is known contained");
    assert_eq!(seen.quotas.len(), 1);

    // A person edits the quota behind the controller: a new resourceVersion, so it is compared
    // again, and written back.
    let q = Arc::make_mut(&mut s.quotas[0]);
    q.spec
        .as_mut()
        .unwrap()
        .hard
        .as_mut()
        .unwrap()
        .values_mut()
        .for_each(|v| v.0 = "100".into());
    q.metadata.resource_version = Some(next_version());
    let d = pass_seen(&s, &mut seen);
    assert_eq!(writes(&d), ["apply ResourceQuota acme/gpu-tenancy"]);
    apply(&mut s, &d);
    assert_eq!(writes(&pass_seen(&s, &mut seen)), Vec::<String>::new());

    // The tenant changes: the same live objects, other desired ones.
    Arc::make_mut(&mut s.tenants[0]).spec.resources[0].count = 1;
    let d = pass_seen(&s, &mut seen);
    assert!(
        writes(&d).contains(&"apply ResourceQuota acme/gpu-tenancy".to_string()),
        "{:?}",
        writes(&d)
    );
    apply(&mut s, &d);
    let d = pass_seen(&s, &mut seen);
    apply(&mut s, &d);
    assert_eq!(writes(&pass_seen(&s, &mut seen)), Vec::<String>::new());

    // The tenant goes: its objects are deleted and forgotten.
    s.tenants.clear();
    for _ in 0..3 {
        let d = pass_seen(&s, &mut seen);
        apply(&mut s, &d);
    }
    assert!(s.quotas.is_empty());
    assert_eq!(seen.quotas.len(), 0);
}

#[test]
fn an_owned_object_without_a_resource_version_is_never_taken_as_found() {
    let mut s = snapshot();
    settle(&mut s);
    for q in &mut s.quotas {
        Arc::make_mut(q).metadata.resource_version = None;
    }
    let mut seen = Seen::default();
    assert_eq!(writes(&pass_seen(&s, &mut seen)), Vec::<String>::new());
    assert_eq!(
        seen.quotas.len(),
        0,
        "no resourceVersion: nothing to tell a later state by"
    );
    assert_eq!(seen.admission_policies.len(), s.admission_policies.len());
}

/// An optional kind the API server does not serve gets nothing written, neither applies nor
/// deletes; every other write stays as it is (the mutating policies stand in for a kind whose
/// absence changes nothing else).
#[test]
fn nothing_is_written_for_a_kind_the_api_server_does_not_serve() {
    let s = snapshot();
    let all = writes(&pass(&s));
    let mut without = s.clone();
    without
        .absent
        .extend([Kind::MutatingAdmissionPolicy, Kind::MutatingAdmissionPolicyBinding]);
    let left = writes(&pass(&without));
    let expected: Vec<String> = all.into_iter().filter(|w| !w.contains("Mutating")).collect();
    assert_eq!(left, expected);
    // Without Kueue's kinds no queue is written; with them, each of its kinds is.
    let queues = |w: &[String]| -> Vec<String> {
        w.iter()
            .filter(|w| KUEUE_KINDS.iter().any(|k| w.contains(&format!(" {k} "))))
            .cloned()
            .collect()
    };
    assert_eq!(queues(&writes(&pass(&s))), Vec::<String>::new());
    let on = queues(&writes(&pass(&with_kueue(s.clone()))));
    assert_eq!(
        on,
        [
            "apply ResourceFlavor gpu-tenancy-any",
            "apply ResourceFlavor gpu-tenancy-mig",
            "apply ClusterQueue gpu-tenancy-acme",
            "apply LocalQueue acme/gpu-tenancy",
            "apply WorkloadPriorityClass gpu-tenancy-acme",
        ],
    );
    // Applied, they are found so: a second pass writes none of them.
    let mut live = with_kueue(s.clone());
    let first = pass(&live);
    apply(&mut live, &first);
    assert_eq!(queues(&writes(&pass(&live))), Vec::<String>::new());
    // A live object of an absent kind is not deleted either (the store holds none anyway).
    let mut live = s.clone();
    apply(&mut live, &pass(&s));
    live.tenants.clear();
    live.absent = [Kind::ResourceQuota].into();
    let w = writes(&pass(&live));
    assert!(!w.iter().any(|x| x.contains("ResourceQuota")), "{w:?}");
}

/// Every diff's writes follow the table of kinds: row by row, then evictions, then binding
/// deletes, then the other deletes; the writer's stages are these.
#[test]
fn writes_follow_the_table_of_kinds() {
    let mut s = snapshot();
    let first = pass(&s);
    apply(&mut s, &first);
    s.tenants.clear();
    s.plans.clear();
    let last = pass(&s);
    for d in [&first, &last] {
        let stages: Vec<_> = d.writes.iter().map(Write::stage).collect();
        assert!(stages.is_sorted(), "{:?}", writes(d));
    }
    assert!(
        last.writes.iter().any(|w| matches!(w, Write::Delete { .. })),
        "{:?}",
        writes(&last)
    );
}
