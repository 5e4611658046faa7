//! The simulated NVML functions answer as nvml.h documents them and as NVIDIA's drivers were seen
//! to answer (`nvidia-smi` outputs quoted in NVIDIA's issue trackers, docs/nvidia.md#mig-geometry). Called in
//! process, through the library's Rust side; e2e/nvml-check drives the built `.so` with NVIDIA's
//! own Go client.
//!
//! The library reads its config path once per process, so every test shares one simulated node
//! and runs under a lock, starting from the config's fresh state.

use nvidia_ml_sim::nvml::{self, instances, lookup, mig_devices, profiles};
use nvidia_ml_sim::state::{self, Paths, SimState};
use nvml_wrapper_sys::bindings::*;
use std::ffi::{CStr, CString};
use std::sync::{Mutex, MutexGuard, OnceLock};

const SUCCESS: u32 = 0;
const INVALID_ARGUMENT: u32 = 2;
const NOT_SUPPORTED: u32 = 3;
const NOT_FOUND: u32 = 6;

/// GPU indices of the node below.
const A100_40: u32 = 0;
const A100_40_SWAPPED: u32 = 1;
const A100_80: u32 = 2;
const A100_80_SWAPPED: u32 = 3;
const H100: u32 = 4;
const H100_NVL: u32 = 5;
const H200: u32 = 6;
const B200: u32 = 8;
const MIG_OFF: u32 = 9;

const CONFIG: &str = r#"gpus:
- {pciDeviceId: "0x20B010DE", count: 2, mig: true}
- {pciDeviceId: "0x20B210DE", count: 2, mig: true}
- {model: "NVIDIA H100 80GB HBM3", mig: true}
- {pciDeviceId: "0x232110DE", mig: true}
- {pciDeviceId: "0x233510DE", count: 2, mig: true}
- {pciDeviceId: "0x290110DE", mig: true}
- {pciDeviceId: "0x20B010DE"}
"#;

fn paths() -> &'static Paths {
    static PATHS: OnceLock<Paths> = OnceLock::new();
    PATHS.get_or_init(|| {
        // Under cargo's temporary directory for tests; those of test processes that ended go.
        let root = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("nvml-answers");
        for e in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            let alive = e
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
                .is_some_and(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists());
            if !alive {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        let dir = root.join(std::process::id().to_string());
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("sim.yaml");
        std::fs::write(&config, CONFIG).unwrap();
        // SAFETY: set once, before the library first reads it, while no other thread reads the
        // environment (every test takes the lock below first).
        unsafe {
            std::env::set_var(state::CONFIG_ENV, &config);
            std::env::remove_var(state::STATE_ENV);
        }
        Paths::for_config(&config)
    })
}

/// The node as its config describes it, for the caller alone.
fn fresh() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let p = paths();
    let cfg = state::load_config(&p.config).unwrap();
    state::update(p, |st| *st = SimState::from_config(&cfg).unwrap()).unwrap();
    assert_eq!(nvml::nvmlInit_v2(), SUCCESS);
    guard
}

fn dev(index: u32) -> nvmlDevice_t {
    let mut d: nvmlDevice_t = std::ptr::null_mut();
    assert_eq!(unsafe { nvml::nvmlDeviceGetHandleByIndex_v2(index, &mut d) }, SUCCESS);
    d
}

fn index_of(d: nvmlDevice_t) -> u32 {
    let mut i = 0;
    assert_eq!(unsafe { nvml::nvmlDeviceGetIndex(d, &mut i) }, SUCCESS);
    i
}

/// Creates a GPU instance of `profile_id` at `start` (or where the driver picks); its ID.
fn create(gpu: u32, profile_id: u32, start: Option<u32>) -> Result<u32, u32> {
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    let rc = match start {
        Some(start) => {
            let size = gpu_tenancy_core::mig::Shape::from_profile_id(profile_id).map_or(1, |s| s.info().memory_slices);
            let p = nvmlGpuInstancePlacement_t { start, size };
            unsafe { instances::nvmlDeviceCreateGpuInstanceWithPlacement(dev(gpu), profile_id, &p, &mut gi) }
        }
        None => unsafe { instances::nvmlDeviceCreateGpuInstance(dev(gpu), profile_id, &mut gi) },
    };
    if rc != SUCCESS {
        return Err(rc);
    }
    Ok(info(gi).id)
}

fn gi_handle(gpu: u32, id: u32) -> nvmlGpuInstance_t {
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    assert_eq!(
        unsafe { instances::nvmlDeviceGetGpuInstanceById(dev(gpu), id, &mut gi) },
        SUCCESS
    );
    gi
}

fn info(gi: nvmlGpuInstance_t) -> nvmlGpuInstanceInfo_t {
    let mut i: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { instances::nvmlGpuInstanceGetInfo(gi, &mut i) }, SUCCESS);
    i
}

fn gi_profile(gpu: u32, profile: u32) -> (u32, nvmlGpuInstanceProfileInfo_t) {
    let mut i: nvmlGpuInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
    let rc = unsafe { profiles::nvmlDeviceGetGpuInstanceProfileInfo(dev(gpu), profile, &mut i) };
    (rc, i)
}

fn gi_profile_v2(gpu: u32, profile: u32) -> u32 {
    let mut i: nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
    i.version = profiles::PROFILE_INFO_V2;
    unsafe { profiles::nvmlDeviceGetGpuInstanceProfileInfoV(dev(gpu), profile, &mut i) }
}

fn ci_profile(gi: nvmlGpuInstance_t, profile: u32, eng: u32) -> (u32, nvmlComputeInstanceProfileInfo_t) {
    let mut i: nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
    let rc = unsafe { profiles::nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, profile, eng, &mut i) };
    (rc, i)
}

fn create_ci(gi: nvmlGpuInstance_t, profile: u32) -> Result<nvmlComputeInstance_t, u32> {
    let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
    match unsafe { instances::nvmlGpuInstanceCreateComputeInstance(gi, profile, &mut ci) } {
        SUCCESS => Ok(ci),
        rc => Err(rc),
    }
}

fn bus_id(gpu: u32) -> String {
    let mut pci: nvmlPciInfo_t = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { nvml::nvmlDeviceGetPciInfo_v3(dev(gpu), &mut pci) }, SUCCESS);
    unsafe { CStr::from_ptr(pci.busId.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

fn by_bus_id(s: &str) -> Result<u32, u32> {
    let c = CString::new(s).unwrap();
    let mut d: nvmlDevice_t = std::ptr::null_mut();
    match unsafe { lookup::nvmlDeviceGetHandleByPciBusId_v2(c.as_ptr(), &mut d) } {
        SUCCESS => Ok(index_of(d)),
        rc => Err(rc),
    }
}

#[test]
fn devices_are_found_by_pci_bus_id_in_every_form_nvml_h_documents() {
    let _node = fresh();
    assert_eq!(bus_id(0), "00000000:18:00.0");
    for gpu in [0, 3, MIG_OFF] {
        let bus = 0x18 + gpu;
        for form in [
            bus_id(gpu),
            format!("0000:{bus:02x}:00.0"),
            format!("0000:{bus:02X}:00"),
            format!("{bus:02x}:00.0"),
        ] {
            assert_eq!(by_bus_id(&form), Ok(gpu), "{form}");
        }
    }
    assert_eq!(by_bus_id("0000:99:00.0"), Err(NOT_FOUND), "no GPU there");
    assert_eq!(by_bus_id("0001:18:00.0"), Err(NOT_FOUND), "another domain");
    assert_eq!(by_bus_id("GPU 0"), Err(INVALID_ARGUMENT));
    let c = CString::new("0000:18:00.0").unwrap();
    assert_eq!(
        unsafe { lookup::nvmlDeviceGetHandleByPciBusId_v2(c.as_ptr(), std::ptr::null_mut()) },
        INVALID_ARGUMENT
    );
}

#[test]
fn devices_and_mig_devices_are_found_by_uuid() {
    let _node = fresh();
    let by_uuid = |s: &str| {
        let c = CString::new(s).unwrap();
        let mut d: nvmlDevice_t = std::ptr::null_mut();
        match unsafe { lookup::nvmlDeviceGetHandleByUUID(c.as_ptr(), &mut d) } {
            SUCCESS => Ok(d),
            rc => Err(rc),
        }
    };
    let st = state::read(paths()).unwrap();
    for g in &st.gpus {
        assert_eq!(index_of(by_uuid(&g.uuid).unwrap()), g.index);
    }
    let id = create(H100, 9, Some(4)).unwrap();
    create_ci(gi_handle(H100, id), 2).unwrap();
    let uuid = state::read(paths()).unwrap().gpus[H100 as usize].gi(id).unwrap().cis[0]
        .uuid
        .clone();
    let mig = by_uuid(&uuid).unwrap();
    let (mut is_mig, mut gi) = (0, 0);
    assert_eq!(
        unsafe { mig_devices::nvmlDeviceIsMigDeviceHandle(mig, &mut is_mig) },
        SUCCESS
    );
    assert_eq!(
        unsafe { mig_devices::nvmlDeviceGetGpuInstanceId(mig, &mut gi) },
        SUCCESS
    );
    assert_eq!((is_mig, gi), (1, id));
    assert_eq!(
        by_uuid("GPU-00000000-0000-0000-0000-000000000000").err(),
        Some(NOT_FOUND)
    );
    assert_eq!(by_uuid("").err(), Some(INVALID_ARGUMENT));
}

/// nvml.h: enumerate "starting from 0, until the API returns NVML_ERROR_INVALID_ARGUMENT";
/// NOT_SUPPORTED "if profile isn't supported". Driver 550's enum ends at 9 (1_SLICE_REV2).
#[test]
fn gpu_instance_profiles_are_invalid_past_the_enum_and_not_supported_inside_it() {
    let _node = fresh();
    for gpu in [A100_40, H100, B200, MIG_OFF] {
        for profile in 0..12 {
            let want = match profile {
                0..=4 | 7 | 9 => SUCCESS,
                5 | 6 | 8 => NOT_SUPPORTED,
                _ => INVALID_ARGUMENT,
            };
            assert_eq!(gi_profile(gpu, profile).0, want, "GPU {gpu} profile {profile}");
            assert_eq!(gi_profile_v2(gpu, profile), want, "V: GPU {gpu} profile {profile}");
        }
        assert_eq!(gi_profile(gpu, u32::MAX).0, INVALID_ARGUMENT);
    }
}

/// SMs per GPU-instance profile, by NVML enum 0, 7, 9, 1, 2, 3, 4 (1g, 1g+me, 1g.2x, 2g, 3g, 4g,
/// 7g), as NVIDIA published them: A100-40GB and the Hopper parts in `nvidia-smi mig -lgip`
/// (operator/tests/data/nvidia-smi, docs/nvidia.md#mig-geometry), A100-80GB's first four in mig-parted#97,
/// B200's first four in mig-parted#187. 0 marks a figure not published (derived, not checked).
#[test]
fn gpu_instance_profiles_report_nvidias_published_sm_counts() {
    let _node = fresh();
    let published: [(u32, [u32; 7]); 7] = [
        (A100_40, [14, 14, 14, 28, 42, 56, 98]),
        (A100_80, [14, 14, 0, 28, 42, 0, 0]),
        (H100, [16, 16, 26, 32, 60, 64, 132]),
        (H100_NVL, [16, 16, 26, 32, 60, 64, 132]),
        (H200, [16, 16, 26, 32, 60, 64, 132]),
        (H200 + 1, [16, 16, 26, 32, 60, 64, 132]),
        (B200, [18, 18, 30, 36, 0, 0, 0]),
    ];
    for (gpu, sms) in published {
        for (profile, want) in [0, 7, 9, 1, 2, 3, 4].into_iter().zip(sms) {
            let (rc, i) = gi_profile(gpu, profile);
            assert_eq!(rc, SUCCESS);
            if want != 0 {
                assert_eq!(i.multiprocessorCount, want, "GPU {gpu} profile enum {profile}");
            }
        }
    }
    // Hopper's 7g has 8 copy engines, A100's 7 (the CE column of the same outputs).
    assert_eq!(
        (
            gi_profile(H100, 4).1.copyEngineCount,
            gi_profile(A100_40, 4).1.copyEngineCount
        ),
        (8, 7)
    );
}

/// nvml.h: INVALID_ARGUMENT "if gpuInstance, profile, engProfile or info are invalid",
/// NOT_SUPPORTED "if profile isn't supported". A 4g instance offers 1c, 2c and 4g, not 3c
/// (`nvidia-smi mig -lcip`).
#[test]
fn compute_instance_profiles_are_invalid_past_the_enum_and_not_supported_inside_it() {
    let _node = fresh();
    let id = create(A100_40, 5, Some(0)).unwrap();
    let gi = gi_handle(A100_40, id);
    for profile in 0..10 {
        let want = match profile {
            0 | 1 | 3 => SUCCESS,
            2 | 4..=7 => NOT_SUPPORTED,
            _ => INVALID_ARGUMENT,
        };
        assert_eq!(ci_profile(gi, profile, 0).0, want, "CI profile {profile}");
    }
    assert_eq!(
        ci_profile(gi, 0, 1).0,
        INVALID_ARGUMENT,
        "only the shared engine profile"
    );
    let (_, full) = ci_profile(gi, 3, 0);
    let (_, one) = ci_profile(gi, 0, 0);
    assert_eq!((full.multiprocessorCount, full.instanceCount), (56, 1));
    assert_eq!((one.multiprocessorCount, one.instanceCount), (14, 4));

    // Listing or creating a profile the instance does not offer: NOT_SUPPORTED, not an empty list.
    let mut cis = [std::ptr::null_mut(); 8];
    let mut n = 0;
    let list = |profile, cis: &mut [nvmlComputeInstance_t; 8], n: &mut u32| unsafe {
        instances::nvmlGpuInstanceGetComputeInstances(gi, profile, cis.as_mut_ptr(), n)
    };
    assert_eq!(list(2, &mut cis, &mut n), NOT_SUPPORTED);
    assert_eq!(list(9, &mut cis, &mut n), INVALID_ARGUMENT);
    assert_eq!(list(3, &mut cis, &mut n), SUCCESS);
    assert_eq!(n, 0);
    assert_eq!(create_ci(gi, 2).err(), Some(NOT_SUPPORTED));
    assert_eq!(create_ci(gi, 9).err(), Some(INVALID_ARGUMENT));
    let ci = create_ci(gi, 3).unwrap();
    assert_eq!(list(3, &mut cis, &mut n), SUCCESS);
    assert_eq!(n, 1);
    let mut back: nvmlComputeInstance_t = std::ptr::null_mut();
    assert_eq!(
        unsafe { instances::nvmlGpuInstanceGetComputeInstanceById(gi, 0, &mut back) },
        SUCCESS
    );
    assert_eq!(back, ci);
    assert_eq!(
        unsafe { instances::nvmlGpuInstanceGetComputeInstanceById(gi, 5, &mut back) },
        NOT_FOUND
    );
}

/// nvml.h: NOT_SUPPORTED "if device doesn't have MIG mode enabled" for listing and creating GPU
/// instances; the MIG device count "returns zero if MIG is not supported or enabled".
#[test]
fn without_mig_mode_instance_calls_are_not_supported() {
    let _node = fresh();
    let d = dev(MIG_OFF);
    let mut gis = [std::ptr::null_mut(); 7];
    let mut n = 0;
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    let p = nvmlGpuInstancePlacement_t { start: 0, size: 8 };
    unsafe {
        assert_eq!(
            instances::nvmlDeviceGetGpuInstances(d, 19, gis.as_mut_ptr(), &mut n),
            NOT_SUPPORTED
        );
        assert_eq!(instances::nvmlDeviceCreateGpuInstance(d, 0, &mut gi), NOT_SUPPORTED);
        assert_eq!(
            instances::nvmlDeviceCreateGpuInstanceWithPlacement(d, 0, &p, &mut gi),
            NOT_SUPPORTED
        );
        assert_eq!(instances::nvmlDeviceGetGpuInstanceById(d, 0, &mut gi), NOT_SUPPORTED);
        assert_eq!(mig_devices::nvmlDeviceGetMaxMigDeviceCount(d, &mut n), SUCCESS);
        assert_eq!(n, 0);
        let mut mig: nvmlDevice_t = std::ptr::null_mut();
        assert_eq!(
            mig_devices::nvmlDeviceGetMigDeviceHandleByIndex(d, 0, &mut mig),
            NOT_SUPPORTED
        );
    }
    // Placements are listed "regardless of whether MIG is enabled or not" (nvml.h).
    let mut count = 0;
    assert_eq!(
        unsafe { instances::nvmlDeviceGetGpuInstancePossiblePlacements_v2(d, 19, std::ptr::null_mut(), &mut count) },
        SUCCESS
    );
    assert_eq!(count, 7);
}

/// `nvidia-smi mig -lgi` on two A100 80GB of one node (NVIDIA/DCGM#138): the same placements got
/// IDs 9, 10, 3, 2 on GPU 0 and 13, 14, 5, 1 on GPU 1. The ID follows from the placement: the
/// order of creation, and destroying and creating again, change nothing.
#[test]
fn gpu_instance_ids_follow_the_placement_as_in_dcgm_138() {
    let _node = fresh();
    let layout = [(19, 2), (19, 3), (14, 0), (9, 4)];
    for (gpu, want) in [(A100_80, [9, 10, 3, 2]), (A100_80_SWAPPED, [13, 14, 5, 1])] {
        let ids: Vec<u32> = layout.iter().map(|&(p, s)| create(gpu, p, Some(s)).unwrap()).collect();
        assert_eq!(ids, want, "GPU {gpu}");
        // Gone and made again, last first: the same IDs.
        for id in &ids {
            assert_eq!(instances::nvmlGpuInstanceDestroy(gi_handle(gpu, *id)), SUCCESS);
        }
        let again: Vec<u32> = layout
            .iter()
            .rev()
            .map(|&(p, s)| create(gpu, p, Some(s)).unwrap())
            .collect();
        assert_eq!(again, want.iter().rev().copied().collect::<Vec<_>>(), "GPU {gpu}");
    }
}

/// `nvidia-smi mig -cgi 19,19,19,19,19,19,19` on an A100-SXM4-40GB (rapidsai/dask-cuda#583):
/// "Successfully created GPU instance ID 9 ... 7 ... 8 ... 11 ... 12 ... 13 ... 14".
#[test]
fn gpu_instances_without_placement_get_the_ids_of_dask_cuda_583() {
    let _node = fresh();
    let ids: Vec<u32> = (0..7).map(|_| create(A100_40_SWAPPED, 19, None).unwrap()).collect();
    assert_eq!(ids, [9, 7, 8, 11, 12, 13, 14]);
    assert_eq!(
        create(A100_40_SWAPPED, 19, None).err(),
        Some(23),
        "INSUFFICIENT_RESOURCES"
    );
    // A full GPU is ID 0, the halves 1 and 2 (the same numbering on every model here).
    assert_eq!(create(H200, 0, None), Ok(0));
    assert_eq!([create(H100, 9, Some(0)), create(H100, 9, Some(4))], [Ok(1), Ok(2)]);
}

/// The attributes of a MIG device (what go-nvlib reads a MIG device's profile from); nvml.h:
/// "This API currently only supports MIG device handles".
#[test]
fn mig_device_attributes_are_their_profiles() {
    let _node = fresh();
    let id = create(A100_40, 9, Some(4)).unwrap();
    create_ci(gi_handle(A100_40, id), 2).unwrap();
    let mut mig: nvmlDevice_t = std::ptr::null_mut();
    let mut a: nvmlDeviceAttributes_t = unsafe { std::mem::zeroed() };
    unsafe {
        assert_eq!(
            mig_devices::nvmlDeviceGetMigDeviceHandleByIndex(dev(A100_40), 0, &mut mig),
            SUCCESS
        );
        assert_eq!(mig_devices::nvmlDeviceGetAttributes_v2(mig, &mut a), SUCCESS);
    }
    // 3g.20gb: 42 SMs, 19.50 GiB (the MIG user guide's -lgip).
    assert_eq!(
        (
            a.multiprocessorCount,
            a.gpuInstanceSliceCount,
            a.computeInstanceSliceCount,
            a.memorySizeMB
        ),
        (42, 3, 3, 19968)
    );
    assert_eq!(
        unsafe { mig_devices::nvmlDeviceGetAttributes_v2(dev(A100_40), &mut a) },
        NOT_SUPPORTED
    );
    let mut n = 0;
    assert_eq!(
        unsafe { mig_devices::nvmlDeviceGetMaxMigDeviceCount(dev(A100_40), &mut n) },
        SUCCESS
    );
    assert_eq!(
        unsafe { mig_devices::nvmlDeviceGetMigDeviceHandleByIndex(dev(A100_40), n, &mut mig) },
        INVALID_ARGUMENT
    );
    assert_eq!(
        unsafe { mig_devices::nvmlDeviceGetMigDeviceHandleByIndex(dev(A100_40), 1, &mut mig) },
        NOT_FOUND
    );
}

fn utilization(d: nvmlDevice_t) -> Result<nvmlUtilization_t, u32> {
    let mut u = nvmlUtilization_t { gpu: 7, memory: 7 };
    match unsafe { nvml::nvmlDeviceGetUtilizationRates(d, &mut u) } {
        SUCCESS => Ok(u),
        code => Err(code),
    }
}

#[test]
fn utilization_sums_the_processes_and_is_not_supported_with_mig() {
    let _g = fresh();
    let p = paths();
    assert_eq!(utilization(dev(MIG_OFF)).map(|u| u.gpu), Ok(0), "an idle GPU");
    let attach = |pid, sm_util| {
        let a = nvidia_ml_sim::ctl::Attach {
            gpu: MIG_OFF,
            pid,
            sm_util,
            used_mib: 100,
            ..Default::default()
        };
        nvidia_ml_sim::ctl::attach(p, &a).unwrap();
    };
    attach(100, 30);
    assert_eq!(utilization(dev(MIG_OFF)).map(|u| (u.gpu, u.memory)), Ok((30, 0)));
    attach(101, 90);
    assert_eq!(utilization(dev(MIG_OFF)).map(|u| u.gpu), Ok(100), "capped at 100");
    // nvml.h: "On MIG-enabled GPUs, querying device utilization rates is not currently supported."
    assert_eq!(utilization(dev(H100)).map(|u| u.gpu), Err(NOT_SUPPORTED));
    let gi = create(H100, 19, Some(0)).unwrap();
    create_ci(gi_handle(H100, gi), 0).unwrap();
    let mut mig: nvmlDevice_t = std::ptr::null_mut();
    assert_eq!(
        unsafe { mig_devices::nvmlDeviceGetMigDeviceHandleByIndex(dev(H100), 0, &mut mig) },
        SUCCESS
    );
    assert_eq!(utilization(mig).map(|u| u.gpu), Err(NOT_SUPPORTED), "a MIG device");
    assert_eq!(
        unsafe { nvml::nvmlDeviceGetUtilizationRates(dev(MIG_OFF), std::ptr::null_mut()) },
        INVALID_ARGUMENT
    );
}

#[path = "nvml_answers/utilization.rs"]
mod utilization_samples;
