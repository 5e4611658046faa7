//! Pods that exist and break their tenant's isolation.

use super::model::{Class, Finding, Kind, Snapshot, f, tier_of};
use gpu_tenancy::api::Mode;
use kube::ResourceExt;
use std::collections::BTreeSet;

/// Namespaces whose GPU pods belong to no tenant by design (the cluster's own, the device plugin's).
const SYSTEM_NAMESPACES: [&str; 5] = [
    "kube-system",
    "kube-public",
    "kube-node-lease",
    "nvidia-device-plugin",
    "gpu-tenancy-system",
];

pub(super) fn pods(snap: &Snapshot, out: &mut Vec<Finding>) {
    for p in &snap.pods {
        let ns = p.namespace().unwrap_or_default();
        let obj = format!("Pod/{ns}/{}", p.name_any());
        let Some(spec) = &p.spec else { continue };
        let mut modes: BTreeSet<&str> = BTreeSet::new();
        for c in spec.containers.iter().chain(spec.init_containers.iter().flatten()) {
            let r = c.resources.as_ref();
            for k in r
                .and_then(|r| r.limits.as_ref())
                .into_iter()
                .chain(r.and_then(|r| r.requests.as_ref()))
                .flat_map(|m| m.keys())
            {
                match k.as_str() {
                    "nvidia.com/gpu" => modes.insert("Exclusive"),
                    "nvidia.com/gpu.shared" => modes.insert("Shared"),
                    k if k.starts_with("nvidia.com/mig-") => modes.insert("MIG"),
                    _ => false,
                };
            }
        }
        let tolerations = spec.tolerations.clone().unwrap_or_default();
        let tenant = snap.tenants.iter().find(|t| t.spec.namespaces.contains(&ns));
        let Some(tenant) = tenant else {
            if !modes.is_empty() && !SYSTEM_NAMESPACES.contains(&ns.as_str()) {
                out.push(f(
                    Kind::PodBreaksIsolation,
                    Class::Settling,
                    obj,
                    format!("asks for GPUs ({modes:?}) in a namespace of no tenant"),
                ));
            }
            continue;
        };
        let tname = tenant.name_any();
        if let Some((_, tier_name, tier)) = tier_of(snap, &tname) {
            for m in &modes {
                let ok = match *m {
                    "Exclusive" => tier.modes.contains(&Mode::Exclusive),
                    "MIG" => tier.modes.contains(&Mode::Mig),
                    _ => tier.modes.contains(&Mode::Mps) || tier.modes.contains(&Mode::TimeSlicing),
                };
                if !ok {
                    out.push(f(
                        Kind::PodBreaksIsolation,
                        Class::Settling,
                        obj.clone(),
                        format!(
                            "tenant {tname} (tier {tier_name}) pod asks for {m} GPUs, which its tier does not allow"
                        ),
                    ));
                }
            }
        }
        for t in &tolerations {
            let key = t.key.as_deref().unwrap_or("");
            let bad = if key.is_empty() && t.operator.as_deref() == Some("Exists") {
                Some("every taint".to_string())
            } else if key == gpu_tenancy::labels::SCRUB_PENDING {
                Some(key.to_string())
            } else if key == gpu_tenancy::labels::DEDICATED && t.value.as_deref() != Some(tname.as_str()) {
                Some(format!("{key}={}", t.value.as_deref().unwrap_or("*")))
            } else {
                None
            };
            if let Some(what) = bad {
                out.push(f(
                    Kind::PodBreaksIsolation,
                    Class::Settling,
                    obj.clone(),
                    format!("tenant {tname}'s pod tolerates {what}"),
                ));
            }
        }
        if let Some(node) = spec
            .node_name
            .as_ref()
            .and_then(|n| snap.nodes.iter().find(|x| x.name_any() == *n))
            && let Some(owner) = node.labels().get(gpu_tenancy::labels::DEDICATED)
            && *owner != tname
        {
            out.push(f(
                Kind::PodBreaksIsolation,
                Class::Settling,
                obj.clone(),
                format!(
                    "tenant {tname}'s pod runs on node {} dedicated to {owner}",
                    node.name_any()
                ),
            ));
        }
    }
}
