//! The Kueue objects of a small fleet, and the quotas beside them. Expected values are worked
//! out by hand from the fleet: plan `mig` is two H100s of two 3g.40gb instances each (pool
//! `h100`), `excl` four whole A100s (pool `a100`), `ts` two time-sliced H200s (pool `h200`).

use crate::api::{GpuPartitionPlan, GpuTenant, Mode, SharingPolicy};
use crate::desired::{Desired, Settings, desired};
use crate::inventory::NodeInventory;
use crate::planner::PlanInput;
use crate::planner::fixtures::{TenantBuilder, group, mig_group, node, now, plan_for, policy};
use kube::ResourceExt;
use serde_json::json;
use std::collections::BTreeMap;

fn fleet() -> (Vec<GpuPartitionPlan>, Vec<NodeInventory>) {
    let plans = vec![
        plan_for("mig", "h100", vec![mig_group("all", &["3g.40gb", "3g.40gb"])]),
        plan_for("ts", "h200", vec![group("all", Mode::TimeSlicing)]),
        plan_for("excl", "a100", vec![group("all", Mode::Exclusive)]),
    ];
    let nodes = vec![
        node("h100-a", "h100", "H100-80GB", 2, false),
        node("h200-a", "h200", "H200", 2, false),
        node("a100-a", "a100", "A100-40GB", 4, false),
    ];
    (plans, nodes)
}

/// `acme` (tier internal, two namespaces, weight 3, priority 5): three 3g.40gb instances and three
/// whole GPUs; `beta` (internal, one namespace): one whole GPU.
fn tenants() -> Vec<GpuTenant> {
    let mut acme = TenantBuilder::new("acme", "internal")
        .mig("3g.40gb", 3)
        .want(Mode::Exclusive, 3)
        .weight(3)
        .priority(5)
        .build();
    acme.spec.namespaces = vec!["acme-prod".into(), "acme-dev".into()];
    let beta = TenantBuilder::new("beta", "internal").want(Mode::Exclusive, 1).build();
    vec![acme, beta]
}

fn run(tenants: &[GpuTenant], policies: &[SharingPolicy], kueue: bool) -> Desired {
    let (plans, nodes) = fleet();
    desired(
        &PlanInput {
            policies,
            tenants: &crate::planner::fixtures::shared(tenants),
            plans: &plans,
            nodes: &nodes,
        },
        &Settings {
            kueue,
            ..Settings::default()
        },
        &now(),
    )
}

fn hard(d: &Desired, ns: &str, key: &str) -> String {
    let q = d
        .resource_quotas
        .iter()
        .find(|q| q.namespace().as_deref() == Some(ns))
        .unwrap();
    q.spec.as_ref().unwrap().hard.as_ref().unwrap()[key].0.clone()
}

fn queue(d: &Desired, name: &str) -> serde_json::Value {
    let q = d.cluster_queues.iter().find(|q| q.name_any() == name).unwrap();
    serde_json::to_value(q).unwrap()
}

fn other_group(lending: bool) -> serde_json::Value {
    let q = |name: &str, n: &str| {
        let mut v = json!({"name": name, "nominalQuota": n});
        if lending {
            v["lendingLimit"] = json!("0");
        }
        v
    };
    json!({
        "coveredResources": ["cpu", "memory", "ephemeral-storage"],
        "flavors": [{"name": "gpu-tenancy-any", "resources": [q("cpu", "1M"), q("memory", "1Ei"), q("ephemeral-storage", "1Ei")]}],
    })
}

/// Without Kueue nothing of it is written and the grant is split; with it, the queues hold each
/// grant per pool and each namespace's quota is a ceiling at the whole grant.
#[test]
fn each_tenant_gets_a_queue_of_its_grant_per_pool() {
    let policies = [policy()];
    let off = run(&tenants(), &policies, false);
    assert!(off.cluster_queues.is_empty() && off.resource_flavors.is_empty() && off.local_queues.is_empty());
    assert_eq!(hard(&off, "acme-prod", "requests.nvidia.com/gpu"), "2");
    assert_eq!(hard(&off, "acme-dev", "requests.nvidia.com/gpu"), "1");

    let d = run(&tenants(), &policies, true);
    assert_eq!(d.problems, vec![]);
    for ns in ["acme-prod", "acme-dev"] {
        assert_eq!(hard(&d, ns, "requests.nvidia.com/gpu"), "3", "{ns}");
        assert_eq!(hard(&d, ns, "requests.nvidia.com/mig-3g.40gb"), "3", "{ns}");
        assert_eq!(hard(&d, ns, "requests.nvidia.com/gpu.shared"), "0", "{ns}");
    }
    let flavors: Vec<(String, BTreeMap<String, String>)> = d
        .resource_flavors
        .iter()
        .map(|f| (f.name_any(), f.spec.node_labels.clone()))
        .collect();
    let pool = |p: &str| BTreeMap::from([("pool".to_string(), p.to_string())]);
    assert_eq!(
        flavors,
        [
            ("gpu-tenancy-any".into(), BTreeMap::new()),
            ("gpu-tenancy-excl".into(), pool("a100")),
            ("gpu-tenancy-mig".into(), pool("h100")),
            ("gpu-tenancy-ts".into(), pool("h200")),
        ]
    );
    let q = |name: &str, n: &str| json!({"name": name, "nominalQuota": n});
    assert_eq!(
        queue(&d, "gpu-tenancy-acme"),
        json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": "gpu-tenancy-acme", "labels": {"gputenancy.io/managed-by": "gpu-tenancy"}},
            "spec": {
                "resourceGroups": [
                    {
                        "coveredResources": ["nvidia.com/gpu", "nvidia.com/mig-3g.40gb"],
                        "flavors": [
                            {"name": "gpu-tenancy-excl", "resources": [q("nvidia.com/gpu", "3"), q("nvidia.com/mig-3g.40gb", "0")]},
                            {"name": "gpu-tenancy-mig", "resources": [q("nvidia.com/gpu", "0"), q("nvidia.com/mig-3g.40gb", "3")]},
                        ],
                    },
                    other_group(false),
                ],
                "namespaceSelector": {
                    "matchLabels": {"gputenancy.io/tenant": "acme"},
                    "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["acme-dev", "acme-prod"]}],
                },
                "fairSharing": {"weight": "3"},
            },
        })
    );
    let local: Vec<(Option<String>, String, String)> = d
        .local_queues
        .iter()
        .map(|l| (l.namespace(), l.name_any(), l.spec.cluster_queue.clone()))
        .collect();
    let lq = |ns: &str, cq: &str| (Some(ns.to_string()), "gpu-tenancy".to_string(), cq.to_string());
    assert_eq!(
        local,
        [
            lq("acme-dev", "gpu-tenancy-acme"),
            lq("acme-prod", "gpu-tenancy-acme"),
            lq("beta", "gpu-tenancy-beta")
        ]
    );
    let priorities: Vec<(String, i32)> = d
        .workload_priority_classes
        .iter()
        .map(|w| (w.metadata.name.clone().unwrap(), w.value))
        .collect();
    assert_eq!(
        priorities,
        [("gpu-tenancy-acme".into(), 5), ("gpu-tenancy-beta".into(), 0)]
    );
    assert!(d.cohorts.is_empty(), "no tier lends");
}

/// A tier that lends 50%: its tenants share one cohort, each quota lends and borrows half of
/// itself rounded down (3 -> 1), and each namespace may hold the grant and what it may borrow.
/// The same percent on a tier that forbids co-location is ignored.
#[test]
fn a_lending_tier_shares_a_cohort_within_its_limits() {
    let mut p = policy();
    for t in &mut p.spec.tiers {
        t.idle_lending_percent = Some(50);
    }
    let policies = [p];
    let d = run(&tenants(), &policies, true);
    let names: Vec<String> = d.cohorts.iter().map(|c| c.name_any()).collect();
    assert_eq!(names, ["gpu-tenancy.internal.default"]);
    let acme = queue(&d, "gpu-tenancy-acme");
    assert_eq!(acme["spec"]["cohortName"], "gpu-tenancy.internal.default");
    // A lender takes back what it lent, by preempting the borrowers; nothing else preempts.
    assert_eq!(
        acme["spec"]["preemption"],
        json!({"reclaimWithinCohort": "Any", "withinClusterQueue": "Never"})
    );
    let q =
        |name: &str, n: &str, l: &str| json!({"name": name, "nominalQuota": n, "borrowingLimit": l, "lendingLimit": l});
    assert_eq!(
        acme["spec"]["resourceGroups"],
        json!([
            {
                "coveredResources": ["nvidia.com/gpu", "nvidia.com/mig-3g.40gb"],
                "flavors": [
                    {"name": "gpu-tenancy-excl", "resources": [q("nvidia.com/gpu", "3", "1"), q("nvidia.com/mig-3g.40gb", "0", "0")]},
                    {"name": "gpu-tenancy-mig", "resources": [q("nvidia.com/gpu", "0", "0"), q("nvidia.com/mig-3g.40gb", "3", "1")]},
                ],
            },
            other_group(true),
        ])
    );
    for ns in ["acme-prod", "acme-dev"] {
        assert_eq!(hard(&d, ns, "requests.nvidia.com/gpu"), "4", "{ns}");
    }
    // beta's one GPU lends nothing (half of 1 is 0) but beta still joins the cohort.
    assert_eq!(
        queue(&d, "gpu-tenancy-beta")["spec"]["cohortName"],
        "gpu-tenancy.internal.default"
    );

    let mut external = tenants();
    for t in &mut external {
        t.spec.tier = "external".into();
    }
    let d = run(&external, &policies, true);
    assert!(d.cohorts.is_empty());
    assert_eq!(queue(&d, "gpu-tenancy-acme")["spec"].get("cohortName"), None);
    assert_eq!(queue(&d, "gpu-tenancy-acme")["spec"].get("preemption"), None);
    assert_eq!(hard(&d, "acme-prod", "requests.nvidia.com/gpu"), "3");
}

/// A tenant not valid, or one whose namespace another tenant lists too: its queue covers no GPU,
/// and a contested namespace has no LocalQueue.
#[test]
fn an_invalid_tenant_queues_no_gpu() {
    let mut ts = tenants();
    ts[1].spec.namespaces = vec!["acme-dev".into()];
    let d = run(&ts, &[policy()], true);
    let beta = queue(&d, "gpu-tenancy-beta");
    assert_eq!(beta["spec"]["resourceGroups"], json!([other_group(false)]));
    assert_eq!(
        beta["spec"]["namespaceSelector"],
        json!({"matchLabels": {"gputenancy.io/tenant": "beta"}})
    );
    assert!(
        d.local_queues
            .iter()
            .all(|l| l.namespace().as_deref() != Some("acme-dev"))
    );
}

/// On a DRA pool a tenant's queue holds its own extended resource (what its pods ask for there),
/// not the device plugin's name; every GPU resource the queue holds, summed over the pools, is
/// what its namespace's quota ceiling holds under `requests.<name>`: the two count one grant.
#[test]
fn a_dra_pool_is_queued_under_the_tenant_s_own_resource() {
    let mut dra = plan_for("mig-dra", "h100", vec![mig_group("all", &["3g.40gb", "3g.40gb"])]);
    dra.spec.device_access = crate::api::DeviceAccess::Dra;
    let plans = vec![dra, plan_for("excl", "a100", vec![group("all", Mode::Exclusive)])];
    let nodes = vec![
        node("h100-a", "h100", "H100-80GB", 2, false),
        node("a100-a", "a100", "A100-40GB", 4, false),
    ];
    let a = TenantBuilder::new("a", "internal")
        .mig("3g.40gb", 2)
        .want(Mode::Exclusive, 2)
        .build();
    let d = desired(
        &PlanInput {
            policies: &[policy()],
            tenants: &crate::planner::fixtures::shared(&[a]),
            plans: &plans,
            nodes: &nodes,
        },
        &Settings {
            kueue: true,
            ..Settings::default()
        },
        &now(),
    );
    assert_eq!(d.problems, vec![]);
    let q = |name: &str, n: &str| json!({"name": name, "nominalQuota": n});
    let gpus = &queue(&d, "gpu-tenancy-a")["spec"]["resourceGroups"][0];
    assert_eq!(
        *gpus,
        json!({
            "coveredResources": ["a.gputenancy.io/mig-3g.40gb", "nvidia.com/gpu"],
            "flavors": [
                {"name": "gpu-tenancy-excl", "resources": [q("a.gputenancy.io/mig-3g.40gb", "0"), q("nvidia.com/gpu", "2")]},
                {"name": "gpu-tenancy-mig-dra", "resources": [q("a.gputenancy.io/mig-3g.40gb", "2"), q("nvidia.com/gpu", "0")]},
            ],
        })
    );
    let quota = d
        .resource_quotas
        .iter()
        .find(|r| r.namespace().as_deref() == Some("a"))
        .unwrap();
    for (key, value) in quota.spec.as_ref().unwrap().hard.as_ref().unwrap() {
        let Some(resource) = key.strip_prefix("requests.") else {
            continue;
        };
        let queued: u64 = gpus["flavors"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|f| f["resources"].as_array().unwrap())
            .filter(|r| r["name"] == resource)
            .map(|r| r["nominalQuota"].as_str().unwrap().parse::<u64>().unwrap())
            .sum();
        assert_eq!(queued.to_string(), value.0, "{key}");
    }
}

/// A cohort whose name would pass Kubernetes' 253 characters is not written: the tier's tenants
/// lend nothing, and the policy has one problem, however many tenants the tier has.
#[test]
fn a_cohort_name_too_long_is_a_problem_once() {
    let long = "p".repeat(240);
    let mut p = policy();
    p.metadata.name = Some(long.clone());
    for t in &mut p.spec.tiers {
        t.idle_lending_percent = Some(50);
    }
    let mut ts = tenants();
    for t in &mut ts {
        t.spec.policy_ref = long.clone();
    }
    let d = run(&ts, &[p], true);
    assert!(d.cohorts.is_empty());
    assert_eq!(queue(&d, "gpu-tenancy-acme")["spec"].get("cohortName"), None);
    let ours: Vec<(&str, &str)> = d
        .problems
        .iter()
        .filter(|p| p.message.contains("Kueue Cohort"))
        .map(|p| (p.object.as_str(), p.field.as_str()))
        .collect();
    assert_eq!(ours, [(format!("SharingPolicy/{long}").as_str(), "metadata.name")]);
}
