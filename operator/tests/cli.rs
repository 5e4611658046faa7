//! The command line, run as a user runs it: the built binary, real files, exit codes and output.

use std::path::PathBuf;
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn gpu_tenancy(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpu-tenancy"))
        .args(args)
        .current_dir(root())
        .output()
        .unwrap()
}

/// `gpu-tenancy plan` of `examples/` on its inventory, with `more` arguments.
fn plan_examples(more: &[&str]) -> Output {
    let mut args = vec!["plan", "-f", "examples/", "--inventory", "examples/inventory.yaml"];
    args.extend_from_slice(more);
    gpu_tenancy(&args)
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn examples_validate() {
    let o = gpu_tenancy(&["validate", "-f", "examples/"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).is_empty());
}

#[test]
fn bad_manifests_give_one_line_per_problem() {
    let o = gpu_tenancy(&["validate", "-f", "operator/tests/data/bad"]);
    assert_eq!(o.status.code(), Some(1));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    let expected = [
        "operator/tests/data/bad/plans.yaml: GpuPartitionPlan/mixed-sharing: spec.gpus[1].timeSlicing.replicas: 1 is less than the minimum of 2.0",
        "operator/tests/data/bad/plans.yaml: GpuPartitionPlan/too-big: spec.gpus[0].mig.profiles: on H100-80GB: 4g.40gb allows 1 instance per GPU, 2 requested",
        "operator/tests/data/bad/plans.yaml: GpuPartitionPlan/too-big: spec.gpus[1].devices: GPU 3 is also in spec.gpus[0].devices; each GPU belongs to one group",
        "operator/tests/data/bad/tenants.yaml: GpuTenant/bad-tier: spec.tier: tier \"platinum\" is not defined in SharingPolicy \"default\"; its tiers are external, internal, experimental",
        "operator/tests/data/bad/tenants.yaml: GpuTenant/no-profile: spec.resources[0].profile: a MIG request needs a profile, e.g. 3g.40gb",
        "operator/tests/data/bad/tenants.yaml: GpuTenant/wrong-mode: spec.resources[0].count: 0 is less than the minimum of 1.0",
    ];
    assert_eq!(lines, expected);
    assert!(!stderr(&o).contains("panicked"));
}

#[test]
fn mixed_sharing_is_explained_once_the_schema_passes() {
    let dir = std::env::temp_dir().join(format!("gt-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = std::fs::read_to_string(root().join("operator/tests/data/bad/plans.yaml")).unwrap();
    let fixed = text.replace("replicas: 1", "replicas: 4");
    let file = dir.join("plans.yaml");
    std::fs::write(&file, fixed).unwrap();
    let o = gpu_tenancy(&["validate", "-f", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout(&o).contains("GpuPartitionPlan/mixed-sharing: spec.gpus[1].mode: the device plugin gives every non-MIG GPU of a node the same sharing"), "{}", stdout(&o));
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn usage_and_read_errors_exit_2() {
    let o = gpu_tenancy(&["validate", "-f", "no/such/file.yaml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).starts_with("error: cannot read no/such/file.yaml:"),
        "{}",
        stderr(&o)
    );
    let o = gpu_tenancy(&["validate"]);
    assert_eq!(o.status.code(), Some(2));
    let o = gpu_tenancy(&["plan", "-f", "examples/", "--inventory", "examples/policy.yaml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("not an inventory file"), "{}", stderr(&o));
}

#[test]
fn garbage_never_panics() {
    let dir = std::env::temp_dir().join(format!("gt-garbage-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let inputs: &[&[u8]] = &[
        b"\xff\xfe\x00binary",
        b"key: [unclosed",
        b"- just\n- a list\n",
        b"apiVersion: gputenancy.io/v1alpha1\nkind: GpuTenant\n",
        b"apiVersion: gputenancy.io/v1alpha1\nkind: GpuTenant\nmetadata: {name: x}\nspec: 7\n",
        b"apiVersion: gputenancy.io/v1alpha1\nkind: Widget\nmetadata: {name: x}\n",
        b"apiVersion: gputenancy.io/v2\nkind: GpuTenant\nmetadata: {name: x}\n",
        b"nodes: 3\n",
        b"version: v1\nmig-configs: {a: [{devices: none, mig-enabled: true}]}\n",
        b"apiVersion: gputenancy.io/v1alpha1\nkind: GpuPartitionPlan\nmetadata: {name: p}\nspec: {gpus: [{devices: \"9-2\", mode: Exclusive}], nodeSelector: {matchLabels: {a: b}}}\n",
    ];
    for (i, input) in inputs.iter().enumerate() {
        let file = dir.join(format!("g{i}.yaml"));
        std::fs::write(&file, input).unwrap();
        let o = gpu_tenancy(&["validate", "-f", file.to_str().unwrap()]);
        let err = stderr(&o);
        assert!(
            !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
            "input {i}: {err}"
        );
        assert!(
            matches!(o.status.code(), Some(1) | Some(2)),
            "input {i} exit {:?}",
            o.status.code()
        );
        for line in stdout(&o).lines() {
            assert!(line.starts_with(file.to_str().unwrap()), "input {i}: {line}");
            assert!(line.matches(": ").count() >= 3, "input {i}: {line}");
        }
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn plan_json_has_nodes_tenants_and_problems() {
    let o = plan_examples(&["-o", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["nodes"].as_array().unwrap().len(), 6);
    assert_eq!(v["tenants"].as_array().unwrap().len(), 7);
    assert_eq!(v["problems"].as_array().unwrap().len(), 0);
    assert_eq!(v["nodes"][0]["kind"], "GpuNode");
    let acme = v["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["metadata"]["name"] == "acme")
        .unwrap();
    assert_eq!(acme["status"]["summary"], "12/12");
}

/// Drops `lastTransitionTime` (the CLI stamps "now") so two computations compare.
fn without_times(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(map) => {
            map.remove("lastTransitionTime");
            map.values_mut().for_each(without_times);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(without_times),
        _ => {}
    }
}

/// Golden test: what `plan -o json` prints is exactly the output of the one function the
/// controller calls.
#[test]
fn plan_json_is_exactly_the_desired_state() {
    use gpu_tenancy::cli::plan::compute;
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now());
    let (desired, problems) = compute(
        &[root().join("examples")],
        Some(&root().join("examples/inventory.yaml")),
        now,
    )
    .unwrap();
    assert_eq!(problems, Vec::<String>::new());
    let o = plan_examples(&["-o", "json"]);
    let mut printed: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let mut computed = serde_json::to_value(&desired).unwrap();
    computed["problems"] = serde_json::json!([]);
    without_times(&mut printed);
    without_times(&mut computed);
    assert_eq!(printed, computed);
    // Every kind of object is there.
    for key in [
        "nodes",
        "tenants",
        "plans",
        "policies",
        "namespaces",
        "resourceQuotas",
        "nodeLabels",
        "configMaps",
        "admissionPolicies",
        "admissionBindings",
    ] {
        assert!(!printed[key].as_array().unwrap().is_empty(), "{key}");
    }
}

/// An object by kind, namespace and name.
type Key = (String, String, String);

fn key_of(o: &serde_json::Value) -> Key {
    let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    (s(&o["kind"]), s(&o["metadata"]["namespace"]), s(&o["metadata"]["name"]))
}

/// `plan -o yaml` prints every object of the desired state that the controller writes whole,
/// and nothing else, each as `-o json` has it (a GpuNode without its status, which is its
/// agent's). The oracle is `-o json`, the desired state serialised field by field: every field
/// of it is either printed or named below as not an object the controller writes, so a kind
/// added to the desired state and forgotten by `-o yaml` fails here.
#[test]
fn plan_yaml_prints_every_object_the_controller_writes() {
    // The fields of the desired state whose objects the controller writes, and those it does not.
    const WRITTEN: [&str; 15] = [
        "nodes",
        "namespaces",
        "resourceQuotas",
        "nodeLabels",
        "configMaps",
        "deviceClasses",
        "admissionPolicies",
        "admissionBindings",
        "mutatingPolicies",
        "mutatingBindings",
        "resourceFlavors",
        "cohorts",
        "clusterQueues",
        "localQueues",
        "workloadPriorityClasses",
    ];
    // The user's own objects (the controller writes only their status), reports, and what Kueue's
    // own Configuration needs (`-o kueue-config`, below).
    const NOT_WRITTEN: [&str; 5] = ["tenants", "plans", "policies", "changes", "kueueDeviceClassMappings"];
    // As for a cluster with Kueue, so its objects are planned too.
    let o = plan_examples(&["-o", "json", "--kueue"]);
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let fields: std::collections::BTreeSet<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .filter(|k| *k != "problems")
        .collect();
    let classified: std::collections::BTreeSet<&str> = WRITTEN.iter().chain(&NOT_WRITTEN).copied().collect();
    assert_eq!(
        fields, classified,
        "a field of the desired state neither printed nor excluded"
    );
    let mut want = std::collections::BTreeMap::new();
    for field in WRITTEN {
        for object in json[field].as_array().unwrap() {
            let mut object = object.clone();
            if object["kind"] == "GpuNode" {
                object.as_object_mut().unwrap().remove("status");
            }
            assert!(want.insert(key_of(&object), object).is_none(), "{field}: twice");
        }
    }

    let o = plan_examples(&["-o", "yaml", "--kueue"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&stdout(&o)).unwrap();
    let mut got = std::collections::BTreeMap::new();
    for d in docs.into_iter().filter(|d| !d.is_null()) {
        assert!(got.insert(key_of(&d), d).is_none(), "printed twice");
    }
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "the same objects"
    );
    for (key, w) in &want {
        let mut g = got[key].clone();
        let mut w = w.clone();
        without_times(&mut g);
        without_times(&mut w);
        assert_eq!(g, w, "{key:?}");
    }
    // Every kind the controller writes for examples/ (which has a DRA pool, so DeviceClasses and
    // the mutating policies too), as the install guide lists them.
    let kinds: std::collections::BTreeSet<&str> = got.keys().map(|k| k.0.as_str()).collect();
    let all: std::collections::BTreeSet<&str> = [
        "GpuNode",
        "Namespace",
        "ResourceQuota",
        "ConfigMap",
        "Node",
        "DeviceClass",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "MutatingAdmissionPolicy",
        "MutatingAdmissionPolicyBinding",
        "ResourceFlavor",
        "ClusterQueue",
        "LocalQueue",
        "WorkloadPriorityClass",
    ]
    .into();
    // No tier of examples/ lends idle capacity: no Cohort (the unit tests plan one).
    assert_eq!(kinds, all, "plan -o yaml prints every kind the controller writes");

    // `-o kueue-config`: Kueue's Configuration with the mappings of every DeviceClass written.
    let o = plan_examples(&["-o", "kueue-config"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let config: serde_json::Value = serde_saphyr::from_str(&stdout(&o)).unwrap();
    assert_eq!(config["kind"], "Configuration");
    let mappings = config["resources"]["deviceClassMappings"].as_array().unwrap().clone();
    assert_eq!(
        serde_json::Value::Array(mappings.clone()),
        json["kueueDeviceClassMappings"]
    );
    let mapped: std::collections::BTreeSet<&str> = mappings
        .iter()
        .flat_map(|m| m["deviceClassNames"].as_array().unwrap())
        .map(|c| c.as_str().unwrap())
        .collect();
    let classes: std::collections::BTreeSet<&str> = json["deviceClasses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(mapped, classes, "every DeviceClass mapped");
    // Each to the extended resource its class names, which the tenant's queue holds.
    for m in &mappings {
        let class = m["deviceClassNames"][0].as_str().unwrap();
        let written = json["deviceClasses"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["metadata"]["name"] == class)
            .unwrap();
        assert_eq!(m["name"], written["spec"]["extendedResourceName"], "{class}");
    }
}

#[test]
fn plan_table_is_for_people() {
    let o = plan_examples(&[]);
    let out = stdout(&o);
    assert!(out.starts_with("NODES\nNODE "), "{out}");
    assert!(out.contains("\nTENANTS\nTENANT "));
    assert!(out.contains("3g.40gb+2×2g.20gb   team-beta,acme"), "{out}");
    let o = plan_examples(&["-o", "wide"]);
    assert!(stdout(&o).contains("2g.20gb@0=team-beta 2g.20gb@2=team-beta 3g.40gb@4=acme"));
}

#[test]
fn nvidia_default_file_imports_validates_and_exports_back() {
    let nvidia = "operator/tests/data/mig-parted-config-default.yaml";
    let o = gpu_tenancy(&["validate", "-f", nvidia]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let o = gpu_tenancy(&["import", "--from", "mig-parted", nvidia]);
    assert_eq!(o.status.code(), Some(0));
    let dir = std::env::temp_dir().join(format!("gt-import-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plans = dir.join("plans.yaml");
    std::fs::write(&plans, &o.stdout).unwrap();
    let o = gpu_tenancy(&["validate", "-f", plans.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let o = gpu_tenancy(&["export", "--to", "mig-parted", "-f", plans.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let back = gpu_tenancy_migparted(&stdout(&o));
    let original = gpu_tenancy_migparted(&std::fs::read_to_string(root().join(nvidia)).unwrap());
    assert_eq!(back, original);
    let o = gpu_tenancy(&["import", "--from", "mig-parted", nvidia, "--config", "all-3g.40gb"]);
    assert!(stdout(&o).contains("name: all-3g.40gb"));
    std::fs::remove_dir_all(dir).ok();
}

fn gpu_tenancy_migparted(text: &str) -> gpu_tenancy::migparted::MigPartedFile {
    gpu_tenancy::migparted::MigPartedFile::parse(text).unwrap()
}

/// What a newcomer runs first (`make plan`) fits a terminal: every line of the default table of
/// `examples/` is at most 120 columns, but the list of changes (a reason per line); `-o wide` keeps
/// each MIG instance's placement and tenant.
#[test]
fn plan_default_table_fits_120_columns() {
    let args = ["plan", "-f", "examples/", "--inventory", "examples/inventory.yaml"];
    let o = gpu_tenancy(&args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let before_changes = out.split("\nCHANGES\n").next().unwrap();
    for line in before_changes.lines() {
        assert!(line.chars().count() <= 120, "{} columns: {line}", line.chars().count());
    }
    assert!(out.contains("3g.40gb+2×2g.20gb"), "{out}");
    assert!(!out.contains("@0="), "the default table counts instances: {out}");

    let o = gpu_tenancy(&[&args[..], &["-o", "wide"]].concat());
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let wide = stdout(&o);
    assert!(wide.contains("LAYOUT (profile@start=tenant)"), "{wide}");
    assert!(wide.contains("3g.40gb@4=acme"), "{wide}");
}
