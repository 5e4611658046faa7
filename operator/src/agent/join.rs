//! The GpuNode of a node joining: read, or created with the GPUs the agent found declared where
//! they hold nothing, so the controller plans the node without waiting for a first status
//! ([`crate::api::FOUND_GPUS_ANNOTATION`] says why, and when a declaration is safe to plan from).
//!
//! A declared node's first status waits for the spec planned from the declaration. A poll before
//! it reads the GPUs and publishes at once if they are no longer as declared (a process or MIG
//! instance appeared, a read failed: the controller must plan from what runs), and otherwise only
//! once [`SPEC_PATIENCE_POLLS`] polls have passed without a spec (no controller, or one that
//! cannot write this node's spec: the node still shows its GPUs). The controller writes a spec to
//! every GpuNode it plans, a node no plan selects included (its device-plugin config says
//! "unplanned"), so a running controller always ends the wait.
//!
//! Why not publish at the first poll: while a fleet joins, the controller's pass that writes the
//! specs can outlast a poll, and each status published before the spec is one more write of the
//! whole object, and makes the spec land on an object with a status, the dearer write
//! (docs/decisions/joining-node-declares-gpus.md).

use super::options::Options;
use super::pass_error::PassError;
use crate::api::{FOUND_GPUS_ANNOTATION, GpuNode, GpuNodeSpec, GpuNodeStatus};
use crate::gpu::Gpus;
use crate::gpu::apply::{ApplyOptions, apply};
use kube::api::{Api, PostParams};
use std::sync::Arc;

/// This node's GpuNode as a pass starts from it.
pub(super) enum Joined {
    /// Read, or created without a declaration: the pass applies its spec and publishes.
    Read(GpuNode),
    /// Created with the GPUs found declared: nothing to apply or publish until its spec.
    Declared(GpuNode),
}

/// Reads this node's GpuNode, creating it if missing, with the GPUs found declared where they
/// hold nothing.
pub(super) async fn read_or_create<G: Gpus + 'static>(
    api: &Api<GpuNode>,
    gpus: &Arc<G>,
    opts: &Options,
) -> Result<Joined, PassError> {
    let read = |source| PassError::Read {
        node: opts.node.clone(),
        source,
    };
    if let Some(n) = api.get_opt(&opts.node).await.map_err(read)? {
        return Ok(Joined::Read(n));
    }
    let found = declarable_gpus(gpus).await;
    let mut new = GpuNode::new(&opts.node, GpuNodeSpec::default());
    if let Some(found) = &found {
        // Serialising a status cannot fail (plain data, string keys); were it to, the node would
        // only go undeclared.
        if let Ok(text) = serde_json::to_string(found) {
            new.metadata.annotations = Some([(FOUND_GPUS_ANNOTATION.to_string(), text)].into());
        }
    }
    let declared = new.metadata.annotations.is_some();
    match api.create(&PostParams::default(), &new).await {
        Ok(n) if declared => Ok(Joined::Declared(n)),
        Ok(n) => Ok(Joined::Read(n)),
        // Created meanwhile (an earlier life of this agent, racing): read as it is.
        Err(kube::Error::Api(e)) if e.code == 409 => api.get(&opts.node).await.map(Joined::Read).map_err(read),
        Err(source) => Err(PassError::Create {
            node: opts.node.clone(),
            source,
        }),
    }
}

/// How many polls a declared node's first status waits for its spec while its GPUs stay as
/// declared: 5 minutes at the default 30 s poll.
pub(super) const SPEC_PATIENCE_POLLS: u32 = 10;

/// Whether the GPUs still hold nothing and read as `node` declares them: `false` where they do not,
/// where NVML cannot be read, or where `node` declares nothing readable.
pub(super) async fn still_as_declared<G: Gpus + 'static>(gpus: &Arc<G>, node: &GpuNode) -> bool {
    let Some(declared) = node.found_gpus() else {
        return false;
    };
    declarable_gpus(gpus).await.is_some_and(|found| found == declared)
}

/// The facts of the GPUs found, where they may be declared ([`GpuNodeStatus::declarable`]); `None`
/// where not, or where NVML could not be read (the pass reports that).
async fn declarable_gpus<G: Gpus + 'static>(gpus: &Arc<G>) -> Option<GpuNodeStatus> {
    let g = gpus.clone();
    let read = tokio::task::spawn_blocking(move || {
        // A dry run of an empty spec: reads the GPUs, changes nothing.
        let opts = ApplyOptions {
            mps: None,
            dry_run: true,
        };
        apply(&*g, &GpuNodeSpec::default(), None, &opts)
    });
    let mut found = read.await.ok()?.ok()?.status;
    // As the first status will publish them, so both give the planner the same tables.
    found.share_profiles(&[]);
    found.declarable().then(|| found.facts())
}
