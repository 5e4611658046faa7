//! Whose processes keep a shared GPU busy, and which namespaces hold a tenant's devices: the
//! agent's side of [`crate::attribution`].
//!
//! A PID's pod UID is read from `<proc root>/<pid>/cgroup` (`--proc-root`, `/proc` by default:
//! the DaemonSet runs in the host's PID namespace, since NVML names host PIDs). A UID's
//! namespace is that of the pod of this node with that UID, as the API server lists them
//! (`spec.nodeName` field selector; listed again only when a UID is not known, at most once a
//! pass); the kubelet's pod-resources answer names pods, not UIDs. A namespace's tenant is the
//! GpuTenant that alone lists it (a watch of GpuTenants). Each step fails closed: what cannot be
//! told is `None`, which the accounting calls [`crate::accounting::UNATTRIBUTED`].

use super::pod_resources::{DeviceId, Holdings};
use crate::accounting::{Busy, Holding};
use crate::api::{GpuNodeSpec, GpuNodeStatus, GpuTenant, Mode};
use crate::attribution::{self, Held};
use crate::gpu::Usage;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The default `--proc-root`.
pub const DEFAULT_PROC_ROOT: &str = "/proc";

/// The largest cgroup file read: a few lines per hierarchy (v1 has about a dozen).
const MAX_CGROUP_BYTES: u64 = 64 * 1024;

/// What the agent keeps to attribute processes and devices.
pub struct Attribution {
    proc_root: PathBuf,
    tenants: Store<GpuTenant>,
    /// Pod UID → namespace, this node's pods as last listed.
    pods: tokio::sync::Mutex<BTreeMap<String, String>>,
}

impl std::fmt::Debug for Attribution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attribution")
            .field("proc_root", &self.proc_root)
            .finish_non_exhaustive()
    }
}

impl Attribution {
    /// Reads processes' pods under `proc_root`, and namespaces' tenants from `tenants` (the
    /// agent's watch of GpuTenants, [`super::Watches`]).
    pub fn new(proc_root: PathBuf, tenants: Store<GpuTenant>) -> Attribution {
        Attribution {
            proc_root,
            tenants,
            pods: Default::default(),
        }
    }

    /// The tenant `namespace` belongs to (the rule admission binds namespaces by,
    /// [`crate::tenancy`]; exempt namespaces, which the agent does not know, list no valid tenant).
    pub fn owner(&self, namespace: &str) -> Option<String> {
        crate::tenancy::owner_of(&self.tenants.state(), namespace, &Default::default()).map(str::to_string)
    }

    /// Each of `pids`' tenant, `None` where it cannot be told.
    pub async fn tenants_of(&self, client: &Client, node: &str, pids: &BTreeSet<u32>) -> BTreeMap<u32, Option<String>> {
        let uids: BTreeMap<u32, Option<String>> = pids.iter().map(|&p| (p, pod_uid(&self.proc_root, p))).collect();
        let mut pods = self.pods.lock().await;
        let unknown = uids.values().flatten().any(|u| !pods.contains_key(u));
        if unknown {
            let api: Api<Pod> = Api::all(client.clone());
            match api
                .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
                .await
            {
                Ok(list) => {
                    *pods = list
                        .items
                        .iter()
                        .filter_map(|p| Some((p.uid()?, p.namespace()?)))
                        .collect();
                }
                // Kept as it was: known pods stay attributed, new ones are not (this pass).
                Err(e) => tracing::debug!(error = %e, "cannot list this node's pods to attribute GPU processes"),
            }
        }
        uids.into_iter()
            .map(|(pid, uid)| {
                let tenant = uid.and_then(|u| pods.get(&u).cloned()).and_then(|ns| self.owner(&ns));
                (pid, tenant)
            })
            .collect()
    }
}

/// The pod UID of process `pid`, from its cgroup file under `proc_root`; `None` when it is gone,
/// unreadable or not in a pod.
fn pod_uid(proc_root: &Path, pid: u32) -> Option<String> {
    use std::io::Read;
    let f = std::fs::File::open(proc_root.join(pid.to_string()).join("cgroup")).ok()?;
    let mut text = String::new();
    f.take(MAX_CGROUP_BYTES).read_to_string(&mut text).ok()?;
    attribution::pod_uid_from_cgroup(&text)
}

/// The PIDs whose tenants [`busy`] needs: those sampled on the GPUs it splits.
pub fn sampled_pids(spec: &GpuNodeSpec, status: &GpuNodeStatus, usage: &Usage) -> BTreeSet<u32> {
    let split = split_gpus(spec, status);
    usage
        .processes
        .iter()
        .filter(|(gpu, _)| split.contains(gpu))
        .flat_map(|(_, s)| s.iter().map(|s| s.pid))
        .collect()
}

/// The GPUs whose busy time is split by their processes: MPS and time-sliced GPUs whose shares
/// several tenants hold. A GPU one tenant holds keeps its busy time to that tenant, as a whole
/// GPU's: the device plugin hands its replicas to that tenant's pods only, and a process of
/// anyone else on it is what `UngrantedUse` reports.
fn split_gpus(spec: &GpuNodeSpec, status: &GpuNodeStatus) -> BTreeSet<u32> {
    let found: Vec<u32> = status.gpus.iter().map(|g| g.index).collect();
    let holdings = crate::accounting::holdings(spec, &found);
    spec.gpus
        .iter()
        .filter(|g| matches!(g.mode, Mode::Mps | Mode::TimeSlicing))
        .filter(|g| crate::accounting::gpu_tenant(&holdings, g.index) == crate::accounting::SHARED)
        .map(|g| g.index)
        .collect()
}

/// The accounting's view of a reading: the GPUs' and instances' utilization, instances by their
/// first memory slice (how the spec names them), and on MPS and time-sliced GPUs several tenants
/// share the split of the busy time between them by the processes' samples (`tenant_of` each
/// sampled PID's tenant). Pure.
pub fn busy(
    spec: &GpuNodeSpec,
    status: &GpuNodeStatus,
    usage: &Usage,
    tenant_of: &BTreeMap<u32, Option<String>>,
) -> Busy {
    let instances = usage
        .instances
        .iter()
        .filter_map(|(&(gpu, gi), &ratio)| {
            let g = status.gpus.iter().find(|g| g.index == gpu)?;
            let i = g.instances.iter().find(|i| i.gpu_instance_id == gi)?;
            Some(((gpu, i.placement.start), ratio))
        })
        .collect();
    let split_gpus = split_gpus(spec, status);
    let split = usage
        .processes
        .iter()
        .filter(|(gpu, _)| split_gpus.contains(gpu))
        .filter_map(|(&gpu, samples)| Some((gpu, attribution::split(samples, tenant_of)?)))
        .collect();
    Busy {
        gpus: usage.gpus.clone(),
        instances,
        split,
    }
}

/// The devices of this node's GPUs containers hold, with their namespaces, from the kubelet's
/// answer (a device of no GPU or instance the status knows is left out). Pure.
pub fn held(status: &GpuNodeStatus, holdings: &Holdings) -> Vec<Held> {
    let mut out = Vec::new();
    for (id, device) in &holdings.devices {
        let id = DeviceId::parse(id);
        let found = status.gpus.iter().find_map(|g| {
            if g.uuid == id.uuid {
                return Some((g.index, None));
            }
            let i = g.instances.iter().find(|i| i.uuid.as_deref() == Some(id.uuid))?;
            Some((g.index, Some(i.placement.start)))
        });
        let Some((gpu, instance)) = found else { continue };
        for h in &device.holders {
            out.push(Held {
                gpu,
                instance,
                replica: id.replica.is_some(),
                namespace: h.namespace.clone(),
            });
        }
    }
    out
}

/// Each tenant's namespaces' part of its holdings ([`attribution::namespace_holdings`]).
pub fn namespaces(
    spec: &GpuNodeSpec,
    holdings: &[Holding],
    status: &GpuNodeStatus,
    pod_holdings: Option<&Holdings>,
    owner: impl Fn(&str) -> Option<String>,
) -> BTreeMap<(String, String), f64> {
    match pod_holdings {
        Some(h) => attribution::namespace_holdings(spec, holdings, &held(status, h), owner),
        None => BTreeMap::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{GpuSpec, GpuStatus, MigInstanceStatus, MigModeStatus, Placement};
    use crate::attribution::ProcessSample;

    #[test]
    fn pod_uids_are_read_from_the_proc_root() {
        let dir = std::env::temp_dir().join(format!("gt-attribution-{}", std::process::id()));
        let uid = "0f5e6a1c-3b2d-4c8e-9a7b-1d2e3f4a5b6c";
        std::fs::create_dir_all(dir.join("42")).unwrap();
        std::fs::write(dir.join("42/cgroup"), format!("0::/kubepods/burstable/pod{uid}/abc\n")).unwrap();
        std::fs::create_dir_all(dir.join("43")).unwrap();
        std::fs::write(dir.join("43/cgroup"), "0::/system.slice/sshd.service\n").unwrap();
        assert_eq!(pod_uid(&dir, 42).as_deref(), Some(uid));
        assert_eq!(pod_uid(&dir, 43), None, "a host process");
        assert_eq!(pod_uid(&dir, 44), None, "gone");
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn status() -> GpuNodeStatus {
        GpuNodeStatus {
            gpus: vec![
                GpuStatus {
                    index: 0,
                    uuid: "GPU-0".into(),
                    ..Default::default()
                },
                GpuStatus {
                    index: 1,
                    uuid: "GPU-1".into(),
                    mig_mode: Some(MigModeStatus {
                        current: true,
                        pending: true,
                    }),
                    instances: vec![MigInstanceStatus {
                        gpu_instance_id: 2,
                        uuid: Some("MIG-1".into()),
                        profile: "3g.40gb".into(),
                        placement: Placement { start: 4, size: 4 },
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn instances_are_named_by_placement_and_only_shared_gpus_are_split() {
        let ts: GpuSpec = serde_json::from_value(serde_json::json!(
            {"index": 0, "mode": "TimeSlicing", "timeSlicing": {"replicas": 2}, "tenants": ["a", "b"]}
        ))
        .expect("a GPU spec");
        let mut spec = GpuNodeSpec {
            gpus: vec![ts].into(),
            ..Default::default()
        };
        let usage = Usage {
            gpus: BTreeMap::from([(0, 0.6)]),
            instances: BTreeMap::from([((1, 2), 0.4), ((1, 9), 0.1)]),
            processes: BTreeMap::from([(
                0,
                vec![ProcessSample { pid: 7, sm: 0.4 }, ProcessSample { pid: 8, sm: 0.2 }],
            )]),
        };
        assert_eq!(sampled_pids(&spec, &status(), &usage), BTreeSet::from([7, 8]));
        let tenant_of = BTreeMap::from([(7, Some("a".to_string())), (8, None)]);
        let b = busy(&spec, &status(), &usage, &tenant_of);
        assert_eq!(
            b.instances,
            BTreeMap::from([((1, 4), 0.4)]),
            "GPU instance 9 is not there"
        );
        let split = &b.split[&0];
        assert!((split["a"] - 2.0 / 3.0).abs() < 1e-12 && (split["unattributed"] - 1.0 / 3.0).abs() < 1e-12);
        // The same GPU used whole, or time-sliced for one tenant alone: its one tenant's, no split.
        spec.gpus[0].tenants = vec!["a".into()];
        assert!(busy(&spec, &status(), &usage, &tenant_of).split.is_empty());
        assert!(sampled_pids(&spec, &status(), &usage).is_empty());
        spec.gpus[0].mode = Mode::Exclusive;
        assert!(busy(&spec, &status(), &usage, &tenant_of).split.is_empty());
    }

    #[test]
    fn held_devices_resolve_to_gpus_instances_and_replicas() {
        let list = super::super::pod_resources::proto::ListPodResourcesResponse { pod_resources: vec![] };
        let mut h = super::super::pod_resources::holdings(&list);
        for (id, ns) in [("GPU-0::1", "a-1"), ("MIG-1", "b-1"), ("GPU-9", "c")] {
            h.devices.insert(
                id.into(),
                super::super::pod_resources::HeldDevice {
                    resource: "nvidia.com/gpu".into(),
                    holders: vec![super::super::pod_resources::Holder {
                        namespace: ns.into(),
                        pod: "p".into(),
                        container: "c".into(),
                    }],
                },
            );
        }
        let held = held(&status(), &h);
        assert_eq!(
            held,
            [
                Held {
                    gpu: 0,
                    instance: None,
                    replica: true,
                    namespace: "a-1".into()
                },
                Held {
                    gpu: 1,
                    instance: Some(4),
                    replica: false,
                    namespace: "b-1".into()
                },
            ]
        );
    }
}
