//! Expected values are read off the device plugin's source (paths in the module comment), not
//! computed by the functions under test.

use super::*;
use crate::api::{GpuSpec, GpuStatus, MpsSettings, condition_status};

/// Where the plugin mounts the MPS root's directories in a container.
const CONTAINER_ROOT: &str = "/mps";

/// What a pod that asks for `nvidia.com/gpu.shared` on an MPS node gets from the plugin's Allocate.
/// A model of NVIDIA's plugin, which the tests hold the agent's paths and the planner's limits to.
#[derive(Clone, Debug, PartialEq, Eq)]
struct PodMps {
    /// Environment variables set in the container.
    pub env: Vec<(String, String)>,
    /// `(container path, host path)` mounts.
    pub mounts: Vec<(PathBuf, PathBuf)>,
}

/// The Allocate response's MPS part for a node whose plugin uses `host_root` as `--mps-root`.
fn pod_mps(host_root: &MpsRoot) -> PodMps {
    let container = MpsRoot(PathBuf::from(CONTAINER_ROOT));
    PodMps {
        env: vec![(
            "CUDA_MPS_PIPE_DIRECTORY".to_string(),
            container.pipe_dir().display().to_string(),
        )],
        mounts: vec![
            (container.pipe_dir(), host_root.pipe_dir()),
            (container.shm_dir(), host_root.shm_dir()),
        ],
    }
}

/// The commands the plugin's daemon sends its control pipe at start for a node whose GPUs are
/// shared `replicas` ways: a pinned memory limit per GPU (bytes / replicas, in whole MiB), then
/// the thread percentage. Every non-MIG GPU of the node is shared (the plugin applies one sharing
/// setting per node). A model of NVIDIA's plugin, for the tests.
fn daemon_commands(gpus: &[GpuStatus], replicas: u32) -> Vec<String> {
    let replicas = u64::from(replicas.max(1));
    let mut out: Vec<String> = gpus
        .iter()
        .filter(|g| g.instances.is_empty() && g.memory_mib > 0)
        .map(|g| {
            // The plugin divides bytes, then converts to MiB: floor(floor(B/r)/2^20) equals
            // floor(floor(B/2^20)/r), so the driver's MiB figure gives the same number.
            format!(
                "set_default_device_pinned_mem_limit {} {}M",
                g.index,
                g.memory_mib / replicas
            )
        })
        .collect();
    out.push(format!("set_default_active_thread_percentage {}", 100 / replicas));
    out
}

fn gpu(index: u32, memory_mib: u64) -> GpuStatus {
    GpuStatus {
        index,
        memory_mib,
        ..Default::default()
    }
}

fn mps_spec(max_clients: u32) -> GpuNodeSpec {
    GpuNodeSpec {
        gpus: vec![GpuSpec::mps(0, max_clients).with_tenants(&["team-delta"])].into(),
        ..Default::default()
    }
}

#[test]
fn a_pod_gets_the_plugin_s_pipe_and_shm_mounts_and_pipe_variable() {
    let pod = pod_mps(&MpsRoot(PathBuf::from(DEFAULT_MPS_ROOT)));
    assert_eq!(
        pod.env,
        vec![(
            "CUDA_MPS_PIPE_DIRECTORY".to_string(),
            "/mps/nvidia.com/gpu.shared/pipe".to_string()
        )]
    );
    assert_eq!(
        pod.mounts,
        vec![
            (
                PathBuf::from("/mps/nvidia.com/gpu.shared/pipe"),
                PathBuf::from("/run/nvidia/mps/nvidia.com/gpu.shared/pipe")
            ),
            (PathBuf::from("/mps/shm"), PathBuf::from("/run/nvidia/mps/shm")),
        ]
    );
    let root = MpsRoot(PathBuf::from(DEFAULT_MPS_ROOT));
    assert_eq!(
        root.started_file(),
        PathBuf::from("/run/nvidia/mps/nvidia.com/gpu.shared/.started")
    );
    assert_eq!(
        root.log_dir(),
        PathBuf::from("/run/nvidia/mps/nvidia.com/gpu.shared/log")
    );
}

#[test]
fn the_daemon_sets_equal_shares_per_gpu() {
    // Two A100-40GB (40960 MiB as the driver reports it), 4 clients each: 10240M and 25%.
    assert_eq!(
        daemon_commands(&[gpu(0, 40960), gpu(1, 40960)], 4),
        vec![
            "set_default_device_pinned_mem_limit 0 10240M",
            "set_default_device_pinned_mem_limit 1 10240M",
            "set_default_active_thread_percentage 25",
        ]
    );
    // An H100 80GB HBM3 (81559 MiB) in 3: the plugin's integer divisions round down.
    assert_eq!(
        daemon_commands(&[gpu(0, 81559)], 3),
        vec![
            "set_default_device_pinned_mem_limit 0 27186M",
            "set_default_active_thread_percentage 33"
        ]
    );
}

/// What the planner accepts as `pinnedMemoryLimit` and `activeThreadPercentage` is exactly what
/// the plugin's daemon sets, for every client count and the memory of the GPUs we know.
#[test]
fn the_plan_values_the_planner_accepts_are_the_daemon_s() {
    for memory in [40960u64, 81920, 81559, 95830, 143771, 183359] {
        for clients in 2..=48u32 {
            let cmds = daemon_commands(&[gpu(0, memory)], clients);
            let pinned: u64 = cmds[0]
                .strip_prefix("set_default_device_pinned_mem_limit 0 ")
                .and_then(|v| v.strip_suffix('M'))
                .and_then(|v| v.parse().ok())
                .unwrap();
            let settings = |limit: u64| MpsSettings {
                max_clients: clients,
                active_thread_percentage: None,
                pinned_memory_limit: Some(format!("{limit}Mi")),
            };
            assert_eq!(
                crate::policy::mps_pinned_problem(&settings(pinned), "GPU", memory),
                None,
                "{memory} MiB, {clients} clients"
            );
            assert!(crate::policy::mps_pinned_problem(&settings(pinned + 1), "GPU", memory).is_some());
            let pct: u32 = cmds[1].rsplit(' ').next().unwrap().parse().unwrap();
            assert_eq!(pct, 100 / clients);
        }
    }
}

#[test]
fn the_condition_follows_the_started_file() {
    let dir = std::env::temp_dir().join(format!("gt-plugin-mps-{}", std::process::id()));
    let root = MpsRoot(dir.clone());
    let now = Time(jiff::Timestamp::now());
    let spec = mps_spec(4);
    let mut status = GpuNodeStatus::default();

    std::fs::remove_dir_all(&dir).ok();
    report(&mut status, &spec, &root, &observe(&root), &now);
    assert_eq!(condition_status(&status.conditions, MPS_DAEMON_READY), Some(false));
    assert!(status.conditions[0].reason == "RootNotMounted" && status.conditions[0].message.contains("--mps-root"));

    std::fs::create_dir_all(root.pipe_dir()).unwrap();
    report(&mut status, &spec, &root, &observe(&root), &now);
    assert_eq!(status.conditions[0].reason, "NotStarted");

    std::fs::write(root.started_file(), "").unwrap();
    report(&mut status, &spec, &root, &observe(&root), &now);
    assert_eq!(condition_status(&status.conditions, MPS_DAEMON_READY), Some(true));

    // A node whose spec has no MPS GPU any more drops the condition.
    report(&mut status, &GpuNodeSpec::default(), &root, &observe(&root), &now);
    assert!(status.conditions.is_empty());
    std::fs::remove_dir_all(&dir).ok();
}
