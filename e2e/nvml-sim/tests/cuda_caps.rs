//! A CUDA client in a capped container sees what it would see under the driver's cap:
//! `cuMemAlloc_v2` past the container's cap is `CUDA_ERROR_OUT_OF_MEMORY`, counting the
//! container's other processes on the GPU, while the same allocation outside the container
//! succeeds. One test: the CUDA side reads its environment once per process.

use nvidia_ml_sim::caps::{self, Alloc, CONTAINER_ENV, MemoryCap};
use nvidia_ml_sim::cuda::*;
use nvidia_ml_sim::state::{self, CONFIG_ENV, MIB, Paths, STATE_ENV};
use std::path::PathBuf;

const OUT_OF_MEMORY: u32 = 2;

#[test]
fn cu_mem_alloc_past_the_containers_cap_is_out_of_memory() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cuda-caps");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("sim.yaml");
    std::fs::write(&config, "gpus:\n- {pciDeviceId: \"0x20B010DE\"}\n").unwrap();
    let paths = Paths {
        state: dir.join("sim.yaml.state.json"),
        config: config.clone(),
    };
    let gpu = state::read(&paths).unwrap().gpus[0].uuid.clone();
    // Container "b" is capped at 10240 MiB and already has a process holding 4096 of it.
    state::update(&paths, |st| {
        st.set_cap(MemoryCap {
            gpu_uuid: gpu.clone(),
            container: "b".into(),
            request_mib: None,
            limit_mib: 10240,
        })
    })
    .unwrap()
    .unwrap();
    let other = Alloc {
        gpu_uuid: gpu.clone(),
        container: "b".into(),
        pid: 7,
        mib: 4096,
        tenant: None,
    };
    caps::alloc(&paths, &other).unwrap();
    // SAFETY: this test binary holds this one test; nothing else reads the environment yet.
    unsafe {
        std::env::set_var(CONFIG_ENV, &config);
        std::env::remove_var(STATE_ENV);
        std::env::set_var("CUDA_VISIBLE_DEVICES", &gpu);
        std::env::set_var(CONTAINER_ENV, "b");
    }
    assert_eq!(cuInit(0), 0);
    let mut ctx = std::ptr::null_mut();
    assert_eq!(unsafe { cuDevicePrimaryCtxRetain(&mut ctx, 0) }, 0);
    assert_eq!(cuCtxSetCurrent(ctx), 0);
    let mut p = 0u64;
    // 4096 held + 6144 = 10240: exactly the cap.
    assert_eq!(unsafe { cuMemAlloc_v2(&mut p, (6144 * MIB) as usize) }, 0);
    assert_eq!(
        unsafe { cuMemAlloc_v2(&mut p, MIB as usize) },
        OUT_OF_MEMORY,
        "one MiB past the cap, with 30 GiB of the GPU free"
    );
    // Outside the container the same process is bounded by the GPU only.
    unsafe { std::env::remove_var(CONTAINER_ENV) };
    assert_eq!(unsafe { cuMemAlloc_v2(&mut p, MIB as usize) }, 0);
}
