//! Each tenant's `MemoryCapped` condition: how the memory of its MPS and time-sliced shares is
//! capped, from its grants and what each node's agent reports (GpuNode `status.memoryCaps`,
//! docs/concepts/isolation.md#memory-limits). A tenant without such shares has no condition.

use crate::api::{ConditionSet, GpuMemoryCap, GpuTenant, Grant, MemoryCapMethod, Mode, condition_holds, set_condition};
use crate::inventory::NodeInventory;
use foldhash::HashMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::BTreeSet;
use std::sync::Arc;

/// A tenant's shares by how they are capped.
#[derive(Debug, Default, PartialEq, Eq)]
struct Counts<'a> {
    driver: u32,
    mps_daemon: u32,
    /// Shares nothing caps, and their nodes.
    none: u32,
    none_on: BTreeSet<&'a str>,
    /// Shares on GPUs whose agent reports nothing (yet), and their nodes.
    unknown: u32,
    unknown_on: BTreeSet<&'a str>,
}

/// What the condition says.
struct Capped {
    ok: bool,
    reason: &'static str,
    message: String,
}

/// Sets `MemoryCapped` on every tenant with MPS or time-sliced grants, from the nodes' reports in
/// `inventory`; removes it from the others. A status is written only where the condition differs.
pub fn memory_cap_conditions(
    mut tenants: Vec<Arc<GpuTenant>>,
    inventory: &[NodeInventory],
    now: &Time,
) -> Vec<Arc<GpuTenant>> {
    let reported: HashMap<&str, &[GpuMemoryCap]> = inventory
        .iter()
        .filter_map(|n| Some((n.name.as_str(), n.current.as_ref()?.memory_caps.as_slice())))
        .collect();
    for t in &mut tenants {
        let generation = t.metadata.generation;
        let Some(status) = t.status.as_ref() else { continue };
        let shared: Vec<&Grant> = status
            .grants
            .iter()
            .filter(|g| matches!(g.mode, Mode::Mps | Mode::TimeSlicing) && g.count > 0)
            .collect();
        if shared.is_empty() {
            if status.conditions.iter().any(|c| c.type_ == ConditionSet::MEMORY_CAPPED)
                && let Some(status) = Arc::make_mut(t).status.as_mut()
            {
                status.conditions.retain(|c| c.type_ != ConditionSet::MEMORY_CAPPED);
            }
            continue;
        }
        let capped = capped(&counts(&shared, &reported));
        if condition_holds(
            &status.conditions,
            ConditionSet::MEMORY_CAPPED,
            capped.ok,
            capped.reason,
            &capped.message,
            generation,
        ) {
            continue;
        }
        if let Some(status) = Arc::make_mut(t).status.as_mut() {
            set_condition(
                &mut status.conditions,
                ConditionSet::MEMORY_CAPPED,
                capped.ok,
                capped.reason,
                capped.message,
                generation,
                now,
            );
        }
    }
    tenants
}

fn counts<'a>(shared: &[&'a Grant], reported: &HashMap<&str, &[GpuMemoryCap]>) -> Counts<'a> {
    let mut c = Counts::default();
    for g in shared {
        let method = reported
            .get(g.node.as_str())
            .and_then(|caps| caps.iter().find(|x| x.index == g.gpu))
            .map(|x| x.method);
        match method {
            Some(MemoryCapMethod::Driver) => c.driver += g.count,
            Some(MemoryCapMethod::MpsDaemon) => c.mps_daemon += g.count,
            Some(MemoryCapMethod::None) => {
                c.none += g.count;
                c.none_on.insert(&g.node);
            }
            None => {
                c.unknown += g.count;
                c.unknown_on.insert(&g.node);
            }
        }
    }
    c
}

/// Up to five node names, then `...`.
fn nodes(on: &BTreeSet<&str>) -> String {
    let listed: Vec<&str> = on.iter().take(5).copied().collect();
    format!("{}{}", listed.join(", "), if on.len() > 5 { ", ..." } else { "" })
}

fn capped(c: &Counts) -> Capped {
    if c.none > 0 {
        return Capped {
            ok: false,
            reason: "Uncapped",
            message: format!(
                "{} time-sliced share(s) on {} have no memory cap (the node's status.memoryCaps says why): a process may use the GPU's whole memory; {} share(s) are capped by the driver, {} by the MPS daemon",
                c.none,
                nodes(&c.none_on),
                c.driver,
                c.mps_daemon
            ),
        };
    }
    if c.unknown > 0 {
        return Capped {
            ok: false,
            reason: "NotReported",
            message: format!(
                "the agents of {} have not reported how {} share(s) are capped yet",
                nodes(&c.unknown_on),
                c.unknown
            ),
        };
    }
    if c.mps_daemon > 0 {
        return Capped {
            ok: true,
            reason: "MpsDaemon",
            message: format!(
                "{} share(s) are capped by the driver, {} by the MPS daemon (each client process to one share's memory)",
                c.driver, c.mps_daemon
            ),
        };
    }
    Capped {
        ok: true,
        reason: "Driver",
        message: format!("all {} share(s) are capped by the driver", c.driver),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{GpuTenantSpec, GpuTenantStatus, MemoryCapReason};
    use crate::inventory::CurrentNode;

    fn grant(node: &str, gpu: u32, mode: Mode, count: u32) -> Grant {
        Grant {
            node: node.into(),
            gpu,
            gpu_uuid: None,
            mode,
            profile: None,
            placement: None,
            instance_uuid: None,
            count,
        }
    }

    fn tenant(grants: Vec<Grant>) -> Arc<GpuTenant> {
        let mut t = GpuTenant::new(
            "t",
            GpuTenantSpec {
                tier: "internal".into(),
                policy_ref: "default".into(),
                namespaces: vec![],
                priority: 0,
                weight: 1,
                resources: vec![],
                limits: None,
            },
        );
        t.status = Some(GpuTenantStatus {
            grants: grants.into(),
            ..Default::default()
        });
        Arc::new(t)
    }

    fn node(name: &str, caps: &[(u32, MemoryCapMethod)]) -> NodeInventory {
        NodeInventory {
            name: name.into(),
            current: Some(CurrentNode {
                memory_caps: caps
                    .iter()
                    .map(|&(index, method)| GpuMemoryCap {
                        index,
                        method,
                        reason: (method != MemoryCapMethod::Driver).then_some(MemoryCapReason::ToolkitMissing),
                        found: None,
                    })
                    .collect(),
                ..CurrentNode::default()
            }),
            ..NodeInventory::default()
        }
    }

    fn condition(t: &GpuTenant) -> Option<(String, String, String)> {
        t.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == ConditionSet::MEMORY_CAPPED)
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    }

    fn now() -> Time {
        Time(jiff::Timestamp::UNIX_EPOCH)
    }

    /// Shares counted by what their node reports of their GPU: all by the driver, some by the
    /// MPS daemon, some by nothing (which names the node), some not reported yet; a tenant with
    /// only whole GPUs or MIG instances has no condition.
    #[test]
    fn the_condition_counts_shares_by_how_they_are_capped() {
        use MemoryCapMethod::*;
        let nodes = [
            node("a", &[(0, Driver), (1, Driver)]),
            node("b", &[(0, MpsDaemon), (1, None)]),
            node("c", &[]),
        ];
        let run = |grants| memory_cap_conditions(vec![tenant(grants)], &nodes, &now()).remove(0);
        let all = run(vec![grant("a", 0, Mode::Mps, 2), grant("a", 1, Mode::TimeSlicing, 3)]);
        assert_eq!(
            condition(&all),
            Some((
                "True".into(),
                "Driver".into(),
                "all 5 share(s) are capped by the driver".into()
            ))
        );
        let daemon = run(vec![grant("a", 0, Mode::Mps, 2), grant("b", 0, Mode::Mps, 1)]);
        let (status, reason, message) = condition(&daemon).unwrap();
        assert_eq!((status.as_str(), reason.as_str()), ("True", "MpsDaemon"));
        assert!(
            message.starts_with("2 share(s) are capped by the driver, 1 by the MPS daemon"),
            "{message}"
        );
        let none = run(vec![grant("b", 0, Mode::Mps, 1), grant("b", 1, Mode::TimeSlicing, 4)]);
        let (status, reason, message) = condition(&none).unwrap();
        assert_eq!((status.as_str(), reason.as_str()), ("False", "Uncapped"));
        assert!(
            message.starts_with("4 time-sliced share(s) on b have no memory cap"),
            "{message}"
        );
        let unknown = run(vec![grant("c", 0, Mode::Mps, 1), grant("d", 0, Mode::Mps, 1)]);
        let (status, reason, message) = condition(&unknown).unwrap();
        assert_eq!((status.as_str(), reason.as_str()), ("False", "NotReported"));
        assert!(
            message.starts_with("the agents of c, d have not reported how 2 share(s)"),
            "{message}"
        );
        let whole = run(vec![grant("a", 0, Mode::Exclusive, 1)]);
        assert_eq!(condition(&whole), Option::None);
        // A tenant whose shares went away loses the condition.
        let mut gone = Arc::unwrap_or_clone(all);
        gone.status.as_mut().unwrap().grants = vec![grant("a", 0, Mode::Mig, 1)].into();
        let gone = memory_cap_conditions(vec![Arc::new(gone)], &nodes, &now()).remove(0);
        assert_eq!(condition(&gone), Option::None);
    }
}
