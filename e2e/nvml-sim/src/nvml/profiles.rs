//! GPU-instance and compute-instance profiles: which enum values exist, which this GPU supports,
//! and the engines (SMs, copy engines, decoders...) NVIDIA's driver reports for each.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::*;
use gpu_tenancy_core::mig::Shape;

/// `NVML_GPU_INSTANCE_PROFILE_COUNT` of the driver the simulator stands for (550, whose nvml.h is
/// CUDA 12.4's: profiles 0 to 9). nvml.h: "enumerate all MIG profiles ... by invoking it on
/// profile values starting from 0, until the API returns NVML_ERROR_INVALID_ARGUMENT"; a value
/// in range that this GPU lacks (8_SLICE, 6_SLICE, 2_SLICE_REV1) is NVML_ERROR_NOT_SUPPORTED.
pub const GI_PROFILE_COUNT: u32 = 10;
/// `NVML_COMPUTE_INSTANCE_PROFILE_COUNT` of the same nvml.h (profiles 0 to 7).
pub const CI_PROFILE_COUNT: u32 = 8;
/// `NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT`: only `..._SHARED` (0) exists.
pub const CI_ENGINE_PROFILE_COUNT: u32 = 1;

/// What a GPU instance of a profile has, as `nvidia-smi mig -lgip` prints it (SM, DEC, ENC on the
/// first line of a row, CE, JPEG, OFA on the second).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Engines {
    pub sm: u32,
    pub dec: u32,
    pub enc: u32,
    pub ce: u32,
    pub jpeg: u32,
    pub ofa: u32,
}

const fn e(sm: u32, dec: u32, enc: u32, ce: u32, jpeg: u32, ofa: u32) -> Engines {
    Engines {
        sm,
        dec,
        enc,
        ce,
        jpeg,
        ofa,
    }
}

/// In `Shape::ALL` order: 1g, 1g+me, 1g.2x, 2g, 3g, 4g, 7g.
type Table = [Engines; 7];

/// A100-SXM4-40GB: the MIG user guide's `nvidia-smi mig -lgip` (tests/data/nvidia-smi/a100-40gb-lgip.txt).
const A100: Table = [
    e(14, 0, 0, 1, 0, 0),
    e(14, 1, 0, 1, 1, 1),
    e(14, 1, 0, 1, 0, 0),
    e(28, 1, 0, 2, 0, 0),
    e(42, 2, 0, 3, 0, 0),
    e(56, 2, 0, 4, 0, 0),
    e(98, 5, 0, 7, 1, 1),
];

/// Hopper: H100 NVL (tests/data/nvidia-smi/h100-nvl-lgip.txt) and H200 (h200-lgip.txt) print the
/// same figures, and so does H100 80GB (docs/nvidia.md#mig-geometry: 16, 26, 32, 60, 64, 132 SMs).
const HOPPER: Table = [
    e(16, 1, 0, 1, 1, 0),
    e(16, 1, 0, 1, 1, 1),
    e(26, 1, 0, 1, 1, 0),
    e(32, 2, 0, 2, 2, 0),
    e(60, 3, 0, 3, 3, 0),
    e(64, 4, 0, 4, 4, 0),
    e(132, 7, 0, 8, 7, 1),
];

/// B200: the first four rows as mig-parted#187 prints them (tests/data/nvidia-smi/b200-lgip.txt).
/// No `-lgip` output of the other three was found. Their copy engines (6, 8, 16) are the MIG user
/// guide's ("Supported MIG Profiles", B200); the rest is derived, not NVIDIA's: SMs as on every
/// published model (4g = 4 × 1g; 3g = 3 × 1g, which Hopper exceeds; 7g = all of B200's 148 SMs,
/// as Hopper's 7g has all 132), a decoder and a JPEG engine per compute slice and one OFA on the
/// whole GPU, as on Hopper.
const B200: Table = [
    e(18, 1, 0, 2, 1, 0),
    e(18, 1, 0, 2, 1, 1),
    e(30, 1, 0, 2, 1, 0),
    e(36, 2, 0, 4, 2, 0),
    e(54, 3, 0, 6, 3, 0),
    e(72, 4, 0, 8, 4, 0),
    e(148, 7, 0, 16, 7, 1),
];

/// The engines of a GPU instance of `shape` on the model `key` (`gpu_tenancy_core::mig` model keys).
/// A100-80GB prints the A100-40GB figures where mig-parted#97 shows them (1g.10gb, 1g.10gb+me,
/// 2g.20gb, 3g.40gb: 14, 14, 28, 42 SMs); the rest are taken from the 40GB part, the same chip.
pub fn engines(key: &str, shape: Shape) -> Engines {
    let table = match key {
        "A100-40GB" | "A100-80GB" => &A100,
        "B200" => &B200,
        _ => &HOPPER,
    };
    let i = Shape::ALL
        .iter()
        .position(|s| *s == shape)
        .expect("a shape of Shape::ALL");
    table[i]
}

/// The GPU-instance profile of an `NVML_GPU_INSTANCE_PROFILE_*` value, or the error nvml.h names:
/// INVALID_ARGUMENT past the enum's range, NOT_SUPPORTED for a profile this GPU does not have.
pub fn shape_by_enum(profile: u32) -> Result<Shape, u32> {
    if profile >= GI_PROFILE_COUNT {
        return Err(ERR_INVALID_ARGUMENT);
    }
    Shape::ALL
        .into_iter()
        .find(|s| s.info().nvml_profile_enum == profile)
        .ok_or(ERR_NOT_SUPPORTED)
}

fn profile_name(g: &SimGpu, shape: Shape) -> String {
    format!("MIG {}", g.model().profile_for(shape).name)
}

fn fill_profile_info(g: &SimGpu, profile: c_uint, info: &mut nvmlGpuInstanceProfileInfo_v2_t) -> Result<(), u32> {
    let shape = shape_by_enum(profile)?;
    let si = shape.info();
    let en = engines(g.model().key, shape);
    info.id = si.profile_id;
    info.isP2pSupported = 0;
    info.sliceCount = si.compute_slices;
    info.instanceCount = si.max_instances;
    info.multiprocessorCount = en.sm;
    info.copyEngineCount = en.ce;
    info.decoderCount = en.dec;
    info.encoderCount = en.enc;
    info.jpegCount = en.jpeg;
    info.ofaCount = en.ofa;
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
        if info.is_null() {
            return Err(ERR_INVALID_ARGUMENT);
        }
        let mut v2: nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
        fill_profile_info(g, profile, &mut v2)?;
        let v1 = nvmlGpuInstanceProfileInfo_t {
            id: v2.id,
            isP2pSupported: v2.isP2pSupported,
            sliceCount: v2.sliceCount,
            instanceCount: v2.instanceCount,
            multiprocessorCount: v2.multiprocessorCount,
            copyEngineCount: v2.copyEngineCount,
            decoderCount: v2.decoderCount,
            encoderCount: v2.encoderCount,
            jpegCount: v2.jpegCount,
            ofaCount: v2.ofaCount,
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
        fill_profile_info(g, profile, info)
    })
}

/// Compute slices of an `NVML_COMPUTE_INSTANCE_PROFILE_*` value (1, 2, 3, 4, 7 slices for 0-4);
/// `None` for 8_SLICE, 6_SLICE and 1_SLICE_REV1, which no GPU modelled here offers.
pub fn ci_slices(profile: u32) -> Option<u32> {
    [1, 2, 3, 4, 7].get(profile as usize).copied()
}

/// The compute slices of a compute-instance profile inside a GPU instance of `gi_slices` compute
/// slices, or nvml.h's error: INVALID_ARGUMENT past the enum's range, NOT_SUPPORTED for a profile
/// this GPU instance does not offer (`nvidia-smi mig -lcip`: no 3c in a 4g instance).
pub fn ci_profile(gi_slices: u32, profile: u32) -> Result<u32, u32> {
    if profile >= CI_PROFILE_COUNT {
        return Err(ERR_INVALID_ARGUMENT);
    }
    let s = ci_slices(profile).ok_or(ERR_NOT_SUPPORTED)?;
    if s > gi_slices || (s == 3 && gi_slices == 4) {
        return Err(ERR_NOT_SUPPORTED);
    }
    Ok(s)
}

/// SMs of a compute instance of `slices` in a GPU instance of `shape`: all of the GPU instance's
/// when it spans it, else one 1g instance's per slice (the MIG user guide's A100 `-lcip`: 14 SMs
/// for 1c.3g.20gb, 28 for 2c.3g.20gb, 42 for the whole 3g.20gb).
pub fn ci_sm(model: &str, shape: Shape, slices: u32) -> u32 {
    if slices == shape.info().compute_slices {
        engines(model, shape).sm
    } else {
        slices * engines(model, Shape::OneSlice).sm
    }
}

/// The shape of a GPU instance the simulator holds (it only creates known profiles).
pub(crate) fn gi_shape(gi: &SimGi) -> Result<Shape, u32> {
    Shape::from_profile_id(gi.profile_id).ok_or(ERR_UNKNOWN)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    gi: nvmlGpuInstance_t,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_t,
) -> nvmlReturn_t {
    read_on("nvmlGpuInstanceGetComputeInstanceProfileInfo", gpu_of(gi), |st| {
        let (g, sgi) = gi_of(st, gi)?;
        // nvml.h: INVALID_ARGUMENT "if gpuInstance, profile, engProfile or info are invalid".
        if eng_profile >= CI_ENGINE_PROFILE_COUNT || info.is_null() {
            return Err(ERR_INVALID_ARGUMENT);
        }
        let shape = gi_shape(sgi)?;
        let gi_slices = shape.info().compute_slices;
        let s = ci_profile(gi_slices, profile)?;
        let v = nvmlComputeInstanceProfileInfo_t {
            id: profile,
            sliceCount: s,
            instanceCount: gi_slices / s,
            multiprocessorCount: ci_sm(g.model().key, shape, s),
            sharedCopyEngineCount: engines(g.model().key, shape).ce,
            sharedDecoderCount: engines(g.model().key, shape).dec,
            sharedEncoderCount: engines(g.model().key, shape).enc,
            sharedJpegCount: engines(g.model().key, shape).jpeg,
            sharedOfaCount: engines(g.model().key, shape).ofa,
        };
        unsafe { out(info, v) }
    })
}
