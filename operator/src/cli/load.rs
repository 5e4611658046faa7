//! Reading manifests: files or folders of multi-document YAML, sorted into the four kinds, the
//! inventory and mig-parted files, with every problem tied to its file and object.

use crate::api::{API_VERSION, GpuNode, GpuPartitionPlan, GpuTenant, SharingPolicy};
use crate::inventory::InventoryFile;
use crate::migparted::{MigPartedFile, import};
use crate::schema::SchemaChecker;
use serde_json::Value;
use serde_saphyr::budget::BudgetBreach;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The path that names standard input: `kustomize build . | gpu-tenancy validate -f -`.
pub const STDIN: &str = "-";

/// How much YAML one run reads. serde-saphyr's own defaults (1,024 documents, 250,000 nodes) are
/// made for config files; a rendered fleet is larger (5,000 tenants in one stream, an inventory of
/// 50,000 nodes), so ours are set above those and can be raised by environment variables. Every
/// limit still bounds memory: nothing grows with the input past them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Documents in one file or stream.
    pub documents: usize,
    /// YAML nodes (mappings, sequences, scalars) in one file or stream.
    pub nodes: usize,
    /// Bytes of one file or of standard input.
    pub bytes: usize,
}

pub const MAX_DOCUMENTS_ENV: &str = "GPU_TENANCY_MAX_DOCUMENTS";
pub const MAX_YAML_NODES_ENV: &str = "GPU_TENANCY_MAX_YAML_NODES";
pub const MAX_INPUT_BYTES_ENV: &str = "GPU_TENANCY_MAX_INPUT_BYTES";

/// Why the input could not be read (exit 2); what is wrong inside it is a [`FileProblem`].
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A limit's environment variable (`var`) is not a positive whole number.
    #[error("{var}={value:?} is not a positive whole number")]
    Limit { var: &'static str, value: OsString },
    #[error(
        "cannot read {}: larger than {limit} bytes, the limit; set {var} to a larger number to read it",
        .path.display(),
        var = MAX_INPUT_BYTES_ENV
    )]
    TooBig { path: PathBuf, limit: usize },
    #[error("cannot read {}: {source}", .path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cannot read {}: not UTF-8 text ({source})", .path.display())]
    NotUtf8 {
        path: PathBuf,
        source: std::string::FromUtf8Error,
    },
    #[error("cannot read folder {}: {source}", .path.display())]
    Folder { path: PathBuf, source: std::io::Error },
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            documents: 100_000,
            nodes: 4_000_000,
            bytes: 128 * 1024 * 1024,
        }
    }
}

impl Limits {
    /// The defaults, raised or lowered by `GPU_TENANCY_MAX_DOCUMENTS`, `GPU_TENANCY_MAX_YAML_NODES`
    /// and `GPU_TENANCY_MAX_INPUT_BYTES`. A value that is not a positive number is a usage error.
    pub fn from_env() -> Result<Limits, LoadError> {
        let mut limits = Limits::default();
        for (var, slot) in [
            (MAX_DOCUMENTS_ENV, &mut limits.documents),
            (MAX_YAML_NODES_ENV, &mut limits.nodes),
            (MAX_INPUT_BYTES_ENV, &mut limits.bytes),
        ] {
            if let Some(v) = std::env::var_os(var) {
                *slot = v
                    .to_str()
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .filter(|&n| n > 0)
                    .ok_or(LoadError::Limit { var, value: v })?;
            }
        }
        Ok(limits)
    }

    /// serde-saphyr's options with our budget; the limits not listed keep its defaults (depth 64,
    /// aliases and anchors), which no real manifest comes near.
    pub fn yaml_options(&self) -> serde_saphyr::Options {
        let mut budget = serde_saphyr::Budget::default();
        budget.max_documents = self.documents;
        budget.max_nodes = self.nodes;
        // Every node is one event, every container one more at its end, every document two.
        budget.max_events = self
            .nodes
            .saturating_mul(2)
            .saturating_add(self.documents.saturating_mul(2))
            .saturating_add(16);
        budget.max_total_scalar_bytes = self.bytes;
        budget.max_reader_input_bytes = Some(self.bytes);
        let mut options = serde_saphyr::Options::default();
        options.budget = Some(budget);
        options
    }

    /// When a YAML error is one of our limits, what says which limit and how to raise it.
    pub fn breach(&self, e: &serde_saphyr::Error) -> Option<String> {
        let mut inner = e;
        while let serde_saphyr::Error::AliasError { error, .. } | serde_saphyr::Error::WithSnippet { error, .. } = inner
        {
            inner = error;
        }
        let serde_saphyr::Error::Budget { breach, .. } = inner else {
            return None;
        };
        let raise = |what: &str, limit: usize, var: &str| {
            format!("more than {limit} {what}, the limit; set {var} to a larger number to read it")
        };
        Some(match breach {
            BudgetBreach::Documents { .. } => raise("YAML documents", self.documents, MAX_DOCUMENTS_ENV),
            BudgetBreach::Nodes { .. } | BudgetBreach::Events { .. } => raise(
                "YAML nodes (mappings, lists and values)",
                self.nodes,
                MAX_YAML_NODES_ENV,
            ),
            BudgetBreach::ScalarBytes { .. } | BudgetBreach::InputBytes { .. } => {
                raise("bytes", self.bytes, MAX_INPUT_BYTES_ENV)
            }
            other => format!(
                "YAML safety limit exceeded ({other:?}); nesting, anchors and aliases are kept small on purpose"
            ),
        })
    }

    /// Reads one file, or standard input for `-`, refusing more than [`Limits::bytes`] before
    /// reading it all.
    pub fn read(&self, path: &Path) -> Result<String, LoadError> {
        let too_big = || LoadError::TooBig {
            path: path.to_path_buf(),
            limit: self.bytes,
        };
        let unreadable = |source| LoadError::Read {
            path: path.to_path_buf(),
            source,
        };
        let mut bytes = Vec::new();
        let cap = u64::try_from(self.bytes).unwrap_or(u64::MAX).saturating_add(1);
        let read = if path.as_os_str() == STDIN {
            std::io::stdin().lock().take(cap).read_to_end(&mut bytes)
        } else {
            let file = std::fs::File::open(path).map_err(unreadable)?;
            if file.metadata().is_ok_and(|m| m.len() > self.bytes as u64) {
                return Err(too_big());
            }
            file.take(cap).read_to_end(&mut bytes)
        };
        read.map_err(unreadable)?;
        if bytes.len() > self.bytes {
            return Err(too_big());
        }
        String::from_utf8(bytes).map_err(|source| LoadError::NotUtf8 {
            path: path.to_path_buf(),
            source,
        })
    }
}

/// A problem found while loading, already in the `FILE: Kind/name: field: message` form's parts.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct FileProblem {
    pub file: String,
    pub object: String,
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for FileProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}: {}: {}", self.file, self.object, self.field, self.message)
    }
}

/// Everything read from the paths.
#[derive(Default)]
pub struct Loaded {
    pub policies: Vec<SharingPolicy>,
    pub tenants: Vec<GpuTenant>,
    pub plans: Vec<GpuPartitionPlan>,
    pub nodes: Vec<GpuNode>,
    /// Kubernetes Nodes (`kubectl get nodes -o yaml`): with `nodes`, a live cluster's inventory.
    pub cluster_nodes: Vec<k8s_openapi::api::core::v1::Node>,
    pub inventories: Vec<(String, InventoryFile)>,
    pub problems: Vec<FileProblem>,
    /// `Kind/name` → file, to place problems found later.
    pub origin: BTreeMap<String, String>,
}

/// Files named by the paths: files as given (`-` is standard input), folders walked for
/// `*.yaml`/`*.yml`, sorted.
/// A missing path is a read error (exit 2), not a problem of the input.
pub fn collect_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, LoadError> {
    let mut out = Vec::new();
    for p in paths {
        if p.as_os_str() == STDIN {
            out.push(p.clone());
            continue;
        }
        let meta = std::fs::metadata(p).map_err(|source| LoadError::Read {
            path: p.clone(),
            source,
        })?;
        if meta.is_dir() {
            walk(p, &mut out).map_err(|source| LoadError::Folder {
                path: p.clone(),
                source,
            })?;
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    entries.sort();
    for p in entries {
        if p.is_dir() {
            walk(&p, out)?;
        } else if p.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(p);
        }
    }
    Ok(())
}

/// Reads and classifies every document. Read errors are returned; content problems are collected.
pub fn load(paths: &[PathBuf]) -> Result<Loaded, LoadError> {
    let limits = Limits::from_env()?;
    let checker = SchemaChecker::new();
    let mut loaded = Loaded::default();
    for file in collect_files(paths)? {
        let name = file.display().to_string();
        let text = limits.read(&file)?;
        let docs: Vec<Value> = match serde_saphyr::from_multiple_with_options(&text, limits.yaml_options()) {
            Ok(d) => d,
            Err(e) => {
                loaded.problems.push(FileProblem {
                    file: name.clone(),
                    object: "-".into(),
                    field: "-".into(),
                    message: limits
                        .breach(&e)
                        .unwrap_or_else(|| format!("not valid YAML: {}", one_line(&e.to_string()))),
                });
                continue;
            }
        };
        for (i, doc) in docs.into_iter().enumerate() {
            if doc.is_null() {
                continue;
            }
            // `kubectl get A,B -o yaml` prints one `v1` List of the objects.
            if is_list(&doc) {
                let items = match doc {
                    Value::Object(mut m) => match m.remove("items") {
                        Some(Value::Array(items)) => items,
                        _ => vec![],
                    },
                    _ => vec![],
                };
                for item in items {
                    classify(&checker, &name, i, &text, item, &mut loaded);
                }
                continue;
            }
            classify(&checker, &name, i, &text, doc, &mut loaded);
        }
    }
    Ok(loaded)
}

/// A `v1` List (`kind: List`, or a `...List` kind such as `NodeList`) with its `items`.
fn is_list(doc: &Value) -> bool {
    doc.get("apiVersion").and_then(Value::as_str) == Some("v1")
        && doc
            .get("kind")
            .and_then(Value::as_str)
            .is_some_and(|k| k.ends_with("List"))
        && doc.get("items").is_some_and(Value::is_array)
}

fn one_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Sorts one document into `loaded`: one of our kinds (schema-checked), a Node, an inventory or a
/// mig-parted file; what it cannot take becomes a problem.
fn classify(checker: &SchemaChecker, file: &str, index: usize, text: &str, doc: Value, loaded: &mut Loaded) {
    let kind = doc.get("kind").and_then(Value::as_str).map(str::to_string);
    let api_version = doc.get("apiVersion").and_then(Value::as_str).map(str::to_string);
    let (Some(kind), Some(api_version)) = (kind, api_version) else {
        return classify_file(file, index, text, doc, loaded);
    };
    let name = doc
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let object = format!("{kind}/{}", if name.is_empty() { "(unnamed)" } else { &name });
    if api_version == "v1" && kind == "Node" {
        // A live cluster's inventory for `plan` (labels and name are what the planner reads).
        match serde_json::from_value(doc) {
            Ok(node) => loaded.cluster_nodes.push(node),
            Err(e) => loaded
                .problems
                .push(problem(file, object, "-", format!("not a Node: {e}"))),
        }
        return;
    }
    if api_version != API_VERSION {
        if api_version.starts_with("gputenancy.io/") {
            loaded.problems.push(problem(
                file,
                object,
                "apiVersion",
                format!("{api_version} is not served; use {API_VERSION}"),
            ));
        }
        // Other APIs (Namespaces, ConfigMaps...) are not ours to judge.
        return;
    }
    classify_object(checker, file, &kind, name.is_empty(), object, doc, loaded);
}

/// A problem of `file`, in the `FILE: Kind/name: field: message` form's parts.
fn problem(file: &str, object: String, field: &str, message: String) -> FileProblem {
    FileProblem {
        file: file.to_string(),
        object,
        field: field.to_string(),
        message,
    }
}

/// A document with no `apiVersion` and `kind`: a mig-parted file (its plans imported), an
/// inventory, or a problem.
fn classify_file(file: &str, index: usize, text: &str, doc: Value, loaded: &mut Loaded) {
    if doc.get("mig-configs").is_some() {
        match MigPartedFile::parse(text).and_then(|f| import(&f, None)) {
            Ok(plans) => {
                for p in plans {
                    let key = format!("GpuPartitionPlan/{}", p.metadata.name.clone().unwrap_or_default());
                    loaded.origin.insert(key, file.to_string());
                    loaded.plans.push(p);
                }
            }
            Err(e) => loaded
                .problems
                .push(problem(file, "mig-parted".into(), "-", e.to_string())),
        }
    } else if doc.get("nodes").is_some() {
        match serde_json::from_value::<InventoryFile>(doc) {
            Ok(inv) => loaded.inventories.push((file.to_string(), inv)),
            Err(e) => loaded
                .problems
                .push(problem(file, "inventory".into(), "-", e.to_string())),
        }
    } else {
        loaded.problems.push(problem(
            file,
            format!("document {}", index + 1),
            "apiVersion",
            "not a Kubernetes object (no apiVersion and kind), an inventory (nodes:) or a mig-parted file (mig-configs:)".into(),
        ));
    }
}

/// One of our kinds: checked against its schema and CEL rules, named once across the files, then
/// kept typed.
fn classify_object(
    checker: &SchemaChecker,
    file: &str,
    kind: &str,
    unnamed: bool,
    object: String,
    doc: Value,
    loaded: &mut Loaded,
) {
    let Some(schema_problems) = checker.check(kind, &doc) else {
        loaded.problems.push(problem(
            file,
            object,
            "kind",
            format!("{kind} is not a kind of {API_VERSION}; use SharingPolicy, GpuTenant, GpuPartitionPlan or GpuNode"),
        ));
        return;
    };
    if unnamed {
        loaded.problems.push(problem(
            file,
            object,
            "metadata.name",
            "every object needs a name".into(),
        ));
        return;
    }
    if !schema_problems.is_empty() {
        for (field, message) in schema_problems {
            loaded.problems.push(problem(file, object.clone(), &field, message));
        }
        return;
    }
    if let Some(previous) = loaded.origin.insert(object.clone(), file.to_string()) {
        loaded.problems.push(problem(
            file,
            object.clone(),
            "metadata.name",
            format!("also defined in {previous}; names are cluster-wide"),
        ));
    }
    let typed = match kind {
        "SharingPolicy" => serde_json::from_value(doc).map(|o| loaded.policies.push(o)),
        "GpuTenant" => serde_json::from_value(doc).map(|o| loaded.tenants.push(o)),
        "GpuPartitionPlan" => serde_json::from_value(doc).map(|o| loaded.plans.push(o)),
        _ => serde_json::from_value(doc).map(|o| loaded.nodes.push(o)),
    };
    if let Err(e) = typed {
        loaded.problems.push(problem(file, object, "-", e.to_string()));
    }
}
