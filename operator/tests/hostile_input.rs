//! Hostile and oversized input to the offline commands: standard input, streams of
//! thousands of documents, counts that would allocate, and a bounded fuzz. Whatever comes in, the
//! binary exits 0, 1 or 2, prints one line per problem and never panics.
//!
//! The fuzz runs 256 cases by default; `PROPTEST_CASES=5000 cargo test --test hostile_input` runs more.

use proptest::prelude::*;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs the binary with `stdin` on standard input.
fn run(args: &[&str], stdin: &[u8], env: &[(&str, &str)]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpu-tenancy"))
        .args(args)
        .current_dir(root())
        .envs(env.iter().copied())
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs");
    let mut input = child.stdin.take().unwrap();
    // The command may stop reading early (a usage error); a broken pipe is then expected.
    let _ = input.write_all(stdin);
    drop(input);
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Exit 0/1/2, no panic, no backtrace, and every problem line is `FILE: Kind/name: field: message`.
fn assert_well_behaved(o: &Output) {
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    let code = o.status.code();
    assert!(
        matches!(code, Some(0..=2)),
        "exit {code:?}\nstdout: {out}\nstderr: {err}"
    );
    for s in [&out, &err] {
        assert!(!s.contains("panicked") && !s.contains("stack backtrace"), "{s}");
    }
    for line in err.lines() {
        assert!(!line.trim().is_empty(), "empty line on stderr: {err:?}");
    }
}

fn tenant(i: usize) -> String {
    format!(
        "apiVersion: gputenancy.io/v1alpha1\nkind: GpuTenant\nmetadata:\n  name: t{i}\nspec:\n  tier: internal\n  namespaces: [ns{i}]\n  resources:\n  - {{mode: MPS, count: 1}}\n"
    )
}

fn inventory(nodes: usize) -> String {
    let mut s = String::from("nodes:\n");
    for i in 0..nodes {
        s.push_str(&format!(
            "- name: n{i}\n  labels: {{nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}}\n  gpus:\n  - {{pciDeviceId: \"0x233010DE\", count: 8}}\n"
        ));
    }
    s
}

fn write_temp(name: &str, body: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("hostile_input");
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    p
}

#[test]
fn validate_reads_standard_input() {
    let o = run(&["validate", "-f", "-"], tenant(1).as_bytes(), &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let bad = "apiVersion: gputenancy.io/v1alpha1\nkind: GpuTenant\nmetadata: {name: x}\nspec: {tier: 5}\n";
    let o = run(&["validate", "-f", "-"], bad.as_bytes(), &[]);
    assert_eq!(o.status.code(), Some(1));
    let out = text(&o.stdout);
    assert!(out.lines().all(|l| l.starts_with("-: GpuTenant/x: ")), "{out}");
}

#[test]
fn plan_reads_manifests_from_standard_input() {
    let policy = std::fs::read_to_string(root().join("examples/policy.yaml")).unwrap();
    let o = run(
        &[
            "plan",
            "-f",
            "-",
            "--inventory",
            "examples/inventory.yaml",
            "-o",
            "json",
        ],
        format!("{policy}\n---\n{}", tenant(1)).as_bytes(),
        &[],
    );
    assert_well_behaved(&o);
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).expect("plan prints JSON");
    assert!(json["tenants"].as_array().is_some_and(|t| !t.is_empty()), "{json}");
}

#[test]
fn thousands_of_documents_validate() {
    let n = 5_000;
    let stream: Vec<String> = (0..n).map(tenant).collect();
    let started = std::time::Instant::now();
    let o = run(&["validate", "-f", "-"], stream.join("---\n").as_bytes(), &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stdout));
    assert!(text(&o.stderr).contains(&format!("{n} tenants")), "{}", text(&o.stderr));
    eprintln!("{n} tenants validated in {:?}", started.elapsed());
}

#[test]
fn a_document_limit_names_itself_and_how_to_raise_it() {
    let stream: Vec<String> = (0..20).map(tenant).collect();
    let o = run(
        &["validate", "-f", "-"],
        stream.join("---\n").as_bytes(),
        &[("GPU_TENANCY_MAX_DOCUMENTS", "10")],
    );
    assert_eq!(o.status.code(), Some(1));
    let out = text(&o.stdout);
    assert!(
        out.contains("more than 10 YAML documents") && out.contains("GPU_TENANCY_MAX_DOCUMENTS"),
        "{out}"
    );
    assert!(!out.contains("not valid YAML"), "{out}");
    let o = run(
        &["validate", "-f", "-"],
        b"a: b\n",
        &[("GPU_TENANCY_MAX_INPUT_BYTES", "2")],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("GPU_TENANCY_MAX_INPUT_BYTES"),
        "{}",
        text(&o.stderr)
    );
    let o = run(&["validate", "-f", "-"], b"", &[("GPU_TENANCY_MAX_DOCUMENTS", "lots")]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn a_large_inventory_plans() {
    // 50,000 nodes take long in a debug build; the budget is checked at full size by parsing only.
    let full = inventory(50_000);
    let o = run(&["validate", "-f", "-"], full.as_bytes(), &[]);
    assert_eq!(o.status.code(), Some(0), "{}{}", text(&o.stdout), text(&o.stderr));
    assert!(text(&o.stderr).contains("50000 inventory nodes"), "{}", text(&o.stderr));
    let n = if cfg!(debug_assertions) { 2_000 } else { 50_000 };
    let inv = write_temp("inventory.yaml", &inventory(n));
    let started = std::time::Instant::now();
    let o = run(
        &[
            "plan",
            "-f",
            "examples/policy.yaml",
            "--inventory",
            inv.to_str().unwrap(),
            "-o",
            "json",
        ],
        b"",
        &[],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    eprintln!("{n} inventory nodes planned in {:?}", started.elapsed());
}

#[test]
fn unbounded_counts_are_refused_by_field() {
    let inv = "nodes:\n- name: a\n  gpus:\n  - {pciDeviceId: \"0x233010DE\", count: 4000000000}\n";
    let p = write_temp("huge-count.yaml", inv);
    let o = run(
        &["plan", "-f", "examples/policy.yaml", "--inventory", p.to_str().unwrap()],
        b"",
        &[],
    );
    assert_well_behaved(&o);
    let all = text(&o.stdout) + &text(&o.stderr);
    assert!(
        all.contains("nodes[0].gpus[0].count") && all.contains("at most 64"),
        "{all}"
    );
    let many = "nodes:\n- name: a\n  gpus:\n  - {pciDeviceId: \"0x233010DE\", count: 40}\n  - {pciDeviceId: \"0x233010DE\", count: 40}\n";
    let o = run(&["validate", "-f", "-"], many.as_bytes(), &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stdout).contains("nodes[0].gpus: the node has 80 GPUs"),
        "{}",
        text(&o.stdout)
    );
    let mig = "version: v1\nmig-configs:\n  x:\n  - devices: all\n    mig-enabled: true\n    mig-devices: {1g.10gb: 4294967295}\n";
    let p = write_temp("mig.yaml", mig);
    let o = run(&["import", "--from", "mig-parted", p.to_str().unwrap()], b"", &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains("mig-devices[\"1g.10gb\"]: count"),
        "{}",
        text(&o.stdout)
    );
}

const KINDS: [&str; 7] = [
    "GpuTenant",
    "SharingPolicy",
    "GpuPartitionPlan",
    "GpuNode",
    "ConfigMap",
    "",
    "Gpu",
];
const FIELDS: [&str; 14] = [
    "spec",
    "tier",
    "count",
    "mode",
    "profile",
    "namespaces",
    "resources",
    "nodeSelector",
    "devices",
    "gpus",
    "nodes",
    "mig-configs",
    "mig-devices",
    "name",
];

/// A YAML-ish value: scalars of every type, nested mappings and lists of our field names.
fn value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        Just("18446744073709551616".to_string()),
        Just("-1".to_string()),
        Just("null".to_string()),
        Just("true".to_string()),
        Just("MIG".to_string()),
        Just("all".to_string()),
        Just("1g.10gb".to_string()),
        "[a-z0-9.:-]{0,12}".prop_map(|s| format!("{s:?}")),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(|v| format!("[{}]", v.join(", "))),
            prop::collection::vec((prop::sample::select(&FIELDS[..]), inner), 0..5).prop_map(|kv| {
                let items: Vec<String> = kv.into_iter().map(|(k, v)| format!("{k:?}: {v}")).collect();
                format!("{{{}}}", items.join(", "))
            }),
        ]
    })
}

fn document() -> impl Strategy<Value = String> {
    (
        prop::sample::select(&KINDS[..]),
        any::<bool>(),
        prop::collection::vec((prop::sample::select(&FIELDS[..]), value()), 0..6),
    )
        .prop_map(|(kind, ours, fields)| {
            let mut d = String::new();
            if !kind.is_empty() {
                let api = if ours { "gputenancy.io/v1alpha1" } else { "v1" };
                d.push_str(&format!("apiVersion: {api}\nkind: {kind}\nmetadata: {{name: x}}\n"));
            }
            for (k, v) in fields {
                d.push_str(&format!("{k:?}: {v}\n"));
            }
            d
        })
}

proptest! {
    // Each case starts the binary three times; PROPTEST_CASES overrides the count.
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(256)
    ))]

    #[test]
    fn any_input_is_a_problem_not_a_crash(
        input in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..256),
            prop::collection::vec(document(), 0..4).prop_map(|d| d.join("---\n").into_bytes()),
        ]
    ) {
        let file = write_temp(&format!("fuzz-{}.yaml", std::process::id()), &text(&input));
        let path = file.to_str().unwrap();
        assert_well_behaved(&run(&["validate", "-f", "-"], &input, &[]));
        assert_well_behaved(&run(&["plan", "-f", "examples/policy.yaml", "--inventory", path], b"", &[]));
        assert_well_behaved(&run(&["import", "--from", "mig-parted", path], b"", &[]));
    }
}
