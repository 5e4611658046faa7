//! MIG device handles: the compute instances as devices, as CUDA and the device plugin see them.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::profiles::{ci_slices, engines, gi_shape};
use super::*;

/// MIG devices are the compute instances, in GPU-instance then compute-instance order.
pub(crate) fn mig_devices(g: &SimGpu) -> Vec<(u32, u32)> {
    g.gis
        .iter()
        .flat_map(|gi| gi.cis.iter().map(move |c| (gi.id, c.id)))
        .collect()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(dev: nvmlDevice_t, count: *mut c_uint) -> nvmlReturn_t {
    read_on("nvmlDeviceGetMaxMigDeviceCount", gpu_of(dev), |st| {
        // nvml.h: "Returns zero if MIG is not supported or enabled."
        let max = if device(st, dev)?.mig_current {
            mig::COMPUTE_SLICES
        } else {
            0
        };
        unsafe { out(count, max) }
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
        // nvml.h: NOT_SUPPORTED "if this query is not supported by the device", INVALID_ARGUMENT
        // for an invalid index, NOT_FOUND "if no valid MIG device was found at index".
        if !g.mig_current {
            return Err(ERR_NOT_SUPPORTED);
        }
        if index >= mig::COMPUTE_SLICES {
            return Err(ERR_INVALID_ARGUMENT);
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

/// nvml.h: "This API currently only supports MIG device handles" (NOT_SUPPORTED for a GPU).
/// go-nvlib's `MigDevice.GetProfile` reads the MIG device's memory from here.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAttributes_v2(
    dev: nvmlDevice_t,
    attrs: *mut nvmlDeviceAttributes_t,
) -> nvmlReturn_t {
    read_on("nvmlDeviceGetAttributes_v2", gpu_of(dev), |st| {
        let (kind, gpu, gid, cid) = unpack(dev);
        let g = st.gpu(gpu).ok_or(ERR_INVALID_ARGUMENT)?;
        match kind {
            K_MIG => {}
            K_DEVICE => return Err(ERR_NOT_SUPPORTED),
            _ => return Err(ERR_INVALID_ARGUMENT),
        }
        let gi = g.gi(gid).ok_or(ERR_NOT_FOUND)?;
        let ci = gi.cis.iter().find(|c| c.id == cid).ok_or(ERR_NOT_FOUND)?;
        let shape = gi_shape(gi)?;
        let slices = ci_slices(ci.profile_id).ok_or(ERR_UNKNOWN)?;
        let en = engines(g.model().key, shape);
        let v = nvmlDeviceAttributes_t {
            multiprocessorCount: super::profiles::ci_sm(g.model().key, shape, slices),
            sharedCopyEngineCount: en.ce,
            sharedDecoderCount: en.dec,
            sharedEncoderCount: en.enc,
            sharedJpegCount: en.jpeg,
            sharedOfaCount: en.ofa,
            gpuInstanceSliceCount: shape.info().compute_slices,
            computeInstanceSliceCount: slices,
            memorySizeMB: g.gi_memory_mib(gi),
        };
        unsafe { out(attrs, v) }
    })
}
