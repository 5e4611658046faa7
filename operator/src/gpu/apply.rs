//! One apply: observe, plan, act, repeat until nothing is left to do, then publish.
//!
//! Each round re-reads the GPUs and plans from scratch, so the loop is level-triggered: whatever
//! a killed run left half-done is simply the state the next round starts from. A round executes
//! each GPU's NVML actions, or, once a GPU's hardware matches, its scrubs (they need the final
//! instance UUIDs). A MIG mode change takes one round, the layout the next, scrubs the one after.

use super::actions::{Action, GpuActions, RunMemory, ScrubTarget, node_actions};
use super::backend::{DiscoverError, Gpus};
use super::mps::{self, MpsConfig};
use super::scrub::ScrubError;
use super::status::{self, RunRecord};
use crate::api::GpuReason;
use crate::api::{GpuNodeSpec, GpuNodeStatus, Placement, ScrubRecord};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Rounds before giving up on convergence (mode, layout, scrubs, and a spare).
const MAX_ROUNDS: usize = 5;

#[derive(Clone, Debug, Default)]
pub struct ApplyOptions {
    /// MPS daemon supervision; `None` leaves any daemon alone.
    pub mps: Option<MpsConfig>,
    /// Plan only: report what would be done, change nothing.
    pub dry_run: bool,
}

/// The outcome: the status to publish and the plan actions carried out.
pub struct Applied {
    pub status: GpuNodeStatus,
    pub executed: usize,
    /// Scrubs and MIG changes, for the agent's metrics.
    pub events: Vec<status::GpuEvent>,
}

/// Why a scrub action did not clear its target.
#[derive(Debug, thiserror::Error)]
enum ScrubStepError {
    #[error("GPU {gpu} is gone")]
    GpuGone { gpu: u32 },
    #[error("the instance at {placement} has no MIG device UUID yet")]
    NoDeviceUuid { placement: Placement },
    #[error(transparent)]
    Scrub(#[from] ScrubError),
}

/// Makes the GPUs match `spec`, remembering hands and scrubs through `prev` (the status last
/// published, or `None` when unknown). Fails only when the GPUs cannot be read at all; what an
/// action or a scrub hits is in the status of its GPU.
pub fn apply<G: Gpus + ?Sized>(
    gpus: &G,
    spec: &GpuNodeSpec,
    prev: Option<&GpuNodeStatus>,
    opts: &ApplyOptions,
) -> Result<Applied, DiscoverError> {
    let mut run = RunRecord::default();
    let mut done = RunMemory::default();
    let mut executed = 0;
    let mut round = 0;
    let (observed, plans) = loop {
        round += 1;
        let observed = gpus.discover()?;
        if round == 1 {
            run.drift = status::drift(&observed, spec, prev);
        }
        let plans = node_actions(&observed, spec, prev, &done);
        for p in &plans {
            if !p.notes.is_empty() {
                run.notes.entry(p.index).or_insert_with(|| p.notes.clone());
            }
        }
        if opts.dry_run || round > MAX_ROUNDS {
            break (observed, plans);
        }
        let mut progress = false;
        for plan in &plans {
            if run.errors.contains_key(&plan.index) || plan.blocked.is_some() {
                continue;
            }
            progress |= step(gpus, &observed, plan, &mut run, &mut done, &mut executed);
        }
        if !progress {
            break (observed, plans);
        }
    };
    let mps = match &opts.mps {
        Some(cfg) if !opts.dry_run => {
            let d = mps::desired(spec, &observed);
            let st = mps::ensure(cfg, &d, prev.and_then(|p| p.mps.as_ref()), &observed);
            for (index, why) in mps::not_ready(spec, &observed, &d, &st) {
                run.errors.entry(index).or_insert((GpuReason::MpsPending, why));
            }
            Some(st)
        }
        _ => prev.and_then(|p| p.mps.clone()),
    };
    let now = Time(jiff::Timestamp::now());
    let mut status = status::build(&observed, spec, prev, &plans, &run, mps, &now);
    status.observed_generation = prev.and_then(|p| p.observed_generation);
    Ok(Applied {
        status,
        executed,
        events: run.events,
    })
}

/// Carries out one GPU's NVML actions, or its scrubs when no NVML action is left. Returns whether
/// anything was done. Stops the GPU at its first error.
fn step<G: Gpus + ?Sized>(
    gpus: &G,
    observed: &GpuNodeStatus,
    plan: &GpuActions,
    run: &mut RunRecord,
    done: &mut RunMemory,
    executed: &mut usize,
) -> bool {
    let nvml: Vec<&Action> = plan.nvml_actions().collect();
    let todo: Vec<&Action> = if nvml.is_empty() {
        plan.actions.iter().collect()
    } else {
        nvml
    };
    let mut any = false;
    for a in todo {
        any = true;
        let result = match a {
            Action::Scrub { gpu, target, tenant } => {
                let started = std::time::Instant::now();
                let r = scrub_one(gpus, observed, *gpu, *target, tenant.clone());
                run.events.push(status::GpuEvent::Scrub {
                    gpu: *gpu,
                    ok: r.is_ok(),
                    seconds: started.elapsed().as_secs_f64(),
                });
                match r {
                    Ok(rec) => {
                        run.scrubs.push((*gpu, *target, rec));
                        done.scrubbed.push((*gpu, *target));
                        Ok(())
                    }
                    Err(e) => {
                        let rec = ScrubRecord {
                            time: jiff::Timestamp::now().to_string(),
                            result: crate::api::ScrubResult::Failed,
                            tenant: tenant.clone(),
                            bytes_cleared: None,
                        };
                        run.scrubs.push((*gpu, *target, rec));
                        Err((GpuReason::ScrubFailed, format!("{a} failed: {e}")))
                    }
                }
            }
            _ => gpus.execute(a).map_err(|e| match e.reason {
                GpuReason::Failed => (GpuReason::Failed, format!("{a} failed: {e}")),
                reason => (reason, e.message),
            }),
        };
        match result {
            Ok(()) => {
                if let Some(t) = touched(observed, a) {
                    done.touched.push((plan.index, t));
                }
                *executed += 1;
                run.executed.entry(plan.index).or_default().push(a.to_string());
                if let Some((gpu, change)) = status::MigChange::of(a) {
                    run.events.push(status::GpuEvent::Mig { gpu, change });
                }
            }
            Err((reason, message)) => {
                run.errors.insert(plan.index, (reason, message));
                break;
            }
        }
    }
    any
}

/// The scrub target an action reconfigures, if any.
fn touched(observed: &GpuNodeStatus, a: &Action) -> Option<ScrubTarget> {
    match a {
        Action::CreateInstance { placement, .. } => Some(ScrubTarget::Instance(*placement)),
        Action::CreateComputeInstance { gpu, gpu_instance_id } => observed
            .gpus
            .iter()
            .find(|g| g.index == *gpu)
            .and_then(|g| g.instances.iter().find(|i| i.gpu_instance_id == *gpu_instance_id))
            .map(|i| ScrubTarget::Instance(i.placement)),
        Action::SetMigMode { .. } | Action::SetComputeMode { .. } => Some(ScrubTarget::Gpu),
        _ => None,
    }
}

fn scrub_one<G: Gpus + ?Sized>(
    gpus: &G,
    observed: &GpuNodeStatus,
    gpu: u32,
    target: ScrubTarget,
    tenant: Option<String>,
) -> Result<ScrubRecord, ScrubStepError> {
    let g = observed
        .gpus
        .iter()
        .find(|g| g.index == gpu)
        .ok_or(ScrubStepError::GpuGone { gpu })?;
    let device = match target {
        ScrubTarget::Gpu => g.uuid.clone(),
        ScrubTarget::Instance(p) => g
            .instances
            .iter()
            .find(|i| i.placement == p)
            .and_then(|i| i.uuid.clone())
            .ok_or(ScrubStepError::NoDeviceUuid { placement: p })?,
    };
    let report = gpus.scrub(&device)?;
    Ok(ScrubRecord {
        time: jiff::Timestamp::now().to_string(),
        result: crate::api::ScrubResult::Scrubbed,
        tenant,
        bytes_cleared: Some(report.bytes_cleared),
    })
}
