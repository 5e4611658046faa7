//! Memory used against the driver's cap, per GPU and tenant, for MPS and time-slicing shares the
//! DRA mode prepared with a cap (docs/operations/metrics.md#memory-caps).
//!
//! The cap is what the agent handed the container runtime: in each prepared claim's CDI spec, a
//! device whose edits carry the toolkit's `apply-cuda-memory-limits` hook (its `--gpu-id` the
//! GPU) and `NVIDIA_GPU_MEMORY_LIMIT` (MiB). Reading it back from the spec written, not from the
//! rule that produced it, keeps the metric true to what the driver was told. The use is NVML's
//! per-process memory on that GPU, of the processes whose pod is in one of the tenant's
//! namespaces ([`crate::agent::attribution`]); a process of no known tenant counts for none.
//!
//! One row per (GPU, tenant): the driver caps each container, but a process is attributed to a
//! tenant, not to a container, so a tenant's several capped containers on one GPU add up, and
//! the row reaches its cap only when they all do.

use super::{AgentMetrics, Labels, MIB};
use crate::agent::dra::checkpoint::Checkpoint;
use crate::api::GpuNodeStatus;
use std::collections::{BTreeMap, BTreeSet};

/// The environment variable the toolkit's hook caps a container's memory by (whole MiB).
const LIMIT_ENV: &str = "NVIDIA_GPU_MEMORY_LIMIT";
/// The toolkit's hook that sets the cap.
const CAP_HOOK: &str = "apply-cuda-memory-limits";

/// One capped device of a prepared claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShareCap {
    pub gpu_uuid: String,
    pub tenant: String,
    pub limit_mib: u64,
}

/// The caps the prepared claims' CDI specs set: a device with the hook and a limit. A device with
/// one but not the other, or a limit that is not a whole number, sets no cap the agent can
/// state, and gets no row (the driver refuses such a container: it does not run).
pub fn caps_of(cp: &Checkpoint) -> Vec<ShareCap> {
    let mut out = Vec::new();
    for claim in cp.claims.values() {
        let devices = claim.cdi_spec["devices"].as_array().map_or(&[][..], Vec::as_slice);
        let spec_env = &claim.cdi_spec["containerEdits"]["env"];
        for d in devices {
            let edits = &d["containerEdits"];
            // The device's own edits apply after the spec's, so its value wins.
            let limit = strings(spec_env)
                .chain(strings(&edits["env"]))
                .filter_map(|kv| kv.strip_prefix(LIMIT_ENV)?.strip_prefix('='))
                .map(str::parse::<u64>)
                .next_back();
            let uuid = edits["hooks"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|h| h["hookName"] == "createRuntime")
                .find_map(|h| {
                    let args: Vec<&str> = strings(&h["args"]).collect();
                    let i = args.iter().position(|a| *a == "--gpu-id")?;
                    args.contains(&CAP_HOOK).then(|| args.get(i + 1).copied())?
                });
            if let (Some(Ok(limit_mib)), Some(uuid)) = (limit, uuid) {
                out.push(ShareCap {
                    gpu_uuid: uuid.to_string(),
                    tenant: claim.tenant.clone(),
                    limit_mib,
                });
            }
        }
    }
    out
}

/// Keeps `m`'s caps those of the DRA mode's checkpoint as last saved, until the checkpoint's
/// sender is gone.
pub async fn follow_caps(mut saved: tokio::sync::watch::Receiver<Checkpoint>, m: std::sync::Arc<AgentMetrics>) {
    loop {
        let caps = caps_of(&saved.borrow_and_update());
        m.share_caps(caps);
        if saved.changed().await.is_err() {
            return;
        }
    }
}

fn strings(v: &serde_json::Value) -> impl DoubleEndedIterator<Item = &str> {
    v.as_array().into_iter().flatten().filter_map(|s| s.as_str())
}

/// One row: a tenant's memory on a GPU against the sum of its caps there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShareMemory {
    pub gpu: u32,
    pub uuid: String,
    pub tenant: String,
    pub used_mib: u64,
    pub cap_mib: u64,
}

/// The PIDs whose tenant [`rows`] needs: the processes on GPUs with a cap.
pub fn capped_pids(status: &GpuNodeStatus, caps: &[ShareCap]) -> BTreeSet<u32> {
    status
        .gpus
        .iter()
        .filter(|g| caps.iter().any(|c| c.gpu_uuid == g.uuid))
        .flat_map(|g| g.processes.iter().map(|p| p.pid))
        .collect()
}

/// The rows, sorted by GPU and tenant; a cap on a GPU the node did not report has none. Pure.
pub fn rows(status: &GpuNodeStatus, caps: &[ShareCap], tenant_of: &BTreeMap<u32, Option<String>>) -> Vec<ShareMemory> {
    let mut by: BTreeMap<(u32, String), ShareMemory> = BTreeMap::new();
    for c in caps {
        let Some(g) = status.gpus.iter().find(|g| g.uuid == c.gpu_uuid) else {
            continue;
        };
        let row = by.entry((g.index, c.tenant.clone())).or_insert_with(|| ShareMemory {
            gpu: g.index,
            uuid: g.uuid.clone(),
            tenant: c.tenant.clone(),
            used_mib: g
                .processes
                .iter()
                .filter(|p| tenant_of.get(&p.pid).and_then(Option::as_deref) == Some(c.tenant.as_str()))
                .map(|p| p.used_memory_mib.unwrap_or(0))
                .sum(),
            cap_mib: 0,
        });
        row.cap_mib += c.limit_mib;
    }
    by.into_values().collect()
}

impl AgentMetrics {
    /// Replaces the prepared claims' caps (the DRA mode's checkpoint as last saved).
    pub fn share_caps(&self, caps: Vec<ShareCap>) {
        self.lock().caps = caps;
    }

    /// The caps as last set.
    pub fn caps(&self) -> Vec<ShareCap> {
        self.lock().caps.clone()
    }

    /// Replaces the share-memory rows: a share released leaves no series behind.
    pub fn share_memory(&self, rows: &[ShareMemory]) {
        let _held = self.lock();
        self.f.share_memory_used.clear();
        self.f.share_memory_cap.clear();
        for r in rows {
            let labels: Labels = vec![
                ("Hostname", self.node.clone()),
                ("gpu", r.gpu.to_string()),
                ("UUID", r.uuid.clone()),
                ("tenant", r.tenant.clone()),
            ];
            self.f
                .share_memory_used
                .get_or_create(&labels)
                .set(r.used_mib as f64 * MIB);
            self.f
                .share_memory_cap
                .get_or_create(&labels)
                .set(r.cap_mib as f64 * MIB);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::dra::checkpoint::PreparedClaim;
    use crate::api::{GpuStatus, ProcessStatus};
    use crate::runtime::http::Exposition;
    use serde_json::json;

    /// A CDI device with `env` and one createRuntime hook with `args`.
    fn device(env: &[&str], args: &[&str]) -> serde_json::Value {
        json!({"name": "d", "containerEdits": {"env": env, "hooks": [
            {"hookName": "createRuntime", "path": "/usr/bin/nvidia-ctk", "args": args}
        ]}})
    }

    fn hook(uuid: &str) -> Vec<&str> {
        vec![
            "nvidia-ctk",
            "hook",
            "apply-cuda-memory-limits",
            "--driver-root",
            "/",
            "--gpu-id",
            uuid,
        ]
    }

    fn checkpoint(claims: &[(&str, Vec<serde_json::Value>)]) -> Checkpoint {
        let mut cp = Checkpoint::default();
        for (i, (tenant, devices)) in claims.iter().enumerate() {
            cp.claims.insert(
                format!("uid-{i}"),
                PreparedClaim {
                    namespace: "ns".into(),
                    name: format!("c{i}"),
                    tenant: tenant.to_string(),
                    devices: vec![],
                    cdi_spec: json!({"cdiVersion": "0.6.0", "kind": "k", "devices": devices}),
                },
            );
        }
        cp
    }

    #[test]
    fn caps_are_read_from_the_specs_written_and_only_whole() {
        let cp = checkpoint(&[
            (
                "a",
                vec![
                    device(&["X=1", "NVIDIA_GPU_MEMORY_LIMIT=30720"], &hook("GPU-x")),
                    // A limit without the hook, the hook without a limit, a limit not in MiB,
                    // another hook: no cap the agent can state.
                    device(
                        &["NVIDIA_GPU_MEMORY_LIMIT=5"],
                        &["nvidia-ctk", "hook", "update-ldcache"],
                    ),
                    device(&["X=1"], &hook("GPU-x")),
                    device(&["NVIDIA_GPU_MEMORY_LIMIT=10G"], &hook("GPU-x")),
                ],
            ),
            ("b", vec![device(&["NVIDIA_GPU_MEMORY_LIMIT=10240"], &hook("GPU-x"))]),
        ]);
        let cap = |tenant: &str, limit_mib| ShareCap {
            gpu_uuid: "GPU-x".into(),
            tenant: tenant.into(),
            limit_mib,
        };
        assert_eq!(caps_of(&cp), vec![cap("a", 30720), cap("b", 10240)]);
        // A limit the spec sets for all its devices counts; a device's own one wins over it.
        let mut cp = checkpoint(&[
            ("c", vec![device(&[], &hook("GPU-x"))]),
            ("d", vec![device(&["NVIDIA_GPU_MEMORY_LIMIT=7"], &hook("GPU-x"))]),
        ]);
        for claim in cp.claims.values_mut() {
            claim.cdi_spec["containerEdits"] = json!({"env": ["NVIDIA_GPU_MEMORY_LIMIT=512"]});
        }
        assert_eq!(caps_of(&cp), vec![cap("c", 512), cap("d", 7)]);
        assert_eq!(caps_of(&Checkpoint::default()), vec![]);
    }

    /// GPU 0 (GPU-x, 40 GiB): pids 1-4 with 20480, 10240, 500 and 100 MiB; GPU 1 (GPU-y): pid 5.
    fn two_gpus() -> GpuNodeStatus {
        let process = |pid, mib| ProcessStatus {
            pid,
            used_memory_mib: Some(mib),
            ..Default::default()
        };
        GpuNodeStatus {
            gpus: vec![
                GpuStatus {
                    index: 0,
                    uuid: "GPU-x".into(),
                    memory_mib: 40960,
                    processes: vec![process(1, 20480), process(2, 10240), process(3, 500), process(4, 100)],
                    ..Default::default()
                },
                GpuStatus {
                    index: 1,
                    uuid: "GPU-y".into(),
                    processes: vec![process(5, 7)],
                    ..Default::default()
                },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn a_tenants_processes_count_against_its_caps_on_their_gpu() {
        let status = two_gpus();
        let caps = vec![
            ShareCap {
                gpu_uuid: "GPU-x".into(),
                tenant: "a".into(),
                limit_mib: 20480,
            },
            ShareCap {
                gpu_uuid: "GPU-x".into(),
                tenant: "a".into(),
                limit_mib: 10240,
            },
            ShareCap {
                gpu_uuid: "GPU-x".into(),
                tenant: "b".into(),
                limit_mib: 10240,
            },
            ShareCap {
                gpu_uuid: "GPU-gone".into(),
                tenant: "b".into(),
                limit_mib: 1,
            },
        ];
        assert_eq!(capped_pids(&status, &caps), BTreeSet::from([1, 2, 3, 4]));
        // 3 is of no known tenant, 4 of a tenant with no cap here.
        let tenant_of = BTreeMap::from([
            (1, Some("a".to_string())),
            (2, Some("b".to_string())),
            (3, None),
            (4, Some("c".to_string())),
        ]);
        let row = |tenant: &str, used_mib, cap_mib| ShareMemory {
            gpu: 0,
            uuid: "GPU-x".into(),
            tenant: tenant.into(),
            used_mib,
            cap_mib,
        };
        let got = rows(&status, &caps, &tenant_of);
        assert_eq!(got, vec![row("a", 20480, 30720), row("b", 10240, 10240)]);

        let m = AgentMetrics::new("n1");
        m.share_memory(&got);
        let text = m.encode();
        let mut lines: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("gpu_tenancy_share_memory"))
            .collect();
        lines.sort();
        assert_eq!(
            lines,
            vec![
                r#"gpu_tenancy_share_memory_cap_bytes{Hostname="n1",gpu="0",UUID="GPU-x",tenant="a"} 32212254720.0"#,
                r#"gpu_tenancy_share_memory_cap_bytes{Hostname="n1",gpu="0",UUID="GPU-x",tenant="b"} 10737418240.0"#,
                r#"gpu_tenancy_share_memory_used_bytes{Hostname="n1",gpu="0",UUID="GPU-x",tenant="a"} 21474836480.0"#,
                r#"gpu_tenancy_share_memory_used_bytes{Hostname="n1",gpu="0",UUID="GPU-x",tenant="b"} 10737418240.0"#,
            ]
        );
        m.share_memory(&[]);
        assert!(
            !m.encode().contains("gpu_tenancy_share_memory_used_bytes{"),
            "released shares leave no rows"
        );
    }
}
