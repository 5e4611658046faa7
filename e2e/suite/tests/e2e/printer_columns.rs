//! `kubectl apply -f examples/` works, and `kubectl get` shows the CRDs' printer columns, per
//! kind and for the whole `gputenancy` category.

use std::path::PathBuf;

use gpu_tenancy_e2e::{
    CATEGORY, Cleanup, GROUP, KINDS, Names, VERSION, client, crd, ensure_crds, kubectl_async, yaml_docs, yaml_files,
};
use serde_json::Value;

use crate::fixtures;

/// The header words `kubectl get` prints for a CRD: NAME, then each column (upper-cased), the
/// `priority > 0` ones only with `-o wide`.
fn expected_header(plural: &str, wide: bool) -> Vec<String> {
    let crd = crd(plural);
    let version = crd
        .spec
        .versions
        .iter()
        .find(|v| v.name == VERSION)
        .expect("served version");
    let mut words = vec!["NAME".to_owned()];
    for col in version.additional_printer_columns.iter().flatten() {
        if col.priority.unwrap_or(0) > 0 && !wide {
            continue;
        }
        words.extend(col.name.to_uppercase().split_whitespace().map(str::to_owned));
    }
    words
}

fn header_words(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_owned).collect()
}

/// Example files that hold Kubernetes objects (every document has apiVersion and kind);
/// others, like the offline-planning inventory, are not for `kubectl apply`.
fn example_manifests() -> Vec<(PathBuf, Vec<Value>)> {
    yaml_files("examples")
        .into_iter()
        .map(|f| {
            let docs = yaml_docs(&f);
            (f, docs)
        })
        .filter(|(_, docs)| {
            !docs.is_empty()
                && docs
                    .iter()
                    .all(|d| d.get("apiVersion").is_some() && d.get("kind").is_some())
        })
        .collect()
}

#[tokio::test]
async fn examples_apply_and_kubectl_get_prints_the_printer_columns() {
    let client = client().await;
    ensure_crds(&client).await;
    let cleanup = Cleanup::new();
    let names = Names::new("columns");

    // examples/ as a user applies it (client-side apply, the default).
    let manifests = example_manifests();
    assert!(!manifests.is_empty(), "examples/ holds no Kubernetes manifests");
    let mut args = vec!["apply".to_owned()];
    for (file, docs) in &manifests {
        cleanup.add_docs(docs);
        args.push("-f".into());
        args.push(
            file.strip_prefix(gpu_tenancy_e2e::repo_root())
                .unwrap()
                .display()
                .to_string(),
        );
    }
    kubectl_async(args).await.ok();

    // One object of each kind of our own, so every kind has a row whatever examples/ holds.
    let mut own = Vec::new();
    for (kind, _, _) in KINDS {
        let name = names.next();
        let obj = fixtures::valid(kind, &name);
        cleanup.add(kind, &name);
        gpu_tenancy_e2e::api(&client, kind)
            .create(&Default::default(), &serde_json::from_value(obj).unwrap())
            .await
            .unwrap_or_else(|e| panic!("creating a valid {kind}: {e}"));
        own.push((kind, name));
    }

    for (kind, plural, short) in KINDS {
        let example_names: Vec<String> = manifests
            .iter()
            .flat_map(|(_, docs)| docs)
            .filter(|d| d["kind"] == kind && d["apiVersion"] == format!("{GROUP}/{VERSION}"))
            .filter_map(|d| d["metadata"]["name"].as_str().map(str::to_owned))
            .collect();
        let own_name = &own.iter().find(|(k, _)| *k == kind).unwrap().1;
        for (resource, wide) in [(plural, false), (short, false), (plural, true)] {
            let mut args = vec!["get".to_owned(), resource.to_owned()];
            if wide {
                args.extend(["-o".to_owned(), "wide".to_owned()]);
            }
            let out = kubectl_async(args.clone()).await.ok();
            let mut lines = out.lines();
            let header = lines.next().unwrap_or_default();
            assert_eq!(
                header_words(header),
                expected_header(plural, wide),
                "`kubectl {}` header does not match the printer columns of crds/:\n{out}",
                args.join(" ")
            );
            let rows: Vec<&str> = lines.filter_map(|l| l.split_whitespace().next()).collect();
            for name in example_names.iter().chain([own_name]) {
                assert!(
                    rows.contains(&name.as_str()),
                    "`kubectl {}` lacks a row for {name}:\n{out}",
                    args.join(" ")
                );
            }
        }
    }

    // The category lists all four kinds, each block with its own header.
    let out = kubectl_async(vec!["get".into(), CATEGORY.into()]).await.ok();
    for (kind, plural, _) in KINDS {
        let singular = crd(plural).spec.names.singular.unwrap_or_else(|| kind.to_lowercase());
        let row_prefix = format!("{singular}.{GROUP}/");
        let block = out
            .split("\n\n")
            .find(|b| b.lines().nth(1).is_some_and(|l| l.starts_with(&row_prefix)))
            .unwrap_or_else(|| {
                panic!("`kubectl get {CATEGORY}` has no block of {kind} rows ({row_prefix}...):\n{out}")
            });
        let header = block.lines().next().unwrap();
        assert_eq!(
            header_words(header),
            expected_header(plural, false),
            "`kubectl get {CATEGORY}`: header of the {kind} block:\n{out}"
        );
        let own_name = &own.iter().find(|(k, _)| *k == kind).unwrap().1;
        assert!(
            block
                .lines()
                .any(|l| l.split_whitespace().next() == Some(&format!("{row_prefix}{own_name}"))),
            "`kubectl get {CATEGORY}` lacks {row_prefix}{own_name}:\n{out}"
        );
    }
}
