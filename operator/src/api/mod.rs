//! The custom resources of `gputenancy.io/v1alpha1` and the helpers their status needs.
//!
//! Every check the API server can make lives in these types as schema bounds or CEL rules
//! (`x-kubernetes-validations`), so `kubectl apply` refuses bad objects before any controller sees them.

mod conditions;
mod node;
mod plan;
mod policy;
mod tenant;

pub use conditions::{Condition, ConditionSet, condition_status, set_condition};
pub use node::*;
pub use plan::*;
pub use policy::*;
pub use tenant::*;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// API group of every resource here.
pub const GROUP: &str = "gputenancy.io";
/// API version of every resource here.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` as written in manifests.
pub const API_VERSION: &str = "gputenancy.io/v1alpha1";

/// How a GPU is shared.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
pub enum Mode {
    /// Hardware partitions: separate memory, SMs, L2 and fault containment.
    #[serde(rename = "MIG")]
    Mig,
    /// CUDA Multi-Process Service: concurrent processes on shared SMs, no memory or fault isolation.
    #[serde(rename = "MPS")]
    Mps,
    /// Processes take turns on the whole GPU; no isolation.
    TimeSlicing,
    /// One tenant has the whole GPU.
    Exclusive,
}

impl Mode {
    pub const ALL: [Mode; 4] = [Mode::Mig, Mode::Mps, Mode::TimeSlicing, Mode::Exclusive];

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Mig => "MIG",
            Mode::Mps => "MPS",
            Mode::TimeSlicing => "TimeSlicing",
            Mode::Exclusive => "Exclusive",
        }
    }

    /// Modes where several tenants' processes run on the same, unpartitioned GPU at once.
    pub fn is_shared(self) -> bool {
        matches!(self, Mode::Mps | Mode::TimeSlicing)
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// All four CRDs, in a stable order (the order of `gpu-tenancy crd` and of `crds/`).
pub fn crds() -> Vec<CustomResourceDefinition> {
    [
        SharingPolicy::crd(),
        GpuTenant::crd(),
        GpuPartitionPlan::crd(),
        GpuNode::crd(),
    ]
    .into_iter()
    .map(kubernetes_formats)
    .collect()
}

/// schemars writes `format: uint32`/`uint64` for unsigned integers; the API server knows only the
/// OpenAPI formats and warns on every other. The bounds (`minimum: 0`) already say "unsigned".
fn kubernetes_formats(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    fn walk(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(map) => {
                match map.get("format").and_then(|f| f.as_str()) {
                    Some("uint32" | "uint16" | "uint8") => {
                        map.insert("format".into(), "int32".into());
                    }
                    Some("uint64" | "uint") => {
                        map.insert("format".into(), "int64".into());
                    }
                    _ => {}
                }
                map.values_mut().for_each(walk);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    let mut value = serde_json::to_value(&crd).expect("a CRD serialises");
    walk(&mut value);
    serde_json::from_value(value).expect("format names do not change a CRD's shape")
}

/// The CRDs as one multi-document YAML stream, exactly what `crds/` holds.
pub fn crds_yaml() -> String {
    crds()
        .iter()
        .map(|crd| serde_saphyr::to_string(crd).expect("a CRD always serialises"))
        .collect::<Vec<_>>()
        .join("---\n")
}

/// Parses a Kubernetes quantity of bytes ("20Gi", "512Mi", "1.5G", "1000") into MiB, rounding down.
/// Returns `None` for anything that is not a plain decimal number with an optional binary or
/// decimal suffix; the CRD pattern [`QUANTITY_PATTERN`] admits the same strings.
pub fn quantity_to_mib(q: &str) -> Option<u64> {
    let q = q.trim();
    let split = q.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    if num.is_empty() || num.starts_with('.') || num.ends_with('.') || num.matches('.').count() > 1 {
        return None;
    }
    let value: f64 = num.parse().ok()?;
    let factor: f64 = match suffix {
        "" => 1.0,
        "k" | "K" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0f64.powi(4),
        "Pi" => 1024.0f64.powi(5),
        _ => return None,
    };
    Some((value * factor / (1024.0 * 1024.0)).floor() as u64)
}

/// The byte quantities the CRDs accept (a subset of Kubernetes quantities: no exponents, no milli).
pub const QUANTITY_PATTERN: &str = r"^[0-9]+(\.[0-9]+)?(k|K|M|G|T|P|Ki|Mi|Gi|Ti|Pi)?$";

/// MIG profile names as NVIDIA writes them: `3g.40gb`, `1g.10gb+me`, `1g.24gb+gfx`, `1g.24gb-me`.
pub const MIG_PROFILE_PATTERN: &str = r"^[1-7]g\.[0-9]+gb([+-][a-z]+(\.[a-z]+)?)?$";

/// Names of tenants, tiers, policies and namespaces: RFC 1123 labels.
pub const DNS_LABEL_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_to_mib() {
        assert_eq!(quantity_to_mib("20Gi"), Some(20 * 1024));
        assert_eq!(quantity_to_mib("512Mi"), Some(512));
        assert_eq!(quantity_to_mib("1.5Gi"), Some(1536));
        assert_eq!(quantity_to_mib("1G"), Some(953));
        assert_eq!(quantity_to_mib("1048576"), Some(1));
        for bad in ["", "Gi", "1.", ".5Gi", "1..2Gi", "10gb", "-1Gi", "1e3"] {
            assert_eq!(quantity_to_mib(bad), None, "{bad}");
        }
    }

    #[test]
    fn crds_are_four_cluster_scoped_in_one_category() {
        let crds = crds();
        assert_eq!(crds.len(), 4);
        for crd in &crds {
            assert_eq!(crd.spec.group, GROUP);
            assert_eq!(crd.spec.scope, "Cluster");
            assert_eq!(
                crd.spec.names.categories.as_deref(),
                Some(&["gputenancy".to_string()][..])
            );
            let v = &crd.spec.versions[0];
            assert!(v.subresources.as_ref().and_then(|s| s.status.as_ref()).is_some());
            let text = serde_json::to_string(crd).unwrap();
            assert!(!text.contains("\"uint"), "the API server warns on unsigned formats");
        }
    }
}
