//! Grants lost or doubled: tenant statuses against the GpuNode specs.

use super::model::{Class, Finding, Kind, Snapshot, f, headroom_of, quantity_mib};
use gpu_tenancy::api::{GpuNode, GpuSpec, Mode};
use kube::ResourceExt;
use std::collections::{BTreeMap, BTreeSet};

/// One unit of capacity: a MIG instance (by placement start), or a whole GPU's shares of a mode.
type Unit = (String, u32, Mode, Option<u32>);

fn unit_name(u: &Unit) -> String {
    match u.3 {
        Some(s) => format!("{} GPU {} {} instance at slice {s}", u.0, u.1, u.2),
        None => format!("{} GPU {} {}", u.0, u.1, u.2),
    }
}

pub(super) fn grants(snap: &Snapshot, out: &mut Vec<Finding>) {
    // What the specs give, per tenant.
    let mut spec_units: BTreeMap<String, BTreeSet<Unit>> = BTreeMap::new();
    let mut gpus: BTreeMap<(String, u32), (&GpuNode, &GpuSpec)> = BTreeMap::new();
    for n in &snap.gpu_nodes {
        for g in &n.spec.gpus {
            gpus.insert((n.name_any(), g.index), (n, g));
            for t in &g.tenants {
                spec_units
                    .entry(t.clone())
                    .or_default()
                    .insert((n.name_any(), g.index, g.mode, None));
            }
            for i in &g.mig_instances {
                if let Some(t) = &i.tenant {
                    spec_units.entry(t.clone()).or_default().insert((
                        n.name_any(),
                        g.index,
                        Mode::Mig,
                        Some(i.placement.start),
                    ));
                }
            }
        }
    }
    // What the statuses list, per unit and tenant.
    let mut holders: BTreeMap<Unit, Vec<(String, u32)>> = BTreeMap::new();
    for t in &snap.tenants {
        let tname = t.name_any();
        let obj = format!("GpuTenant/{tname}");
        let Some(st) = &t.status else { continue };
        let mut listed: BTreeSet<Unit> = BTreeSet::new();
        for gr in &st.grants {
            let start = gr.placement.as_deref().and_then(|p| p.split(':').next()?.parse().ok());
            let unit: Unit = (
                gr.node.clone(),
                gr.gpu,
                gr.mode,
                if gr.mode == Mode::Mig { start } else { None },
            );
            if !listed.insert(unit.clone()) {
                out.push(f(
                    Kind::GrantDoubled,
                    Class::Instant,
                    obj.clone(),
                    format!("{} listed twice in its grants", unit_name(&unit)),
                ));
            }
            holders
                .entry(unit.clone())
                .or_default()
                .push((tname.clone(), gr.count.max(1)));
            if !spec_units.get(&tname).is_some_and(|s| s.contains(&unit)) {
                out.push(f(
                    Kind::GrantDoubled,
                    Class::Quiescent,
                    obj.clone(),
                    format!("granted {} which no GpuNode spec gives it", unit_name(&unit)),
                ));
            }
        }
        for unit in spec_units.get(&tname).into_iter().flatten() {
            if !listed.contains(unit) {
                out.push(f(
                    Kind::GrantLost,
                    Class::Quiescent,
                    obj.clone(),
                    format!(
                        "GpuNode spec gives it {} but its status does not list it",
                        unit_name(unit)
                    ),
                ));
            }
        }
        for a in &st.allocation {
            let sum: u32 = st
                .grants
                .iter()
                .filter(|g| g.mode == a.mode && g.profile == a.profile)
                .map(|g| g.count.max(1))
                .sum();
            if sum != a.granted {
                out.push(f(
                    Kind::GrantLost,
                    Class::Instant,
                    obj.clone(),
                    format!(
                        "allocation says {} {}{} granted, its grants add up to {sum}",
                        a.granted,
                        a.mode,
                        a.profile.as_deref().map(|p| format!(" {p}")).unwrap_or_default()
                    ),
                ));
            }
        }
    }
    // Each unit within what its GPU offers.
    for (unit, who) in &holders {
        let total: u32 = who.iter().map(|w| w.1).sum();
        let obj = format!("GpuNode/{}", unit.0);
        if unit.2 == Mode::Mig || unit.2 == Mode::Exclusive {
            if who.len() > 1 || total > 1 {
                out.push(f(
                    Kind::GrantDoubled,
                    Class::Settling,
                    obj,
                    format!("{} granted {total} times: {who:?}", unit_name(unit)),
                ));
            }
            continue;
        }
        let Some((n, g)) = gpus.get(&(unit.0.clone(), unit.1)) else {
            continue;
        };
        let setting = match unit.2 {
            Mode::Mps => g.mps.as_ref().map(|m| m.max_clients).unwrap_or(4),
            _ => g.time_slicing.as_ref().map(|t| t.replicas).unwrap_or(1),
        };
        if total > setting {
            out.push(f(
                Kind::Overcommit,
                Class::Settling,
                obj.clone(),
                format!(
                    "{} has {total} shares granted ({who:?}), its plan setting offers {setting}",
                    unit_name(unit)
                ),
            ));
        }
        if unit.2 == Mode::Mps {
            let memory = n
                .status
                .as_ref()
                .and_then(|s| s.gpus.iter().find(|x| x.index == unit.1))
                .map(|x| x.memory_mib)
                .unwrap_or(0);
            let share = g
                .mps
                .as_ref()
                .and_then(|m| m.pinned_memory_limit.as_deref())
                .and_then(quantity_mib)
                .unwrap_or(memory / u64::from(setting.max(1)));
            let headroom = who.iter().map(|w| headroom_of(snap, &w.0)).max().unwrap_or(0);
            let usable = memory * u64::from(100 - headroom.min(100)) / 100;
            if memory > 0 && u64::from(total) * share > usable {
                out.push(f(Kind::Overcommit, Class::Settling, obj, format!("{}: {total} clients × {share} MiB pinned exceed {usable} MiB ({memory} MiB less {headroom}% headroom)", unit_name(unit))));
            }
        }
    }
}
