//! Every CEL rule of the CRDs, evaluated client-side by kube-cel: a valid object passes, and one
//! mutation per rule is refused with the rule's message at the rule's field.

use gpu_tenancy::api::crds;
use gpu_tenancy::schema::SchemaChecker;
use serde_json::{Value, json};
use std::collections::BTreeSet;

fn policy() -> Value {
    json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "SharingPolicy", "metadata": {"name": "p"},
           "spec": {"tiers": [{"name": "a", "modes": ["MIG"]}, {"name": "b", "modes": ["MPS"]}]}})
}

fn tenant() -> Value {
    json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuTenant", "metadata": {"name": "t"},
           "spec": {"tier": "a", "resources": [{"mode": "MIG", "profile": "3g.40gb", "count": 1}, {"mode": "MPS", "count": 2}]}})
}

fn plan() -> Value {
    json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuPartitionPlan", "metadata": {"name": "g"},
           "spec": {"nodeSelector": {"matchLabels": {"a": "b"}},
                    "gpus": [{"devices": "0-3", "mode": "MIG", "mig": {"profiles": ["7g.80gb"]}},
                             {"devices": "4", "mode": "MPS", "mps": {"maxClients": 4}},
                             {"devices": "5", "mode": "Exclusive"}],
                    "rollout": {"maxUnavailable": 1}}})
}

fn ts_plan() -> Value {
    json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuPartitionPlan", "metadata": {"name": "ts"},
           "spec": {"nodeSelector": {"matchLabels": {"a": "b"}},
                    "gpus": [{"devices": "all", "mode": "TimeSlicing", "timeSlicing": {"replicas": 4}}],
                    "rollout": {"maxUnavailable": "25%"}}})
}

fn node() -> Value {
    json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuNode", "metadata": {"name": "n"},
           "spec": {"gpus": [{"index": 0, "mode": "MIG", "migInstances": [{"profile": "7g.80gb", "placement": {"start": 0, "size": 8}}]},
                             {"index": 1, "mode": "Exclusive"}]}})
}

struct Case {
    rule: &'static str,
    base: fn() -> Value,
    pointer: &'static str,
    value: Value,
    field: &'static str,
    message: &'static str,
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            rule: "!(self.metadata.name in ['unallocated', 'shared', 'unattributed'])",
            base: tenant,
            pointer: "/metadata/name",
            value: json!("shared"),
            field: "",
            message: "metadata.name: unallocated, shared and unattributed are reserved by showback for what no tenant holds; name the tenant otherwise",
        },
        Case {
            rule: "self.all(t, self.filter(u, u.name == t.name).size() == 1)",
            base: policy,
            pointer: "/spec/tiers/1/name",
            value: json!("a"),
            field: "spec.tiers",
            message: "tier names must be unique",
        },
        Case {
            rule: "self.all(c, !c.startsWith('system-'))",
            base: policy,
            pointer: "/spec/tiers/0/priorityClassNames",
            value: json!(["batch", "system-node-critical"]),
            field: "spec.tiers[0].priorityClassNames",
            message: "system PriorityClasses (system-node-critical, system-cluster-critical) preempt any pod; a tenant tier may not use them",
        },
        Case {
            rule: "!has(self.idleLendingPercent) || !has(self.coLocation) || self.coLocation != 'Forbidden'",
            base: policy,
            pointer: "/spec/tiers/0",
            value: json!({"name": "a", "modes": ["MIG"], "coLocation": "Forbidden", "idleLendingPercent": 50}),
            field: "spec.tiers[0].idleLendingPercent",
            message: "a tier that forbids co-location lends no capacity: a borrowed unit may sit on a GPU beside another tenant's",
        },
        Case {
            rule: "self.mode != 'MIG' || has(self.profile)",
            base: tenant,
            pointer: "/spec/resources/0",
            value: json!({"mode": "MIG", "count": 1}),
            field: "spec.resources[0].profile",
            message: "a MIG request needs a profile, e.g. 3g.40gb",
        },
        Case {
            rule: "self.mode == 'MIG' || !has(self.profile)",
            base: tenant,
            pointer: "/spec/resources/1/profile",
            value: json!("3g.40gb"),
            field: "spec.resources[1].profile",
            message: "profile applies only to mode MIG",
        },
        Case {
            rule: "!self.exists(g, g.devices == 'all') || self.size() == 1",
            base: plan,
            pointer: "/spec/gpus/2/devices",
            value: json!("all"),
            field: "spec.gpus",
            message: "devices 'all' must be the only GPU group of a plan",
        },
        Case {
            rule: "self.mode == 'MIG' ? has(self.mig) : !has(self.mig)",
            base: plan,
            pointer: "/spec/gpus/2/mig",
            value: json!({"profiles": []}),
            field: "spec.gpus[2].mig",
            message: "mig settings are required with mode MIG and allowed only with it",
        },
        Case {
            rule: "self.mode == 'MPS' || !has(self.mps)",
            base: plan,
            pointer: "/spec/gpus/2/mps",
            value: json!({"maxClients": 4}),
            field: "spec.gpus[2].mps",
            message: "mps settings are allowed only with mode MPS",
        },
        Case {
            rule: "self.mode == 'TimeSlicing' ? has(self.timeSlicing) : !has(self.timeSlicing)",
            base: ts_plan,
            pointer: "/spec/gpus/0/timeSlicing",
            value: Value::Null,
            field: "spec.gpus[0].timeSlicing",
            message: "timeSlicing settings are required with mode TimeSlicing and allowed only with it",
        },
        Case {
            rule: "string(self).matches('^([1-9][0-9]*|[1-9][0-9]?%|100%)$')",
            base: ts_plan,
            pointer: "/spec/rollout/maxUnavailable",
            value: json!("0%"),
            field: "spec.rollout.maxUnavailable",
            message: "maxUnavailable must be a number of nodes >= 1 or a percentage from 1% to 100%",
        },
        Case {
            rule: "self.mode == 'MIG' || !has(self.migInstances) || size(self.migInstances) == 0",
            base: node,
            pointer: "/spec/gpus/1/migInstances",
            value: json!([{"profile": "7g.80gb", "placement": {"start": 0, "size": 8}}]),
            field: "spec.gpus[1].migInstances",
            message: "migInstances are allowed only with mode MIG",
        },
    ]
}

/// Sets (or, with null, removes) the value at a JSON pointer.
fn mutate(mut v: Value, pointer: &str, value: &Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    let target = v.pointer_mut(parent).unwrap();
    match (target, value) {
        (Value::Object(m), Value::Null) => {
            m.remove(key);
        }
        (Value::Object(m), _) => {
            m.insert(key.to_string(), value.clone());
        }
        (Value::Array(a), _) => a[key.parse::<usize>().unwrap()] = value.clone(),
        _ => panic!("cannot set {pointer}"),
    }
    v
}

#[test]
fn valid_bases_pass() {
    let checker = SchemaChecker::new();
    for base in [policy(), tenant(), plan(), ts_plan(), node()] {
        let kind = base["kind"].as_str().unwrap();
        assert_eq!(checker.check(kind, &base).unwrap(), vec![], "{kind}");
    }
}

#[test]
fn each_rule_refuses_its_mutation_at_its_field() {
    let checker = SchemaChecker::new();
    for case in cases() {
        let obj = mutate((case.base)(), case.pointer, &case.value);
        let kind = obj["kind"].as_str().unwrap().to_string();
        let problems = checker.check(&kind, &obj).unwrap();
        assert_eq!(
            problems,
            vec![(case.field.to_string(), case.message.to_string())],
            "rule {}",
            case.rule
        );
    }
}

#[test]
fn the_table_covers_every_rule_in_the_crds() {
    fn rules(v: &Value, out: &mut BTreeSet<String>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::Array(list)) = m.get("x-kubernetes-validations") {
                    out.extend(list.iter().filter_map(|r| r["rule"].as_str().map(str::to_string)));
                }
                m.values().for_each(|c| rules(c, out));
            }
            Value::Array(a) => a.iter().for_each(|c| rules(c, out)),
            _ => {}
        }
    }
    let mut in_crds = BTreeSet::new();
    for crd in crds() {
        rules(&serde_json::to_value(&crd).unwrap(), &mut in_crds);
    }
    let tested: BTreeSet<String> = cases().iter().map(|c| c.rule.to_string()).collect();
    assert_eq!(in_crds, tested);
}
