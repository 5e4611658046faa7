//! The permissions deploy/base grants are exactly the ones the controller and the agent need
//! (docs/install.md): a guard against drift and against wildcards. The Helm
//! chart renders the same objects (checked by the e2e suite, which has Helm's renderer).

use gpu_tenancy::controller::kinds::{Scope, permissions};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn docs(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()));
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

/// Every object of deploy/base's own files.
fn base_objects() -> Vec<Value> {
    let dir = root().join("deploy/base");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") && !path.ends_with("kustomization.yaml") {
            out.extend(docs(&path));
        }
    }
    out
}

fn object<'a>(objects: &'a [Value], kind: &str, namespace: Option<&str>, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| {
            o["kind"] == kind && o["metadata"]["name"] == name && o["metadata"]["namespace"].as_str() == namespace
        })
        .unwrap_or_else(|| panic!("deploy/base has no {kind} {namespace:?}/{name}"))
}

/// The (apiGroup, resource, verb) triples a Role or ClusterRole grants.
fn grants(role: &Value) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for rule in role["rules"].as_array().expect("rules") {
        let list = |field: &str| -> Vec<String> {
            rule[field]
                .as_array()
                .unwrap_or_else(|| panic!("a rule without {field}: {rule}"))
                .iter()
                .map(|v| v.as_str().expect("a string").to_owned())
                .collect()
        };
        assert!(rule.get("nonResourceURLs").is_none(), "unexpected rule {rule}");
        // A rule narrowed to names grants `resource/name` for each name.
        let names = rule.get("resourceNames").map(|_| list("resourceNames"));
        for g in list("apiGroups") {
            let resources = list("resources");
            let resources: Vec<String> = match &names {
                None => resources,
                Some(names) => resources
                    .iter()
                    .flat_map(|r| names.iter().map(move |n| format!("{r}:{n}")))
                    .collect(),
            };
            for r in resources {
                for v in list("verbs") {
                    assert!(
                        !out.contains(&(g.clone(), r.clone(), v.clone())),
                        "{g} {r} {v} granted twice"
                    );
                    out.insert((g.clone(), r.clone(), v.clone()));
                }
            }
        }
    }
    out
}

/// `[(group, [resources], [verbs])]` as a set of triples.
fn expect(rules: &[(&str, &[&str], &[&str])]) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for (g, resources, verbs) in rules {
        for r in *resources {
            for v in *verbs {
                out.insert((g.to_string(), r.to_string(), v.to_string()));
            }
        }
    }
    out
}

#[track_caller]
fn assert_grants(role: &Value, want: BTreeSet<(String, String, String)>) {
    let have = grants(role);
    let extra: Vec<_> = have.difference(&want).collect();
    let missing: Vec<_> = want.difference(&have).collect();
    assert!(
        extra.is_empty() && missing.is_empty(),
        "{} {}: grants more than it should: {extra:?}; lacks: {missing:?}",
        role["kind"],
        role["metadata"]["name"]
    );
}

const READ: &[&str] = &["get", "list", "watch"];

/// The grants the controller's table of kinds asks for in `scope`
/// (`gpu_tenancy::controller::kinds::permissions`: list and watch of every row, and the verbs of
/// its writes).
fn from_the_table(scope: Scope) -> BTreeSet<(String, String, String)> {
    permissions()
        .into_iter()
        .filter(|p| p.scope == scope)
        .map(|p| (p.group, p.resource, p.verb.to_string()))
        .collect()
}

/// What operator/src/controller reads and writes: the table of kinds' grants (watches, server-side
/// apply, which may create, statuses through `/status`, patches of Node and Namespace labels and
/// Node taints, deletes of owned objects), and what is no row's: the reads of a single object (a
/// pod an agent asks it to evict; any GpuTenant, which the API server checks before it admits a
/// policy or binding whose parameter is a GpuTenant), the eviction, events through
/// kube-runtime's Recorder (events.k8s.io), the Lease through kube-lease-manager (server-side
/// apply) plus a watch for its release.
#[test]
fn controller_cluster_role_grants_exactly_what_the_controller_needs() {
    let objects = base_objects();
    let role = object(&objects, "ClusterRole", None, "gpu-tenancy-controller");
    let mut want = from_the_table(Scope::Cluster);
    want.extend(expect(&[
        // The API server's check on a policy whose parameter is a GpuTenant.
        ("gputenancy.io", &["gputenants"], &["get"]),
        ("", &["pods"], &["get"]),
        ("", &["pods/eviction"], &["create"]),
        ("events.k8s.io", &["events"], &["create", "patch"]),
    ]));
    assert_grants(role, want);
    let plugin = object(&objects, "Role", Some("nvidia-device-plugin"), "gpu-tenancy-controller");
    assert_grants(plugin, from_the_table(Scope::DevicePluginNamespace));
    let leases = object(
        &objects,
        "Role",
        Some("gpu-tenancy-system"),
        "gpu-tenancy-controller-leader-election",
    );
    assert_grants(
        leases,
        expect(&[(
            "coordination.k8s.io",
            &["leases"],
            &["get", "list", "watch", "create", "patch"],
        )]),
    );
}

#[test]
fn agent_cluster_role_grants_exactly_what_the_agent_needs() {
    let objects = base_objects();
    let role = object(&objects, "ClusterRole", None, "gpu-tenancy-agent");
    assert_grants(
        role,
        expect(&[
            ("gputenancy.io", &["gpunodes"], &["get", "list", "watch", "create"]),
            ("gputenancy.io", &["gpunodes/status"], &["patch"]),
            ("", &["nodes"], &["get", "patch"]),
            ("", &["pods"], &["list"]),
            (
                "resource.k8s.io",
                &["resourceslices"],
                &["list", "watch", "create", "patch", "delete"],
            ),
            ("resource.k8s.io", &["resourceclaims"], &["get"]),
            // The hand-over evidence: its own driver's entries of claims on its own node only.
            ("resource.k8s.io", &["resourceclaims/status"], &["patch"]),
            (
                "resource.k8s.io",
                &["resourceclaims/driver:gpu.gputenancy.io"],
                &["associated-node:patch"],
            ),
            ("gputenancy.io", &["gputenants"], &["list", "watch"]),
            ("events.k8s.io", &["events"], &["create", "patch"]),
        ]),
    );
    let plugin = object(&objects, "Role", Some("nvidia-device-plugin"), "gpu-tenancy-agent");
    assert_grants(plugin, expect(&[("", &["pods"], &["delete"])]));
}

/// No wildcard anywhere, and every role is bound to the service account it is named after.
#[test]
fn no_wildcards_and_each_role_bound_to_its_service_account() {
    let objects = base_objects();
    let mut roles = 0;
    for o in &objects {
        let kind = o["kind"].as_str().unwrap_or_default();
        if kind == "Role" || kind == "ClusterRole" {
            roles += 1;
            for (g, r, v) in grants(o) {
                assert!(
                    !(g.contains('*') || r.contains('*') || v.contains('*')),
                    "{kind} {}: wildcard in {g} {r} {v}",
                    o["metadata"]["name"]
                );
            }
        }
        if kind == "RoleBinding" || kind == "ClusterRoleBinding" {
            let name = o["metadata"]["name"].as_str().unwrap();
            let sa = if name.starts_with("gpu-tenancy-controller") {
                "gpu-tenancy-controller"
            } else {
                "gpu-tenancy-agent"
            };
            assert_eq!(o["roleRef"]["name"], name, "{kind} {name}: roleRef");
            assert_eq!(
                o["subjects"],
                serde_json::json!([{"kind": "ServiceAccount", "name": sa, "namespace": "gpu-tenancy-system"}]),
                "{kind} {name}: subjects"
            );
        }
    }
    assert_eq!(
        roles, 6,
        "three ClusterRoles (controller, agent, tenant viewer) and three Roles"
    );
}

/// A tenant's users read GpuTenants (their grants and conditions) and nothing else; the role is
/// for a platform team to bind, so deploy/base binds it to no one.
#[test]
fn tenant_viewer_reads_gputenants_only_and_is_bound_to_no_one() {
    let objects = base_objects();
    let role = object(&objects, "ClusterRole", None, "gpu-tenancy-tenant-viewer");
    assert_grants(role, expect(&[("gputenancy.io", &["gputenants"], READ)]));
    assert!(
        objects
            .iter()
            .all(|o| o["roleRef"]["name"] != "gpu-tenancy-tenant-viewer"),
        "deploy/base binds gpu-tenancy-tenant-viewer"
    );
}

/// crds/Kustomization (how deploy/base installs the CRDs without a copy) lists every CRD file.
#[test]
fn crds_kustomization_lists_every_crd() {
    let dir = root().join("crds");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    files.sort();
    let k = docs(&dir.join("Kustomization"));
    let mut listed: Vec<String> = k[0]["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    listed.sort();
    assert_eq!(
        listed, files,
        "crds/Kustomization must list exactly the CRD files of crds/"
    );
}
