//! The node's ResourceSlices: its pool (named after the node) of the devices of [`super::devices`],
//! cut into slices of at most 64 devices (the API server's limit when devices carry taints), each
//! device with its attributes, its memory as capacity, and the taint `gputenancy.io/not-ready`
//! while it may not be handed over. Built pure; written by [`super::publish`] only when they differ
//! from what the API server holds, with a new pool generation (the scheduler uses only the newest
//! generation of a pool, so a half-written change is never mixed with the old one).

use super::devices::{DRIVER, DraDevice, Unit};
use k8s_openapi::api::resource::v1::ResourceSlice;
use serde_json::{Map, Value, json};

/// Devices per slice: the limit of a slice whose devices may carry taints.
pub const DEVICES_PER_SLICE: usize = 64;
use crate::dra::attr;
pub use crate::dra::{NOT_READY_TAINT, UNHEALTHY_TAINT};

/// The name of slice `n` of `node`'s pool.
pub fn slice_name(node: &str, n: usize) -> String {
    format!("{node}-{DRIVER}-{n}")
}

fn string(v: &str) -> Value {
    json!({"string": v})
}

/// One device as the API server's `resource.k8s.io/v1` Device. Attribute names without a domain
/// are in the driver's (`device.attributes["gpu.gputenancy.io"].tenant` in CEL).
fn device(d: &DraDevice) -> Value {
    let mut attributes = Map::new();
    attributes.insert(attr::TENANT.into(), string(d.tenant.as_deref().unwrap_or("")));
    attributes.insert(attr::MODE.into(), string(d.mode.as_str()));
    attributes.insert("index".into(), json!({"int": d.gpu}));
    attributes.insert("productName".into(), string(&d.product_name));
    if let Some(p) = &d.profile {
        attributes.insert(attr::PROFILE.into(), string(p));
    }
    if let Some(u) = &d.uuid {
        attributes.insert("uuid".into(), string(u));
    }
    if let Some(u) = &d.parent_uuid {
        attributes.insert("parentUUID".into(), string(u));
    }
    if let Some(n) = d.numa_node {
        attributes.insert(attr::NUMA_NODE.into(), json!({"int": n}));
    }
    let unit = match d.unit {
        Unit::Gpu => "gpu",
        Unit::Instance(_) => "mig",
        Unit::Share { .. } => "share",
    };
    attributes.insert("type".into(), string(unit));
    let mut out = json!({
        "name": d.name,
        "attributes": attributes,
        "capacity": {"memory": {"value": format!("{}Mi", d.memory_mib)}},
    });
    let mut taints = Vec::new();
    if let Some(why) = d.not_ready {
        taints.push(json!({"key": NOT_READY_TAINT, "value": why.as_str(), "effect": "NoSchedule"}));
    }
    if let Some(u) = &d.unhealthy {
        taints.push(json!({"key": UNHEALTHY_TAINT, "value": u.reason.as_str(), "effect": "NoSchedule"}));
    }
    if !taints.is_empty() {
        out["taints"] = json!(taints);
    }
    out
}

/// The Node that owns a node's slices: garbage collection deletes them with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeOwner {
    pub name: String,
    pub uid: String,
}

/// The slices of `node`'s pool at `generation`, as server-side apply bodies, owned by `owner`
/// when its Node is known.
pub fn slices(node: &str, owner: Option<&NodeOwner>, devices: &[DraDevice], generation: i64) -> Vec<ResourceSlice> {
    let chunks: Vec<&[DraDevice]> = if devices.is_empty() {
        vec![&[]]
    } else {
        devices.chunks(DEVICES_PER_SLICE).collect()
    };
    let count = chunks.len();
    chunks
        .into_iter()
        .enumerate()
        .map(|(n, chunk)| {
            serde_json::from_value(json!({
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": slice_name(node, n), "labels": {crate::labels::MANAGED_BY: crate::labels::MANAGED_BY_VALUE},
                    "ownerReferences": owner.map(|o| vec![json!({"apiVersion": "v1", "kind": "Node", "name": o.name, "uid": o.uid, "controller": true})])},
                "spec": {
                    "driver": DRIVER,
                    "nodeName": node,
                    "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
                    "devices": chunk.iter().map(device).collect::<Vec<_>>(),
                }
            }))
            .expect("a ResourceSlice built from its own fields deserialises")
        })
        .collect()
}

/// What of a slice this agent writes, for comparison: its name, owner, node, driver, pool name and
/// count, and per device its name, attributes, capacity values and taints (key, value, effect).
/// The generation and what the API server adds (a taint's `timeAdded`) are left out; a field
/// the live slice has and the wanted one lacks (a taint to lift) does count.
fn ours(s: &ResourceSlice) -> Value {
    let devices: Vec<Value> = s
        .spec
        .devices
        .iter()
        .flatten()
        .map(|d| {
            let taints: Vec<Value> = d
                .taints
                .iter()
                .flatten()
                .map(|t| json!({"key": t.key, "value": t.value, "effect": t.effect}))
                .collect();
            let capacity: Map<String, Value> = d
                .capacity
                .iter()
                .flatten()
                .map(|(k, c)| (k.clone(), json!(quantity_value(&c.value.0))))
                .collect();
            json!({
                "name": d.name,
                "attributes": serde_json::to_value(&d.attributes).expect("attributes serialise"),
                "capacity": capacity,
                "taints": taints,
            })
        })
        .collect();
    let owners: Vec<Value> = s
        .metadata
        .owner_references
        .iter()
        .flatten()
        .map(|o| json!({"kind": o.kind, "name": o.name, "uid": o.uid}))
        .collect();
    json!({
        "name": s.metadata.name,
        "owners": owners,
        "node": s.spec.node_name,
        "driver": s.spec.driver,
        "pool": s.spec.pool.name,
        "count": s.spec.pool.resource_slice_count,
        "devices": devices,
    })
}

/// A quantity as a number where it is a whole one (`0`, `5097Mi`, `40Gi`, `2k`), else as written:
/// the API server writes back its canonical form (`0Mi` as `0`, `10240Mi` as `10Gi`), which must
/// compare equal to what was applied, or every comparison would find a change.
fn quantity_value(q: &str) -> Value {
    const SUFFIXES: [(&str, u128); 12] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("Pi", 1 << 50),
        ("Ei", 1 << 60),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
        ("P", 1_000_000_000_000_000),
        ("E", 1_000_000_000_000_000_000),
    ];
    let (digits, factor) = SUFFIXES
        .iter()
        .find_map(|(s, f)| q.strip_suffix(s).map(|d| (d, *f)))
        .unwrap_or((q, 1));
    match digits.parse::<u128>().ok().and_then(|d| d.checked_mul(factor)) {
        Some(n) => json!(n.to_string()),
        None => json!(q),
    }
}

/// Do the live slices already say what `want` says (the generation aside)?
pub fn same(live: &[ResourceSlice], want: &[ResourceSlice]) -> bool {
    difference(live, want).is_none()
}

/// The first thing the live slices say otherwise than `want` (the generation aside), for the log.
pub fn difference(live: &[ResourceSlice], want: &[ResourceSlice]) -> Option<String> {
    let mut l: Vec<Value> = live.iter().map(ours).collect();
    let mut w: Vec<Value> = want.iter().map(ours).collect();
    let by_name = |a: &Value, b: &Value| a["name"].as_str().cmp(&b["name"].as_str());
    l.sort_by(by_name);
    w.sort_by(by_name);
    if l.len() != w.len() {
        return Some(format!("{} slices, {} wanted", l.len(), w.len()));
    }
    l.iter().zip(&w).find(|(a, b)| a != b).map(|(a, b)| {
        let (da, db) = (&a["devices"], &b["devices"]);
        let device = da
            .as_array()
            .zip(db.as_array())
            .and_then(|(x, y)| x.iter().zip(y).find(|(p, q)| p != q))
            .map(|(p, q)| format!(": device {p} is to be {q}"));
        match device {
            Some(d) => format!("slice {}{d}", b["name"]),
            None => format!("slice {} is {a}, to be {b}", b["name"]),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::dra::devices::NotReady;
    use crate::api::{Mode, ScrubMemory};

    fn dev(i: u32, not_ready: Option<NotReady>) -> DraDevice {
        DraDevice {
            name: format!("gpu-{i}"),
            gpu: i,
            unit: Unit::Gpu,
            mode: Mode::Exclusive,
            tenant: Some("a".into()),
            profile: None,
            uuid: Some(format!("GPU-{i}")),
            parent_uuid: None,
            product_name: "NVIDIA H100 80GB HBM3".into(),
            numa_node: Some(0),
            memory_mib: 81559,
            mps: None,
            memory_cap: None,
            scrub: ScrubMemory::OnTenantChange,
            not_ready,
            unhealthy: None,
            minor: Some(i),
            instance_ids: None,
        }
    }

    /// A pool of 130 devices is three slices of the same generation, counted in each; a device
    /// The API server's canonical quantities are the ones applied: `0Mi` comes back as `0`,
    /// `10240Mi` as `10Gi`.
    #[test]
    fn canonical_quantities_are_no_change() {
        let mut devices: Vec<DraDevice> = (0..3).map(|i| dev(i, None)).collect();
        devices[0].memory_mib = 0;
        devices[1].memory_mib = 10240;
        let want = slices("n1", None, &devices, 1);
        let mut live = want.clone();
        let caps = |s: &mut ResourceSlice, i: usize, v: &str| {
            let d = &mut s.spec.devices.as_mut().unwrap()[i];
            d.capacity.as_mut().unwrap().get_mut("memory").unwrap().value =
                k8s_openapi::apimachinery::pkg::api::resource::Quantity(v.into());
        };
        caps(&mut live[0], 0, "0");
        caps(&mut live[0], 1, "10Gi");
        assert!(same(&live, &want), "{:?}", difference(&live, &want));
        caps(&mut live[0], 1, "11Gi");
        assert!(!same(&live, &want));
    }

    /// not ready carries the taint; the same devices at another generation are the same.
    #[test]
    fn slices_hold_at_most_64_devices_and_the_taint_of_what_is_not_ready() {
        let devices: Vec<DraDevice> = (0..130)
            .map(|i| dev(i, (i == 3).then_some(NotReady::ScrubPending)))
            .collect();
        let s = slices("n1", None, &devices, 5);
        assert_eq!(s.len(), 3);
        let sizes: Vec<usize> = s
            .iter()
            .map(|x| x.spec.devices.as_ref().map_or(0, |d| d.len()))
            .collect();
        assert_eq!(sizes, [64, 64, 2]);
        assert!(
            s.iter()
                .all(|x| x.spec.pool.resource_slice_count == 3 && x.spec.pool.generation == 5)
        );
        let d3 = &s[0].spec.devices.as_ref().unwrap()[3];
        let taint = &d3.taints.as_ref().unwrap()[0];
        assert_eq!(
            (taint.key.as_str(), taint.value.as_deref()),
            (NOT_READY_TAINT, Some("ScrubPending"))
        );
        assert!(s[0].spec.devices.as_ref().unwrap()[4].taints.is_none());
        let tenant = &d3.attributes.as_ref().unwrap()["tenant"];
        assert_eq!(tenant.string.as_deref(), Some("a"));
        assert!(same(&slices("n1", None, &devices, 9), &s));
        assert!(!same(&slices("n1", None, &devices[1..], 9), &s));
        // A taint lifted is a change, though the wanted slice has no field the live one lacks.
        let lifted: Vec<DraDevice> = (0..130).map(|i| dev(i, None)).collect();
        assert!(!same(&s, &slices("n1", None, &lifted, 5)));
        // An unhealthy device carries its own taint beside the other.
        let mut sick = devices.clone();
        sick[3].unhealthy = Some(crate::api::Unhealthy {
            reason: crate::api::HealthReason::Xid,
            message: "the driver reported XID 79".into(),
        });
        let s = slices("n1", None, &sick, 5);
        let taints: Vec<(String, Option<String>)> = s[0].spec.devices.as_ref().unwrap()[3]
            .taints
            .iter()
            .flatten()
            .map(|t| (t.key.clone(), t.value.clone()))
            .collect();
        assert_eq!(
            taints,
            [
                (NOT_READY_TAINT.to_string(), Some("ScrubPending".to_string())),
                (UNHEALTHY_TAINT.to_string(), Some("Xid".to_string()))
            ]
        );
        assert_eq!(slice_name("n1", 2), "n1-gpu.gputenancy.io-2");
    }
}
