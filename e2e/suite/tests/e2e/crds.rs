//! `kubectl apply --server-side -f crds/` installs the four CRDs and they become Established.

use std::collections::BTreeSet;

use gpu_tenancy_e2e::{CATEGORY, GROUP, KINDS, VERSION, apply_crds, client, crds, kubectl_async};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;

#[tokio::test]
async fn crds_install_with_server_side_apply_and_become_established() {
    let client = client().await;
    // Server-side apply of the whole directory, as a GitOps tool or a person would do it.
    apply_crds(&client).await;

    let committed = crds();
    let plurals: BTreeSet<&str> = committed.keys().map(String::as_str).collect();
    let expected: BTreeSet<&str> = KINDS.iter().map(|(_, p, _)| *p).collect();
    assert_eq!(plurals, expected, "crds/ must hold exactly the four gputenancy.io CRDs");

    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (kind, plural, short) in KINDS {
        let name = format!("{plural}.{GROUP}");
        let crd = api.get(&name).await.unwrap_or_else(|e| panic!("get CRD {name}: {e}"));
        let spec = &crd.spec;
        assert_eq!(spec.group, GROUP, "{name}: group");
        assert_eq!(spec.scope, "Cluster", "{name}: must be cluster-scoped");
        assert_eq!(spec.names.kind, kind, "{name}: kind");
        assert_eq!(spec.names.plural, plural, "{name}: plural");
        assert!(
            spec.names.short_names.iter().flatten().any(|s| s == short),
            "{name}: short name {short} missing (has {:?})",
            spec.names.short_names
        );
        assert!(
            spec.names.categories.iter().flatten().any(|c| c == CATEGORY),
            "{name}: category {CATEGORY} missing (has {:?})",
            spec.names.categories
        );
        let v = spec
            .versions
            .iter()
            .find(|v| v.name == VERSION)
            .unwrap_or_else(|| panic!("{name}: no version {VERSION}"));
        assert!(v.served && v.storage, "{name}: {VERSION} must be served and stored");
        assert!(
            v.subresources.as_ref().and_then(|s| s.status.as_ref()).is_some(),
            "{name}: status subresource missing"
        );
        assert!(
            v.additional_printer_columns.as_ref().is_some_and(|c| !c.is_empty()),
            "{name}: no printer columns"
        );

        let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
        for wanted in ["Established", "NamesAccepted"] {
            let c = conditions.iter().find(|c| c.type_ == wanted);
            assert!(
                c.is_some_and(|c| c.status == "True"),
                "{name}: condition {wanted} is not True: {c:?}"
            );
        }
    }

    // Discovery serves them, with the category and short names.
    let out = kubectl_async(vec![
        "api-resources".into(),
        format!("--api-group={GROUP}"),
        "-o".into(),
        "wide".into(),
    ])
    .await
    .ok();
    for (kind, plural, short) in KINDS {
        let line = out
            .lines()
            .find(|l| l.split_whitespace().next() == Some(plural))
            .unwrap_or_else(|| panic!("kubectl api-resources does not list {plural}:\n{out}"));
        for word in [short, kind, "false", CATEGORY] {
            assert!(
                line.split_whitespace()
                    .any(|w| w == word || w.split(',').any(|x| x == word)),
                "api-resources line for {plural} lacks {word:?}: {line}"
            );
        }
    }

    // Applying again changes nothing and still succeeds (idempotent, as GitOps re-syncs are).
    apply_crds(&client).await;
}

/// Installing crds/ on a fresh cluster must not make the API server warn (`kubectl apply`, Argo CD
/// and Flux all show such warnings to users). Warnings come on create only, so each CRD is
/// created with server-side dry-run under a group of its own, which leaves the cluster unchanged.
#[tokio::test]
async fn crds_install_without_api_server_warnings() {
    let _client = client().await;
    let dir = std::env::temp_dir().join(format!("gpu-tenancy-e2e-crds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut warnings = Vec::new();
    for (plural, crd) in crds() {
        let mut v = serde_json::to_value(&crd).unwrap();
        let group = format!("warnings-check.{GROUP}");
        v["spec"]["group"] = group.clone().into();
        v["metadata"]["name"] = format!("{plural}.{group}").into();
        let file = dir.join(format!("{plural}.json"));
        std::fs::write(&file, serde_json::to_vec(&v).unwrap()).unwrap();
        let out = kubectl_async(vec![
            "create".into(),
            "--dry-run=server".into(),
            "-f".into(),
            file.display().to_string(),
        ])
        .await;
        let stderr = out.stderr.clone();
        out.ok();
        warnings.extend(
            stderr
                .lines()
                .filter(|l| l.starts_with("Warning:"))
                .map(|l| format!("crds/{plural}.{GROUP}.yaml: {l}")),
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        warnings.is_empty(),
        "the API server warns about crds/:\n  {}",
        warnings.join("\n  ")
    );
}
