//! The GpuNode conditions `UngrantedUse` and `SharedMemoryPressure`: the pitfalls the agent can
//! tell from its own GPUs ([`crate::signals`]), with the kubelet's pod-resources answer of the
//! pass where the device plugin hands out devices.

use super::pod_resources::{DeviceId, Holdings};
use crate::api::{ConditionSet, GpuNodeSpec, GpuNodeStatus, set_condition};
use crate::signals::{SHARED_MEMORY_PRESSURE_PERCENT, Signals, signals};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::BTreeSet;

/// Sets both conditions on `status` and returns what was found (for the metrics). `holders`:
/// the pod-resources answer of this pass, `None` where it was not read.
pub fn report(status: &mut GpuNodeStatus, spec: &GpuNodeSpec, holders: Option<&Holdings>, now: &Time) -> Signals {
    let held: Option<BTreeSet<String>> = holders.map(|h| {
        h.devices
            .iter()
            .filter(|(_, d)| !d.holders.is_empty())
            .map(|(id, _)| DeviceId::parse(id).uuid.to_string())
            .collect()
    });
    let found = signals(spec, status, held.as_ref());
    let generation = status.observed_generation;
    let (on, reason, message) = match &found.ungranted {
        None => (
            false,
            "NotKnown",
            "with NVIDIA's device plugin only the kubelet's pod-resources API tells which pod holds which device, and it could not be read (see the PodResources condition)".to_string(),
        ),
        Some(u) if u.is_empty() => (false, "None", String::new()),
        Some(u) => (
            true,
            "ProcessesWithoutGrant",
            format!(
                "compute processes on {} that no tenant's pod was given: find them with nvidia-smi and close the way they came in (a namespace exempt from the admission policies, NVIDIA_VISIBLE_DEVICES honoured by the container toolkit, a process on the host)",
                u.iter().map(|x| x.device.as_str()).collect::<Vec<_>>().join(", ")
            ),
        ),
    };
    set_condition(
        &mut status.conditions,
        ConditionSet::UNGRANTED_USE,
        on,
        reason,
        message,
        generation,
        now,
    );
    let pressure = !found.memory_pressure.is_empty();
    set_condition(
        &mut status.conditions,
        ConditionSet::SHARED_MEMORY_PRESSURE,
        pressure,
        if pressure { "NearlyFull" } else { "None" },
        if pressure {
            format!(
                "the processes on shared {} use {SHARED_MEMORY_PRESSURE_PERCENT}% or more of its memory; nothing keeps one tenant's memory from another's there, so the next allocation fails for whoever makes it: lower the tenants' jobs' memory, fewer shares per GPU, or MIG",
                found.memory_pressure.join(", "),
            )
        } else {
            String::new()
        },
        generation,
        now,
    );
    found
}
