//! `kubectl apply -f examples/` works, and `kubectl get` shows the CRDs' printer columns, per
//! kind and for the whole `gputenancy` category; the cells hold the values of the status written.

use std::collections::BTreeMap;
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

/// `kubectl get <resource> <name>` as header → cell. Columns start where their header word starts
/// (kubectl aligns them), so a cell may hold spaces (a GpuNode's layout does).
async fn printed_row(resource: &str, name: &str) -> BTreeMap<String, String> {
    printed_row_with(resource, name, &[]).await
}

/// The cells of `kubectl get RESOURCE NAME [FLAGS]`, by header. Columns are found by character,
/// not byte: kubectl pads cells by runes, and a layout holds `×`.
async fn printed_row_with(resource: &str, name: &str, flags: &[&str]) -> BTreeMap<String, String> {
    let mut args: Vec<String> = vec!["get".into(), resource.into(), name.into()];
    args.extend(flags.iter().map(|f| f.to_string()));
    let out = kubectl_async(args).await.ok();
    let mut lines = out.lines();
    let header: Vec<char> = lines.next().unwrap_or_default().chars().collect();
    let row: Vec<char> = lines
        .next()
        .unwrap_or_else(|| panic!("`kubectl get {resource} {name}` printed no row:\n{out}"))
        .chars()
        .collect();
    let starts: Vec<usize> = (0..header.len())
        .filter(|&i| header[i] != ' ' && (i == 0 || header[i - 1] == ' '))
        .collect();
    let text = |v: &[char], from: usize, to: usize| -> String {
        v.get(from.min(v.len())..to.min(v.len()))
            .unwrap_or_default()
            .iter()
            .collect::<String>()
            .trim()
            .to_owned()
    };
    let mut cells = BTreeMap::new();
    for (k, &start) in starts.iter().enumerate() {
        let end = starts.get(k + 1).copied().unwrap_or(usize::MAX);
        let word = text(&header, start, header.len())
            .split(' ')
            .next()
            .unwrap_or_default()
            .to_owned();
        cells.insert(word, text(&row, start, end));
    }
    cells
}

/// Writes `status` with server-side apply on /status, the way the controller does.
async fn write_status(client: &kube::Client, kind: &str, name: &str, status: Value) {
    let patch = serde_json::json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": kind,
        "metadata": {"name": name},
        "status": status,
    });
    gpu_tenancy_e2e::api(client, kind)
        .patch_status(
            name,
            &kube::api::PatchParams::apply("gpu-tenancy-e2e-columns").force(),
            &kube::api::Patch::Apply(&patch),
        )
        .await
        .unwrap_or_else(|e| panic!("{kind} {name}: server-side apply to /status: {e}"));
}

fn ready(status: &str) -> Value {
    serde_json::json!([{
        "type": "Ready",
        "status": status,
        "reason": "Written",
        "message": "written by the e2e suite",
        "lastTransitionTime": "2026-01-01T00:00:00Z"
    }])
}

fn cells(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// The printed cells hold the values a status carries, not only the headers: each kind gets a
/// status with known values through /status, and `kubectl get` must print exactly those.
#[tokio::test]
async fn kubectl_get_prints_the_status_values_in_the_columns() {
    let client = client().await;
    ensure_crds(&client).await;
    let cleanup = Cleanup::new();
    let names = Names::new("cells");

    let mut created = Vec::new();
    for (kind, _, _) in KINDS {
        let name = names.next();
        let mut obj = fixtures::valid(kind, &name);
        match kind {
            "GpuTenant" => obj["spec"]["priority"] = serde_json::json!(42),
            "GpuPartitionPlan" => obj["spec"]["priority"] = serde_json::json!(7),
            "SharingPolicy" => obj["spec"]["memoryHeadroomPercent"] = serde_json::json!(15),
            _ => {}
        }
        cleanup.add(kind, &name);
        gpu_tenancy_e2e::api(&client, kind)
            .create(&Default::default(), &serde_json::from_value(obj).unwrap())
            .await
            .unwrap_or_else(|e| panic!("creating a valid {kind}: {e}"));
        created.push((kind, name));
    }
    let name_of = |kind: &str| created.iter().find(|(k, _)| *k == kind).unwrap().1.clone();

    let policy = name_of("SharingPolicy");
    write_status(
        &client,
        "SharingPolicy",
        &policy,
        serde_json::json!({"tiers": "external,internal,experimental", "tenants": 3, "conditions": ready("True")}),
    )
    .await;
    let tenant = name_of("GpuTenant");
    write_status(
        &client,
        "GpuTenant",
        &tenant,
        serde_json::json!({"summary": "3/5", "conditions": [
            ready("True")[0].clone(),
            {"type": "Isolated", "status": "True", "reason": "DraBound", "message": "written by the e2e suite",
             "lastTransitionTime": "2026-01-01T00:00:00Z"}
        ]}),
    )
    .await;
    let plan = name_of("GpuPartitionPlan");
    write_status(
        &client,
        "GpuPartitionPlan",
        &plan,
        serde_json::json!({
            "nodes": {"selected": 12, "updated": 9, "applied": 7, "pending": 4, "waiting": 0, "failed": 1},
            "conditions": ready("False")
        }),
    )
    .await;
    let node = name_of("GpuNode");
    write_status(
        &client,
        "GpuNode",
        &node,
        serde_json::json!({
            "gpuCount": 4,
            "layout": "[3g.40gb+2×2g.20gb] MPS 2×Exclusive",
            "gpuLayout": "0:3g.40gb+2g.20gb+2g.20gb 1:MPS 2:Exclusive 3:Exclusive",
            "conditions": ready("True")
        }),
    )
    .await;

    let cases = [
        (
            "sharingpolicies",
            &policy,
            cells(&[
                ("NAME", &policy),
                ("TIERS", "external,internal,experimental"),
                ("HEADROOM", "15"),
                ("TENANTS", "3"),
                ("READY", "True"),
            ]),
        ),
        (
            "gputenants",
            &tenant,
            cells(&[
                ("NAME", &tenant),
                ("TIER", "external"),
                ("PRIORITY", "42"),
                ("GRANTED", "3/5"),
                ("ISOLATION", "DraBound"),
                ("READY", "True"),
            ]),
        ),
        (
            "gpupartitionplans",
            &plan,
            cells(&[
                ("NAME", &plan),
                ("PRIORITY", "7"),
                ("SELECTED", "12"),
                ("UPDATED", "9"),
                ("APPLIED", "7"),
                ("READY", "False"),
            ]),
        ),
        (
            "gpunodes",
            &node,
            cells(&[
                ("NAME", &node),
                ("PLAN", "h100-mixed"),
                ("GPUS", "4"),
                ("LAYOUT", "[3g.40gb+2×2g.20gb] MPS 2×Exclusive"),
                ("READY", "True"),
            ]),
        ),
    ];
    for (resource, name, want) in cases {
        let mut got = printed_row(resource, name).await;
        // Age is the clock's; it is there and not empty.
        let age = got.remove("AGE").unwrap_or_default();
        assert!(
            !age.is_empty(),
            "`kubectl get {resource} {name}` has no AGE cell: {got:?}"
        );
        assert_eq!(
            got, want,
            "`kubectl get {resource} {name}`: printed cells vs the status written"
        );
    }
    // `-o wide` adds each GPU's placement after the short layout.
    let wide = printed_row_with("gpunodes", &node, &["-o", "wide"]).await;
    assert_eq!(
        (wide.get("LAYOUT"), wide.get("PLACEMENT")),
        (
            Some(&"[3g.40gb+2×2g.20gb] MPS 2×Exclusive".to_string()),
            Some(&"0:3g.40gb+2g.20gb+2g.20gb 1:MPS 2:Exclusive 3:Exclusive".to_string())
        ),
        "`kubectl get gpunodes {node} -o wide`: {wide:?}"
    );
}
