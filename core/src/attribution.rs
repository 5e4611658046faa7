//! Whose work keeps a shared GPU busy, and which namespaces hold a tenant's devices: the pure half
//! of the agent's per-tenant use on MPS and time-sliced GPUs and of the showback's top namespaces.
//!
//! NVML's per-process samples (`nvmlDeviceGetProcessUtilization`) name host PIDs. A PID's pod is
//! in its cgroup path (`/proc/<pid>/cgroup`): the kubelet puts every container of a pod under
//! `kubepods[/<qos>]/pod<UID>` (cgroupfs driver) or `kubepods[-<qos>].slice/...-pod<UID with _>.slice`
//! (systemd driver). The pod's namespace makes the tenant: the tenant that alone lists it, as
//! admission binds namespaces. Whatever cannot be told (a host process, a cgroup of another
//! shape, a pod the agent does not know, a namespace no tenant lists alone) goes to
//! [`UNATTRIBUTED`]: never to a guessed tenant.

use crate::accounting::{Holding, UNATTRIBUTED};
use crate::api::{GpuNodeSpec, Mode};
use std::collections::BTreeMap;

/// The pod UID in the text of a `/proc/<pid>/cgroup` file (cgroup v1 or v2, either kubelet cgroup
/// driver); `None` for a process outside the kubelet's pods. UIDs come back in their API form
/// (dashes), whichever the driver wrote.
pub fn pod_uid_from_cgroup(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        // `hierarchy-ID:controllers:path`; the path may itself hold colons (never in kubepods').
        let path = line.splitn(3, ':').nth(2)?;
        if !path.contains("kubepods") {
            return None;
        }
        path.split('/').find_map(pod_uid_of_component)
    })
}

/// `pod<UID>` (cgroupfs) or `kubepods-<qos>-pod<UID_with_underscores>.slice` (systemd).
fn pod_uid_of_component(c: &str) -> Option<String> {
    let rest = match c.strip_suffix(".slice") {
        Some(slice) => slice.rsplit_once("-pod")?.1,
        None => c.strip_prefix("pod")?,
    };
    let uid = rest.replace('_', "-");
    is_uid(&uid).then_some(uid)
}

/// A Kubernetes UID: 8-4-4-4-12 hex digits.
fn is_uid(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.len() == 5
        && parts
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(p, n)| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// One per-process sample of a GPU: the process and the part of the GPU's SMs it kept busy over
/// the sample period (NVML's `smUtil`, 0 to 1).
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessSample {
    pub pid: u32,
    pub sm: f64,
}

/// How a GPU's busy time divides between tenants (fractions adding up to 1) from its processes'
/// samples, each PID's tenant from `tenant_of` (`None`: not attributable, [`UNATTRIBUTED`]'s).
/// Several samples of one PID are averaged first (the driver buffers several periods). `None`
/// when the samples say nothing (none, or all at 0): the caller keeps the GPU-wide rule.
pub fn split(samples: &[ProcessSample], tenant_of: &BTreeMap<u32, Option<String>>) -> Option<BTreeMap<String, f64>> {
    let mut per_pid: BTreeMap<u32, (f64, u32)> = BTreeMap::new();
    for s in samples {
        let e = per_pid.entry(s.pid).or_default();
        e.0 += s.sm.clamp(0.0, 1.0);
        e.1 += 1;
    }
    let mut by_tenant: BTreeMap<String, f64> = BTreeMap::new();
    for (pid, (sum, n)) in per_pid {
        let tenant = tenant_of.get(&pid).cloned().flatten();
        *by_tenant
            .entry(tenant.unwrap_or_else(|| UNATTRIBUTED.into()))
            .or_default() += sum / f64::from(n);
    }
    let total: f64 = by_tenant.values().sum();
    if total <= 0.0 {
        return None;
    }
    Some(
        by_tenant
            .into_iter()
            .map(|(t, v)| (t, v / total))
            .filter(|(_, v)| *v > 0.0)
            .collect(),
    )
}

/// A device some container holds, by the kubelet's pod-resources answer, resolved to this node's
/// GPUs: a whole GPU, a MIG instance (by its first memory slice) or one replica of a shared GPU.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Held {
    pub gpu: u32,
    pub instance: Option<u32>,
    /// A replica (`GPU-…::3`) of an MPS or time-sliced GPU: one replica's part of the GPU.
    pub replica: bool,
    pub namespace: String,
}

/// Which part of each tenant's holdings the pods of each of its namespaces hold: (tenant,
/// namespace) → fraction of a whole GPU. A whole GPU or MIG instance goes to the namespaces of the
/// tenant's pods holding it, in equal parts; a replica is its part of the GPU (1 / replicas), at
/// most the tenant's share. Only namespaces `owner` gives the holding's tenant count: the label
/// values stay within the namespaces the tenants list, and a device held from elsewhere is not
/// charged to a namespace (UngrantedUse and the admission rules are about that). What no pod holds
/// stays with the tenant and no namespace.
pub fn namespace_holdings(
    spec: &GpuNodeSpec,
    holdings: &[Holding],
    held: &[Held],
    owner: impl Fn(&str) -> Option<String>,
) -> BTreeMap<(String, String), f64> {
    let mut out: BTreeMap<(String, String), f64> = BTreeMap::new();
    for h in holdings.iter().filter(|h| h.tenant != crate::accounting::UNALLOCATED) {
        let start = h.instance.as_ref().map(|(s, _)| *s);
        let mine: Vec<&Held> = held
            .iter()
            .filter(|d| d.gpu == h.gpu && d.instance == start)
            .filter(|d| owner(&d.namespace).as_deref() == Some(h.tenant.as_str()))
            .collect();
        if mine.is_empty() {
            continue;
        }
        let replicas = replicas(spec, h.gpu);
        let mut parts: BTreeMap<&str, f64> = BTreeMap::new();
        match (h.mode, replicas) {
            ("MPS" | "TimeSlicing", Some(n)) => {
                for d in mine.iter().filter(|d| d.replica) {
                    *parts.entry(d.namespace.as_str()).or_default() += 1.0 / f64::from(n);
                }
            }
            _ => {
                let mut namespaces: Vec<&str> = mine.iter().map(|d| d.namespace.as_str()).collect();
                namespaces.sort();
                namespaces.dedup();
                for ns in &namespaces {
                    parts.insert(ns, h.weight / namespaces.len() as f64);
                }
            }
        }
        // More replicas held than the tenant's share (a share count lowered while pods run): the
        // share is what is charged, in proportion.
        let sum: f64 = parts.values().sum();
        let scale = if sum > h.weight { h.weight / sum } else { 1.0 };
        for (ns, v) in parts {
            *out.entry((h.tenant.clone(), ns.to_string())).or_default() += v * scale;
        }
    }
    out
}

/// The replicas of an MPS or time-sliced GPU of `spec`.
fn replicas(spec: &GpuNodeSpec, gpu: u32) -> Option<u32> {
    let g = spec.gpus.iter().find(|g| g.index == gpu)?;
    match g.mode {
        Mode::Mps => g.mps.as_ref().map(|m| m.max_clients),
        Mode::TimeSlicing => g.time_slicing.as_ref().map(|t| t.replicas),
        _ => None,
    }
    .map(|n| n.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accounting::holdings;
    use crate::api::{GpuSpec, MigInstanceSpec};

    const UID: &str = "0f5e6a1c-3b2d-4c8e-9a7b-1d2e3f4a5b6c";

    #[test]
    fn pod_uids_come_from_either_cgroup_driver_and_version() {
        // cgroup v2, cgroupfs driver (containerd's default outside systemd hosts).
        let v2 = format!(
            "0::/kubepods/burstable/pod{UID}/4b1f6c0d9e8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c\n"
        );
        assert_eq!(pod_uid_from_cgroup(&v2).as_deref(), Some(UID));
        // cgroup v2, systemd driver: the UID's dashes become underscores.
        let systemd = format!(
            "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-4b1f.scope\n",
            UID.replace('-', "_")
        );
        assert_eq!(pod_uid_from_cgroup(&systemd).as_deref(), Some(UID));
        // Guaranteed pods sit right under kubepods; cgroup v1 lists a line per hierarchy.
        let v1 = format!("12:pids:/kubepods/pod{UID}/abc\n11:memory:/kubepods/pod{UID}/abc\n1:name=systemd:/\n");
        assert_eq!(pod_uid_from_cgroup(&v1).as_deref(), Some(UID));
        let guaranteed_systemd = format!(
            "0::/kubepods.slice/kubepods-pod{}.slice/crio-1.scope",
            UID.replace('-', "_")
        );
        assert_eq!(pod_uid_from_cgroup(&guaranteed_systemd).as_deref(), Some(UID));
    }

    #[test]
    fn processes_outside_pods_have_no_uid() {
        for text in [
            "0::/system.slice/nvidia-persistenced.service\n",
            "0::/user.slice/user-1000.slice/session-3.scope\n",
            "0::/\n",
            "",
            // Something merely named like it, not a UID.
            "0::/kubepods/burstable/podnot-a-uid/abc\n",
            "0::/docker/pod0f5e6a1c-3b2d-4c8e-9a7b-1d2e3f4a5b6c\n",
        ] {
            assert_eq!(pod_uid_from_cgroup(text), None, "{text:?}");
        }
    }

    fn sample(pid: u32, sm: f64) -> ProcessSample {
        ProcessSample { pid, sm }
    }

    #[test]
    fn a_gpus_busy_time_divides_by_the_tenants_samples_and_the_unknown_are_unattributed() {
        let tenant_of = BTreeMap::from([(1, Some("a".to_string())), (2, Some("b".to_string())), (3, None)]);
        // a 30%, b 20% (two samples of 10 and 30 averaged), a process no pod explains 10%, and a
        // PID the agent never looked up 0%.
        let samples = [
            sample(1, 0.3),
            sample(2, 0.1),
            sample(2, 0.3),
            sample(3, 0.1),
            sample(9, 0.0),
        ];
        let s = split(&samples, &tenant_of).expect("a split");
        assert!((s["a"] - 0.5).abs() < 1e-12, "{s:?}");
        assert!((s["b"] - 1.0 / 3.0).abs() < 1e-12, "{s:?}");
        assert!((s[UNATTRIBUTED] - 1.0 / 6.0).abs() < 1e-12, "{s:?}");
        assert_eq!(s.len(), 3, "{s:?}");
        assert_eq!(split(&[], &tenant_of), None);
        assert_eq!(split(&[sample(1, 0.0)], &tenant_of), None);
    }

    fn spec() -> GpuNodeSpec {
        let ts = GpuSpec::time_sliced(0, 4).with_shares(&[("a", 3)]);
        let mig = GpuSpec::mig(1, vec![MigInstanceSpec::new("3g.40gb", 4, 4).for_tenant("b")]);
        let ex = GpuSpec::exclusive(2, "b");
        GpuNodeSpec {
            gpus: vec![ts, mig, ex].into(),
            ..Default::default()
        }
    }

    fn held(gpu: u32, instance: Option<u32>, replica: bool, ns: &str) -> Held {
        Held {
            gpu,
            instance,
            replica,
            namespace: ns.into(),
        }
    }

    #[test]
    fn namespaces_get_the_part_their_pods_hold_of_their_tenants_holdings() {
        let spec = spec();
        let h = holdings(&spec, &[0, 1, 2]);
        let owner = |ns: &str| match ns {
            "a-1" | "a-2" => Some("a".to_string()),
            "b-1" | "b-2" => Some("b".to_string()),
            _ => None,
        };
        let held = [
            // Two of a's three replicas, in two namespaces; one replica of the GPU taken from a
            // namespace of b's (not a's: not charged to a namespace of a's).
            held(0, None, true, "a-1"),
            held(0, None, true, "a-2"),
            held(0, None, true, "b-1"),
            // b's instance by one pod, b's whole GPU by pods of two of its namespaces and one
            // pod of a namespace no tenant lists.
            held(1, Some(4), false, "b-1"),
            held(2, None, false, "b-1"),
            held(2, None, false, "b-2"),
            held(2, None, false, "kube-system"),
        ];
        let n = namespace_holdings(&spec, &h, &held, owner);
        let get = |t: &str, ns: &str| n.get(&(t.to_string(), ns.to_string())).copied();
        assert_eq!(get("a", "a-1"), Some(0.25));
        assert_eq!(get("a", "a-2"), Some(0.25));
        assert_eq!(get("a", "b-1"), None);
        assert!((get("b", "b-1").unwrap() - (3.0 / 7.0 + 0.5)).abs() < 1e-12, "{n:?}");
        assert_eq!(get("b", "b-2"), Some(0.5));
        assert_eq!(n.len(), 4, "{n:?}");
    }

    #[test]
    fn more_replicas_held_than_the_share_are_charged_as_the_share() {
        let spec = spec();
        let h = holdings(&spec, &[0]);
        let held: Vec<Held> = (0..4).map(|_| held(0, None, true, "a-1")).collect();
        let n = namespace_holdings(&spec, &h, &held, |_| Some("a".into()));
        assert_eq!(n.get(&("a".to_string(), "a-1".to_string())), Some(&0.75));
    }
}
