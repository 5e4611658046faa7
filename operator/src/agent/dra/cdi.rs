//! One transient CDI spec per prepared claim (Container Device Interface, the lowest version
//! that expresses it, [`cdi_version`]): a
//! device per allocated device, whose container edits give the container that device and no
//! other. The kubelet passes the returned CDI device IDs to the runtime, which applies the edits.
//!
//! - device nodes: the GPU's `/dev/nvidia<minor>` and the driver's control nodes; for a MIG
//!   instance also its GPU instance's and compute instance's capability nodes
//!   (`/dev/nvidia-caps/nvidia-cap<N>`, their minors from the driver's `mig-minors` file);
//! - env: `NVIDIA_VISIBLE_DEVICES` with the device's UUID (NVIDIA's hooks and CUDA then see it
//!   alone), the tenant and device for the workload to log;
//! - MPS: the agent's MPS pipe directory mounted and `CUDA_MPS_PIPE_DIRECTORY` pointing at it, with
//!   the plan's thread percentage and pinned memory limit as the client's own defaults
//!   (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`: a process may change
//!   its own environment, so these are not what binds; the daemon's own limit is);
//! - memory cap: a share the driver caps ([`MemoryCapMethod::Driver`]) gets
//!   `NVIDIA_GPU_MEMORY_REQUEST` and `NVIDIA_GPU_MEMORY_LIMIT` (whole MiB) and the container
//!   toolkit's `createRuntime` hook `nvidia-ctk hook apply-cuda-memory-limits --driver-root <root>
//!   --gpu-id <UUID>`, which reads them from the container's OCI spec (its environment at create
//!   time, before any process runs) and caps the container's memory on that GPU through NVML
//!   ([`claim_cap_mib`] says which value; docs/concepts/isolation.md#memory-limits). A CDI env
//!   edit replaces a variable of the same name the pod sets, so a pod cannot raise its own cap.
//!
//! Driver libraries are NVIDIA's to inject: with `--nvidia-cdi-kind` (default `nvidia.com/gpu`, what
//! `nvidia-ctk cdi generate --device-name-strategy=uuid` and the GPU Operator write) Prepare also
//! returns NVIDIA's own CDI device of the same UUID.

use super::devices::{DraDevice, Unit};
use crate::api::{MemoryCapMethod, Mode};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The lowest CDI version that expresses a spec of `devices`, the one it names: a runtime refuses
/// a spec whose version its CDI library does not know (containerd 1.7 to 2.2.0 refuse 1.1.0). A
/// device name that starts with a digit (a claim's UID may) needs 0.5.0; device nodes by path,
/// env, mounts with options and hooks (`createRuntime` among them) are 0.3.0's.
pub fn cdi_version<'a>(mut names: impl Iterator<Item = &'a str>) -> &'static str {
    if names.any(|n| n.starts_with(|c: char| c.is_ascii_digit())) {
        "0.5.0"
    } else {
        "0.3.0"
    }
}

/// The CDI vendor and class of this driver's devices (`gputenancy.io/gpu=<claim>-<device>`).
pub const KIND: &str = "gputenancy.io/gpu";
/// Where an MPS client finds the daemon's pipes inside the container.
pub const MPS_PIPE_IN_CONTAINER: &str = "/run/gpu-tenancy/mps";

/// What the node's devices need beyond the device itself.
#[derive(Clone, Debug)]
pub struct CdiContext {
    /// The directory of transient specs (`/var/run/cdi`).
    pub dir: PathBuf,
    /// The host's MPS pipe directory (the agent's daemon), for MPS shares.
    pub mps_pipe_dir: Option<PathBuf>,
    /// `gpu<minor>/gi<id>/access` and `gpu<minor>/gi<id>/ci<id>/access` -> capability minor.
    pub mig_minors: BTreeMap<String, u32>,
    /// NVIDIA's CDI kind whose devices are named by UUID, appended to each device's IDs.
    pub nvidia_kind: Option<String>,
    /// The container toolkit's `nvidia-ctk` as the runtime finds it (the memory cap's hook).
    pub nvidia_ctk: PathBuf,
    /// The driver's root as the runtime sees it (`--driver-root` of the hook).
    pub driver_root: PathBuf,
}

/// The toolkit's CLI where NVIDIA's packages install it.
pub const DEFAULT_NVIDIA_CTK: &str = "/usr/bin/nvidia-ctk";

impl Default for CdiContext {
    fn default() -> Self {
        CdiContext {
            dir: PathBuf::new(),
            mps_pipe_dir: None,
            mig_minors: BTreeMap::new(),
            nvidia_kind: None,
            nvidia_ctk: DEFAULT_NVIDIA_CTK.into(),
            driver_root: "/".into(),
        }
    }
}

/// The driver's `mig-minors` file (`/proc/driver/nvidia-caps/mig-minors`): one `name minor` a line.
pub fn parse_mig_minors(text: &str) -> BTreeMap<String, u32> {
    text.lines()
        .filter_map(|l| {
            let (name, minor) = l.split_once(' ')?;
            Some((name.trim().to_string(), minor.trim().parse().ok()?))
        })
        .collect()
}

/// Why a device cannot be described.
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    #[error("device {device}: its GPU's minor number is not known, so its device node cannot be named")]
    NoMinor { device: String },
    #[error(
        "device {device}: no capability minor for {cap} in the driver's mig-minors file; is this node's driver the one that created the instance?"
    )]
    NoCapability { device: String, cap: String },
    #[error("device {device} is an MPS share, but the agent runs no MPS daemon (--mps-pipe-dir)")]
    NoMpsDaemon { device: String },
    #[error("writing the CDI spec {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
}

/// The CDI device name of `device` in `claim`'s spec.
pub fn device_id(claim: &str, device: &str) -> String {
    format!("{KIND}={claim}-{device}")
}

/// The path of `claim`'s spec.
pub fn spec_path(dir: &Path, claim: &str) -> PathBuf {
    dir.join(format!("gputenancy.io-gpu_{claim}.json"))
}

/// The memory cap of a claim's container on each GPU the driver caps, in MiB: the environment is
/// the container's, one value for all its GPUs, while the hook is per GPU. So the value is the
/// claim's memory on one GPU (the sum of its shares there), and where the claim has shares on
/// several GPUs, the smallest of those sums: no GPU's cap is ever above what the claim holds on
/// it (fail closed: a claim holding more on another GPU is capped lower there). `None` where the
/// driver caps none of its devices. A container given two claims of different caps is refused at
/// Prepare ([`super::container_caps`]): it would get one of the two values on every GPU.
pub fn claim_cap_mib(devices: &[(&DraDevice, &str)]) -> Option<u64> {
    let mut per_gpu: BTreeMap<&str, u64> = BTreeMap::new();
    for (d, uuid) in devices {
        if d.memory_cap == Some(MemoryCapMethod::Driver) {
            *per_gpu.entry(uuid).or_default() += d.memory_mib;
        }
    }
    per_gpu.into_values().min()
}

/// The `createRuntime` hook that caps the container's memory on GPU `uuid`, as NVIDIA's own
/// generated specs write it.
fn memory_cap_hook(ctx: &CdiContext, uuid: &str) -> Value {
    json!({
        "hookName": "createRuntime",
        "path": ctx.nvidia_ctk,
        "args": ["nvidia-ctk", "hook", "apply-cuda-memory-limits", "--driver-root", ctx.driver_root, "--gpu-id", uuid],
    })
}

fn edits(ctx: &CdiContext, d: &DraDevice, uuid: &str, tenant: &str) -> Result<Value, CdiError> {
    let minor = d.minor.ok_or_else(|| CdiError::NoMinor { device: d.name.clone() })?;
    let mut nodes: Vec<String> = vec![
        format!("/dev/nvidia{minor}"),
        "/dev/nvidiactl".into(),
        "/dev/nvidia-uvm".into(),
        "/dev/nvidia-uvm-tools".into(),
    ];
    if let (Unit::Instance(_), Some((gi, ci))) = (&d.unit, d.instance_ids) {
        for cap in [
            format!("gpu{minor}/gi{gi}/access"),
            format!("gpu{minor}/gi{gi}/ci{ci}/access"),
        ] {
            let n = ctx.mig_minors.get(&cap).ok_or_else(|| CdiError::NoCapability {
                device: d.name.clone(),
                cap: cap.clone(),
            })?;
            nodes.push(format!("/dev/nvidia-caps/nvidia-cap{n}"));
        }
    }
    let mut env = vec![
        format!("NVIDIA_VISIBLE_DEVICES={uuid}"),
        format!("GPU_TENANCY_TENANT={tenant}"),
        format!("GPU_TENANCY_DEVICE={}", d.name),
    ];
    let mut mounts = Vec::new();
    if d.mode == Mode::Mps {
        let pipe = ctx
            .mps_pipe_dir
            .as_ref()
            .ok_or_else(|| CdiError::NoMpsDaemon { device: d.name.clone() })?;
        let mps = d.mps.clone().unwrap_or_default();
        let clients = mps.max_clients.max(1);
        let threads = mps.active_thread_percentage.unwrap_or(100 / clients);
        env.push(format!("CUDA_MPS_PIPE_DIRECTORY={MPS_PIPE_IN_CONTAINER}"));
        env.push(format!("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={threads}"));
        // Device 0: the one device the client sees. Its share of the GPU's memory, as the plan says.
        env.push(format!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={}M", d.memory_mib));
        mounts.push(json!({"hostPath": pipe, "containerPath": MPS_PIPE_IN_CONTAINER, "options": ["rbind", "rw"]}));
    }
    let mut e = json!({
        "env": env,
        "deviceNodes": nodes.iter().map(|p| json!({"path": p})).collect::<Vec<_>>(),
    });
    if !mounts.is_empty() {
        e["mounts"] = Value::Array(mounts);
    }
    Ok(e)
}

/// The spec of `claim` for its `devices` (device, its UUID), and the CDI device IDs per device.
pub fn spec(
    ctx: &CdiContext,
    claim: &str,
    tenant: &str,
    devices: &[(&DraDevice, &str)],
) -> Result<(Value, Vec<Vec<String>>), CdiError> {
    let mut out = Vec::new();
    let mut ids = Vec::new();
    let cap = claim_cap_mib(devices);
    let mut hooked = std::collections::BTreeSet::new();
    for (d, uuid) in devices {
        let mut e = edits(ctx, d, uuid, tenant)?;
        if let (Some(mib), Some(MemoryCapMethod::Driver)) = (cap, d.memory_cap) {
            if let Some(env) = e["env"].as_array_mut() {
                env.push(json!(format!("NVIDIA_GPU_MEMORY_REQUEST={mib}")));
                env.push(json!(format!("NVIDIA_GPU_MEMORY_LIMIT={mib}")));
            }
            // One hook per GPU, as NVIDIA's specs have it: the runtime runs every device's hooks.
            if hooked.insert(*uuid) {
                e["hooks"] = json!([memory_cap_hook(ctx, uuid)]);
            }
        }
        out.push(json!({"name": format!("{claim}-{}", d.name), "containerEdits": e}));
        let mut these = vec![device_id(claim, &d.name)];
        if let Some(kind) = &ctx.nvidia_kind {
            these.push(format!("{kind}={uuid}"));
        }
        ids.push(these);
    }
    let version = cdi_version(out.iter().filter_map(|d| d["name"].as_str()));
    Ok((json!({"cdiVersion": version, "kind": KIND, "devices": out}), ids))
}

/// Writes `spec` for `claim`, atomically (a runtime reading the directory sees it whole or not),
/// readable by the runtime and writable by the agent alone.
pub fn write(dir: &Path, claim: &str, spec: &Value) -> Result<(), CdiError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = spec_path(dir, claim);
    let err = |source| CdiError::Write {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(err)?;
    let tmp = dir.join(format!(".gputenancy.io-gpu_{claim}.json.tmp"));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&tmp)
        .map_err(err)?;
    f.write_all(&serde_json::to_vec_pretty(spec).expect("a CDI spec serialises"))
        .map_err(err)?;
    f.sync_all().map_err(err)?;
    std::fs::rename(&tmp, &path).map_err(err)
}

/// Whether `claim`'s spec on disk is `spec` as this agent wrote it: its bytes, its owner (the
/// agent's user) and a mode that lets no one else write it. A runtime applies whatever the file
/// says, so a spec changed behind the agent's back would hand a container other devices.
pub fn intact(dir: &Path, claim: &str, spec: &Value) -> Result<(), NotIntact> {
    let path = spec_path(dir, claim);
    let meta = match std::fs::symlink_metadata(&path) {
        Ok(meta) => meta,
        Err(source) => return Err(NotIntact::Unreadable { path, source }),
    };
    if !meta.file_type().is_file() {
        return Err(NotIntact::NotAFile { path });
    }
    if let Err(why) = super::checkpoint::owned_by_us(&meta, false) {
        return Err(NotIntact::NotOurs { path, why });
    }
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(source) => return Err(NotIntact::Unreadable { path, source }),
    };
    if bytes != serde_json::to_vec_pretty(spec).expect("a CDI spec serialises") {
        return Err(NotIntact::Differs { path });
    }
    Ok(())
}

/// Why a claim's CDI spec on disk is not the one the agent wrote.
#[derive(Debug, thiserror::Error)]
pub enum NotIntact {
    #[error("{}: {source}", path.display())]
    Unreadable { path: PathBuf, source: std::io::Error },
    #[error("{} is not a plain file", path.display())]
    NotAFile { path: PathBuf },
    #[error("{}: {why}", path.display())]
    NotOurs {
        path: PathBuf,
        why: super::checkpoint::NotOurs,
    },
    #[error("{} differs from the spec the agent wrote", path.display())]
    Differs { path: PathBuf },
}

/// Writes `claim`'s spec again unless it is [`intact`]; says why it was rewritten.
pub fn restore(dir: &Path, claim: &str, spec: &Value) -> Result<Option<NotIntact>, CdiError> {
    match intact(dir, claim, spec) {
        Ok(()) => Ok(None),
        Err(why) => {
            let path = spec_path(dir, claim);
            if std::fs::symlink_metadata(&path).is_ok_and(|m| !m.file_type().is_file()) {
                std::fs::remove_file(&path).map_err(|source| CdiError::Write { path, source })?;
            }
            write(dir, claim, spec)?;
            Ok(Some(why))
        }
    }
}

/// Removes `claim`'s spec; one already gone is fine (Unprepare is idempotent).
pub fn remove(dir: &Path, claim: &str) -> Result<(), CdiError> {
    let path = spec_path(dir, claim);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(CdiError::Write { path, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{MpsSettings, Placement, ScrubMemory};

    fn dev(unit: Unit, mode: Mode) -> DraDevice {
        DraDevice {
            name: "gpu-0-mig-0-4".into(),
            gpu: 0,
            unit,
            mode,
            tenant: Some("a".into()),
            profile: None,
            uuid: Some("MIG-1".into()),
            parent_uuid: Some("GPU-0".into()),
            product_name: String::new(),
            numa_node: None,
            memory_mib: 20389,
            mps: Some(MpsSettings {
                max_clients: 4,
                active_thread_percentage: None,
                pinned_memory_limit: None,
            }),
            memory_cap: None,
            scrub: ScrubMemory::OnTenantChange,
            not_ready: None,
            unhealthy: None,
            minor: Some(3),
            instance_ids: Some((2, 0)),
        }
    }

    #[test]
    fn a_mig_device_gets_its_capabilities_and_an_mps_share_its_limits() {
        let ctx = CdiContext {
            dir: "/var/run/cdi".into(),
            mps_pipe_dir: Some("/run/gpu-tenancy/mps/pipe".into()),
            mig_minors: parse_mig_minors("config 1\nmonitor 2\ngpu3/gi2/access 30\ngpu3/gi2/ci0/access 31\n"),
            nvidia_kind: Some("nvidia.com/gpu".into()),
            ..CdiContext::default()
        };
        let mig = dev(Unit::Instance(Placement { start: 0, size: 4 }), Mode::Mig);
        let (spec, ids) = spec(&ctx, "uid1", "a", &[(&mig, "MIG-1")]).unwrap();
        assert_eq!(ids, [["gputenancy.io/gpu=uid1-gpu-0-mig-0-4", "nvidia.com/gpu=MIG-1"]]);
        // The lowest version that expresses it: 0.5.0 only for a name that starts with a digit.
        assert_eq!(spec["cdiVersion"], "0.3.0");
        let (digit, _) = super::spec(&ctx, "4ea1", "a", &[(&mig, "MIG-1")]).unwrap();
        assert_eq!(digit["cdiVersion"], "0.5.0");
        let nodes: Vec<&str> = spec["devices"][0]["containerEdits"]["deviceNodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["path"].as_str().unwrap())
            .collect();
        assert_eq!(
            nodes,
            [
                "/dev/nvidia3",
                "/dev/nvidiactl",
                "/dev/nvidia-uvm",
                "/dev/nvidia-uvm-tools",
                "/dev/nvidia-caps/nvidia-cap30",
                "/dev/nvidia-caps/nvidia-cap31"
            ]
        );
        let share = dev(Unit::Share { k: 0 }, Mode::Mps);
        let (spec, _) = super::spec(&ctx, "uid2", "a", &[(&share, "GPU-0")]).unwrap();
        let env = spec["devices"][0]["containerEdits"]["env"].as_array().unwrap().clone();
        assert!(env.contains(&json!("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25")));
        assert!(env.contains(&json!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20389M")));
        assert!(env.contains(&json!("NVIDIA_VISIBLE_DEVICES=GPU-0")));
        // Changed behind the agent's back: found, and written again as it was.
        let dir = std::env::temp_dir().join(format!("gt-cdi-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        write(&dir, "uid2", &spec).unwrap();
        assert!(restore(&dir, "uid2", &spec).unwrap().is_none());
        let forged = std::fs::read_to_string(spec_path(&dir, "uid2"))
            .unwrap()
            .replace("NVIDIA_VISIBLE_DEVICES=GPU-0", "NVIDIA_VISIBLE_DEVICES=all");
        std::fs::write(spec_path(&dir, "uid2"), forged).unwrap();
        assert!(intact(&dir, "uid2", &spec).is_err());
        assert!(restore(&dir, "uid2", &spec).unwrap().is_some());
        intact(&dir, "uid2", &spec).unwrap();
        std::fs::remove_file(spec_path(&dir, "uid2")).unwrap();
        assert!(restore(&dir, "uid2", &spec).unwrap().is_some());
        intact(&dir, "uid2", &spec).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let no_caps = CdiContext::default();
        assert!(matches!(
            super::spec(&no_caps, "u", "a", &[(&mig, "MIG-1")]),
            Err(CdiError::NoCapability { .. })
        ));
    }

    /// A share of `gpu` with `mib` of memory, capped by `cap`.
    fn share(gpu: u32, mode: Mode, mib: u64, cap: MemoryCapMethod) -> DraDevice {
        DraDevice {
            name: format!("gpu-{gpu}-share-{mib}"),
            gpu,
            unit: Unit::Share { k: 0 },
            memory_mib: mib,
            memory_cap: Some(cap),
            instance_ids: None,
            ..dev(Unit::Share { k: 0 }, mode)
        }
    }

    fn env_of(spec: &Value, i: usize) -> Vec<String> {
        spec["devices"][i]["containerEdits"]["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e.as_str().unwrap().to_string())
            .collect()
    }

    fn caps_of(spec: &Value, i: usize) -> Vec<String> {
        env_of(spec, i)
            .into_iter()
            .filter(|e| e.starts_with("NVIDIA_GPU_MEMORY_"))
            .collect()
    }

    /// A claim's shares the driver caps carry the toolkit's hook, one per GPU with NVIDIA's
    /// arguments, and the same cap on every device: the claim's memory on its GPU, or the
    /// smallest of its GPUs' where it spans several. Values by hand: 2 x 20389 = 40778 on GPU-1;
    /// 11651 on GPU-2 is smaller.
    #[test]
    fn a_driver_capped_claim_carries_the_hook_and_one_cap() {
        let ctx = CdiContext {
            mps_pipe_dir: Some("/run/gpu-tenancy/mps/pipe".into()),
            nvidia_ctk: "/opt/nvidia/bin/nvidia-ctk".into(),
            driver_root: "/run/nvidia/driver".into(),
            ..CdiContext::default()
        };
        let (a, b) = (
            share(1, Mode::Mps, 20389, MemoryCapMethod::Driver),
            DraDevice {
                name: "second".into(),
                ..share(1, Mode::Mps, 20389, MemoryCapMethod::Driver)
            },
        );
        let (spec, _) = super::spec(&ctx, "uid1", "a", &[(&a, "GPU-1"), (&b, "GPU-1")]).unwrap();
        assert_eq!(spec["cdiVersion"], "0.3.0");
        for i in 0..2 {
            assert_eq!(
                caps_of(&spec, i),
                ["NVIDIA_GPU_MEMORY_REQUEST=40778", "NVIDIA_GPU_MEMORY_LIMIT=40778"]
            );
        }
        assert_eq!(
            spec["devices"][0]["containerEdits"]["hooks"],
            json!([{
                "hookName": "createRuntime",
                "path": "/opt/nvidia/bin/nvidia-ctk",
                "args": ["nvidia-ctk", "hook", "apply-cuda-memory-limits", "--driver-root", "/run/nvidia/driver", "--gpu-id", "GPU-1"],
            }])
        );
        // One hook per GPU: the second share of GPU-1 adds none.
        assert!(spec["devices"][1]["containerEdits"].get("hooks").is_none());

        let ts = share(2, Mode::TimeSlicing, 11651, MemoryCapMethod::Driver);
        let (spec, _) = super::spec(&ctx, "uid2", "a", &[(&a, "GPU-1"), (&b, "GPU-1"), (&ts, "GPU-2")]).unwrap();
        for i in 0..3 {
            assert_eq!(
                caps_of(&spec, i),
                ["NVIDIA_GPU_MEMORY_REQUEST=11651", "NVIDIA_GPU_MEMORY_LIMIT=11651"]
            );
        }
        assert_eq!(spec["devices"][2]["containerEdits"]["hooks"][0]["args"][6], "GPU-2");
        assert_eq!(
            claim_cap_mib(&[(&a, "GPU-1"), (&b, "GPU-1"), (&ts, "GPU-2")]),
            Some(11651)
        );
    }

    /// Defaults are NVIDIA's paths; a share its MPS daemon caps, or nothing caps, carries no
    /// hook and no cap variables; a whole device beside a capped share adds nothing to the value.
    #[test]
    fn only_the_driver_method_gets_the_hook() {
        let ctx = CdiContext {
            mps_pipe_dir: Some("/pipe".into()),
            ..CdiContext::default()
        };
        let daemon = share(1, Mode::Mps, 20389, MemoryCapMethod::MpsDaemon);
        let none = share(2, Mode::TimeSlicing, 11651, MemoryCapMethod::None);
        let (spec, _) = super::spec(&ctx, "uid", "a", &[(&daemon, "GPU-1"), (&none, "GPU-2")]).unwrap();
        for i in 0..2 {
            assert!(caps_of(&spec, i).is_empty());
            assert!(spec["devices"][i]["containerEdits"].get("hooks").is_none());
        }
        // The MPS daemon's client setting stays for the client; the daemon's own limit binds.
        assert!(env_of(&spec, 0).contains(&"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20389M".to_string()));
        let whole = DraDevice {
            unit: Unit::Gpu,
            memory_mib: 81559,
            memory_cap: None,
            ..dev(Unit::Gpu, Mode::Exclusive)
        };
        let ts = share(2, Mode::TimeSlicing, 11651, MemoryCapMethod::Driver);
        let (spec, _) = super::spec(&ctx, "uid", "a", &[(&whole, "GPU-0"), (&ts, "GPU-2")]).unwrap();
        assert!(caps_of(&spec, 0).is_empty());
        assert_eq!(
            caps_of(&spec, 1),
            ["NVIDIA_GPU_MEMORY_REQUEST=11651", "NVIDIA_GPU_MEMORY_LIMIT=11651"]
        );
        assert_eq!(
            spec["devices"][1]["containerEdits"]["hooks"][0]["path"],
            "/usr/bin/nvidia-ctk"
        );
        assert_eq!(spec["devices"][1]["containerEdits"]["hooks"][0]["args"][4], "/");
    }
}
