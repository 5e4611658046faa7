//! Two tenants time-slicing one 40 GB GPU, each wanting 30 GiB, with and without the driver's
//! per-container caps: the container toolkit's hook (the built `sim-nvidia-ctk`, run as an OCI
//! runtime runs a `createRuntime` hook) sets the caps, then each container's process allocates
//! in 10 GiB steps, the two taking turns.
//!
//! The numbers, by hand: an A100-SXM4-40GB has 40960 MiB. Split in 4 time-slicing shares with no
//! headroom, a share is 10240 MiB; tenant A's claim holds 3 shares (a 30720 MiB cap), B's one
//! (10240 MiB). Without caps the turns go A 10240, B 10240, A 20480, B 20480: the GPU is full
//! (40960), so A's third step and B's third step both fail and neither job gets its 30 GiB. With
//! caps B's second step fails at B's own cap (10240 used + 10240 > 10240) and A's third step
//! succeeds: A holds its 30720 MiB, the GPU is full, and B is the only one refused.

use nvidia_ml_sim::caps::{self, Alloc, CapError};
use nvidia_ml_sim::state::{self, Paths};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const GIB: u64 = 1024;
const CONFIG: &str = "gpus:\n- {pciDeviceId: \"0x20B010DE\"}\n";

fn node(name: &str) -> (PathBuf, Paths) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("memory-caps")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("sim.yaml");
    std::fs::write(&config, CONFIG).unwrap();
    let paths = Paths {
        state: dir.join("sim.yaml.state.json"),
        config,
    };
    (dir, paths)
}

/// Runs the hook for container `id` whose spec sets `env`, as runc runs a `createRuntime` hook:
/// the OCI state on stdin, the bundle holding `config.json`. Returns (success, stderr).
fn run_hook(dir: &Path, paths: &Paths, id: &str, gpu: &str, env: &[&str]) -> (bool, String) {
    let bundle = dir.join(format!("bundle-{id}"));
    std::fs::create_dir_all(&bundle).unwrap();
    let spec = serde_json::json!({"ociVersion": "1.2.0", "process": {"env": env, "args": ["sleep"], "cwd": "/"}});
    std::fs::write(bundle.join("config.json"), spec.to_string()).unwrap();
    let state =
        serde_json::json!({"ociVersion": "1.2.0", "id": id, "status": "creating", "pid": 4242, "bundle": bundle});
    let mut child = Command::new(env!("CARGO_BIN_EXE_sim-nvidia-ctk"))
        .args([
            "hook",
            "apply-cuda-memory-limits",
            "--driver-root",
            "/",
            "--gpu-id",
            gpu,
        ])
        .env_clear()
        .env(state::CONFIG_ENV, &paths.config)
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(state.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn step(paths: &Paths, gpu: &str, container: &str, pid: u32) -> Result<u64, CapError> {
    caps::alloc(
        paths,
        &Alloc {
            gpu_uuid: gpu.to_string(),
            container: container.to_string(),
            pid,
            mib: 10 * GIB,
            tenant: Some(container.to_string()),
        },
    )
}

fn gpu_uuid(paths: &Paths) -> String {
    state::read(paths).unwrap().gpus[0].uuid.clone()
}

#[test]
fn without_caps_two_30_gib_jobs_on_a_40_gb_gpu_both_run_out() {
    let (dir, paths) = node("without");
    let gpu = gpu_uuid(&paths);
    for id in ["a", "b"] {
        let (ok, err) = run_hook(&dir, &paths, id, &gpu, &["PATH=/bin"]);
        assert!(ok, "{err}");
        assert!(err.contains("nothing to cap"), "{err}");
    }
    assert_eq!(step(&paths, &gpu, "a", 100), Ok(10 * GIB));
    assert_eq!(step(&paths, &gpu, "b", 200), Ok(10 * GIB));
    assert_eq!(step(&paths, &gpu, "a", 100), Ok(20 * GIB));
    assert_eq!(step(&paths, &gpu, "b", 200), Ok(20 * GIB));
    for (c, pid) in [("a", 100), ("b", 200)] {
        assert!(
            matches!(step(&paths, &gpu, c, pid), Err(CapError::GpuFull { free_mib: 0, .. })),
            "{c}'s third 10 GiB: the GPU is full"
        );
    }
    let st = state::read(&paths).unwrap();
    let used: Vec<_> = st.gpus[0].processes.iter().map(|p| (p.pid, p.used_mib)).collect();
    assert_eq!(
        used,
        vec![(100, 20 * GIB), (200, 20 * GIB)],
        "the refused steps changed nothing"
    );
}

#[test]
fn with_caps_the_tenant_past_its_share_is_the_only_one_refused() {
    let (dir, paths) = node("with");
    let gpu = gpu_uuid(&paths);
    let a = ["NVIDIA_GPU_MEMORY_REQUEST=30720", "NVIDIA_GPU_MEMORY_LIMIT=30720"];
    let b = ["NVIDIA_GPU_MEMORY_REQUEST=10240", "NVIDIA_GPU_MEMORY_LIMIT=10240"];
    assert!(run_hook(&dir, &paths, "a", &gpu, &a).0);
    assert!(run_hook(&dir, &paths, "b", &gpu, &b).0);
    let st = state::read(&paths).unwrap();
    assert_eq!(st.cap_of(&gpu, "a").map(|c| c.limit_mib), Some(30720));
    assert_eq!(
        st.cap_of(&gpu, "b").map(|c| (c.request_mib, c.limit_mib)),
        Some((Some(10240), 10240))
    );

    assert_eq!(step(&paths, &gpu, "a", 100), Ok(10 * GIB));
    assert_eq!(step(&paths, &gpu, "b", 200), Ok(10 * GIB));
    assert_eq!(step(&paths, &gpu, "a", 100), Ok(20 * GIB));
    assert_eq!(
        step(&paths, &gpu, "b", 200),
        Err(CapError::OverCap {
            container: "b".into(),
            gpu_uuid: gpu.clone(),
            used_mib: 10240,
            limit_mib: 10240,
            asked_mib: 10240,
        })
    );
    assert_eq!(step(&paths, &gpu, "a", 100), Ok(30 * GIB), "A gets its 30 GiB");
    // NVML reports each process's memory as before: A 30 GiB, B 10 GiB, the GPU full.
    let st = state::read(&paths).unwrap();
    let used: Vec<_> = st.gpus[0].processes.iter().map(|p| (p.pid, p.used_mib)).collect();
    assert_eq!(used, vec![(100, 30720), (200, 10240)]);

    // sim-ctl answers the same refusal with its out-of-memory exit code.
    let out = Command::new(env!("CARGO_BIN_EXE_sim-ctl"))
        .args(["alloc", "--gpu", "0", "--container", "b", "--pid", "200", "--mib", "1"])
        .env(state::CONFIG_ENV, &paths.config)
        .env_remove(state::STATE_ENV)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("out of memory"));
}

#[test]
fn the_hook_fails_clearly_on_a_malformed_value_or_an_unknown_gpu() {
    let (dir, paths) = node("malformed");
    let gpu = gpu_uuid(&paths);
    let (ok, err) = run_hook(&dir, &paths, "a", &gpu, &["NVIDIA_GPU_MEMORY_LIMIT=30Gi"]);
    assert!(!ok);
    assert!(
        err.contains("NVIDIA_GPU_MEMORY_LIMIT=\"30Gi\"") && err.contains("MiB"),
        "{err}"
    );
    let (ok, err) = run_hook(&dir, &paths, "a", "GPU-nope", &["NVIDIA_GPU_MEMORY_LIMIT=1"]);
    assert!(!ok);
    assert!(err.contains("GPU-nope"), "{err}");
    assert!(
        state::read(&paths).unwrap().caps.is_empty(),
        "no cap from a failed hook"
    );
}

#[test]
fn the_version_is_reported_as_nvidia_ctk_does_and_can_be_set() {
    let run = |v: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_sim-nvidia-ctk"));
        c.arg("--version").env_remove("GPU_TENANCY_SIM_CTK_VERSION");
        if let Some(v) = v {
            c.env("GPU_TENANCY_SIM_CTK_VERSION", v);
        }
        String::from_utf8(c.output().unwrap().stdout).unwrap()
    };
    assert!(run(None).starts_with("NVIDIA Container Toolkit CLI version 1.20.1\n"));
    assert!(run(Some("1.17.4")).starts_with("NVIDIA Container Toolkit CLI version 1.17.4\n"));
}
