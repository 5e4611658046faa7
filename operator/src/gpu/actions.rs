//! What to do to the GPUs: a pure function from what NVML reports, the desired spec and the
//! previously published status to a list of actions per GPU. No NVML, no clock, no I/O.
//!
//! Rules (docs/design.md#invariants): a GPU whose state already matches gets no action; a GPU with processes
//! in the way of a change is left as it is (`Busy`); a MIG mode change pending until a reset is
//! reported (`ResetRequired`) and never retried; instances that stay are untouched; memory is
//! scrubbed when a GPU or instance changes hands.

use crate::api::GpuReason;
use crate::api::{
    GpuNodeSpec, GpuNodeStatus, GpuSpec, GpuStatus, MigInstanceStatus, MigModeStatus, Mode, Placement, ScrubMemory,
};
use crate::handover::gpu_changes_hands;
use crate::mig::{COMPUTE_SLICES, ExistingInstance, diff_placed};
use std::fmt;

/// NVML compute modes the agent sets.
pub const COMPUTE_DEFAULT: &str = "Default";
pub const COMPUTE_EXCLUSIVE_PROCESS: &str = "ExclusiveProcess";

/// Whether discovery could not read this GPU (its `message` says what failed).
pub fn unreadable(o: &GpuStatus) -> bool {
    o.reason == Some(GpuReason::Unreadable)
}

/// One step of a reconfiguration. NVML steps first, scrubs last.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    SetMigMode {
        gpu: u32,
        enable: bool,
    },
    DestroyComputeInstance {
        gpu: u32,
        gpu_instance_id: u32,
        compute_instance_id: u32,
    },
    DestroyGpuInstance {
        gpu: u32,
        gpu_instance_id: u32,
        profile: String,
        placement: Placement,
    },
    /// Creates the GPU instance and one compute instance spanning it.
    CreateInstance {
        gpu: u32,
        profile_id: u32,
        profile: String,
        placement: Placement,
    },
    /// Gives a GPU instance exactly one compute instance spanning it: finishes one left without
    /// (an interrupted run), replaces several or a partial one (made by hand).
    CreateComputeInstance {
        gpu: u32,
        gpu_instance_id: u32,
    },
    SetComputeMode {
        gpu: u32,
        mode: &'static str,
    },
    Scrub {
        gpu: u32,
        target: ScrubTarget,
        tenant: Option<String>,
    },
}

/// What a scrub clears: the whole GPU, or the MIG instance at a placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScrubTarget {
    Gpu,
    Instance(Placement),
}

impl Action {
    pub fn gpu(&self) -> u32 {
        match self {
            Action::SetMigMode { gpu, .. }
            | Action::DestroyComputeInstance { gpu, .. }
            | Action::DestroyGpuInstance { gpu, .. }
            | Action::CreateInstance { gpu, .. }
            | Action::CreateComputeInstance { gpu, .. }
            | Action::SetComputeMode { gpu, .. }
            | Action::Scrub { gpu, .. } => *gpu,
        }
    }

    pub fn is_scrub(&self) -> bool {
        matches!(self, Action::Scrub { .. })
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::SetMigMode { enable, .. } => {
                write!(f, "{} MIG mode", if *enable { "enable" } else { "disable" })
            }
            Action::DestroyComputeInstance {
                gpu_instance_id,
                compute_instance_id,
                ..
            } => {
                write!(
                    f,
                    "destroy compute instance {compute_instance_id} of GPU instance {gpu_instance_id}"
                )
            }
            Action::DestroyGpuInstance { profile, placement, .. } => write!(f, "destroy {profile} at {placement}"),
            Action::CreateInstance { profile, placement, .. } => write!(f, "create {profile} at {placement}"),
            Action::CreateComputeInstance { gpu_instance_id, .. } => {
                write!(f, "create the compute instance of GPU instance {gpu_instance_id}")
            }
            Action::SetComputeMode { mode, .. } => write!(f, "set compute mode {mode}"),
            Action::Scrub {
                target: ScrubTarget::Gpu,
                ..
            } => write!(f, "scrub GPU memory"),
            Action::Scrub {
                target: ScrubTarget::Instance(p),
                ..
            } => write!(f, "scrub instance at {p}"),
        }
    }
}

/// Why a GPU is left as it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocked {
    pub reason: GpuReason,
    pub message: String,
}

/// The decision for one GPU of the spec.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuActions {
    pub index: u32,
    pub actions: Vec<Action>,
    pub blocked: Option<Blocked>,
    /// Things found that a person may want to know (half-done work, drift), already handled.
    pub notes: Vec<String>,
}

impl GpuActions {
    pub fn nvml_actions(&self) -> impl Iterator<Item = &Action> {
        self.actions.iter().filter(|a| !a.is_scrub())
    }

    fn block(&mut self, reason: GpuReason, message: String) {
        self.actions.clear();
        self.blocked = Some(Blocked { reason, message });
    }
}

/// What earlier rounds of the same run did: later rounds must neither repeat a scrub nor forget
/// that a target was reconfigured (created, mode changed) and so needs one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunMemory {
    pub scrubbed: Vec<(u32, ScrubTarget)>,
    pub touched: Vec<(u32, ScrubTarget)>,
}

type Done<'a> = &'a RunMemory;

/// The actions of every GPU the spec names, in spec order.
pub fn node_actions(
    observed: &GpuNodeStatus,
    spec: &GpuNodeSpec,
    previous: Option<&GpuNodeStatus>,
    done: Done,
) -> Vec<GpuActions> {
    spec.gpus
        .iter()
        .map(|g| {
            let prev = previous.and_then(|p| p.gpus.iter().find(|x| x.index == g.index));
            match observed.gpus.iter().find(|o| o.index == g.index) {
                // Nothing known, nothing done: not even what "idle" or "no MIG" would allow.
                Some(o) if unreadable(o) => GpuActions {
                    index: g.index,
                    blocked: Some(Blocked {
                        reason: GpuReason::Unreadable,
                        message: o.message.clone().unwrap_or_else(|| format!("NVML cannot read GPU {}", g.index)),
                    }),
                    ..Default::default()
                },
                Some(o) => gpu_actions(o, g, prev, done),
                None => GpuActions {
                    index: g.index,
                    blocked: Some(Blocked {
                        reason: GpuReason::NotFound,
                        message: format!(
                            "spec.gpus[index={}]: this node has no GPU {} (NVML reports {} GPU{}); fix the index in the spec",
                            g.index,
                            g.index,
                            observed.gpus.len(),
                            if observed.gpus.len() == 1 { "" } else { "s" }
                        ),
                    }),
                    ..Default::default()
                },
            }
        })
        .collect()
}

fn pids(procs: impl Iterator<Item = u32>) -> String {
    procs.map(|p| p.to_string()).collect::<Vec<_>>().join(", ")
}

/// The actions of one GPU.
pub fn gpu_actions(o: &GpuStatus, g: &GpuSpec, prev: Option<&GpuStatus>, done: Done) -> GpuActions {
    let mut plan = GpuActions {
        index: g.index,
        ..Default::default()
    };
    let want_mig = g.mode == Mode::Mig;
    let Some(mig) = o.mig_mode else {
        if want_mig {
            plan.block(
                GpuReason::MigNotSupported,
                format!("GPU {} ({}) does not support MIG; choose another mode", g.index, o.name),
            );
            return plan;
        }
        return whole_gpu_actions(o, g, prev, done, plan);
    };
    if want_mig && let Err(e) = validate_layout(o, g) {
        plan.block(
            GpuReason::InvalidSpec,
            format!("spec.gpus[index={}].migInstances: {e}", g.index),
        );
        return plan;
    }
    if mig.current != want_mig || mig.pending != want_mig {
        mig_mode_actions(o, g, prev, mig, &mut plan);
        return plan;
    }
    if !want_mig {
        return whole_gpu_actions(o, g, prev, done, plan);
    }
    mig_layout_actions(o, g, prev, done, plan)
}

/// A MIG mode change: none while processes run, none until a reset NVML said this machine cannot
/// do; otherwise the instances go first (when MIG is turned off) and the mode is set. The layout
/// (or whole-GPU settings) follow once the mode is in effect: the next round.
fn mig_mode_actions(o: &GpuStatus, g: &GpuSpec, prev: Option<&GpuStatus>, mig: MigModeStatus, plan: &mut GpuActions) {
    let want_mig = g.mode == Mode::Mig;
    if !o.processes.is_empty() {
        plan.block(
            GpuReason::Busy,
            format!(
                "MIG mode must change but processes run on GPU {}: pids {}",
                g.index,
                pids(o.processes.iter().map(|p| p.pid))
            ),
        );
        return;
    }
    // Pending and idle: the call activates it, unless NVML said this machine cannot reset
    // the GPU (RESET_REQUIRED, recorded as the reason last time): then only a reboot helps,
    // and calling again would only get the same answer.
    let reset_required = prev.is_some_and(|p| p.uuid == o.uuid && p.reason == Some(GpuReason::ResetRequired));
    if mig.current != want_mig && mig.pending == want_mig && reset_required {
        plan.block(
            GpuReason::ResetRequired,
            format!(
                "MIG mode {} is pending until GPU {} is reset, which NVML says this machine does not expose (NVML_ERROR_RESET_REQUIRED): reboot the node (or its VM); not retried until then",
                if want_mig { "enable" } else { "disable" },
                g.index,
            ),
        );
        return;
    }
    if !want_mig {
        for inst in &o.instances {
            destroy_instance(&mut plan.actions, g.index, inst);
        }
    }
    plan.actions.push(Action::SetMigMode {
        gpu: g.index,
        enable: want_mig,
    });
}

/// A GPU in MIG mode as the spec wants it: instances not in the spec destroyed, missing ones
/// created, any without one compute instance spanning it given one, and the scrubs hand-overs
/// need; nothing while processes are in the way (`Busy`).
fn mig_layout_actions(
    o: &GpuStatus,
    g: &GpuSpec,
    prev: Option<&GpuStatus>,
    done: Done,
    mut plan: GpuActions,
) -> GpuActions {
    let current: Vec<ExistingInstance> = o
        .instances
        .iter()
        .map(|i| ExistingInstance {
            profile: i.profile.clone(),
            placement: i.placement,
            gpu_instance_id: Some(i.gpu_instance_id),
        })
        .collect();
    let diff = diff_placed(&current, &g.mig_instances);
    let inst_of = |e: &ExistingInstance| {
        o.instances
            .iter()
            .find(|i| Some(i.gpu_instance_id) == e.gpu_instance_id)
            .expect("diffed from these instances")
    };
    let mut busy = Vec::new();
    for e in &diff.destroy {
        destroy_surplus(o, g.index, inst_of(e), &mut plan, &mut busy);
    }
    for c in &diff.create {
        let Some(profile) = o.profiles.iter().find(|p| p.name == c.profile) else {
            unreachable!("validated")
        };
        plan.actions.push(Action::CreateInstance {
            gpu: g.index,
            profile_id: profile.id,
            profile: c.profile.clone(),
            placement: c.placement,
        });
    }
    for k in &diff.keep {
        let inst = inst_of(k);
        if inst.compute_instance_id.is_none() {
            replace_compute_instances(o, g.index, inst, &mut plan, &mut busy);
        }
    }
    let created: Vec<Placement> = diff.create.iter().map(|c| c.placement).collect();
    instance_scrubs(o, g, prev, done, &created, &mut plan.actions, &mut busy);
    if !busy.is_empty() {
        plan.block(
            GpuReason::Busy,
            format!("GPU {} left as it is: {}", g.index, busy.join("; ")),
        );
    }
    plan
}

/// Destroys an instance the spec does not have (noted), unless processes run in it (`busy`).
fn destroy_surplus(o: &GpuStatus, gpu: u32, inst: &MigInstanceStatus, plan: &mut GpuActions, busy: &mut Vec<String>) {
    let p = instance_pids(o, inst.gpu_instance_id);
    if !p.is_empty() {
        busy.push(format!(
            "{} at {} runs pids {}",
            inst.profile,
            inst.placement,
            pids(p.into_iter())
        ));
    }
    plan.notes
        .push(format!("{} at {} is not in the spec", inst.profile, inst.placement));
    destroy_instance(&mut plan.actions, gpu, inst);
}

/// Gives a GPU instance that stays one compute instance spanning it (noted), unless processes run
/// in it (`busy`).
fn replace_compute_instances(
    o: &GpuStatus,
    gpu: u32,
    inst: &MigInstanceStatus,
    plan: &mut GpuActions,
    busy: &mut Vec<String>,
) {
    plan.notes.push(format!(
        "GPU instance {} ({} at {}) has no compute instance spanning it (none, from an interrupted run, or several or a partial one, made by hand): its compute instances are replaced by one",
        inst.gpu_instance_id, inst.profile, inst.placement
    ));
    let p = instance_pids(o, inst.gpu_instance_id);
    if !p.is_empty() {
        busy.push(format!(
            "{} at {} needs its compute instances replaced but runs pids {}",
            inst.profile,
            inst.placement,
            pids(p.into_iter())
        ));
    }
    plan.actions.push(Action::CreateComputeInstance {
        gpu,
        gpu_instance_id: inst.gpu_instance_id,
    });
}

/// The scrubs a MIG GPU's instances need before their tenants get them (`created`: placements this
/// plan creates), and the processes in the way of one (`busy`).
fn instance_scrubs(
    o: &GpuStatus,
    g: &GpuSpec,
    prev: Option<&GpuStatus>,
    done: Done,
    created: &[Placement],
    actions: &mut Vec<Action>,
    busy: &mut Vec<String>,
) {
    for want in &g.mig_instances {
        let target = ScrubTarget::Instance(want.placement);
        let existing = o
            .instances
            .iter()
            .find(|i| i.placement == want.placement && i.profile == want.profile);
        let created = created.contains(&want.placement) || done.touched.contains(&(g.index, target));
        let record = prev.and_then(|p| {
            p.instances
                .iter()
                .find(|i| i.placement == want.placement && i.profile == want.profile)
        });
        // Fails closed (docs/design.md#scrub-on-change-of-hands): only a record of handing this very instance to this
        // tenant counts as the same hands. No status, a GpuNode created again, an instance
        // (re)created since the record (a reboot, a crash, a change behind the agent's back) or
        // a failed scrub: the previous owner is unknown, and that is a change of hands.
        let changed = created || !existing.is_some_and(|e| known_owner(record, e, &want.tenant));
        let needed = match g.scrub {
            ScrubMemory::Never => false,
            ScrubMemory::OnTenantChange => changed,
            ScrubMemory::Always => changed || created,
        };
        if needed && !done.scrubbed.contains(&(g.index, target)) {
            // Never under a process, even in an instance this run created: whoever got it
            // before its scrub must be gone first.
            if let Some(inst) = existing {
                let p = instance_pids(o, inst.gpu_instance_id);
                if !p.is_empty() {
                    busy.push(format!(
                        "{} at {} changes hands but runs pids {}",
                        inst.profile,
                        inst.placement,
                        pids(p.into_iter())
                    ));
                }
            }
            actions.push(Action::Scrub {
                gpu: g.index,
                target,
                tenant: want.tenant.clone(),
            });
        }
    }
}

/// Whether a scrub record proves a finished hand-over: scrubbed, or skipped by policy; not
/// failed, not missing.
pub fn handed_over(r: Option<&crate::api::ScrubRecord>) -> bool {
    r.is_some_and(|r| r.result != crate::api::ScrubResult::Failed)
}

/// Whether `record` (from the previous status) shows the instance `now` handed to `tenant`: the
/// same MIG device (UUIDs change when an instance is created again) and a finished hand-over.
pub fn known_owner(record: Option<&MigInstanceStatus>, now: &MigInstanceStatus, tenant: &Option<String>) -> bool {
    record.is_some_and(|r| {
        r.uuid.is_some() && r.uuid == now.uuid && r.tenant == *tenant && handed_over(r.last_scrub.as_ref())
    })
}

/// Whether `prev` (from the previous status) shows the GPU `o` handed whole, in `g`'s mode, to
/// `g`'s tenants, or to some of them that the others only join on a shared GPU (no change of
/// hands: [`crate::handover`]): the same GPU (UUID) and a finished hand-over.
pub fn known_gpu_owner(prev: Option<&GpuStatus>, o: &GpuStatus, g: &GpuSpec) -> bool {
    prev.is_some_and(|p| {
        p.uuid == o.uuid
            && !gpu_changes_hands(p.applied_mode, &p.applied_tenants, g.mode, &g.tenants)
            && handed_over(p.last_scrub.as_ref())
    })
}

fn destroy_instance(actions: &mut Vec<Action>, gpu: u32, inst: &MigInstanceStatus) {
    if let Some(ci) = inst.compute_instance_id {
        actions.push(Action::DestroyComputeInstance {
            gpu,
            gpu_instance_id: inst.gpu_instance_id,
            compute_instance_id: ci,
        });
    }
    actions.push(Action::DestroyGpuInstance {
        gpu,
        gpu_instance_id: inst.gpu_instance_id,
        profile: inst.profile.clone(),
        placement: inst.placement,
    });
}

/// A GPU used whole (MPS, TimeSlicing, Exclusive) with MIG off.
fn whole_gpu_actions(
    o: &GpuStatus,
    g: &GpuSpec,
    prev: Option<&GpuStatus>,
    done: Done,
    mut plan: GpuActions,
) -> GpuActions {
    let want_cm = if g.mode == Mode::Mps {
        COMPUTE_EXCLUSIVE_PROCESS
    } else {
        COMPUTE_DEFAULT
    };
    let cm_change = o.compute_mode.as_deref() != Some(want_cm);
    let reconfigured = cm_change || done.touched.contains(&(g.index, ScrubTarget::Gpu));
    // Fails closed (docs/design.md#scrub-on-change-of-hands): without a record of handing this GPU to these tenants in
    // this mode (or to some of them, that the others join), the previous owner is unknown, and
    // that is a change of hands.
    let changed = !known_gpu_owner(prev, o, g);
    let needed = match g.scrub {
        ScrubMemory::Never => false,
        ScrubMemory::OnTenantChange => changed,
        ScrubMemory::Always => changed || reconfigured,
    } && !done.scrubbed.contains(&(g.index, ScrubTarget::Gpu));
    if (cm_change || needed) && !o.processes.is_empty() {
        let what = if cm_change {
            "its compute mode must change"
        } else {
            "it changes hands"
        };
        let pids = pids(o.processes.iter().map(|p| p.pid));
        plan.block(
            GpuReason::Busy,
            format!("GPU {} left as it is: {what} but processes run: pids {pids}", g.index),
        );
        return plan;
    }
    if cm_change {
        plan.actions.push(Action::SetComputeMode {
            gpu: g.index,
            mode: want_cm,
        });
    }
    if needed {
        plan.actions.push(Action::Scrub {
            gpu: g.index,
            target: ScrubTarget::Gpu,
            tenant: g.tenants.first().cloned(),
        });
    }
    plan
}

/// Pids of the processes running in one GPU instance.
fn instance_pids(o: &GpuStatus, gpu_instance_id: u32) -> Vec<u32> {
    o.processes
        .iter()
        .filter(|p| p.gpu_instance_id == Some(gpu_instance_id))
        .map(|p| p.pid)
        .collect()
}

/// Why a spec layout does not fit the GPU; `index` and `other` are positions in `migInstances`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// `gpu`: the GPU's name; `offered`: the profiles it offers.
    #[error("[{index}] profile {profile:?} is not offered by {gpu} (it offers {})", .offered.join(", "))]
    NotOffered {
        index: usize,
        profile: String,
        gpu: String,
        offered: Vec<String>,
    },
    #[error("[{index}] {profile} cannot be placed at {placement} (allowed: {})", joined(.allowed))]
    Placement {
        index: usize,
        profile: String,
        placement: Placement,
        allowed: Vec<Placement>,
    },
    #[error("[{index}] {profile} at {placement} overlaps [{other}] {other_profile} at {other_placement}")]
    Overlap {
        index: usize,
        profile: String,
        placement: Placement,
        other: usize,
        other_profile: String,
        other_placement: Placement,
    },
    #[error("{profile} allows {max} instances per GPU, {requested} requested")]
    TooMany { profile: String, max: u32, requested: u32 },
    #[error("compute slices {slices} > {max}", max = COMPUTE_SLICES)]
    ComputeSlices { slices: u32 },
}

fn joined<T: fmt::Display>(items: &[T]) -> String {
    items.iter().map(T::to_string).collect::<Vec<_>>().join(", ")
}

/// Checks a spec layout against the profiles and placements the driver reports for this GPU.
pub fn validate_layout(o: &GpuStatus, g: &GpuSpec) -> Result<(), LayoutError> {
    let mut compute = 0;
    for (index, inst) in g.mig_instances.iter().enumerate() {
        let Some(p) = o.profiles.iter().find(|p| p.name == inst.profile) else {
            return Err(LayoutError::NotOffered {
                index,
                profile: inst.profile.clone(),
                gpu: o.name.clone(),
                offered: o.profiles.iter().map(|p| p.name.clone()).collect(),
            });
        };
        if !p.placements.contains(&inst.placement) {
            return Err(LayoutError::Placement {
                index,
                profile: inst.profile.clone(),
                placement: inst.placement,
                allowed: p.placements.clone(),
            });
        }
        for (other, o) in g.mig_instances.iter().enumerate().take(index) {
            let (a, b) = (inst.placement, o.placement);
            if a.start < b.start + b.size && b.start < a.start + a.size {
                return Err(LayoutError::Overlap {
                    index,
                    profile: inst.profile.clone(),
                    placement: a,
                    other,
                    other_profile: o.profile.clone(),
                    other_placement: b,
                });
            }
        }
        let same = g.mig_instances.iter().filter(|x| x.profile == inst.profile).count() as u32;
        if same > p.max_instances {
            return Err(LayoutError::TooMany {
                profile: inst.profile.clone(),
                max: p.max_instances,
                requested: same,
            });
        }
        compute += p.compute_slices;
    }
    if compute > COMPUTE_SLICES {
        return Err(LayoutError::ComputeSlices { slices: compute });
    }
    Ok(())
}
