//! MIG: GPU-instance placements, GPU and compute instances, under the rules of `gpu_tenancy_core::mig`
//! (overlaps refused, instance limits, compute budget), with the return codes nvml.h documents.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::profiles::{ci_profile, ci_slices, gi_shape};
use super::*;
use crate::state::SimCi;
use gpu_tenancy_core::mig::Shape;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    dev: nvmlDevice_t,
    profile_id: c_uint,
    placements: *mut nvmlGpuInstancePlacement_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    read_on("nvmlDeviceGetGpuInstancePossiblePlacements_v2", gpu_of(dev), |st| {
        device(st, dev)?;
        let shape = Shape::from_profile_id(profile_id).ok_or(ERR_NOT_SUPPORTED)?;
        let si = shape.info();
        if count.is_null() {
            return Err(ERR_INVALID_ARGUMENT);
        }
        let n = si.starts.len() as c_uint;
        if placements.is_null() {
            unsafe { *count = n };
            return Ok(());
        }
        if unsafe { *count } < n {
            unsafe { *count = n };
            return Err(ERR_INSUFFICIENT_SIZE);
        }
        for (i, &start) in si.starts.iter().enumerate() {
            unsafe {
                *placements.add(i) = nvmlGpuInstancePlacement_t {
                    start,
                    size: si.memory_slices,
                }
            };
        }
        unsafe { *count = n };
        Ok(())
    })
}

fn overlaps(a: (u32, u32), b: (u32, u32)) -> bool {
    a.0 < b.0 + b.1 && b.0 < a.0 + a.1
}

/// How many placements of all profiles use the memory slices of `start:size`.
fn demand(start: u32, size: u32) -> usize {
    Shape::ALL
        .iter()
        .map(|s| s.info())
        .flat_map(|si| si.starts.iter().map(move |&st| (st, si.memory_slices)))
        .filter(|&p| overlaps(p, (start, size)))
        .count()
}

/// The placement the driver picks when the caller names none: NVIDIA documents no rule. The
/// simulator takes the free placement the fewest placements of other profiles would need (the
/// least constraining), the lowest of equals: for seven 1g instances that is 6, 4, 5, 0, 1, 2, 3,
/// which is the order of IDs 9, 7, 8, 11, 12, 13, 14 in rapidsai/dask-cuda#583.
fn pick_start(g: &SimGpu, shape: Shape) -> Option<u32> {
    let si = shape.info();
    si.starts
        .iter()
        .copied()
        .filter(|&s| free(g, s, si.memory_slices))
        .min_by_key(|&s| (demand(s, si.memory_slices), s))
}

fn free(g: &SimGpu, start: u32, size: u32) -> bool {
    g.gis.iter().all(|gi| !overlaps((start, size), (gi.start, gi.size)))
}

/// Creates a GPU instance if the MIG rules allow it; returns its ID. nvml.h: NOT_SUPPORTED "if
/// device doesn't have MIG mode enabled", INVALID_ARGUMENT for a profile ID or placement that is
/// invalid, INSUFFICIENT_RESOURCES "if the requested GPU instance could not be created".
fn create_gi(g: &mut SimGpu, profile_id: u32, placement: Option<(u32, u32)>) -> Result<u32, u32> {
    if !g.mig_current {
        return Err(ERR_NOT_SUPPORTED);
    }
    let shape = Shape::from_profile_id(profile_id).ok_or(ERR_INVALID_ARGUMENT)?;
    let si = shape.info();
    if let Some((start, size)) = placement
        && (size != si.memory_slices || !si.starts.contains(&start))
    {
        return Err(ERR_INVALID_ARGUMENT);
    }
    let used_compute: u32 = g
        .gis
        .iter()
        .filter_map(|gi| Shape::from_profile_id(gi.profile_id))
        .map(|s| s.info().compute_slices)
        .sum();
    let same = g.gis.iter().filter(|gi| gi.profile_id == profile_id).count() as u32;
    if used_compute + si.compute_slices > mig::COMPUTE_SLICES || same >= si.max_instances {
        return Err(ERR_INSUFFICIENT_RESOURCES);
    }
    let start = match placement {
        Some((s, _)) if !free(g, s, si.memory_slices) => return Err(ERR_INSUFFICIENT_RESOURCES),
        Some((s, _)) => s,
        None => pick_start(g, shape).ok_or(ERR_INSUFFICIENT_RESOURCES)?,
    };
    let id = g.gpu_instance_id(start, si.memory_slices);
    if let Some(other) = g.gi(id) {
        // Only a state edited by hand gets here: instances that do not overlap never share an ID.
        eprintln!(
            "nvml-sim: GPU {}: GPU instance ID {id} for {start}:{} is taken by the one at {}:{}",
            g.index, si.memory_slices, other.start, other.size
        );
        return Err(ERR_UNKNOWN);
    }
    g.gis.push(SimGi {
        id,
        profile_id,
        start,
        size: si.memory_slices,
        cis: Vec::new(),
    });
    g.gis.sort_by_key(|gi| gi.id);
    Ok(id)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstanceWithPlacement(
    dev: nvmlDevice_t,
    profile_id: c_uint,
    placement: *const nvmlGpuInstancePlacement_t,
    gi: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    call_on("nvmlDeviceCreateGpuInstanceWithPlacement", gpu_of(dev), true, |st| {
        if placement.is_null() || gi.is_null() {
            return Err(ERR_INVALID_ARGUMENT);
        }
        let p = unsafe { *placement };
        let g = device_mut(st, dev)?;
        let id = create_gi(g, profile_id, Some((p.start, p.size)))?;
        let index = g.index;
        unsafe { *gi = pack(K_GI, index, id, 0) as nvmlGpuInstance_t };
        st.record(
            "nvmlDeviceCreateGpuInstanceWithPlacement",
            index,
            format!("gi={id} profile={profile_id} placement={}:{}", p.start, p.size),
        );
        Ok(true)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstance(
    dev: nvmlDevice_t,
    profile_id: c_uint,
    gi: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    call_on("nvmlDeviceCreateGpuInstance", gpu_of(dev), true, |st| {
        if gi.is_null() {
            return Err(ERR_INVALID_ARGUMENT);
        }
        let g = device_mut(st, dev)?;
        let id = create_gi(g, profile_id, None)?;
        let index = g.index;
        let placement = g.gi(id).map(|x| format!("{}:{}", x.start, x.size)).unwrap_or_default();
        unsafe { *gi = pack(K_GI, index, id, 0) as nvmlGpuInstance_t };
        st.record(
            "nvmlDeviceCreateGpuInstance",
            index,
            format!("gi={id} profile={profile_id} placement={placement}"),
        );
        Ok(true)
    })
}

/// nvml.h: NOT_SUPPORTED "if device doesn't have MIG mode enabled", INVALID_ARGUMENT for an
/// invalid profile ID, buffer or count. The buffer must hold the profile's instance count.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstances(
    dev: nvmlDevice_t,
    profile_id: c_uint,
    gis: *mut nvmlGpuInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    read_on("nvmlDeviceGetGpuInstances", gpu_of(dev), |st| {
        let g = device(st, dev)?;
        if !g.mig_current {
            return Err(ERR_NOT_SUPPORTED);
        }
        Shape::from_profile_id(profile_id).ok_or(ERR_INVALID_ARGUMENT)?;
        if count.is_null() || gis.is_null() {
            return Err(ERR_INVALID_ARGUMENT);
        }
        let ids: Vec<u32> = g
            .gis
            .iter()
            .filter(|gi| gi.profile_id == profile_id)
            .map(|gi| gi.id)
            .collect();
        for (i, id) in ids.iter().enumerate() {
            unsafe { *gis.add(i) = pack(K_GI, g.index, *id, 0) as nvmlGpuInstance_t };
        }
        unsafe { *count = ids.len() as c_uint };
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(
    dev: nvmlDevice_t,
    id: c_uint,
    gi: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    read_on("nvmlDeviceGetGpuInstanceById", gpu_of(dev), |st| {
        let g = device(st, dev)?;
        if !g.mig_current {
            return Err(ERR_NOT_SUPPORTED);
        }
        g.gi(id).ok_or(ERR_NOT_FOUND)?;
        unsafe { out(gi, pack(K_GI, g.index, id, 0) as nvmlGpuInstance_t) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    gi: nvmlGpuInstance_t,
    info: *mut nvmlGpuInstanceInfo_t,
) -> nvmlReturn_t {
    read_on("nvmlGpuInstanceGetInfo", gpu_of(gi), |st| {
        let (g, sgi) = gi_of(st, gi)?;
        let v = nvmlGpuInstanceInfo_t {
            device: pack(K_DEVICE, g.index, 0, 0) as nvmlDevice_t,
            id: sgi.id,
            profileId: sgi.profile_id,
            placement: nvmlGpuInstancePlacement_t {
                start: sgi.start,
                size: sgi.size,
            },
        };
        unsafe { out(info, v) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlGpuInstanceDestroy(gi: nvmlGpuInstance_t) -> nvmlReturn_t {
    call_on("nvmlGpuInstanceDestroy", gpu_of(gi), true, |st| {
        let (_, gpu, id, _) = unpack(gi);
        gi_of(st, gi)?;
        let g = st.gpu_mut(gpu).ok_or(ERR_INVALID_ARGUMENT)?;
        let sgi = g.gi(id).ok_or(ERR_NOT_FOUND)?;
        if !sgi.cis.is_empty() || g.processes.iter().any(|p| p.gi == Some(id)) {
            return Err(ERR_IN_USE);
        }
        let detail = format!(
            "gi={id} profile={} placement={}:{}",
            sgi.profile_id, sgi.start, sgi.size
        );
        g.gis.retain(|x| x.id != id);
        st.record("nvmlGpuInstanceDestroy", gpu, detail);
        Ok(true)
    })
}

/// nvml.h: INVALID_ARGUMENT for an invalid profile ID, NOT_SUPPORTED "if profileId isn't
/// supported" (by this GPU instance), INSUFFICIENT_RESOURCES when its compute slices are taken.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstance(
    gi: nvmlGpuInstance_t,
    profile_id: c_uint,
    ci: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    call_on("nvmlGpuInstanceCreateComputeInstance", gpu_of(gi), true, |st| {
        let (_, gpu, gid, _) = unpack(gi);
        let (_, sgi) = gi_of(st, gi)?;
        let gi_slices = gi_shape(sgi)?.info().compute_slices;
        let s = ci_profile(gi_slices, profile_id)?;
        let used: u32 = sgi.cis.iter().filter_map(|c| ci_slices(c.profile_id)).sum();
        if used + s > gi_slices {
            return Err(ERR_INSUFFICIENT_RESOURCES);
        }
        let id = (0..).find(|id| sgi.cis.iter().all(|c| c.id != *id)).expect("a free id");
        let uuid = st.next_mig_uuid(gpu, gid);
        let g = st.gpu_mut(gpu).ok_or(ERR_INVALID_ARGUMENT)?;
        let sgi = g.gis.iter_mut().find(|x| x.id == gid).ok_or(ERR_NOT_FOUND)?;
        sgi.cis.push(SimCi { id, profile_id, uuid });
        if !ci.is_null() {
            unsafe { *ci = pack(K_CI, gpu, gid, id) as nvmlComputeInstance_t };
        }
        st.record(
            "nvmlGpuInstanceCreateComputeInstance",
            gpu,
            format!("gi={gid} ci={id} profile={profile_id}"),
        );
        Ok(true)
    })
}

/// nvml.h: INVALID_ARGUMENT for an invalid profile ID, buffer or count, NOT_SUPPORTED "if
/// profileId isn't supported" (a 3c in a 4g instance, say): never an empty list for those.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstances(
    gi: nvmlGpuInstance_t,
    profile_id: c_uint,
    cis: *mut nvmlComputeInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    read_on("nvmlGpuInstanceGetComputeInstances", gpu_of(gi), |st| {
        let (g, sgi) = gi_of(st, gi)?;
        ci_profile(gi_shape(sgi)?.info().compute_slices, profile_id)?;
        if count.is_null() || cis.is_null() {
            return Err(ERR_INVALID_ARGUMENT);
        }
        let ids: Vec<u32> = sgi
            .cis
            .iter()
            .filter(|c| c.profile_id == profile_id)
            .map(|c| c.id)
            .collect();
        for (i, id) in ids.iter().enumerate() {
            unsafe { *cis.add(i) = pack(K_CI, g.index, sgi.id, *id) as nvmlComputeInstance_t };
        }
        unsafe { *count = ids.len() as c_uint };
        Ok(())
    })
}

/// What go-nvlib's `MigDevice.GetProfile` calls to get from a MIG device to its profile.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceById(
    gi: nvmlGpuInstance_t,
    id: c_uint,
    ci: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    read_on("nvmlGpuInstanceGetComputeInstanceById", gpu_of(gi), |st| {
        let (g, sgi) = gi_of(st, gi)?;
        sgi.cis.iter().find(|c| c.id == id).ok_or(ERR_NOT_FOUND)?;
        unsafe { out(ci, pack(K_CI, g.index, sgi.id, id) as nvmlComputeInstance_t) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo_v2(
    ci: nvmlComputeInstance_t,
    info: *mut nvmlComputeInstanceInfo_t,
) -> nvmlReturn_t {
    read_on("nvmlComputeInstanceGetInfo_v2", gpu_of(ci), |st| {
        let (kind, gpu, gid, cid) = unpack(ci);
        if kind != K_CI {
            return Err(ERR_INVALID_ARGUMENT);
        }
        let g = st.gpu(gpu).ok_or(ERR_INVALID_ARGUMENT)?;
        let c = g
            .gi(gid)
            .and_then(|x| x.cis.iter().find(|c| c.id == cid))
            .ok_or(ERR_NOT_FOUND)?;
        let v = nvmlComputeInstanceInfo_t {
            device: pack(K_DEVICE, gpu, 0, 0) as nvmlDevice_t,
            gpuInstance: pack(K_GI, gpu, gid, 0) as nvmlGpuInstance_t,
            id: c.id,
            profileId: c.profile_id,
            placement: nvmlComputeInstancePlacement_t {
                start: 0,
                size: ci_slices(c.profile_id).unwrap_or(1),
            },
        };
        unsafe { out(info, v) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlComputeInstanceDestroy(ci: nvmlComputeInstance_t) -> nvmlReturn_t {
    call_on("nvmlComputeInstanceDestroy", gpu_of(ci), true, |st| {
        let (kind, gpu, gid, cid) = unpack(ci);
        if kind != K_CI {
            return Err(ERR_INVALID_ARGUMENT);
        }
        let g = st.gpu_mut(gpu).ok_or(ERR_INVALID_ARGUMENT)?;
        if g.processes
            .iter()
            .any(|p| p.gi == Some(gid) && p.ci.is_none_or(|c| c == cid))
        {
            return Err(ERR_IN_USE);
        }
        let sgi = g.gis.iter_mut().find(|x| x.id == gid).ok_or(ERR_NOT_FOUND)?;
        let before = sgi.cis.len();
        sgi.cis.retain(|c| c.id != cid);
        if sgi.cis.len() == before {
            return Err(ERR_NOT_FOUND);
        }
        st.record("nvmlComputeInstanceDestroy", gpu, format!("gi={gid} ci={cid}"));
        Ok(true)
    })
}
