//! The custom resources of `gputenancy.io/v1alpha1` and the helpers their status needs.
//!
//! Every check the API server can make lives in these types as schema bounds or CEL rules
//! (`x-kubernetes-validations`), so `kubectl apply` refuses bad objects before any controller sees them.

mod common;
mod conditions;
pub mod evidence;
pub(crate) mod found;
mod memory_caps;
mod node;
mod node_status;
mod plan;
mod policy;
mod shared_vec;
mod tenant;

pub use common::{DNS_LABEL_PATTERN, DNS_SUBDOMAIN_PATTERN, MIG_PROFILE_PATTERN, Mode, Placement, QUANTITY_PATTERN};
pub use conditions::{Condition, ConditionSet, condition_holds, condition_status, set_condition};
pub use found::FOUND_GPUS_ANNOTATION;
pub use memory_caps::*;
pub use node::*;
pub use node_status::*;
pub use plan::*;
pub use policy::*;
pub use shared_vec::SharedVec;
pub use tenant::*;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// API group of every resource here.
pub const GROUP: &str = "gputenancy.io";
/// API version of every resource here.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` as written in manifests.
pub const API_VERSION: &str = "gputenancy.io/v1alpha1";

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
    .map(unobserved_status)
    .map(reserved_tenant_names)
    .collect()
}

/// The names showback reserves for what no tenant holds (`accounting::RESERVED`): a GpuTenant
/// of one of them would be counted together with them, so the API server refuses the name.
pub const RESERVED_TENANT_NAMES_RULE: &str = "!(self.metadata.name in ['unallocated', 'shared', 'unattributed'])";

/// A root rule on GpuTenant: a rule on a field cannot see `metadata.name`, and kube's derive
/// takes root rules only from `KubeSchema`, which these types do not use.
fn reserved_tenant_names(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    if crd.spec.names.kind != "GpuTenant" {
        return crd;
    }
    let mut value = serde_json::to_value(&crd).expect("a CRD serialises");
    for version in value["spec"]["versions"].as_array_mut().into_iter().flatten() {
        version["schema"]["openAPIV3Schema"]["x-kubernetes-validations"] = serde_json::json!([{
            "rule": RESERVED_TENANT_NAMES_RULE,
            "message": "metadata.name: unallocated, shared and unattributed are reserved by showback for what no tenant holds; name the tenant otherwise",
            "reason": "FieldValueForbidden",
        }]);
    }
    serde_json::from_value(value).expect("a rule does not change a CRD's shape")
}

/// A new object reads back with `status: {observedGeneration: 0}` until its controller (or agent)
/// writes one: kstatus, and so Flux, calls an object without a status Current (ready), which
/// would let a GitOps sync pass before anything looked at the object. With the generation not
/// yet observed, kstatus says InProgress until the first status arrives. (The API server applies
/// schema defaults when it reads an object from etcd, so this holds although a create's status is
/// dropped by the status subresource.)
fn unobserved_status(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    let mut value = serde_json::to_value(&crd).expect("a CRD serialises");
    for version in value["spec"]["versions"].as_array_mut().into_iter().flatten() {
        let status = &mut version["schema"]["openAPIV3Schema"]["properties"]["status"];
        if status.is_object() {
            status["default"] = serde_json::json!({"observedGeneration": 0});
        }
    }
    serde_json::from_value(value).expect("a default does not change a CRD's shape")
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
/// decimal suffix (the CRD pattern [`QUANTITY_PATTERN`] admits the same strings), and for amounts
/// of MiB past `u64::MAX`.
///
/// Integer arithmetic throughout: a float cannot hold every byte count (`0.9999999999999999999Mi`
/// reads as `1.0` in an f64), and a limit rounded up would hand out memory that is not there.
pub fn quantity_to_mib(q: &str) -> Option<u64> {
    const MIB: u128 = 1 << 20;
    let q = q.trim();
    let split = q.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let (whole, fraction) = num.split_once('.').unwrap_or((num, ""));
    if whole.is_empty() || (num.contains('.') && fraction.is_empty()) || fraction.contains('.') {
        return None;
    }
    let factor: u128 = match suffix {
        "" => 1,
        "k" | "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        _ => return None,
    };
    let mut whole_value: u128 = 0;
    for d in whole.bytes() {
        whole_value = whole_value.checked_mul(10)?.checked_add(u128::from(d - b'0'))?;
    }
    // floor(0.d1d2...dn × factor), exactly: multiply the digit string by `factor` from the last
    // digit, carrying; what carries past the decimal point is the whole part. The carry stays
    // below `factor`, so any number of fraction digits is fine.
    let fraction_bytes = fraction
        .bytes()
        .rev()
        .fold(0u128, |carry, d| (u128::from(d - b'0') * factor + carry) / 10);
    // floor((w·f + x) / 2^20) = floor((w·f + floor(x)) / 2^20) for the fractional bytes x.
    let bytes = whole_value.checked_mul(factor)?.checked_add(fraction_bytes)?;
    u64::try_from(bytes / MIB).ok()
}

/// The shortest exact binary quantity for an amount of MiB: `40Gi`, `512Mi`, `1536Mi`, `0`.
/// [`quantity_to_mib`] reads it back to the same number (the tests' oracle for it).
#[cfg(test)]
fn mib_to_quantity(mib: u64) -> String {
    if mib == 0 {
        return "0".into();
    }
    let mut value = mib;
    let mut suffix = 0;
    const SUFFIXES: [&str; 4] = ["Mi", "Gi", "Ti", "Pi"];
    while suffix + 1 < SUFFIXES.len() && value.is_multiple_of(1024) {
        value /= 1024;
        suffix += 1;
    }
    format!("{value}{}", SUFFIXES[suffix])
}

/// An object's name as `name_any` gives it (the name, else `generateName`), borrowed.
pub fn name_of<K: kube::Resource>(o: &K) -> &str {
    let meta = o.meta();
    meta.name.as_deref().or(meta.generate_name.as_deref()).unwrap_or("")
}

/// Sorts Kubernetes objects by [`name_of`], stably, without the copy of each name that
/// `sort_by_key(|o| o.name_any())` makes at every comparison: at 20,000 tenants those copies were
/// most of the time spent rendering their admission policies.
pub fn sort_by_name<K: kube::Resource>(items: &mut [K]) {
    items.sort_by(|a, b| name_of(a).cmp(name_of(b)));
}

/// [`sort_by_name`] for a list of borrowed objects.
pub fn sort_refs_by_name<K: kube::Resource>(items: &mut [&K]) {
    items.sort_by(|a, b| name_of(*a).cmp(name_of(*b)));
}

/// [`sort_by_name`] for a list of shared objects.
pub fn sort_shared_by_name<K: kube::Resource>(items: &mut [std::sync::Arc<K>]) {
    items.sort_by(|a, b| name_of(&**a).cmp(name_of(&**b)));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same order as `sort_by_key(|o| o.name_any())`, generateName and no name included.
    #[test]
    fn sort_by_name_orders_as_name_any() {
        use k8s_openapi::api::core::v1::ConfigMap;
        let object = |name: Option<&str>, generate: Option<&str>| {
            let mut o = ConfigMap::default();
            o.metadata.name = name.map(String::from);
            o.metadata.generate_name = generate.map(String::from);
            o
        };
        let objects = vec![
            object(Some("b"), None),
            object(None, Some("a-")),
            object(None, None),
            object(Some("a"), Some("z-")),
            object(Some("b"), Some("first-b")),
            object(None, Some("c-")),
        ];
        let mut ours = objects.clone();
        sort_by_name(&mut ours);
        let mut oracle = objects;
        oracle.sort_by_key(kube::ResourceExt::name_any);
        assert_eq!(ours, oracle);
        assert_eq!(ours[0].metadata.name, None);
        assert_eq!(ours[4].metadata.generate_name.as_deref(), Some("first-b"));
    }

    #[test]
    fn quantities_parse_to_mib() {
        assert_eq!(quantity_to_mib("20Gi"), Some(20 * 1024));
        assert_eq!(quantity_to_mib("512Mi"), Some(512));
        assert_eq!(quantity_to_mib("1.5Gi"), Some(1536));
        assert_eq!(quantity_to_mib("1G"), Some(953));
        assert_eq!(quantity_to_mib("1048576"), Some(1));
        for bad in [
            "", "Gi", "1.", ".5Gi", "1..2Gi", "1.2.3Gi", "10gb", "-1Gi", "1e3", "1m", "1Ei", " 1 Gi",
        ] {
            assert_eq!(quantity_to_mib(bad), None, "{bad}");
        }
    }

    #[test]
    fn quantity_fractions_round_down_exactly() {
        assert_eq!(quantity_to_mib("0.5Gi"), Some(512));
        assert_eq!(quantity_to_mib("1.1G"), Some(1049), "1100000000 B = 1049.04 MiB");
        assert_eq!(quantity_to_mib("0.25Mi"), Some(0));
        assert_eq!(quantity_to_mib("1.999999Mi"), Some(1));
        assert_eq!(
            quantity_to_mib("1.0000000000000000000000000000000000000000001Gi"),
            Some(1024)
        );
        // An f64 reads 0.9999999999999999999 as 1.0: the float version said 1 MiB here.
        assert_eq!(quantity_to_mib("0.9999999999999999999Mi"), Some(0));
        assert_eq!(quantity_to_mib("2047.99999999999999999999Ki"), Some(1));
        assert_eq!(quantity_to_mib("1048575.9999999999999"), Some(0));
        assert_eq!(quantity_to_mib("1.048576M"), Some(1), "1048576 bytes exactly");
        assert_eq!(quantity_to_mib("0001.5Gi"), Some(1536));
    }

    #[test]
    fn quantities_near_u64_limits() {
        let max = u64::MAX;
        assert_eq!(quantity_to_mib(&format!("{max}Mi")), Some(max));
        assert_eq!(quantity_to_mib("18446744073709551616Mi"), None, "2^64 MiB");
        // 2^84 - 1 bytes is u64::MAX MiB and a little; 2^84 bytes is 2^64 MiB.
        assert_eq!(quantity_to_mib("19342813113834066795298815"), Some(max));
        assert_eq!(quantity_to_mib("19342813113834066795298816"), None);
        assert_eq!(quantity_to_mib("17179869183Pi"), Some(max - (1 << 30) + 1));
        assert_eq!(quantity_to_mib("17179869184Pi"), None, "2^34 Pi = 2^64 MiB");
        assert_eq!(quantity_to_mib("17179869183.999999999999999999Pi"), Some(max));
        assert_eq!(quantity_to_mib("19342813113.834066795298815P"), Some(max));
        // Past u128 while reading the digits.
        assert_eq!(quantity_to_mib(&"9".repeat(40)), None);
        assert_eq!(quantity_to_mib(&format!("{}Ki", "9".repeat(39))), None);
        assert_eq!(
            quantity_to_mib(&format!("1.{}Pi", "9".repeat(200))),
            Some((1 << 31) - 1)
        );
    }

    #[test]
    fn mib_write_as_the_shortest_exact_binary_quantity() {
        assert_eq!(mib_to_quantity(40 * 1024), "40Gi");
        assert_eq!(mib_to_quantity(512), "512Mi");
        assert_eq!(mib_to_quantity(1536), "1536Mi");
        assert_eq!(mib_to_quantity(1024 * 1024), "1Ti");
        assert_eq!(mib_to_quantity(3 << 30), "3Pi");
        assert_eq!(mib_to_quantity(1 << 40), "1024Pi", "no suffix past Pi");
        assert_eq!(mib_to_quantity(0), "0");
        for mib in [0, 1, 1023, 1024, 81559, 81920, 1 << 33, u64::MAX, u64::MAX - 1023] {
            let q = mib_to_quantity(mib);
            assert_eq!(quantity_to_mib(&q), Some(mib), "{q}");
            assert!(regex_like_quantity(&q), "{q} matches QUANTITY_PATTERN");
        }
    }

    proptest::proptest! {
        /// Against the same number computed as one fraction `digits / 10^k`, small enough for u128.
        #[test]
        fn quantities_match_exact_fractions(
            whole in 0u64..10_000_000_000,
            fraction in proptest::option::of("[0-9]{1,9}"),
            suffix in proptest::sample::select(vec!["", "k", "M", "G", "T", "P", "Ki", "Mi", "Gi", "Ti", "Pi"]),
        ) {
            let factor: u128 = match suffix {
                "" => 1,
                "k" => 1_000,
                "M" => 1_000_000,
                "G" => 1_000_000_000,
                "T" => 1_000_000_000_000,
                "P" => 1_000_000_000_000_000,
                binary => 1 << (10 * (["Ki", "Mi", "Gi", "Ti", "Pi"].iter().position(|s| *s == binary).unwrap() + 1)),
            };
            let frac = fraction.as_deref().unwrap_or("");
            let scale = 10u128.pow(frac.len() as u32);
            let digits = u128::from(whole) * scale + frac.parse::<u128>().unwrap_or(0);
            let expected = u64::try_from(digits * factor / scale / (1 << 20)).ok();
            let q = match fraction {
                Some(f) => format!("{whole}.{f}{suffix}"),
                None => format!("{whole}{suffix}"),
            };
            proptest::prop_assert_eq!(quantity_to_mib(&q), expected, "{}", q);
        }
    }

    /// [`QUANTITY_PATTERN`] for integers with a binary suffix, without a regex engine.
    fn regex_like_quantity(q: &str) -> bool {
        let digits = q.trim_end_matches(|c: char| c.is_ascii_alphabetic());
        let suffix = &q[digits.len()..];
        !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && ["", "Ki", "Mi", "Gi", "Ti", "Pi"].contains(&suffix)
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
