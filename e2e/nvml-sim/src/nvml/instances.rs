//! MIG: GPU-instance profiles and placements, GPU and compute instances, MIG device handles,
//! under the rules of `gpu_tenancy::mig` (overlaps refused, instance limits, compute budget).

#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::*;
use crate::state::{SimCi, SimGi};
use gpu_tenancy::mig::Shape;

/// GPU-instance profiles by NVML enum: the shapes of FACTS.md §1 (enums 0,1,2,3,4,7,9).
fn shape_by_enum(e: u32) -> Option<Shape> {
    Shape::ALL.into_iter().find(|s| s.info().nvml_profile_enum == e)
}

fn profile_name(g: &SimGpu, shape: Shape) -> String {
    format!("MIG {}", g.model().profile_for(shape).name)
}

unsafe fn fill_profile_info(
    g: &SimGpu,
    profile: c_uint,
    info: &mut nvmlGpuInstanceProfileInfo_v2_t,
) -> Result<(), u32> {
    let shape = shape_by_enum(profile).ok_or(ERR_NOT_SUPPORTED)?;
    let si = shape.info();
    info.id = si.profile_id;
    info.isP2pSupported = 0;
    info.sliceCount = si.compute_slices;
    info.instanceCount = si.max_instances;
    info.multiprocessorCount = si.compute_slices * 16;
    info.copyEngineCount = si.compute_slices;
    // What NVIDIA's driver reports for the profile on this model (checked against published
    // `nvidia-smi mig -lgip` output in operator/tests/nvidia_smi_outputs.rs).
    info.memorySizeMB = g.model().shape_memory_mib(shape).min(g.memory_mib);
    let name = profile_name(g, shape);
    unsafe { write_str(info.name.as_mut_ptr(), info.name.len() as c_uint, &name) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    dev: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_t,
) -> nvmlReturn_t {
    read_on("nvmlDeviceGetGpuInstanceProfileInfo", gpu_of(dev), |st| {
        let g = device(st, dev)?;
        let mut v2: nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
        unsafe { fill_profile_info(g, profile, &mut v2)? };
        let v1 = nvmlGpuInstanceProfileInfo_t {
            id: v2.id,
            isP2pSupported: v2.isP2pSupported,
            sliceCount: v2.sliceCount,
            instanceCount: v2.instanceCount,
            multiprocessorCount: v2.multiprocessorCount,
            copyEngineCount: v2.copyEngineCount,
            decoderCount: 0,
            encoderCount: 0,
            jpegCount: 0,
            ofaCount: 0,
            memorySizeMB: v2.memorySizeMB,
        };
        unsafe { out(info, v1) }
    })
}

/// `nvmlGpuInstanceProfileInfo_v2`: the struct size with version 2 in the top byte.
pub const PROFILE_INFO_V2: u32 = std::mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>() as u32 | (2 << 24);

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoV(
    dev: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_v2_t,
) -> nvmlReturn_t {
    read_on("nvmlDeviceGetGpuInstanceProfileInfoV", gpu_of(dev), |st| {
        let g = device(st, dev)?;
        if info.is_null() {
            return Err(ERR_INVALID_ARGUMENT);
        }
        let info = unsafe { &mut *info };
        if info.version != PROFILE_INFO_V2 {
            return Err(ERR_ARGUMENT_VERSION_MISMATCH);
        }
        unsafe { fill_profile_info(g, profile, info) }
    })
}

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

/// Creates a GPU instance if the MIG rules allow it; returns its ID.
fn create_gi(g: &mut SimGpu, profile_id: u32, start: Option<u32>) -> Result<u32, u32> {
    if !g.mig_current {
        return Err(ERR_INVALID_STATE);
    }
    let shape = Shape::from_profile_id(profile_id).ok_or(ERR_INVALID_ARGUMENT)?;
    let si = shape.info();
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
    let free = |s: u32| {
        g.gis
            .iter()
            .all(|gi| !overlaps((s, si.memory_slices), (gi.start, gi.size)))
    };
    let start = match start {
        Some(s) if !si.starts.contains(&s) => return Err(ERR_INVALID_ARGUMENT),
        Some(s) if !free(s) => return Err(ERR_INSUFFICIENT_RESOURCES),
        Some(s) => s,
        None => *si.starts.iter().find(|&&s| free(s)).ok_or(ERR_INSUFFICIENT_RESOURCES)?,
    };
    let id = (1..).find(|id| g.gi(*id).is_none()).expect("a free id");
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
        if Shape::from_profile_id(profile_id).is_some_and(|s| s.info().memory_slices != p.size) {
            return Err(ERR_INVALID_ARGUMENT);
        }
        let id = create_gi(g, profile_id, Some(p.start))?;
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
        unsafe { *gi = pack(K_GI, index, id, 0) as nvmlGpuInstance_t };
        st.record(
            "nvmlDeviceCreateGpuInstance",
            index,
            format!("gi={id} profile={profile_id}"),
        );
        Ok(true)
    })
}

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
            return Err(ERR_INVALID_STATE);
        }
        Shape::from_profile_id(profile_id).ok_or(ERR_INVALID_ARGUMENT)?;
        let ids: Vec<u32> = g
            .gis
            .iter()
            .filter(|gi| gi.profile_id == profile_id)
            .map(|gi| gi.id)
            .collect();
        if count.is_null() || gis.is_null() {
            return Err(ERR_INVALID_ARGUMENT);
        }
        // The caller passes a buffer of at least the profile's instance count (like nvidia-smi).
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

/// Compute-instance profiles by enum: their compute slices (1, 2, 3, 4, 7 slices).
fn ci_slices(profile: u32) -> Option<u32> {
    [1, 2, 3, 4, 7].get(profile as usize).copied()
}

fn ci_supported(gi_slices: u32, profile: u32) -> Option<u32> {
    let s = ci_slices(profile)?;
    (s <= gi_slices && !(s == 3 && gi_slices == 4)).then_some(s)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    gi: nvmlGpuInstance_t,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_t,
) -> nvmlReturn_t {
    read_on("nvmlGpuInstanceGetComputeInstanceProfileInfo", gpu_of(gi), |st| {
        let (_, sgi) = gi_of(st, gi)?;
        if eng_profile != 0 {
            return Err(ERR_NOT_SUPPORTED);
        }
        let gi_slices = Shape::from_profile_id(sgi.profile_id)
            .ok_or(ERR_UNKNOWN)?
            .info()
            .compute_slices;
        let s = ci_supported(gi_slices, profile).ok_or(ERR_NOT_SUPPORTED)?;
        let v = nvmlComputeInstanceProfileInfo_t {
            id: profile,
            sliceCount: s,
            instanceCount: gi_slices / s,
            multiprocessorCount: s * 16,
            sharedCopyEngineCount: 1,
            sharedDecoderCount: 0,
            sharedEncoderCount: 0,
            sharedJpegCount: 0,
            sharedOfaCount: 0,
        };
        unsafe { out(info, v) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstance(
    gi: nvmlGpuInstance_t,
    profile_id: c_uint,
    ci: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    call_on("nvmlGpuInstanceCreateComputeInstance", gpu_of(gi), true, |st| {
        let (_, gpu, gid, _) = unpack(gi);
        let (_, sgi) = gi_of(st, gi)?;
        let gi_slices = Shape::from_profile_id(sgi.profile_id)
            .ok_or(ERR_UNKNOWN)?
            .info()
            .compute_slices;
        let s = ci_supported(gi_slices, profile_id).ok_or(ERR_INVALID_ARGUMENT)?;
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

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstances(
    gi: nvmlGpuInstance_t,
    profile_id: c_uint,
    cis: *mut nvmlComputeInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    read_on("nvmlGpuInstanceGetComputeInstances", gpu_of(gi), |st| {
        let (g, sgi) = gi_of(st, gi)?;
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

/// MIG devices are the compute instances, in GPU-instance then compute-instance order.
fn mig_devices(g: &SimGpu) -> Vec<(u32, u32)> {
    g.gis
        .iter()
        .flat_map(|gi| gi.cis.iter().map(move |c| (gi.id, c.id)))
        .collect()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(dev: nvmlDevice_t, count: *mut c_uint) -> nvmlReturn_t {
    read_on("nvmlDeviceGetMaxMigDeviceCount", gpu_of(dev), |st| {
        device(st, dev)?;
        unsafe { out(count, mig::COMPUTE_SLICES) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    dev: nvmlDevice_t,
    index: c_uint,
    mig_dev: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    read_on("nvmlDeviceGetMigDeviceHandleByIndex", gpu_of(dev), |st| {
        let g = device(st, dev)?;
        if !g.mig_current {
            return Err(ERR_INVALID_STATE);
        }
        let (gi, ci) = *mig_devices(g).get(index as usize).ok_or(ERR_NOT_FOUND)?;
        unsafe { out(mig_dev, pack(K_MIG, g.index, gi, ci) as nvmlDevice_t) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(dev: nvmlDevice_t, is_mig: *mut c_uint) -> nvmlReturn_t {
    read_on("nvmlDeviceIsMigDeviceHandle", gpu_of(dev), |_| unsafe {
        out(is_mig, (unpack(dev).0 == K_MIG) as c_uint)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(dev: nvmlDevice_t, id: *mut c_uint) -> nvmlReturn_t {
    read_on("nvmlDeviceGetGpuInstanceId", gpu_of(dev), |_| match unpack(dev) {
        (K_MIG, _, gi, _) => unsafe { out(id, gi) },
        _ => Err(ERR_NOT_SUPPORTED),
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(dev: nvmlDevice_t, id: *mut c_uint) -> nvmlReturn_t {
    read_on("nvmlDeviceGetComputeInstanceId", gpu_of(dev), |_| match unpack(dev) {
        (K_MIG, _, _, ci) => unsafe { out(id, ci) },
        _ => Err(ERR_NOT_SUPPORTED),
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig_dev: nvmlDevice_t,
    dev: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    read_on(
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
        gpu_of(mig_dev),
        |_| match unpack(mig_dev) {
            (K_MIG, gpu, _, _) => unsafe { out(dev, pack(K_DEVICE, gpu, 0, 0) as nvmlDevice_t) },
            _ => Err(ERR_INVALID_ARGUMENT),
        },
    )
}
