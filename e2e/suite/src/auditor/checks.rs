//! The invariants (docs/design.md#invariants), checked on one snapshot of the cluster. Every expected value
//! comes from the objects themselves (GpuNode specs and statuses, tenants, policies, Nodes, Pods),
//! never from the planner: the auditor is an oracle independent of the code it watches.

use gpu_tenancy::api::{CoLocation, GpuNode, GpuSpec, Mode, ScrubMemory, ScrubRecord, ScrubResult, Tier};
use kube::ResourceExt;
use std::collections::{BTreeMap, BTreeSet};

mod grants;
mod model;
mod pods;
use grants::grants;
pub use model::{Class, Finding, Kind, Snapshot};
use model::{f, tier_of};
use pods::pods;

/// An instance as last reported: its tenant, MIG device UUID and scrub record.
type InstanceSeen = (Option<String>, Option<String>, Option<ScrubRecord>);
/// A GPU used whole as last seen: applied tenants, last scrub, applied mode.
type GpuSeen = (BTreeSet<String>, Option<ScrubRecord>, Option<Mode>);

/// What the auditor remembers of each GPU and instance between snapshots, to see hand-overs.
#[derive(Default)]
pub struct History {
    gpus: BTreeMap<(String, u32), GpuSeen>,
    instances: BTreeMap<(String, u32, u32), InstanceSeen>,
    seen_nodes: BTreeSet<String>,
}

/// Every finding of one snapshot; `history` is updated with what the statuses now report.
pub fn check(snap: &Snapshot, history: &mut History) -> Vec<Finding> {
    let mut out = Vec::new();
    for n in &snap.gpu_nodes {
        for g in &n.spec.gpus {
            capacity_of_spec(n, g, &mut out);
            tiers_of_gpu(snap, n, g.index, g.mode, &g.tenants, "spec", &mut out);
            for i in g.mig_instances.iter().filter_map(|i| i.tenant.as_ref()) {
                tiers_of_gpu(snap, n, g.index, Mode::Mig, std::slice::from_ref(i), "spec", &mut out);
            }
        }
        if let Some(st) = &n.status {
            for g in &st.gpus {
                if let Some(mode) = g.applied_mode.filter(|m| *m != Mode::Mig) {
                    tiers_of_gpu(snap, n, g.index, mode, &g.applied_tenants, "status", &mut out);
                }
            }
        }
        hand_overs(n, history, &mut out);
        scrub_taint(snap, n, &mut out);
    }
    grants(snap, &mut out);
    pods(snap, &mut out);
    out
}

/// Whether every GpuNode and GpuTenant has observed its generation (no rollout step or pass in
/// flight).
pub fn quiescent(snap: &Snapshot) -> bool {
    snap.gpu_nodes.iter().all(|n| {
        n.spec.gpus.is_empty() || n.status.as_ref().and_then(|s| s.observed_generation) == n.metadata.generation
    }) && snap
        .tenants
        .iter()
        .all(|t| t.status.as_ref().and_then(|s| s.observed_generation) == t.metadata.generation)
}

fn capacity_of_spec(n: &GpuNode, g: &GpuSpec, out: &mut Vec<Finding>) {
    let obj = format!("GpuNode/{}", n.name_any());
    match g.mode {
        Mode::Mig => {
            let profiles = n
                .status
                .as_ref()
                .and_then(|s| {
                    s.gpus
                        .iter()
                        .find(|x| x.index == g.index)
                        .map(|x| s.profiles_of(x).to_vec())
                })
                .unwrap_or_default();
            let mut used = [false; 8];
            let mut counts: BTreeMap<&str, u32> = BTreeMap::new();
            for i in &g.mig_instances {
                let (s, z) = (i.placement.start as usize, i.placement.size as usize);
                *counts.entry(&i.profile).or_default() += 1;
                if s + z > used.len() {
                    out.push(f(
                        Kind::Overcommit,
                        Class::Instant,
                        obj.clone(),
                        format!(
                            "GPU {}: instance {} at {} runs past the GPU's 8 memory slices",
                            g.index, i.profile, i.placement
                        ),
                    ));
                    continue;
                }
                if used[s..s + z].iter().any(|u| *u) {
                    out.push(f(
                        Kind::Overcommit,
                        Class::Instant,
                        obj.clone(),
                        format!(
                            "GPU {}: instance {} at {} overlaps another instance",
                            g.index, i.profile, i.placement
                        ),
                    ));
                }
                used[s..s + z].iter_mut().for_each(|u| *u = true);
                if let Some(p) = profiles.iter().find(|p| p.name == i.profile)
                    && !p.placements.is_empty()
                    && !p.placements.iter().any(|pl| pl.start == i.placement.start)
                {
                    out.push(f(
                        Kind::Overcommit,
                        Class::Instant,
                        obj.clone(),
                        format!(
                            "GPU {}: instance {} at {} is not a placement the driver offers for it",
                            g.index, i.profile, i.placement
                        ),
                    ));
                }
            }
            for (profile, count) in counts {
                if let Some(p) = profiles.iter().find(|p| p.name == profile)
                    && p.max_instances > 0
                    && count > p.max_instances
                {
                    out.push(f(
                        Kind::Overcommit,
                        Class::Instant,
                        obj.clone(),
                        format!(
                            "GPU {}: {count} instances of {profile}, the driver offers {}",
                            g.index, p.max_instances
                        ),
                    ));
                }
            }
        }
        Mode::Exclusive if g.tenants.len() > 1 => out.push(f(
            Kind::Overcommit,
            Class::Instant,
            obj,
            format!(
                "GPU {}: Exclusive GPU given to {} tenants {:?}",
                g.index,
                g.tenants.len(),
                g.tenants
            ),
        )),
        _ => {}
    }
}

fn tiers_of_gpu(
    snap: &Snapshot,
    n: &GpuNode,
    gpu: u32,
    mode: Mode,
    tenants: &[String],
    side: &str,
    out: &mut Vec<Finding>,
) {
    let obj = format!("GpuNode/{}", n.name_any());
    let tiers: Vec<(String, String, &Tier)> = tenants
        .iter()
        .filter_map(|t| tier_of(snap, t).map(|(_, name, tier)| (t.clone(), name, tier)))
        .collect();
    for (t, name, tier) in &tiers {
        if !tier.modes.contains(&mode) {
            out.push(f(
                Kind::TierIsolation,
                Class::Settling,
                obj.clone(),
                format!(
                    "{side} GPU {gpu}: tenant {t} (tier {name}) is given mode {mode}, which its tier does not allow"
                ),
            ));
        }
    }
    if mode == Mode::Mig || tenants.len() < 2 {
        return;
    }
    let distinct: BTreeSet<&String> = tiers.iter().map(|x| &x.1).collect();
    if distinct.len() > 1 {
        out.push(f(
            Kind::TierIsolation,
            Class::Settling,
            obj.clone(),
            format!(
                "{side} GPU {gpu} ({mode}): tenants of different tiers share it: {:?}",
                tiers.iter().map(|x| format!("{} ({})", x.0, x.1)).collect::<Vec<_>>()
            ),
        ));
    }
    for (t, name, tier) in &tiers {
        if tier.co_location == CoLocation::Forbidden {
            out.push(f(
                Kind::TierIsolation,
                Class::Settling,
                obj.clone(),
                format!(
                    "{side} GPU {gpu} ({mode}): tenant {t} (tier {name}, coLocation Forbidden) shares it with {:?}",
                    tenants
                ),
            ));
        }
    }
}

/// A scrub record that hands the GPU or instance to `tenants` (docs/design.md#scrub-on-change-of-hands).
fn scrubbed_for(
    rec: Option<&ScrubRecord>,
    before: Option<&ScrubRecord>,
    tenants: &BTreeSet<String>,
    policy: Option<ScrubMemory>,
) -> Result<(), String> {
    let Some(rec) = rec else {
        return Err("no scrub record".into());
    };
    if before == Some(rec) {
        return Err(format!(
            "its scrub record is the old one ({} {:?} for {:?})",
            rec.time, rec.result, rec.tenant
        ));
    }
    if !rec.tenant.as_ref().is_some_and(|t| tenants.contains(t)) {
        return Err(format!("its scrub record names {:?}, not a new tenant", rec.tenant));
    }
    match rec.result {
        ScrubResult::Scrubbed => Ok(()),
        ScrubResult::Skipped if policy == Some(ScrubMemory::Never) => Ok(()),
        other => Err(format!("its scrub record says {other:?} (scrub policy {policy:?})")),
    }
}

fn hand_overs(n: &GpuNode, history: &mut History, out: &mut Vec<Finding>) {
    let name = n.name_any();
    let obj = format!("GpuNode/{name}");
    let baseline = history.seen_nodes.insert(name.clone());
    let Some(st) = &n.status else {
        return;
    };
    for g in &st.gpus {
        let policy = n.spec.gpus.iter().find(|s| s.index == g.index).map(|s| s.scrub);
        let now: BTreeSet<String> = g.applied_tenants.iter().cloned().collect();
        let key = (name.clone(), g.index);
        // Tenants joining an MPS or time-sliced GPU whose tenants all stay, in the same mode, are
        // no change of hands (docs/concepts/planner.md#isolation-and-scrubs): nothing to scrub for. That
        // they may share it at all is the tier check's (`tiers_of_gpu`, on the applied tenants).
        let joined = |before: &BTreeSet<String>, mode_before: &Option<Mode>| {
            !before.is_empty()
                && before.is_subset(&now)
                && *mode_before == g.applied_mode
                && matches!(g.applied_mode, Some(Mode::Mps | Mode::TimeSlicing))
        };
        if let Some((before, rec_before, mode_before)) = history.gpus.get(&key)
            && !baseline
            && now.iter().any(|t| !before.contains(t))
            && !joined(before, mode_before)
            && let Err(why) = scrubbed_for(g.last_scrub.as_ref(), rec_before.as_ref(), &now, policy)
        {
            out.push(f(
                Kind::HandOverWithoutScrub,
                Class::Instant,
                obj.clone(),
                format!(
                    "GPU {} reported serving {:?} (before {:?}), but {why}",
                    g.index, now, before
                ),
            ));
        }
        history.gpus.insert(key, (now, g.last_scrub.clone(), g.applied_mode));
        for i in &g.instances {
            let key = (name.clone(), g.index, i.placement.start);
            let before = history.instances.get(&key);
            let new_hands = match before {
                None => i.tenant.is_some(),
                Some((tenant, uuid, _)) => {
                    i.tenant.is_some() && (*tenant != i.tenant || (uuid.is_some() && *uuid != i.uuid))
                }
            };
            if !baseline && new_hands {
                let tenants: BTreeSet<String> = i.tenant.iter().cloned().collect();
                if let Err(why) = scrubbed_for(
                    i.last_scrub.as_ref(),
                    before.and_then(|b| b.2.as_ref()),
                    &tenants,
                    policy,
                ) {
                    out.push(f(
                        Kind::HandOverWithoutScrub,
                        Class::Instant,
                        obj.clone(),
                        format!(
                            "GPU {} instance {} at {} reported serving {:?} (before {:?}), but {why}",
                            g.index,
                            i.profile,
                            i.placement,
                            i.tenant,
                            before.map(|b| &b.0)
                        ),
                    ));
                }
            }
            history
                .instances
                .insert(key, (i.tenant.clone(), i.uuid.clone(), i.last_scrub.clone()));
        }
    }
}

fn scrub_taint(snap: &Snapshot, n: &GpuNode, out: &mut Vec<Finding>) {
    let status = n.status.clone().unwrap_or_default();
    let mut pending = Vec::new();
    for g in &n.spec.gpus {
        let sg = status.gpus.iter().find(|s| s.index == g.index);
        if g.mode == Mode::Mig {
            for i in g.mig_instances.iter().filter(|i| i.tenant.is_some()) {
                let served = sg.is_some_and(|s| {
                    s.instances
                        .iter()
                        .any(|x| x.placement.start == i.placement.start && x.tenant == i.tenant)
                });
                if !served {
                    pending.push(format!("GPU {} instance at {} to {:?}", g.index, i.placement, i.tenant));
                }
            }
        } else {
            let applied: Vec<String> = sg.map(|s| s.applied_tenants.clone()).unwrap_or_default();
            let new: Vec<&String> = g.tenants.iter().filter(|t| !applied.contains(t)).collect();
            if !new.is_empty() {
                pending.push(format!("GPU {} to {new:?}", g.index));
            }
        }
    }
    if pending.is_empty() {
        return;
    }
    let tainted = snap
        .nodes
        .iter()
        .find(|x| x.name_any() == n.name_any())
        .and_then(|x| x.spec.as_ref()?.taints.as_ref())
        .is_some_and(|t| {
            t.iter()
                .any(|t| t.key == gpu_tenancy::labels::SCRUB_PENDING && t.effect == "NoSchedule")
        });
    if !tainted {
        out.push(f(
            Kind::ScrubTaintMissing,
            Class::Settling,
            format!("Node/{}", n.name_any()),
            format!(
                "hand-over not yet applied by the agent ({}) and the node lacks the {} taint",
                pending.join("; "),
                gpu_tenancy::labels::SCRUB_PENDING
            ),
        ));
    }
}
