//! The desired state on small fleets: quotas, admission, node labels and taints, device-plugin
//! config, and the Isolated condition. Expected values are written out by hand.

use super::*;
use crate::api::{ConditionSet, Mode, TenantLimits};
use crate::device_plugin::{PluginConfig, PluginEnv, parser_rule_violations};
use crate::inventory::NodeInventory;
use crate::planner::fixtures::{TenantBuilder, group, mig_group, node, now, plan_for, policy};
use kube::ResourceExt;
use std::collections::BTreeMap;

fn run(tenants: &[GpuTenant], plans: &[GpuPartitionPlan], nodes: &[NodeInventory]) -> Desired {
    let policies = [policy()];
    desired(
        &PlanInput {
            policies: &policies,
            tenants: &crate::planner::fixtures::shared(tenants),
            plans,
            nodes,
        },
        &Settings::default(),
        &now(),
    )
}

fn hard(d: &Desired, ns: &str) -> BTreeMap<String, String> {
    d.resource_quotas
        .iter()
        .find(|q| q.namespace().as_deref() == Some(ns))
        .unwrap_or_else(|| panic!("no quota in {ns}"))
        .spec
        .as_ref()
        .unwrap()
        .hard
        .clone()
        .unwrap()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect()
}

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

/// The texts of admission policy `policy`'s validations: each has a fixed message or one built in
/// CEL.
fn messages(d: &Desired, policy: &str) -> Vec<String> {
    d.admission_policies
        .iter()
        .find(|p| p.name_any() == policy)
        .unwrap_or_else(|| panic!("no policy {policy}"))
        .spec
        .as_ref()
        .unwrap()
        .validations
        .as_ref()
        .unwrap()
        .iter()
        .map(|v| v.message.clone().or(v.message_expression.clone()).unwrap())
        .collect()
}

/// What tenant `name`'s pods and claims may name, from its status.
fn admission(d: &Desired, name: &str) -> crate::api::TenantAdmission {
    let t = d.tenants.iter().find(|t| t.name_any() == name).unwrap();
    t.status.as_ref().unwrap().admission.clone().unwrap()
}

/// The admission binding named `name`.
fn binding<'d>(d: &'d Desired, name: &str) -> &'d ValidatingAdmissionPolicyBinding {
    d.admission_bindings.iter().find(|b| b.name_any() == name).unwrap()
}

/// A tenant's `Isolated` condition.
fn isolated(t: &GpuTenant) -> &crate::api::Condition {
    let s = t.status.as_ref().unwrap();
    s.conditions.iter().find(|c| c.type_ == ConditionSet::ISOLATED).unwrap()
}

#[test]
fn quotas_split_each_grant_over_the_tenants_namespaces() {
    let (plans, nodes) = fleet();
    let mut acme = TenantBuilder::new("acme", "external")
        .mig("3g.40gb", 3)
        .want(Mode::Exclusive, 3)
        .build();
    acme.spec.namespaces = vec!["acme-prod".into(), "acme-dev".into()];
    let d = run(&[acme], &plans, &nodes);
    // 3 instances over 2 namespaces: the first listed gets 2, the second 1; the sum is the grant.
    let prod = hard(&d, "acme-prod");
    let dev = hard(&d, "acme-dev");
    assert_eq!(prod["requests.nvidia.com/mig-3g.40gb"], "2");
    assert_eq!(dev["requests.nvidia.com/mig-3g.40gb"], "1");
    assert_eq!(prod["requests.nvidia.com/gpu"], "2");
    assert_eq!(dev["requests.nvidia.com/gpu"], "1");
    // What the tenant was not given is 0, not absent.
    assert_eq!(prod["requests.nvidia.com/gpu.shared"], "0");
    assert_eq!(prod.len(), 3, "{prod:?}");
    let ns: Vec<(String, Option<String>)> = d
        .namespaces
        .iter()
        .map(|n| (n.name_any(), n.labels().get("gputenancy.io/tenant").cloned()))
        .collect();
    assert_eq!(
        ns,
        [
            ("acme-dev".to_string(), Some("acme".to_string())),
            ("acme-prod".to_string(), Some("acme".to_string()))
        ]
    );
}

#[test]
fn an_invalid_tenant_and_a_contested_namespace_get_zeros() {
    let (plans, nodes) = fleet();
    let bad = TenantBuilder::new("bad", "platinum").want(Mode::Exclusive, 1).build();
    let mut a = TenantBuilder::new("a", "internal").want(Mode::Exclusive, 1).build();
    let mut b = TenantBuilder::new("b", "internal").want(Mode::Exclusive, 1).build();
    a.spec.namespaces = vec!["shared".into()];
    b.spec.namespaces = vec!["shared".into()];
    let d = run(&[a, b, bad], &plans, &nodes);
    for ns in ["bad", "shared"] {
        assert!(hard(&d, ns).values().all(|v| v == "0"), "{ns}: {:?}", hard(&d, ns));
    }
    let shared = d.namespaces.iter().find(|n| n.name_any() == "shared").unwrap();
    assert!(!shared.labels().contains_key("gputenancy.io/tenant"));
    // The invalid tenant's status holds no grants for its policy to read: its pods get no GPU.
    let bad = d.tenants.iter().find(|t| t.name_any() == "bad").unwrap();
    assert_eq!(bad.status.as_ref().unwrap().admission, None);
    let p = d
        .admission_policies
        .iter()
        .find(|p| p.name_any() == "gputenancy.io-tenants")
        .unwrap();
    let v = p.spec.as_ref().unwrap().validations.as_ref().unwrap();
    assert!(
        v.iter().any(|v| v
            .message_expression
            .as_deref()
            .unwrap_or("")
            .contains("is not valid, so its pods get no GPUs")),
        "{v:?}"
    );
    // The contested namespace is under the no-tenant rules, not under either tenant's.
    assert_eq!(d.namespace_rules.owner("shared"), None);
    assert!(d.namespace_rules.untenanted_excluded().contains("bad"));
    assert!(!d.namespace_rules.untenanted_excluded().contains("shared"));
}

/// `acme` (one MIG instance, at most two GPUs a pod) and `lab` (two time-sliced shares) on the
/// fleet.
fn acme_and_lab() -> Desired {
    let (plans, nodes) = fleet();
    let mut acme = TenantBuilder::new("acme", "external").mig("3g.40gb", 1).build();
    acme.spec.limits = Some(TenantLimits {
        max_gpus_per_pod: Some(2),
        memory: None,
    });
    let lab = TenantBuilder::new("lab", "experimental")
        .want(Mode::TimeSlicing, 2)
        .build();
    run(&[acme, lab], &plans, &nodes)
}

#[test]
fn admission_follows_the_grants() {
    let d = acme_and_lab();
    let tenants = messages(&d, "gputenancy.io-tenants");
    // acme holds one MIG instance: that name is its allow-list, and it holds no shares, so it may
    // tolerate no sharing taint at all. The tenants' policy reads both from its status, its
    // parameter, and its name, tier and maxGpusPerPod from its object.
    assert_eq!(admission(&d, "acme").resource_names, ["nvidia.com/mig-3g.40gb"]);
    assert!(admission(&d, "acme").shared_modes.is_empty());
    assert!(
        tenants.iter().any(|m| m.contains("!(k in variables.granted)")),
        "{tenants:?}"
    );
    assert!(
        tenants
            .iter()
            .any(|m| m.contains("a mode it holds shares of (' + (size(variables.sharedModes)"))
    );
    assert!(
        tenants
            .iter()
            .any(|m| m.contains("' allows at most ' + string(variables.maxGpus)"))
    );
    assert!(
        tenants
            .iter()
            .any(|m| m.contains("only its own dedicated nodes (gputenancy.io/dedicated=' + params.metadata.name"))
    );
    assert_eq!(admission(&d, "lab").resource_names, ["nvidia.com/gpu.shared"]);
    assert_eq!(admission(&d, "lab").shared_modes, [Mode::TimeSlicing]);
}

/// Two policies for every tenant, whatever its grants, name or tier, each with the tenant as its
/// parameter.
#[test]
fn every_tenant_is_judged_by_the_same_policies() {
    let d = acme_and_lab();
    let names: Vec<String> = d.admission_policies.iter().map(|p| p.name_any()).collect();
    assert_eq!(
        names,
        [
            "gputenancy.io-claims-no-tenant",
            "gputenancy.io-claims-tenants",
            "gputenancy.io-device-env-keys",
            "gputenancy.io-no-tenant",
            "gputenancy.io-node-files",
            "gputenancy.io-tenants"
        ]
    );
    let policy = |name: &str| {
        let p = d.admission_policies.iter().find(|p| p.name_any() == name).unwrap();
        serde_json::to_value(p.spec.as_ref().unwrap()).unwrap()
    };
    for name in ["gputenancy.io-tenants", "gputenancy.io-claims-tenants"] {
        assert_eq!(
            policy(name)["paramKind"],
            serde_json::json!({"apiVersion": crate::api::API_VERSION, "kind": "GpuTenant"})
        );
    }
}

/// Bindings select the tenants' namespaces by name; the no-tenant policy covers every other
/// namespace that is not exempt; each rule set has a claims policy bound like its pod policy,
/// one policy judges ConfigMap keys everywhere, and one host paths of the node's hand-over files.
#[test]
fn admission_bindings_select_the_tenants_namespaces() {
    let d = acme_and_lab();
    let names: Vec<String> = d.admission_bindings.iter().map(|b| b.name_any()).collect();
    assert_eq!(
        names,
        [
            "gputenancy.io-claims-no-tenant",
            "gputenancy.io-claims-tenant-acme",
            "gputenancy.io-claims-tenant-lab",
            "gputenancy.io-device-env-keys",
            "gputenancy.io-no-tenant",
            "gputenancy.io-node-files",
            "gputenancy.io-tenant-acme",
            "gputenancy.io-tenant-lab"
        ]
    );
    // The node's hand-over files are refused everywhere but the trusted namespaces, exempt ones
    // included.
    assert_eq!(
        crate::desired::coverage(binding(&d, "gputenancy.io-node-files")),
        crate::desired::Coverage::AllBut(Settings::default().node_file_trusted())
    );
    let acme_binding = binding(&d, "gputenancy.io-tenant-acme");
    assert_eq!(
        crate::desired::coverage(acme_binding),
        crate::desired::Coverage::Only(["acme".to_string()].into())
    );
    // Its parameter is the tenant; without it the binding refuses everything it matches.
    assert_eq!(
        serde_json::to_value(&acme_binding.spec).unwrap()["paramRef"],
        serde_json::json!({"name": "acme", "parameterNotFoundAction": "Deny"})
    );
}

/// The fleet with one more node, its two exclusive GPUs dedicated to `gamma`, which asks for both.
fn gamma_on_its_dedicated_node() -> Desired {
    let (mut plans, mut nodes) = fleet();
    let gamma = TenantBuilder::new("gamma", "internal").want(Mode::Exclusive, 2).build();
    plans.push(plan_for(
        "gamma-only",
        "dedicated",
        vec![crate::api::GpuGroup {
            tenants: vec!["gamma".into()],
            ..group("all", Mode::Exclusive)
        }],
    ));
    nodes.push(node("h200-d", "dedicated", "H200", 2, false));
    run(&[gamma], &plans, &nodes)
}

/// A node's taints, as `key=value`.
fn taints(n: &k8s_openapi::api::core::v1::Node) -> Vec<String> {
    let taints = n.spec.as_ref().unwrap().taints.clone().unwrap();
    taints
        .iter()
        .map(|t| format!("{}={}", t.key, t.value.clone().unwrap()))
        .collect()
}

#[test]
fn nodes_get_their_device_plugin_config_and_taints() {
    let d = gamma_on_its_dedicated_node();
    let summary: Vec<(String, String, Vec<String>)> = d
        .node_labels
        .iter()
        .map(|n| {
            (
                n.name_any(),
                n.labels()["nvidia.com/device-plugin.config"].clone(),
                taints(n),
            )
        })
        .collect();
    let s = |x: &str| x.to_string();
    assert_eq!(
        summary,
        [
            (s("a100-a"), s("exclusive"), vec![]),
            (s("h100-a"), s("mig-mixed"), vec![]),
            (
                s("h200-a"),
                s("time-slicing-4"),
                vec![s("gputenancy.io/sharing=TimeSlicing")]
            ),
            // gamma's GPUs change hands (from nobody known): no new pods until its agent has scrubbed.
            (
                s("h200-d"),
                s("exclusive"),
                vec![
                    s("gputenancy.io/scrub-pending=true"),
                    s("gputenancy.io/dedicated=gamma")
                ]
            ),
        ]
    );
}

#[test]
fn each_device_plugin_config_is_one_key_the_plugin_starts_with() {
    let d = gamma_on_its_dedicated_node();
    // One ConfigMap key per distinct config, each one the plugin starts with as the install
    // guide deploys it, and the refused config of nodes with no plan.
    let data = d.config_maps[0].data.clone().unwrap();
    assert_eq!(
        data.keys().collect::<Vec<_>>(),
        ["default", "exclusive", "mig-mixed", "time-slicing-4"]
    );
    for (key, text) in data.iter().filter(|(k, _)| *k != "default") {
        let config: PluginConfig = serde_saphyr::from_str(text).unwrap();
        let mig = key.starts_with("mig-");
        assert_eq!(
            parser_rule_violations(&config, &PluginEnv::documented(), mig),
            Vec::<String>::new(),
            "{key}"
        );
    }
    // The label and the GpuNode spec say the same key.
    for n in &d.nodes {
        let label = d.node_labels.iter().find(|l| l.name_any() == n.name_any()).unwrap();
        assert_eq!(
            n.spec.device_plugin_config.as_deref(),
            Some(label.labels()["nvidia.com/device-plugin.config"].as_str())
        );
    }
    assert!(
        data["time-slicing-4"].contains("renameByDefault: true"),
        "{}",
        data["time-slicing-4"]
    );
    assert!(data["mig-mixed"].contains("migStrategy: mixed"));
}

#[test]
fn a_tenant_granted_only_on_its_dedicated_nodes_is_isolated() {
    let d = gamma_on_its_dedicated_node();
    // gamma's grants are all on its dedicated node: Kubernetes enforces them.
    let isolated = isolated(&d.tenants[0]);
    assert_eq!(
        (isolated.status.as_str(), isolated.reason.as_str()),
        ("True", "DedicatedNodes")
    );
}

#[test]
fn bindings_on_shared_nodes_are_reported_as_counts_only() {
    let (plans, nodes) = fleet();
    let acme = TenantBuilder::new("acme", "external").mig("3g.40gb", 1).build();
    let d = run(&[acme], &plans, &nodes);
    let c = isolated(&d.tenants[0]);
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "CountsOnly"));
    assert!(c.message.contains("h100-a"), "{}", c.message);
}

#[test]
fn the_same_input_gives_the_same_objects() {
    let (plans, nodes) = fleet();
    let t = [TenantBuilder::new("acme", "external").mig("3g.40gb", 3).build()];
    assert_eq!(run(&t, &plans, &nodes), run(&t, &plans, &nodes));
}

/// The tenants' admission policies the memo keeps are taken back only under the settings they
/// were rendered with: a controller started again with another allow-list renders them again.
#[test]
fn the_memo_renders_admission_again_under_other_settings() {
    let (plans, nodes) = fleet();
    let t = [TenantBuilder::new("acme", "external").mig("3g.40gb", 3).build()];
    let policies = [policy()];
    let input = PlanInput {
        policies: &policies,
        tenants: &crate::planner::fixtures::shared(&t),
        plans: &plans,
        nodes: &nodes,
    };
    let mut memo = DesiredMemo::default();
    let first = desired_with(&input, &Settings::default(), &now(), Some(&mut memo));
    assert_eq!(first, desired(&input, &Settings::default(), &now()));
    let other = Settings {
        allowed_resources: vec!["nvidia.com/nic".into()],
        ..Settings::default()
    };
    let fresh = desired(&input, &other, &now());
    assert_ne!(
        first.admission_policies, fresh.admission_policies,
        "the allow-list is in each tenant's policy"
    );
    assert_eq!(desired_with(&input, &other, &now(), Some(&mut memo)), fresh);
}

/// Two tenants, `a` and `b`, on one MIG node of a DRA pool.
fn a_dra_pool() -> Desired {
    let mut plan = plan_for("mig-dra", "h100", vec![mig_group("all", &["3g.40gb", "3g.40gb"])]);
    plan.spec.device_access = crate::api::DeviceAccess::Dra;
    let nodes = vec![node("h100-a", "h100", "H100-80GB", 2, false)];
    let a = TenantBuilder::new("a", "internal").mig("3g.40gb", 2).build();
    let b = TenantBuilder::new("b", "internal").mig("3g.40gb", 2).build();
    let d = run(&[a, b], &[plan], &nodes);
    assert!(d.problems.is_empty(), "{:?}", d.problems);
    d
}

/// In a DRA pool each tenant gets its own DeviceClass, and a quota by class and by its own
/// extended resource (none under the device plugin's name).
#[test]
fn a_dra_pool_binds_each_tenant_to_its_own_devices() {
    let d = a_dra_pool();
    let classes: Vec<String> = d.device_classes.iter().map(|c| c.name_any()).collect();
    assert_eq!(classes, ["a.mig-3g.40gb.gputenancy.io", "b.mig-3g.40gb.gputenancy.io"]);
    let q = hard(&d, "a");
    assert_eq!(
        q["a.mig-3g.40gb.gputenancy.io.deviceclass.resource.k8s.io/devices"],
        "2"
    );
    assert_eq!(q["requests.a.gputenancy.io/mig-3g.40gb"], "2");
    assert_eq!(q["requests.nvidia.com/mig-3g.40gb"], "0");
    assert!(
        !q.keys().any(|k| k.starts_with("b.") || k.starts_with("requests.b.")),
        "{q:?}"
    );
}

/// A node of a DRA pool gets no device-plugin config, label or taint.
#[test]
fn a_dra_node_gets_no_device_plugin_config() {
    let d = a_dra_pool();
    let node = &d.node_labels[0];
    assert_eq!(
        node.labels().get("gputenancy.io/device-access").map(String::as_str),
        Some("DRA")
    );
    assert!(!node.labels().contains_key("nvidia.com/device-plugin.config"));
    assert_eq!(node.spec.as_ref().unwrap().taints.as_deref(), Some(&[][..]));
    let keys: Vec<&String> = d.config_maps[0].data.as_ref().unwrap().keys().collect();
    assert_eq!(keys, ["default"]);
    assert_eq!(d.nodes[0].spec.device_access, crate::api::DeviceAccess::Dra);
    assert_eq!(d.nodes[0].spec.device_plugin_config, None);
}

/// A DRA pool's tenants are `Isolated=True (DraBound)`, their claim rules name only their own
/// classes, and the device plugin's name is renamed to each tenant's own.
#[test]
fn dra_tenants_are_isolated_and_admitted_by_their_own_classes() {
    let d = a_dra_pool();
    for t in &d.tenants {
        let c = isolated(t);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "DraBound"),
            "{}",
            t.name_any()
        );
    }
    // What its claims and pods may name is the tenant's status, which its policies read as their
    // parameter (the e2e suite holds the messages to the API server's evaluation).
    assert_eq!(
        admission(&d, "a"),
        crate::api::TenantAdmission {
            resource_names: vec!["a.gputenancy.io/mig-3g.40gb".into()],
            device_classes: vec!["a.mig-3g.40gb.gputenancy.io".into()],
            shared_modes: vec![],
            priority_class_names: vec![],
        }
    );
    let claims = messages(&d, "gputenancy.io-claims-tenants");
    assert!(
        claims
            .iter()
            .any(|m| m.contains("'its own device classes are ' + (size(variables.ownClasses) == 0")),
        "{claims:?}"
    );
    let renames: Vec<String> = d.mutating_policies.iter().map(|p| p.name_any()).collect();
    assert_eq!(
        renames,
        [
            "gputenancy.io-dra-names-a",
            "gputenancy.io-dra-names-b",
            "gputenancy.io-off-gpu-nodes"
        ]
    );
}

/// A tenant's `Isolated` condition follows its nodes' roles, not only its grants: the pool turned
/// to DRA leaves the grants as they were (the same list, from the allocation memo), and the memo
/// of the conditions must not give back the last pass's `CountsOnly`.
#[test]
fn the_isolation_memo_follows_the_nodes_roles() {
    let mut plan = plan_for("mig", "h100", vec![mig_group("all", &["3g.40gb", "3g.40gb"])]);
    let nodes = vec![node("h100-a", "h100", "H100-80GB", 2, false)];
    let t = [
        TenantBuilder::new("a", "internal").mig("3g.40gb", 2).build(),
        TenantBuilder::new("b", "internal").mig("3g.40gb", 2).build(),
    ];
    let policies = [policy()];
    let tenants = crate::planner::fixtures::shared(&t);
    let isolated = |d: &Desired| -> Vec<String> {
        d.tenants
            .iter()
            .map(|t| {
                let s = t.status.as_ref().unwrap();
                let c = s.conditions.iter().find(|c| c.type_ == ConditionSet::ISOLATED).unwrap();
                c.reason.clone()
            })
            .collect()
    };
    let mut memo = DesiredMemo::default();
    let pass = |plan: &GpuPartitionPlan, memo: Option<&mut DesiredMemo>| {
        let plans = [plan.clone()];
        let input = PlanInput {
            policies: &policies,
            tenants: &tenants,
            plans: &plans,
            nodes: &nodes,
        };
        match memo {
            Some(m) => desired_with(&input, &Settings::default(), &now(), Some(m)),
            None => desired(&input, &Settings::default(), &now()),
        }
    };
    let first = pass(&plan, Some(&mut memo));
    assert_eq!(isolated(&first), ["CountsOnly", "CountsOnly"]);
    // The same inputs again: the conditions taken back are the ones found.
    assert_eq!(pass(&plan, Some(&mut memo)), first);
    plan.spec.device_access = crate::api::DeviceAccess::Dra;
    let fresh = pass(&plan, None);
    assert_eq!(isolated(&fresh), ["DraBound", "DraBound"]);
    assert_eq!(pass(&plan, Some(&mut memo)), fresh);
}
