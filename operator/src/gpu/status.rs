//! The status an apply publishes: what NVML reports now, plus what the agent remembers (tenants
//! last handed each GPU or instance, last scrub) and whether each GPU matches its spec. Pure.

use super::actions::{Action, GpuActions, ScrubTarget, handed_over, unreadable};
use crate::api::GpuReason;
use crate::api::{
    ConditionSet, GpuNodeSpec, GpuNodeStatus, GpuSpec, GpuStatus, MpsDaemonStatus, ScrubMemory, ScrubRecord,
    set_condition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::BTreeMap;

/// What happened during one apply, per GPU.
#[derive(Clone, Debug, Default)]
pub struct RunRecord {
    /// Actions carried out, in order.
    pub executed: BTreeMap<u32, Vec<String>>,
    /// The first error; the GPU was left alone after it.
    pub errors: BTreeMap<u32, (GpuReason, String)>,
    pub scrubs: Vec<(u32, ScrubTarget, ScrubRecord)>,
    /// Findings worth telling (drift, half-done work), from the first plan that saw them.
    pub notes: BTreeMap<u32, Vec<String>>,
    /// GPUs found changed behind the agent's back, from the first observation (see [`drift`]).
    pub drift: BTreeMap<u32, String>,
    /// What the agent's metrics count, in order.
    pub events: Vec<GpuEvent>,
}

/// Something an apply did that the agent's metrics count.
#[derive(Clone, Debug, PartialEq)]
pub enum GpuEvent {
    /// A scrub of a GPU or of one of its MIG instances, and how long it took.
    Scrub { gpu: u32, ok: bool, seconds: f64 },
    /// A MIG change carried out.
    Mig { gpu: u32, change: MigChange },
}

/// The `change` label of `gpu_tenancy_mig_changes_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MigChange {
    CreateInstance,
    DestroyInstance,
    MigMode,
}

impl MigChange {
    pub fn as_str(self) -> &'static str {
        match self {
            MigChange::CreateInstance => "create_instance",
            MigChange::DestroyInstance => "destroy_instance",
            MigChange::MigMode => "mig_mode",
        }
    }

    /// The change an action makes, if it is one of those counted.
    pub fn of(action: &Action) -> Option<(u32, MigChange)> {
        match action {
            Action::CreateInstance { gpu, .. } => Some((*gpu, MigChange::CreateInstance)),
            Action::DestroyGpuInstance { gpu, .. } => Some((*gpu, MigChange::DestroyInstance)),
            Action::SetMigMode { gpu, .. } => Some((*gpu, MigChange::MigMode)),
            _ => None,
        }
    }
}

/// A GPU's MIG state as comparable data: mode on, and (profile, placement) of each instance.
fn mig_state(
    mig_on: bool,
    instances: impl Iterator<Item = (String, crate::api::Placement)>,
) -> (bool, Vec<(String, crate::api::Placement)>) {
    let mut v: Vec<_> = instances.collect();
    v.sort_by_key(|(_, p)| *p);
    (mig_on, v)
}

fn describe(state: &(bool, Vec<(String, crate::api::Placement)>)) -> String {
    match state {
        (false, _) => "MIG off".into(),
        (true, v) if v.is_empty() => "MIG on, no instances".into(),
        (true, v) => v
            .iter()
            .map(|(p, at)| format!("{p}@{at}"))
            .collect::<Vec<_>>()
            .join(" "),
    }
}

/// GPUs whose hardware no longer matches what the agent last applied, although their spec is the
/// same (a reboot, or someone with nvidia-smi): GPU index → what was expected and what was found.
/// Pure; compares the first observation of an apply with the previous status.
pub fn drift(observed: &GpuNodeStatus, spec: &GpuNodeSpec, prev: Option<&GpuNodeStatus>) -> BTreeMap<u32, String> {
    let mut out = BTreeMap::new();
    let Some(prev) = prev else { return out };
    for g in &spec.gpus {
        let (Some(before), Some(now)) = (
            prev.gpus.iter().find(|p| p.index == g.index && p.applied == Some(true)),
            observed.gpus.iter().find(|o| o.index == g.index && !unreadable(o)),
        ) else {
            continue;
        };
        let wanted = mig_state(
            g.mode == crate::api::Mode::Mig,
            g.mig_instances.iter().map(|i| (i.profile.clone(), i.placement)),
        );
        let applied = mig_state(
            before.mig_mode.is_some_and(|m| m.current),
            before.instances.iter().map(|i| (i.profile.clone(), i.placement)),
        );
        if applied != wanted {
            continue; // the spec changed since: a reconfiguration, not drift
        }
        let found = mig_state(
            now.mig_mode.is_some_and(|m| m.current),
            now.instances.iter().map(|i| (i.profile.clone(), i.placement)),
        );
        if found != wanted {
            out.insert(
                g.index,
                format!(
                    "GPU {}: applied {}, found {}",
                    g.index,
                    describe(&wanted),
                    describe(&found)
                ),
            );
        }
    }
    out
}

/// Builds the status to publish from the final observation and the final actions (which are
/// empty for every GPU that matches its spec).
pub fn build(
    observed: &GpuNodeStatus,
    spec: &GpuNodeSpec,
    prev: Option<&GpuNodeStatus>,
    plans: &[GpuActions],
    run: &RunRecord,
    mps: Option<MpsDaemonStatus>,
    now: &Time,
) -> GpuNodeStatus {
    let stamp = now.0.to_string();
    let mut out = observed.clone();
    for o in &mut out.gpus {
        let prev_g = prev.and_then(|p| p.gpus.iter().find(|g| g.index == o.index));
        publish_gpu(o, spec, prev_g, plans, run, &stamp);
    }
    // GPUs in the spec that NVML does not report still get a line saying so.
    for plan in plans {
        if !out.gpus.iter().any(|g| g.index == plan.index)
            && let Some(b) = &plan.blocked
        {
            out.gpus.push(crate::api::GpuStatus {
                index: plan.index,
                applied: Some(false),
                reason: Some(b.reason),
                message: Some(b.message.clone()),
                ..Default::default()
            });
        }
    }
    out.layout = Some(layout_summary(&out));
    out.gpu_layout = Some(gpu_layout_line(&out));
    out.mps = mps;
    out.conditions = prev.map(|p| p.conditions.clone()).unwrap_or_default();
    set_conditions(&mut out, run, now);
    out
}

/// One GPU's line: what the agent remembers of it (`prev`: its line last published) and, when the
/// spec names it, how it stands against the spec after this run.
fn publish_gpu(
    o: &mut GpuStatus,
    spec: &GpuNodeSpec,
    prev: Option<&GpuStatus>,
    plans: &[GpuActions],
    run: &RunRecord,
    stamp: &str,
) {
    if unreadable(o) {
        last_known(o, prev);
    } else {
        carry(o, prev);
    }
    let Some(g) = spec.gpus.iter().find(|g| g.index == o.index) else {
        return;
    };
    let plan = plans.iter().find(|p| p.index == o.index);
    settle(o, g, plan, run, stamp);
    // What the last change did stays readable until the next one, so an apply with
    // nothing to do publishes nothing new (docs/design.md#level-triggered-idempotent-crash-safe: no write without a change).
    if o.applied == Some(true)
        && !run.executed.contains_key(&o.index)
        && !run.notes.contains_key(&o.index)
        && let Some(p) = prev.filter(|p| p.uuid == o.uuid && p.applied == Some(true))
    {
        o.message = p.message.clone();
    }
}

/// The node's conditions from its GPUs' lines: Ready, Stalled (a spec to fix), Drifted (changed
/// behind the agent's back) and Reconciling (waiting on busy GPUs, a reset or a retry).
fn set_conditions(out: &mut GpuNodeStatus, run: &RunRecord, now: &Time) {
    let generation = out.observed_generation;
    let mut set = |type_: &str, status: bool, reason: &str, message: String| {
        set_condition(&mut out.conditions, type_, status, reason, message, generation, now)
    };
    let not_applied: Vec<&GpuStatus> = out.gpus.iter().filter(|g| g.applied == Some(false)).collect();
    if not_applied.is_empty() {
        set(
            ConditionSet::READY,
            true,
            "Applied",
            "every GPU in the spec matches it".into(),
        );
    } else {
        let msg = format!("not applied: {}", listed(&not_applied));
        set(ConditionSet::READY, false, "NotApplied", msg);
    }
    let stalled: Vec<&GpuStatus> = not_applied
        .iter()
        .copied()
        .filter(|g| g.reason.is_some_and(GpuReason::stalls))
        .collect();
    if stalled.is_empty() {
        set(ConditionSet::STALLED, false, "NoProblems", String::new());
    } else {
        let msg = format!("the spec needs a fix: {}", listed(&stalled));
        set(ConditionSet::STALLED, true, "InvalidSpec", msg);
    }
    let (drifted, reason, msg) = drift_condition(run, &out.gpus);
    set("Drifted", drifted, reason, msg);
    // Which GPUs wait and on what (the busy pids, a reset): the one line `kubectl get` shows.
    let waiting_on: Vec<String> = not_applied
        .iter()
        .filter(|g| !stalled.iter().any(|s| s.index == g.index))
        .map(|g| {
            format!(
                "GPU {} ({}): {}",
                g.index,
                g.reason.map_or("NotApplied", GpuReason::as_str),
                g.message.as_deref().unwrap_or("not applied yet")
            )
        })
        .collect();
    let waiting = !waiting_on.is_empty();
    let msg = if waiting {
        format!("waiting for busy GPUs, a reset or a retry: {}", waiting_on.join("; "))
    } else {
        String::new()
    };
    set(
        ConditionSet::RECONCILING,
        waiting,
        if waiting { "Waiting" } else { "Idle" },
        msg,
    );
}

/// `GPU 0 (Busy), GPU 2 (NotApplied)`.
fn listed(gs: &[&GpuStatus]) -> String {
    gs.iter()
        .map(|g| format!("GPU {} ({})", g.index, g.reason.map_or("NotApplied", GpuReason::as_str)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The Drifted condition's status, reason and message: the drift this run found (see [`drift`])
/// and whether every drifted GPU is applied again.
fn drift_condition(run: &RunRecord, gpus: &[GpuStatus]) -> (bool, &'static str, String) {
    if run.drift.is_empty() {
        return (false, "NoDrift", String::new());
    }
    let drifted: Vec<String> = run.drift.values().cloned().collect();
    let repaired = run
        .drift
        .keys()
        .all(|i| gpus.iter().any(|g| g.index == *i && g.applied == Some(true)));
    (
        true,
        if repaired { "Repaired" } else { "Found" },
        format!(
            "changed outside the agent (reboot or manual change): {}",
            drifted.join("; ")
        ),
    )
}

/// Keeps what only the agent knows from the previous status: for the same GPU (UUID) its last
/// applied mode, tenants and scrub, and for the same MIG devices (UUID) their tenant and scrub. A
/// GPU or instance that is not the one recorded starts with no record: an unknown owner.
fn carry(o: &mut GpuStatus, prev: Option<&GpuStatus>) {
    let Some(p) = prev.filter(|p| p.uuid == o.uuid) else {
        return;
    };
    o.applied_mode = p.applied_mode;
    o.applied_tenants = p.applied_tenants.clone();
    o.last_scrub = p.last_scrub.clone();
    for inst in &mut o.instances {
        if let Some(pi) = p.instances.iter().find(|x| {
            x.placement == inst.placement && x.profile == inst.profile && x.uuid.is_some() && x.uuid == inst.uuid
        }) {
            inst.tenant = pi.tenant.clone();
            inst.last_scrub = pi.last_scrub.clone();
        }
    }
}

/// A GPU NVML cannot read keeps its last published record (hardware as last seen, tenants,
/// scrubs), marked unreadable: forgetting it would make the next readable apply see an unknown
/// owner, and the planner would lose the bindings it keeps.
fn last_known(o: &mut GpuStatus, prev: Option<&GpuStatus>) {
    let Some(p) = prev else { return };
    let (reason, message) = (o.reason.take(), o.message.take());
    *o = GpuStatus {
        reason,
        message,
        applied: None,
        ..p.clone()
    };
}

/// Where a GPU of the spec stands after this run: its scrubs recorded, its hands passed on where
/// they were handed over, applied or the reason it is not, and the message saying what was done.
fn settle(o: &mut GpuStatus, g: &GpuSpec, plan: Option<&GpuActions>, run: &RunRecord, stamp: &str) {
    let error = run.errors.get(&g.index);
    record_scrubs(o, g.index, run);
    let blocked = plan.and_then(|p| p.blocked.as_ref());
    let pending: Vec<&Action> = plan.map(|p| p.actions.iter().collect()).unwrap_or_default();
    if blocked.is_none() && error.is_none() {
        hand_over_instances(o, g, &pending, stamp);
    }
    let applied = error.is_none() && blocked.is_none() && pending.is_empty();
    o.applied = Some(applied);
    let mut message: Vec<String> = run.notes.get(&g.index).cloned().unwrap_or_default();
    if let Some(done) = run.executed.get(&g.index) {
        message.push(format!("done: {}", done.join(", ")));
    }
    if applied {
        hand_over_gpu(o, g, stamp);
    } else if let Some((reason, e)) = error {
        o.reason = Some(*reason);
        message.push(e.clone());
    } else if let Some(b) = blocked {
        o.reason = Some(b.reason);
        message.push(b.message.clone());
    } else {
        let (reason, still_to_do) = pending_reason(&pending);
        o.reason = Some(reason);
        message.push(still_to_do);
    }
    o.message = (!message.is_empty()).then(|| message.join("; "));
}

/// The scrubs this run did on GPU `index`, as the last scrub of the GPU or of its instance.
fn record_scrubs(o: &mut GpuStatus, index: u32, run: &RunRecord) {
    for (_, target, rec) in run.scrubs.iter().filter(|s| s.0 == index) {
        match target {
            ScrubTarget::Gpu => o.last_scrub = Some(rec.clone()),
            ScrubTarget::Instance(p) => {
                if let Some(i) = o.instances.iter_mut().find(|i| i.placement == *p) {
                    i.last_scrub = Some(rec.clone());
                }
            }
        }
    }
}

/// Each instance of the spec with no scrub still owed goes to its tenant (a scrub policy of Never
/// records the hand-over as skipped).
fn hand_over_instances(o: &mut GpuStatus, g: &GpuSpec, pending: &[&Action], stamp: &str) {
    for want in &g.mig_instances {
        let scrub_pending = pending
            .iter()
            .any(|a| matches!(a, Action::Scrub { target: ScrubTarget::Instance(p), .. } if *p == want.placement));
        let Some(inst) = o
            .instances
            .iter_mut()
            .find(|i| i.placement == want.placement && i.profile == want.profile)
        else {
            continue;
        };
        if scrub_pending {
            continue;
        }
        if g.scrub == ScrubMemory::Never && !(inst.tenant == want.tenant && handed_over(inst.last_scrub.as_ref())) {
            inst.last_scrub = skipped(stamp, want.tenant.as_ref());
        }
        inst.tenant = want.tenant.clone();
    }
}

/// An applied GPU is handed to the spec's tenants in the spec's mode (a whole GPU under a scrub
/// policy of Never that changes hands records the hand-over as skipped).
fn hand_over_gpu(o: &mut GpuStatus, g: &GpuSpec, stamp: &str) {
    let owner_changed = crate::handover::gpu_changes_hands(o.applied_mode, &o.applied_tenants, g.mode, &g.tenants)
        || !handed_over(o.last_scrub.as_ref());
    if g.mode != crate::api::Mode::Mig && g.scrub == ScrubMemory::Never && owner_changed {
        o.last_scrub = skipped(stamp, g.tenants.first());
    }
    o.applied_mode = Some(g.mode);
    o.applied_tenants = g.tenants.clone();
    o.reason = None;
}

/// A scrub skipped by policy at `stamp`, for `tenant`.
fn skipped(stamp: &str, tenant: Option<&String>) -> Option<ScrubRecord> {
    Some(ScrubRecord {
        time: stamp.to_string(),
        result: crate::api::ScrubResult::Skipped,
        tenant: tenant.cloned(),
        bytes_cleared: None,
    })
}

/// Why a GPU with actions left and nothing in their way is not applied, and the line listing them.
/// A scrub still owed means a hand-over not done: say so, so that whoever admits pods to this GPU
/// keeps the new tenant off it (docs/operations/agent.md).
fn pending_reason(pending: &[&Action]) -> (GpuReason, String) {
    let scrub_owed = pending.iter().any(|a| a.is_scrub());
    let todo: Vec<String> = pending.iter().map(|a| a.to_string()).collect();
    let (reason, what) = if scrub_owed {
        (GpuReason::ScrubPending, "not handed over before its scrub; still to do")
    } else {
        (GpuReason::Pending, "still to do")
    };
    (reason, format!("{what}: {}", todo.join(", ")))
}

/// What one GPU runs, for the layout lines: its MIG instances (`3g.40gb+2g.20gb`, as placed),
/// `MIG(empty)`, its applied mode, or `-`.
fn gpu_layout(g: &GpuStatus) -> String {
    if g.mig_mode.is_some_and(|m| m.current) {
        if g.instances.is_empty() {
            "MIG(empty)".to_string()
        } else {
            g.instances
                .iter()
                .map(|i| i.profile.as_str())
                .collect::<Vec<_>>()
                .join("+")
        }
    } else {
        g.applied_mode.map_or_else(|| "-".into(), |m| m.to_string())
    }
}

/// `0:3g.40gb+2g.20gb 1:MPS 2:-`: per GPU its MIG instances or applied mode (`status.gpuLayout`,
/// `kubectl get -o wide`). Over 250 characters on an 8-GPU node of small instances.
pub fn gpu_layout_line(status: &GpuNodeStatus) -> String {
    status
        .gpus
        .iter()
        .map(|g| format!("{}:{}", g.index, gpu_layout(g)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `4×[3g.40gb+2×2g.20gb] 2×[7×1g.10gb] 2×Exclusive`: the node's GPUs grouped by what they run
/// (`status.layout`, the `kubectl get gpunodes` column), so it stays short at any GPU count.
/// Within a MIG GPU equal profiles are counted, largest first (a summary, not the placement:
/// that is `gpu_layout_line`); groups keep the order of their first GPU; no `1×`.
pub fn layout_summary(status: &GpuNodeStatus) -> String {
    let mut groups: Vec<(String, usize)> = Vec::new();
    for g in &status.gpus {
        let what = if g.mig_mode.is_some_and(|m| m.current) && !g.instances.is_empty() {
            format!("[{}]", counted_profiles(g))
        } else {
            gpu_layout(g)
        };
        match groups.iter_mut().find(|(w, _)| *w == what) {
            Some((_, n)) => *n += 1,
            None => groups.push((what, 1)),
        }
    }
    groups
        .iter()
        .map(|(what, n)| if *n == 1 { what.clone() } else { format!("{n}×{what}") })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `3g.40gb+2×2g.20gb`: a MIG GPU's instances counted by profile, more compute slices first
/// (`3g` before `2g`; the name breaks ties), so GPUs cut alike read alike whatever the order
/// their instances were placed in.
fn counted_profiles(g: &GpuStatus) -> String {
    counted_profile_names(g.instances.iter().map(|i| i.profile.as_str()))
}

/// `3g.40gb+2×2g.20gb` from a GPU's instance profiles, in any order: the form of
/// [`layout_summary`], also what `gpu-tenancy plan` prints per GPU of a spec.
pub fn counted_profile_names<'a>(profiles: impl IntoIterator<Item = &'a str>) -> String {
    let mut counts: BTreeMap<(std::cmp::Reverse<u32>, &str), usize> = BTreeMap::new();
    for profile in profiles {
        let slices = profile.split('g').next().and_then(|n| n.parse().ok()).unwrap_or(0);
        *counts.entry((std::cmp::Reverse(slices), profile)).or_default() += 1;
    }
    counts
        .iter()
        .map(|((_, p), n)| if *n == 1 { (*p).to_string() } else { format!("{n}×{p}") })
        .collect::<Vec<_>>()
        .join("+")
}
