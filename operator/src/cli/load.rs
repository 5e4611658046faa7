//! Reading manifests: files or folders of multi-document YAML, sorted into the four kinds, the
//! inventory and mig-parted files, with every problem tied to its file and object.

use crate::api::{API_VERSION, GpuNode, GpuPartitionPlan, GpuTenant, SharingPolicy};
use crate::inventory::InventoryFile;
use crate::migparted::{MigPartedFile, import};
use crate::schema::SchemaChecker;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

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
    pub inventories: Vec<(String, InventoryFile)>,
    pub problems: Vec<FileProblem>,
    /// `Kind/name` → file, to place problems found later.
    pub origin: BTreeMap<String, String>,
}

/// Files named by the paths: files as given, folders walked for `*.yaml`/`*.yml`, sorted.
/// A missing path is a read error (exit 2), not a problem of the input.
pub fn collect_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    for p in paths {
        let meta = std::fs::metadata(p).map_err(|e| format!("cannot read {}: {e}", p.display()))?;
        if meta.is_dir() {
            walk(p, &mut out).map_err(|e| format!("cannot read folder {}: {e}", p.display()))?;
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
pub fn load(paths: &[PathBuf]) -> Result<Loaded, String> {
    let checker = SchemaChecker::new();
    let mut loaded = Loaded::default();
    for file in collect_files(paths)? {
        let name = file.display().to_string();
        let text = std::fs::read_to_string(&file).map_err(|e| format!("cannot read {name}: {e}"))?;
        let docs: Vec<Value> = match serde_saphyr::from_multiple(&text) {
            Ok(d) => d,
            Err(e) => {
                loaded.problems.push(FileProblem {
                    file: name.clone(),
                    object: "-".into(),
                    field: "-".into(),
                    message: format!("not valid YAML: {}", one_line(&e.to_string())),
                });
                continue;
            }
        };
        for (i, doc) in docs.into_iter().enumerate() {
            if doc.is_null() {
                continue;
            }
            classify(&checker, &name, i, &text, doc, &mut loaded);
        }
    }
    Ok(loaded)
}

fn one_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

fn classify(checker: &SchemaChecker, file: &str, index: usize, text: &str, doc: Value, loaded: &mut Loaded) {
    let problem = |object: String, field: &str, message: String| FileProblem {
        file: file.to_string(),
        object,
        field: field.to_string(),
        message,
    };
    let kind = doc.get("kind").and_then(Value::as_str).map(str::to_string);
    let api_version = doc.get("apiVersion").and_then(Value::as_str).map(str::to_string);
    let (Some(kind), Some(api_version)) = (kind, api_version) else {
        if doc.get("mig-configs").is_some() {
            match MigPartedFile::parse(text)
                .map_err(|e| e.to_string())
                .and_then(|f| import(&f, None).map_err(|e| e.to_string()))
            {
                Ok(plans) => {
                    for p in plans {
                        let key = format!("GpuPartitionPlan/{}", p.metadata.name.clone().unwrap_or_default());
                        loaded.origin.insert(key, file.to_string());
                        loaded.plans.push(p);
                    }
                }
                Err(e) => loaded.problems.push(problem("mig-parted".into(), "-", e)),
            }
        } else if doc.get("nodes").is_some() {
            match serde_json::from_value::<InventoryFile>(doc) {
                Ok(inv) => loaded.inventories.push((file.to_string(), inv)),
                Err(e) => loaded.problems.push(problem("inventory".into(), "-", e.to_string())),
            }
        } else {
            loaded.problems.push(problem(
                format!("document {}", index + 1),
                "apiVersion",
                "not a Kubernetes object (no apiVersion and kind), an inventory (nodes:) or a mig-parted file (mig-configs:)".into(),
            ));
        }
        return;
    };
    let name = doc
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let object = format!("{kind}/{}", if name.is_empty() { "(unnamed)" } else { &name });
    if api_version != API_VERSION {
        if api_version.starts_with("gputenancy.io/") {
            loaded.problems.push(problem(
                object,
                "apiVersion",
                format!("{api_version} is not served; use {API_VERSION}"),
            ));
        }
        // Other APIs (Namespaces, ConfigMaps...) are not ours to judge.
        return;
    }
    let Some(schema_problems) = checker.check(&kind, &doc) else {
        loaded.problems.push(problem(
            object,
            "kind",
            format!("{kind} is not a kind of {API_VERSION}; use SharingPolicy, GpuTenant, GpuPartitionPlan or GpuNode"),
        ));
        return;
    };
    if name.is_empty() {
        loaded.problems.push(problem(
            object.clone(),
            "metadata.name",
            "every object needs a name".into(),
        ));
        return;
    }
    if !schema_problems.is_empty() {
        for (field, message) in schema_problems {
            loaded.problems.push(problem(object.clone(), &field, message));
        }
        return;
    }
    if let Some(previous) = loaded.origin.insert(object.clone(), file.to_string()) {
        loaded.problems.push(problem(
            object.clone(),
            "metadata.name",
            format!("also defined in {previous}; names are cluster-wide"),
        ));
    }
    let typed = match kind.as_str() {
        "SharingPolicy" => serde_json::from_value(doc).map(|o| loaded.policies.push(o)),
        "GpuTenant" => serde_json::from_value(doc).map(|o| loaded.tenants.push(o)),
        "GpuPartitionPlan" => serde_json::from_value(doc).map(|o| loaded.plans.push(o)),
        _ => serde_json::from_value(doc).map(|o| loaded.nodes.push(o)),
    };
    if let Err(e) = typed {
        loaded.problems.push(problem(object, "-", e.to_string()));
    }
}
