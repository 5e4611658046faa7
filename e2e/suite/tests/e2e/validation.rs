//! Admission-time validation is Kubernetes' own: every schema bound and every CEL rule
//! (`x-kubernetes-validations`) of crds/ refuses a bad object, and the API server's message
//! names the field.
//!
//! Two tables:
//! - schema bounds (minimum/maximum, minLength/maxLength, pattern, enum, minItems/maxItems,
//!   required) are read from the CRDs themselves: the schema is walked alongside the valid
//!   object of each kind and one case is made per bound met on the way;
//! - CEL rules are listed by hand in [`cel_cases`] (a rule's meaning cannot be inverted
//!   mechanically), and a coverage check fails when crds/ holds a rule that no case covers.
//!
//! All cases are sent with server-side dry-run (`dryRun=All`), so nothing is stored.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use futures::future::join_all;
use gpu_tenancy_e2e::{KINDS, Names, VERSION, api, client, crd, ensure_crds};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use kube::api::{DynamicObject, PostParams};
use serde_json::{Value, json};

use crate::bounds::schema_cases;
use crate::fixtures;

/// One way to break one rule.
pub struct Case {
    /// `Kind/what`, unique.
    pub id: String,
    pub kind: &'static str,
    /// Turns the valid object into one that breaks exactly the rule under test.
    pub mutate: Box<dyn Fn(&mut Value) + Send + Sync>,
    /// Fragments that must all appear in the API server's error message (the field path first).
    pub expect: Vec<String>,
}

fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        field_manager: Some("gpu-tenancy-e2e".into()),
    }
}

/// Creates `obj` with server-side dry-run; Ok(()) if accepted, Err(message) if refused.
async fn try_create(client: &kube::Client, kind: &str, obj: Value) -> Result<(), String> {
    let obj: DynamicObject = serde_json::from_value(obj).map_err(|e| format!("not an object: {e}"))?;
    match api(client, kind).create(&dry_run(), &obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) => Err(format!("{} ({})", s.message, s.code)),
        Err(e) => Err(format!("request failed: {e}")),
    }
}

#[tokio::test]
async fn valid_objects_are_accepted() {
    let client = client().await;
    ensure_crds(&client).await;
    let names = Names::new("valid");
    for (kind, _, _) in KINDS {
        let obj = fixtures::valid(kind, &names.next());
        if let Err(e) = try_create(&client, kind, obj.clone()).await {
            panic!("the valid {kind} was refused: {e}\nobject: {obj:#}");
        }
    }
    // Valid variants on the edges of the CEL rules.
    let mut variants = Vec::new();
    for mu in [json!(1), json!("1%"), json!("25%"), json!("100%"), json!(50)] {
        let mut o = fixtures::valid("GpuPartitionPlan", &names.next());
        gpu_tenancy_e2e::set_path(&mut o, "spec.rollout.maxUnavailable", mu);
        variants.push(("GpuPartitionPlan", o));
    }
    let mut all = fixtures::valid("GpuPartitionPlan", &names.next());
    gpu_tenancy_e2e::set_path(
        &mut all,
        "spec.gpus",
        json!([{"devices": "all", "mode": "TimeSlicing", "timeSlicing": {"replicas": 4}}]),
    );
    variants.push(("GpuPartitionPlan", all));
    let mut no_instances = fixtures::valid("GpuNode", &names.next());
    gpu_tenancy_e2e::set_path(&mut no_instances, "spec.gpus.3.migInstances", json!([]));
    variants.push(("GpuNode", no_instances));
    for (kind, obj) in variants {
        if let Err(e) = try_create(&client, kind, obj.clone()).await {
            panic!("a valid {kind} variant was refused: {e}\nobject: {obj:#}");
        }
    }
}

#[tokio::test]
async fn every_schema_bound_refuses_a_bad_object_naming_the_field() {
    let cases = schema_cases();
    assert!(!cases.is_empty(), "no schema bounds found in crds/");
    run_cases(cases).await;
}

#[tokio::test]
async fn every_cel_rule_refuses_a_bad_object_naming_the_field() {
    // Coverage first: every rule in crds/ has at least one case.
    let covered: BTreeSet<String> = cel_cases().iter().map(|(rule, _)| rule.to_string()).collect();
    let mut missing = Vec::new();
    for (kind, plural, _) in KINDS {
        for (path, rule) in cel_rules(plural) {
            if !covered.contains(&rule) {
                missing.push(format!("{kind} {path}: {rule}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "CEL rules in crds/ without a case in e2e/suite/tests/e2e/validation.rs::cel_cases:\n  {}",
        missing.join("\n  ")
    );
    let cases: Vec<Case> = cel_cases().into_iter().map(|(_, c)| c).collect();
    run_cases(cases).await;
}

/// Sends every case (concurrently) and fails with a list of all the cases that went wrong.
async fn run_cases(cases: Vec<Case>) {
    let client = client().await;
    ensure_crds(&client).await;
    let names = Names::new("invalid");
    let mut ids = BTreeSet::new();
    for c in &cases {
        assert!(ids.insert(c.id.clone()), "duplicate case id {}", c.id);
    }
    let results = join_all(cases.iter().map(|case| {
        let client = client.clone();
        let mut obj = fixtures::valid(case.kind, &names.next());
        (case.mutate)(&mut obj);
        async move { (case, try_create(&client, case.kind, obj).await) }
    }))
    .await;
    let mut failures = String::new();
    for (case, result) in &results {
        // Shown with --nocapture (and on failure): what the API server said to each case.
        eprintln!(
            "{}: {}",
            case.id,
            result.as_ref().err().map_or("accepted", String::as_str)
        );
        match result {
            Ok(()) => writeln!(
                failures,
                "- {}: accepted, expected a refusal naming {:?}",
                case.id, case.expect
            )
            .unwrap(),
            Err(msg) => {
                let absent: Vec<&String> = case.expect.iter().filter(|f| !msg.contains(f.as_str())).collect();
                if !absent.is_empty() || !msg.ends_with("(422)") {
                    writeln!(
                        failures,
                        "- {}: refused, but the message lacks {absent:?} (or is not a 422):\n    {msg}",
                        case.id
                    )
                    .unwrap();
                }
            }
        }
    }
    eprintln!("{} cases sent", results.len());
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{failures}",
        failures.lines().filter(|l| l.starts_with("- ")).count(),
        results.len()
    );
}

// ------------------------------------------------------------------------------------------
// CRD schema access

pub(crate) fn schema(plural: &str) -> JSONSchemaProps {
    let crd = crd(plural);
    let v = crd
        .spec
        .versions
        .into_iter()
        .find(|v| v.name == VERSION)
        .expect("version");
    *v.schema
        .and_then(|s| s.open_api_v3_schema)
        .map(Box::new)
        .expect("openAPIV3Schema")
}

/// Every CEL rule of a CRD's spec and status: (field path, rule).
fn cel_rules(plural: &str) -> Vec<(String, String)> {
    fn walk(s: &JSONSchemaProps, path: String, out: &mut Vec<(String, String)>) {
        for v in s.x_kubernetes_validations.iter().flatten() {
            out.push((path.clone(), v.rule.clone()));
        }
        for (k, p) in s.properties.iter().flatten() {
            walk(
                p,
                if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                },
                out,
            );
        }
        if let Some(JSONSchemaPropsOrArray::Schema(items)) = &s.items {
            walk(items, format!("{path}[*]"), out);
        }
        if let Some(JSONSchemaPropsOrBool::Schema(a)) = &s.additional_properties {
            walk(a, format!("{path}[*]"), out);
        }
    }
    let mut out = Vec::new();
    walk(&schema(plural), String::new(), &mut out);
    out
}

// ------------------------------------------------------------------------------------------
// CEL cases, by hand: (the rule exactly as in crds/, a case that breaks it)

fn cel_case(
    kind: &'static str,
    id: &str,
    expect: &[&str],
    mutate: impl Fn(&mut Value) + Send + Sync + 'static,
) -> Case {
    Case {
        id: format!("{kind}/{id}"),
        kind,
        mutate: Box::new(mutate),
        expect: expect.iter().map(|s| s.to_string()).collect(),
    }
}

fn cel_cases() -> Vec<(&'static str, Case)> {
    use gpu_tenancy_e2e::{remove_path as rm, set_path as set};
    const UNIQUE_TIERS: &str = "self.all(t, self.filter(u, u.name == t.name).size() == 1)";
    const MIG_NEEDS_PROFILE: &str = "self.mode != 'MIG' || has(self.profile)";
    const PROFILE_ONLY_MIG: &str = "self.mode == 'MIG' || !has(self.profile)";
    const ALL_ALONE: &str = "!self.exists(g, g.devices == 'all') || self.size() == 1";
    const MIG_IFF: &str = "self.mode == 'MIG' ? has(self.mig) : !has(self.mig)";
    const MPS_ONLY: &str = "self.mode == 'MPS' || !has(self.mps)";
    const TS_IFF: &str = "self.mode == 'TimeSlicing' ? has(self.timeSlicing) : !has(self.timeSlicing)";
    const MAX_UNAVAILABLE: &str = "string(self).matches('^([1-9][0-9]*|[1-9][0-9]?%|100%)$')";
    const NODE_MIG_ONLY: &str = "self.mode == 'MIG' || !has(self.migInstances) || size(self.migInstances) == 0";
    const NO_SYSTEM_CLASSES: &str = "self.all(c, !c.startsWith('system-'))";
    const FORBIDDEN_LENDS_NOTHING: &str =
        "!has(self.idleLendingPercent) || !has(self.coLocation) || self.coLocation != 'Forbidden'";
    let max_unavailable_msg = "maxUnavailable must be a number of nodes >= 1 or a percentage from 1% to 100%";
    vec![
        (
            gpu_tenancy::api::RESERVED_TENANT_NAMES_RULE,
            cel_case(
                "GpuTenant",
                "reserved-name",
                &["reserved by showback", "name the tenant otherwise"],
                |o| set(o, "metadata.name", json!("unattributed")),
            ),
        ),
        (
            NO_SYSTEM_CLASSES,
            cel_case(
                "SharingPolicy",
                "system-priority-class",
                &["spec.tiers[0].priorityClassNames", "system PriorityClasses"],
                |o| {
                    set(
                        o,
                        "spec.tiers.0.priorityClassNames",
                        json!(["batch", "system-cluster-critical"]),
                    )
                },
            ),
        ),
        (
            FORBIDDEN_LENDS_NOTHING,
            cel_case(
                "SharingPolicy",
                "forbidden-tier-lends",
                &[
                    "spec.tiers[0].idleLendingPercent",
                    "forbids co-location lends no capacity",
                ],
                |o| set(o, "spec.tiers.0.idleLendingPercent", json!(20)),
            ),
        ),
        (
            UNIQUE_TIERS,
            cel_case(
                "SharingPolicy",
                "duplicate-tier",
                &["spec.tiers", "tier names must be unique"],
                |o| set(o, "spec.tiers.1.name", json!("external")),
            ),
        ),
        (
            MIG_NEEDS_PROFILE,
            cel_case(
                "GpuTenant",
                "mig-without-profile",
                &["spec.resources[0].profile", "a MIG request needs a profile"],
                |o| rm(o, "spec.resources.0.profile"),
            ),
        ),
        (
            PROFILE_ONLY_MIG,
            cel_case(
                "GpuTenant",
                "profile-on-exclusive",
                &["spec.resources[1].profile", "profile applies only to mode MIG"],
                |o| set(o, "spec.resources.1.profile", json!("3g.40gb")),
            ),
        ),
        (
            PROFILE_ONLY_MIG,
            cel_case(
                "GpuTenant",
                "profile-on-mps",
                &["spec.resources[2].profile", "profile applies only to mode MIG"],
                |o| set(o, "spec.resources.2.profile", json!("1g.10gb")),
            ),
        ),
        (
            ALL_ALONE,
            cel_case(
                "GpuPartitionPlan",
                "all-with-others",
                &["spec.gpus", "devices 'all' must be the only GPU group of a plan"],
                |o| set(o, "spec.gpus.3.devices", json!("all")),
            ),
        ),
        (
            MIG_IFF,
            cel_case(
                "GpuPartitionPlan",
                "mig-without-mig-settings",
                &[
                    "spec.gpus[0].mig",
                    "mig settings are required with mode MIG and allowed only with it",
                ],
                |o| rm(o, "spec.gpus.0.mig"),
            ),
        ),
        (
            MIG_IFF,
            cel_case(
                "GpuPartitionPlan",
                "mig-settings-on-exclusive",
                &[
                    "spec.gpus[3].mig",
                    "mig settings are required with mode MIG and allowed only with it",
                ],
                |o| set(o, "spec.gpus.3.mig", json!({"profiles": ["7g.80gb"]})),
            ),
        ),
        (
            MPS_ONLY,
            cel_case(
                "GpuPartitionPlan",
                "mps-settings-on-timeslicing",
                &["spec.gpus[2].mps", "mps settings are allowed only with mode MPS"],
                |o| set(o, "spec.gpus.2.mps", json!({"maxClients": 4})),
            ),
        ),
        (
            TS_IFF,
            cel_case(
                "GpuPartitionPlan",
                "timeslicing-without-settings",
                &[
                    "spec.gpus[2].timeSlicing",
                    "timeSlicing settings are required with mode TimeSlicing and allowed only with it",
                ],
                |o| rm(o, "spec.gpus.2.timeSlicing"),
            ),
        ),
        (
            TS_IFF,
            cel_case(
                "GpuPartitionPlan",
                "timeslicing-settings-on-mps",
                &[
                    "spec.gpus[1].timeSlicing",
                    "timeSlicing settings are required with mode TimeSlicing and allowed only with it",
                ],
                |o| set(o, "spec.gpus.1.timeSlicing", json!({"replicas": 4})),
            ),
        ),
        (
            MAX_UNAVAILABLE,
            cel_case(
                "GpuPartitionPlan",
                "max-unavailable-zero",
                &["spec.rollout.maxUnavailable", max_unavailable_msg],
                |o| set(o, "spec.rollout.maxUnavailable", json!(0)),
            ),
        ),
        (
            MAX_UNAVAILABLE,
            cel_case(
                "GpuPartitionPlan",
                "max-unavailable-zero-percent",
                &["spec.rollout.maxUnavailable", max_unavailable_msg],
                |o| set(o, "spec.rollout.maxUnavailable", json!("0%")),
            ),
        ),
        (
            MAX_UNAVAILABLE,
            cel_case(
                "GpuPartitionPlan",
                "max-unavailable-over-100-percent",
                &["spec.rollout.maxUnavailable", max_unavailable_msg],
                |o| set(o, "spec.rollout.maxUnavailable", json!("101%")),
            ),
        ),
        (
            MAX_UNAVAILABLE,
            cel_case(
                "GpuPartitionPlan",
                "max-unavailable-words",
                &["spec.rollout.maxUnavailable", max_unavailable_msg],
                |o| set(o, "spec.rollout.maxUnavailable", json!("half")),
            ),
        ),
        (
            NODE_MIG_ONLY,
            cel_case(
                "GpuNode",
                "mig-instances-on-exclusive",
                &[
                    "spec.gpus[3].migInstances",
                    "migInstances are allowed only with mode MIG",
                ],
                |o| {
                    set(
                        o,
                        "spec.gpus.3.migInstances",
                        json!([{"profile": "7g.80gb", "placement": {"start": 0, "size": 8}}]),
                    )
                },
            ),
        ),
    ]
}
