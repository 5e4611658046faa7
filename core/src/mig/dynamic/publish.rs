//! A dynamic GPU as DRA partitionable devices (Kubernetes' `DRAPartitionableDevices`, beta and
//! on since 1.36): one counter set per GPU, holding its free memory slices, compute slices and
//! media extensions, and one device per placement of each profile, consuming those counters. The
//! scheduler allocates a placement only while its counters are free, so two allocated placements
//! never overlap. Instances the agent did not create are taken: their slices are not in the
//! counter set, and no placement that needs them is published.
//!
//! The API server keeps counters and devices in separate slices of one pool: [`counter_sets`] go
//! in one slice, the devices in slices of at most 64 (its limit for devices that consume
//! counters).

use super::{GpuState, Placement, placements};
use crate::dra::{DRIVER, attr};
use crate::mig::{GpuModel, Shape};
use serde_json::{Map, Value, json};

/// Compute slices left on a GPU.
pub const COMPUTE_COUNTER: &str = "compute-slices";
/// Instances with media extensions left on a GPU (one per GPU).
pub const MEDIA_COUNTER: &str = "media-extensions";
/// The attribute naming a placement's first memory slice.
pub const PLACEMENT_START: &str = "placementStart";

/// The counter of memory slice `slice`.
pub fn memory_counter(slice: u32) -> String {
    format!("memory-slice-{slice}")
}

/// The counter set of GPU `index`.
pub fn counter_set_name(index: u32) -> String {
    format!("gpu-{index}")
}

/// The device of `profile` at `start` on GPU `index`: a DNS label (`gpu-0-3g-40gb-at-4`).
pub fn device_name(index: u32, profile: &str, start: u32) -> String {
    let profile: String = profile
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    format!("gpu-{index}-{profile}-at-{start}")
}

/// What a placement consumes: its memory slices, compute slices, and a media extension for 1g+me.
fn consumption(p: Placement) -> Map<String, Value> {
    let info = p.shape.info();
    let mut counters: Map<String, Value> = (p.start..p.start + info.memory_slices)
        .map(|s| (memory_counter(s), json!({"value": "1"})))
        .collect();
    counters.insert(
        COMPUTE_COUNTER.into(),
        json!({"value": info.compute_slices.to_string()}),
    );
    if p.shape == Shape::OneSliceMe {
        counters.insert(MEDIA_COUNTER.into(), json!({"value": "1"}));
    }
    counters
}

/// GPU `index`'s counter set (a `resource.k8s.io/v1` CounterSet), less what `taken` holds.
pub fn counter_set(index: u32, taken: &GpuState) -> Value {
    let occupied = taken.occupied();
    let mut counters: Map<String, Value> = (0..8)
        .map(|s| {
            let free = u8::from(occupied & (1 << s) == 0);
            (memory_counter(s), json!({"value": free.to_string()}))
        })
        .collect();
    let compute: u32 = taken.instances.iter().map(|p| p.shape.info().compute_slices).sum();
    counters.insert(
        COMPUTE_COUNTER.into(),
        json!({"value": crate::mig::COMPUTE_SLICES.saturating_sub(compute).to_string()}),
    );
    let media = u8::from(!taken.instances.iter().any(|p| p.shape == Shape::OneSliceMe));
    counters.insert(MEDIA_COUNTER.into(), json!({"value": media.to_string()}));
    json!({"name": counter_set_name(index), "counters": counters})
}

/// One GPU of a node, as its agent publishes it.
pub struct DynamicGpu<'a> {
    pub index: u32,
    pub uuid: &'a str,
    pub model: &'a GpuModel,
    /// Instances the agent did not create (or holds for a claim): never published as free.
    pub taken: &'a GpuState,
}

/// The devices of `gpu` (`resource.k8s.io/v1` Devices): every placement of every profile of its
/// model that fits next to what is taken, in [`super::offer_order`], each consuming its counters.
pub fn devices(gpu: &DynamicGpu<'_>) -> Vec<Value> {
    placements(&Shape::ALL)
        .into_iter()
        .filter(|p| gpu.taken.fits(*p))
        .map(|p| {
            let profile = gpu.model.profile_for(p.shape).name;
            json!({
                "name": device_name(gpu.index, profile, p.start),
                "attributes": {
                    "type": {"string": "mig"},
                    attr::PROFILE: {"string": profile},
                    PLACEMENT_START: {"int": p.start},
                    "placementSize": {"int": p.shape.info().memory_slices},
                    "index": {"int": gpu.index},
                    "parentUUID": {"string": gpu.uuid},
                    "productName": {"string": gpu.model.name()},
                },
                "capacity": {"memory": {"value": format!("{}Mi", gpu.model.shape_memory_mib(p.shape))}},
                "consumesCounters": [{"counterSet": counter_set_name(gpu.index), "counters": consumption(p)}],
            })
        })
        .collect()
}

/// The ResourceSlices of `node`'s dynamic GPUs at pool `generation`: one slice of counter sets,
/// then the devices, at most 64 a slice.
pub fn slices(node: &str, gpus: &[DynamicGpu<'_>], generation: i64) -> Vec<Value> {
    let sets: Vec<Value> = gpus.iter().map(|g| counter_set(g.index, g.taken)).collect();
    let devices: Vec<Value> = gpus.iter().flat_map(devices).collect();
    let chunks: Vec<&[Value]> = devices.chunks(64).collect();
    let count = 1 + chunks.len();
    let slice = |n: usize, body: Value| {
        let mut spec =
            json!({"driver": DRIVER, "pool": {"name": node, "generation": generation, "resourceSliceCount": count}});
        if let (Value::Object(s), Value::Object(b)) = (&mut spec, body) {
            s.extend(b);
        }
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": format!("{node}-{DRIVER}-dynamic-{n}")}, "spec": spec})
    };
    // Counters are not tied to a node in the API: the slice holding them names no node.
    std::iter::once(slice(0, json!({"allNodes": true, "sharedCounters": sets})))
        .chain(
            chunks
                .into_iter()
                .enumerate()
                .map(|(n, c)| slice(n + 1, json!({"nodeName": node, "devices": c}))),
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100() -> &'static GpuModel {
        crate::mig::model_by_name("NVIDIA H100 80GB HBM3").expect("the H100 is modelled")
    }

    #[test]
    fn a_free_gpu_offers_every_placement_and_a_taken_instance_removes_its_slices() {
        let free = GpuState::default();
        let gpu = DynamicGpu {
            index: 0,
            uuid: "GPU-0",
            model: h100(),
            taken: &free,
        };
        let all = devices(&gpu);
        // NVIDIA's placements: 7 + 7 + 4 + 3 + 2 + 1 + 1.
        assert_eq!(all.len(), 25);
        assert_eq!(all[0]["name"], "gpu-0-1g-10gb-at-6");
        let set = counter_set(0, &free);
        assert_eq!(set["counters"]["memory-slice-7"]["value"], "1");
        assert_eq!(set["counters"][COMPUTE_COUNTER]["value"], "7");
        let three = all.iter().find(|d| d["name"] == "gpu-0-3g-40gb-at-4").unwrap();
        let c = &three["consumesCounters"][0]["counters"];
        assert_eq!(
            (
                c["memory-slice-4"]["value"].clone(),
                c["memory-slice-7"]["value"].clone()
            ),
            (json!("1"), json!("1"))
        );
        assert_eq!(c[COMPUTE_COUNTER]["value"], "3");
        // Another's 4g at 0: its slices and compute gone, nothing that needs them offered.
        let taken = GpuState {
            instances: vec![Placement {
                shape: Shape::FourSlice,
                start: 0,
            }],
        };
        let set = counter_set(0, &taken);
        assert_eq!(set["counters"]["memory-slice-0"]["value"], "0");
        assert_eq!(set["counters"][COMPUTE_COUNTER]["value"], "3");
        let left = devices(&DynamicGpu { taken: &taken, ..gpu });
        assert!(
            left.iter()
                .all(|d| d["attributes"][PLACEMENT_START]["int"].as_u64().unwrap() >= 4),
            "{left:#?}"
        );
        let slices = slices("n1", &[DynamicGpu { taken: &taken, ..gpu }], 1);
        assert_eq!(slices.len(), 2);
        assert!(slices[0]["spec"]["devices"].is_null() && slices[1]["spec"]["sharedCounters"].is_null());
    }
}
