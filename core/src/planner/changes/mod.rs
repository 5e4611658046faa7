//! What a plan changes against what runs now: each GPU used whole, or MIG instance, whose tenants
//! change, why, and whether a memory scrub and an eviction may follow (docs/design.md#scrub-on-change-of-hands
//! and 4). Also the rule that sets each GPU's scrub policy from those hand-overs.

use super::nodes::NodeDesired;
use crate::api::{GpuSpec, GpuTenant, MemoryCapPolicy, MigInstanceSpec, Mode, Placement, ScrubMemory};
use crate::handover::gpu_changes_hands;
use crate::inventory::{AppliedState, NodeGpu};
use crate::policy::TenantProfile;
use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use serde::Serialize;
use std::borrow::Borrow;

/// One GPU used whole (MPS, TimeSlicing, Exclusive), or one MIG instance, whose tenants change.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct BindingChange {
    pub node: String,
    pub gpu: u32,
    /// The MIG instance's profile and placement; absent for a GPU used whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
    /// Tenants bound to it now, sorted.
    pub old_tenants: Vec<String>,
    /// Tenants bound to it in the plan, sorted.
    pub new_tenants: Vec<String>,
    pub reason: ChangeReason,
    /// The agent clears its memory before the new tenants get it: the GPU's `scrub` is not `Never`
    /// and the GPU changes hands (tenants joining a shared GPU whose tenants stay do not:
    /// [`crate::handover`]).
    pub scrub: bool,
    /// A tenant loses it and may still run pods there: they are evicted or waited for, as the plan's
    /// `busyGpuPolicy` says.
    pub may_evict: bool,
}

/// Why a binding changes. For a unit a tenant loses, why that tenant loses it; for a unit that was
/// free, why a tenant gets it.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(tag = "kind")]
pub enum ChangeReason {
    /// Free before; goes to a tenant that held nothing of its kind.
    TenantAdded,
    /// Free before; goes to a tenant whose grant of its kind grew.
    GrantGrew,
    /// Its tenant no longer exists.
    TenantRemoved,
    /// Its tenant exists but is not valid, so it gets nothing.
    TenantInvalid,
    /// Its tenant holds fewer of its kind now (a smaller request, or a smaller fair share).
    GrantShrank,
    /// Its tenant holds fewer of its kind now and a tenant of higher priority takes this one.
    Preempted { by: String },
    /// The plan changed the GPU: another mode, another MIG layout, or no plan for the node.
    PlanChanged,
    /// Its tenant holds as many of its kind as before, elsewhere: a placement rule (co-location,
    /// NUMA topology, dedicated GPUs, tier caps) did not let it stay.
    Repacked,
}

impl std::fmt::Display for ChangeReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChangeReason::TenantAdded => write!(f, "free; granted to a tenant that held none of this kind"),
            ChangeReason::GrantGrew => write!(f, "free; the tenant's grant of this kind grew"),
            ChangeReason::TenantRemoved => write!(f, "the tenant no longer exists"),
            ChangeReason::TenantInvalid => write!(f, "the tenant is not valid (see its Valid condition)"),
            ChangeReason::GrantShrank => write!(f, "the tenant's grant of this kind shrank"),
            ChangeReason::Preempted { by } => write!(f, "preempted by {by}, of higher priority"),
            ChangeReason::PlanChanged => write!(f, "the plan changed this GPU"),
            ChangeReason::Repacked => write!(f, "moved by a placement rule; the tenant keeps as many elsewhere"),
        }
    }
}

/// Tenant of planned MIG instance `inst` now: only when that instance exists now with the same
/// profile and placement (otherwise the plan creates it, and nobody holds it yet).
pub(crate) fn instance_holder<'a>(gpu: &'a NodeGpu, inst: &MigInstanceSpec) -> Option<&'a str> {
    let exists = gpu
        .instances
        .iter()
        .any(|e| e.profile == inst.profile && e.placement == inst.placement);
    exists
        .then(|| gpu.instance_tenants.get(&inst.placement).map(String::as_str))
        .flatten()
}

/// Tenants of a GPU used whole now, when it is used in `mode` now (a mode change binds anew).
pub(crate) fn whole_holders(gpu: &NodeGpu, mode: Mode) -> &[String] {
    if mode != Mode::Mig && gpu.mode == Some(mode) {
        &gpu.tenants
    } else {
        &[]
    }
}

/// What a tenant holds is counted per kind: mode, and profile for MIG instances.
type Kind<'a> = (Mode, Option<&'a str>);

/// One unit whose tenants differ between now and the plan.
struct UnitDiff<'a> {
    gpu: u32,
    instance: Option<(&'a str, Placement)>,
    old: Vec<&'a str>,
    new: Vec<&'a str>,
    old_kind: Kind<'a>,
    new_kind: Kind<'a>,
    /// The unit is gone or new with the plan's layout, or the GPU's mode changed.
    plan_changed: bool,
}

impl<'a> UnitDiff<'a> {
    fn leaving(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.old.iter().copied().filter(|t| !self.new.contains(t))
    }

    fn joining(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.new.iter().copied().filter(|t| !self.old.contains(t))
    }
}

fn sorted<'a>(names: impl IntoIterator<Item = &'a String>) -> Vec<&'a str> {
    let mut v: Vec<&str> = names.into_iter().map(String::as_str).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The units of a node whose tenants change, GPU by GPU: MIG instances now, instances the plan
/// creates, then the GPU used whole.
fn unit_diffs<'a>(node: &'a NodeDesired) -> Vec<UnitDiff<'a>> {
    let mut out = Vec::new();
    for inv in &node.inventory.gpus {
        let spec = node.gpus.iter().find(|s| s.index == inv.index);
        let planned: &[MigInstanceSpec] = spec.filter(|s| s.mode == Mode::Mig).map_or(&[], |s| &s.mig_instances);
        for e in &inv.instances {
            let kept = planned
                .iter()
                .find(|i| i.profile == e.profile && i.placement == e.placement);
            let (old, new) = (
                inv.instance_tenants.get(&e.placement),
                kept.and_then(|i| i.tenant.as_ref()),
            );
            // Compared before any list is built: nearly every instance keeps its tenant.
            if old != new {
                let (old, new) = (sorted(old), sorted(new));
                let kind = (Mode::Mig, Some(e.profile.as_str()));
                out.push(UnitDiff {
                    gpu: inv.index,
                    instance: Some((&e.profile, e.placement)),
                    old,
                    new,
                    old_kind: kind,
                    new_kind: kind,
                    plan_changed: kept.is_none(),
                });
            }
        }
        let known = inv.mode.is_some() || !inv.instances.is_empty();
        for i in planned {
            let exists = inv
                .instances
                .iter()
                .any(|e| e.profile == i.profile && e.placement == i.placement);
            if !exists && let Some(t) = &i.tenant {
                let kind = (Mode::Mig, Some(i.profile.as_str()));
                out.push(UnitDiff {
                    gpu: inv.index,
                    instance: Some((&i.profile, i.placement)),
                    old: vec![],
                    new: vec![t],
                    old_kind: kind,
                    new_kind: kind,
                    plan_changed: known,
                });
            }
        }
        let whole_now = inv.mode.filter(|m| *m != Mode::Mig);
        let whole_plan = spec.map(|s| s.mode).filter(|m| *m != Mode::Mig);
        let old: &[String] = if inv.mode == Some(Mode::Mig) { &[] } else { &inv.tenants };
        let new: &[String] = spec.filter(|s| s.mode != Mode::Mig).map_or(&[], |s| &s.tenants);
        // The same list in the same order is the same set: no list to build (nearly every GPU).
        if old == new {
            continue;
        }
        let (old, new) = (sorted(old), sorted(new));
        if old != new {
            let old_mode = whole_now.or(whole_plan).unwrap_or(Mode::Exclusive);
            out.push(UnitDiff {
                gpu: inv.index,
                instance: None,
                old,
                new,
                old_kind: (old_mode, None),
                new_kind: (whole_plan.unwrap_or(old_mode), None),
                plan_changed: inv.mode.is_some() && inv.mode != spec.map(|s| s.mode),
            });
        }
    }
    out
}

/// Each planned GPU's scrub policy (docs/design.md#scrub-on-change-of-hands): the strictest `scrubMemory` of
/// the tenants it serves and of every tenant it or one of its instances is taken from. A previous
/// owner that is not a valid tenant now (removed, invalid, a name nobody knows) counts as `Always`:
/// nothing says what its data needs, so the planner fails closed and the GPU is scrubbed. And a
/// scrub the agent has not applied yet is never relaxed: the current bindings come from that
/// spec, so the hand-over it announced is no longer visible here while it may still be ahead.
#[cfg(test)]
pub(crate) fn scrub_policies(node: &NodeDesired, scrub_of: &HashMap<&str, ScrubMemory>) -> Vec<ScrubMemory> {
    scrub_of_gpus(node, &unit_diffs(node), scrub_of)
}

/// [`scrub_policies`] from the node's unit diffs, computed once for this and the changes listed.
fn scrub_of_gpus(node: &NodeDesired, diffs: &[UnitDiff], scrub_of: &HashMap<&str, ScrubMemory>) -> Vec<ScrubMemory> {
    let pending = node
        .inventory
        .current
        .as_ref()
        .filter(|c| c.applied != AppliedState::Applied);
    node.gpus
        .iter()
        .map(|spec| {
            let serving = spec
                .tenants
                .iter()
                .map(String::as_str)
                .chain(spec.mig_instances.iter().filter_map(|i| i.tenant.as_deref()))
                .filter_map(|n| scrub_of.get(n).copied())
                .max()
                .unwrap_or_default();
            let outgoing = diffs
                .iter()
                .filter(|d| d.gpu == spec.index)
                .flat_map(UnitDiff::leaving)
                .map(|t| scrub_of.get(t).copied().unwrap_or(ScrubMemory::Always));
            let unapplied = pending
                .and_then(|c| c.spec.gpus.iter().find(|g| g.index == spec.index))
                .map(|g| g.scrub);
            outgoing.chain(unapplied).fold(serving, Ord::max)
        })
        .collect()
}

/// A planned GPU's memory cap policy: the strictest `memoryCaps` of the tenants it serves. A
/// tenant that is not valid now serves nothing, so counts for nothing.
fn memory_cap_policy(spec: &GpuSpec, caps_of: &HashMap<&str, MemoryCapPolicy>) -> MemoryCapPolicy {
    spec.tenants
        .iter()
        .map(String::as_str)
        .chain(spec.shares.iter().map(|s| s.tenant.as_str()))
        .filter_map(|t| caps_of.get(t).copied())
        .max()
        .unwrap_or_default()
}

/// Whether any GPU of the node has an instance or a tenant now: a node that does not adds
/// nothing to [`holdings`] now.
fn holds_now(node: &NodeDesired) -> bool {
    node.inventory
        .gpus
        .iter()
        .any(|g| !g.instances.is_empty() || !g.tenants.is_empty())
}

/// Units each tenant of `of` holds, per kind: now (`planned` false) or in the plan. Only the
/// tenants whose changes need a count: nearly every pass changes few bindings, or none.
fn holdings<'a, 'i: 'a>(
    nodes: impl IntoIterator<Item = &'a NodeDesired<'i>>,
    planned: bool,
    of: &HashSet<&str>,
) -> HashMap<(&'a str, Kind<'a>), u32> {
    let mut out: HashMap<(&str, Kind), u32> = HashMap::new();
    if of.is_empty() {
        return out;
    }
    let mut add = |t: &'a str, kind: Kind<'a>| {
        if of.contains(t) {
            *out.entry((t, kind)).or_default() += 1;
        }
    };
    for node in nodes {
        if planned {
            for spec in &node.gpus {
                for i in &spec.mig_instances {
                    if let Some(t) = &i.tenant {
                        add(t, (Mode::Mig, Some(&i.profile)));
                    }
                }
                if spec.mode != Mode::Mig {
                    for t in &spec.tenants {
                        add(t, (spec.mode, None));
                    }
                }
            }
            continue;
        }
        for gpu in &node.inventory.gpus {
            for e in &gpu.instances {
                if let Some(t) = gpu.instance_tenants.get(&e.placement) {
                    add(t, (Mode::Mig, Some(&e.profile)));
                }
            }
            if let Some(mode) = gpu.mode.filter(|m| *m != Mode::Mig) {
                for t in &gpu.tenants {
                    add(t, (mode, None));
                }
            }
        }
    }
    out
}

/// What a change's reason is read from, beside its [`BindingChange`]: the modes its units are
/// counted in now and in the plan (the profile, for an instance, is the change's own).
#[derive(Clone, Copy)]
struct ReasonFacts {
    old_mode: Mode,
    new_mode: Mode,
    plan_changed: bool,
}

/// A node's changes, listed from its unit diffs (with the scrub policies just computed), their
/// reasons still to find ([`ChangeReason::TenantAdded`] until then).
fn listed(node: &NodeDesired, diffs: &[UnitDiff], scrub: &[ScrubMemory]) -> Vec<(BindingChange, ReasonFacts)> {
    diffs
        .iter()
        .map(|d| {
            let scrubs = node
                .gpus
                .iter()
                .position(|s| s.index == d.gpu)
                .is_some_and(|g| scrub[g] != ScrubMemory::Never);
            let change = BindingChange {
                node: node.inventory.name.clone(),
                gpu: d.gpu,
                profile: d.instance.map(|(p, _)| p.to_string()),
                placement: d.instance.map(|(_, at)| at),
                reason: ChangeReason::TenantAdded,
                // Tenants joining a shared GPU whose tenants stay hand nothing over: no scrub.
                scrub: scrubs
                    && (d.instance.is_some() || gpu_changes_hands(Some(d.old_kind.0), &d.old, d.new_kind.0, &d.new)),
                may_evict: d.leaving().next().is_some(),
                old_tenants: d.old.iter().map(|t| t.to_string()).collect(),
                new_tenants: d.new.iter().map(|t| t.to_string()).collect(),
            };
            let facts = ReasonFacts {
                old_mode: d.old_kind.0,
                new_mode: d.new_kind.0,
                plan_changed: d.plan_changed,
            };
            (change, facts)
        })
        .collect()
}

/// Sets every planned GPU's scrub policy ([`scrub_policies`]; `tenants` valid, unknown previous
/// owners counting as `Always`) and returns every binding the plan changes, sorted by node, GPU
/// and placement (the GPU used whole first). Each node's units are compared once, and its changes
/// listed then, while its GPUs are in cache (a fleet planned from empty changes every unit; a
/// second walk for the reasons read it all from memory again at 50,000 nodes). A node taken back
/// from the last pass whose bindings no cell moved, none of which changed hands then, keeps its
/// scrub policies and has no change, unless the tenants' `scrubMemory` is not as then
/// (`same_scrub` false).
pub fn settle<T: Borrow<GpuTenant>>(
    nodes: &mut [NodeDesired],
    tenants: &[T],
    valid: &[TenantProfile],
    same_scrub: bool,
) -> Vec<BindingChange> {
    let scrub_of: HashMap<&str, ScrubMemory> = valid.iter().map(|t| (t.name.as_str(), t.scrub)).collect();
    let caps_of: HashMap<&str, MemoryCapPolicy> = valid.iter().map(|t| (t.name.as_str(), t.memory_caps)).collect();
    let Compared {
        per_node,
        counted,
        holding_now,
    } = compare_nodes(nodes, (&scrub_of, &caps_of), same_scrub);
    if per_node.is_empty() {
        return Vec::new();
    }
    let counted: HashSet<&str> = counted.iter().map(String::as_str).collect();
    let nodes: &[NodeDesired] = nodes;
    let reasons = Reasons {
        nodes,
        counted: &counted,
        exists: tenants.iter().map(|t| crate::api::name_of(t.borrow())).collect(),
        priority: valid.iter().map(|t| (t.name.as_str(), t.priority)).collect(),
        before: holdings(holding_now.iter().map(|&n| &nodes[n]), false, &counted),
        after: std::cell::OnceCell::new(),
    };
    let mut out = Vec::with_capacity(per_node.iter().map(Vec::len).sum());
    for (mut change, n) in per_node.into_iter().flatten() {
        change.reason = reasons.of(&change, n);
        out.push(change);
    }
    out.sort_by(|a, b| (&a.node, a.gpu, a.placement, &a.profile).cmp(&(&b.node, b.gpu, b.placement, &b.profile)));
    out
}

/// What comparing each node's units found.
struct Compared {
    /// Each changed node's changes, joined into one list at its size by the caller.
    per_node: Vec<Vec<(BindingChange, ReasonFacts)>>,
    /// Tenants whose holdings a reason counts: they leave or join a unit (see [`Reasons::of`]).
    counted: HashSet<String>,
    /// The nodes that may hold something now, for the holdings before the plan: nodes of a fleet
    /// planned from empty are not read again.
    holding_now: Vec<usize>,
}

/// Compares each node's units (but those [`settle`] keeps as they were), sets its GPUs' scrub
/// policies and whether it is changing, and lists its changes.
fn compare_nodes(
    nodes: &mut [NodeDesired],
    (scrub_of, caps_of): (&HashMap<&str, ScrubMemory>, &HashMap<&str, MemoryCapPolicy>),
    same_scrub: bool,
) -> Compared {
    let mut out = Compared {
        per_node: Vec::new(),
        counted: HashSet::new(),
        holding_now: Vec::new(),
    };
    for (n, node) in nodes.iter_mut().enumerate() {
        if node.kept && !node.recomputed && !node.changing && same_scrub {
            out.holding_now.push(n);
            continue;
        }
        if holds_now(node) {
            out.holding_now.push(n);
        }
        node.recomputed = true;
        let diffs = unit_diffs(node);
        let scrub = scrub_of_gpus(node, &diffs, scrub_of);
        let changing = !diffs.is_empty();
        if changing {
            for d in &diffs {
                for t in d.leaving().chain(d.joining()) {
                    // A copy only of names not seen yet: a fleet planned from empty changes
                    // every unit, a few tenants' each.
                    if !out.counted.contains(t) {
                        out.counted.insert(t.to_string());
                    }
                }
            }
            out.per_node.push(listed(node, &diffs, &scrub));
        }
        drop(diffs);
        node.changing = changing;
        // Written only where it differs: the node's GPU list may be shared with the last pass's.
        for (g, s) in scrub.into_iter().enumerate() {
            if node.gpus[g].scrub != s {
                node.gpus[g].scrub = s;
            }
            let caps = memory_cap_policy(&node.gpus[g], caps_of);
            if node.gpus[g].memory_caps != caps {
                node.gpus[g].memory_caps = caps;
            }
        }
    }
    out
}

/// What a change's reason is read from: which tenants exist and are valid, and what the counted
/// tenants hold before and after the plan.
struct Reasons<'a, 'i> {
    nodes: &'a [NodeDesired<'i>],
    counted: &'a HashSet<&'a str>,
    exists: HashSet<&'a str>,
    priority: HashMap<&'a str, i32>,
    before: HashMap<(&'a str, Kind<'a>), u32>,
    /// Read only for a tenant that leaves a unit: none in a fleet planned from empty.
    after: std::cell::OnceCell<HashMap<(&'a str, Kind<'a>), u32>>,
}

impl Reasons<'_, '_> {
    /// Why `c` changes: for a unit a tenant loses, why that tenant loses it; for a unit that was
    /// free, why a tenant gets it.
    fn of(&self, c: &BindingChange, n: ReasonFacts) -> ChangeReason {
        let count = |m: &HashMap<(&str, Kind), u32>, t: &str, k: Kind| m.get(&(t, k)).copied().unwrap_or(0);
        let (old, new) = (&c.old_tenants, &c.new_tenants);
        let old_kind = (n.old_mode, c.profile.as_deref());
        let new_kind = (n.new_mode, c.profile.as_deref());
        if let Some(o) = old.iter().find(|t| !new.contains(t)) {
            if !self.exists.contains(o.as_str()) {
                return ChangeReason::TenantRemoved;
            }
            let Some(&mine) = self.priority.get(o.as_str()) else {
                return ChangeReason::TenantInvalid;
            };
            if n.plan_changed {
                return ChangeReason::PlanChanged;
            }
            let after = self.after.get_or_init(|| holdings(self.nodes, true, self.counted));
            if count(after, o, old_kind) >= count(&self.before, o, old_kind) {
                return ChangeReason::Repacked;
            }
            let by = new
                .iter()
                .find(|t| self.priority.get(t.as_str()).is_some_and(|&p| p > mine));
            return match by {
                Some(by) => ChangeReason::Preempted { by: by.clone() },
                None => ChangeReason::GrantShrank,
            };
        }
        match new.iter().find(|t| !old.contains(t)) {
            _ if n.plan_changed => ChangeReason::PlanChanged,
            Some(j) if count(&self.before, j, new_kind) > 0 => ChangeReason::GrantGrew,
            _ => ChangeReason::TenantAdded,
        }
    }
}

#[cfg(test)]
mod tests;
