//! The one writer: makes a pass's writes against the API server, in order, and publishes its events.
//! A failed write does not stop the others (each object stands alone); the pass reports how many
//! failed and the loop retries with backoff.

use super::diff::{Kind, Note, Write};
use super::metrics::Metrics;
use crate::runtime::client::apply_params;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use std::sync::Arc;

/// Field manager of everything the controller writes.
pub const FIELD_MANAGER: &str = "gpu-tenancy-controller";

/// Writes of one stage in flight at once, by default (`--writes-in-flight`): enough to hide the
/// round trip, few enough that a fleet's first pass does not crowd out the agents (the API
/// server's default limit for mutating requests in flight is 200, shared by every client).
pub const WRITES_IN_FLIGHT: usize = 8;

/// Makes writes and publishes events.
pub struct Writer {
    client: Client,
    recorder: Recorder,
    /// Writes of one stage in flight at once (at least 1).
    in_flight: usize,
    /// Where each write is counted as soon as it is made: a pass of thousands of writes takes
    /// seconds, and `objects_written_total` moves while it lasts, not after.
    metrics: Option<Arc<Metrics>>,
}

/// What a batch of writes did.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Writes that failed or were held back, each with why, in the order of the writes.
    pub failed: Vec<Failure>,
}

/// Why a write of a pass was not made.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// Held back: a node label naming a device-plugin config that was not written would make the
    /// plugin fall back to its default sharing, so the nodes stay as they are until it is in.
    #[error("not sent: the device plugin's ConfigMap could not be written in this pass")]
    ConfigNotWritten,
    /// Held back: a GpuNode spec may hand a GPU over, so it waits for its node's scrub-pending
    /// taint.
    #[error("not sent: Node {node}'s labels and taints could not be written in this pass")]
    NodeNotWritten { node: String },
    /// Sent, and the API server refused it or could not be reached.
    #[error("{0}")]
    Failed(#[from] kube::Error),
}

impl WriteError {
    /// Not sent because a write it depends on failed (the next pass retries both).
    pub fn held_back(&self) -> bool {
        !matches!(self, WriteError::Failed(_))
    }
}

/// A write of a pass that was not made: which, and why.
#[derive(Debug, thiserror::Error)]
#[error("{write}: {error}")]
pub struct Failure {
    /// Its place in the pass's writes.
    pub index: usize,
    pub kind: Kind,
    /// The write as the logs name it (`action Kind name`).
    pub write: String,
    pub error: WriteError,
}

impl Failure {
    fn of(index: usize, w: &Write, error: WriteError) -> Failure {
        Failure {
            index,
            kind: w.kind(),
            write: w.to_string(),
            error,
        }
    }
}

/// What earlier writes of a pass decide about later ones.
#[derive(Default)]
struct Behind {
    /// The device plugin's ConfigMap could not be written.
    config: bool,
    /// Nodes whose labels and taints were not written.
    nodes: std::collections::BTreeSet<String>,
}

impl Behind {
    /// Why `w` must not be sent, if it must not.
    fn holds_back(&self, w: &Write) -> Option<WriteError> {
        if self.config && w.kind() == Kind::Node {
            return Some(WriteError::ConfigNotWritten);
        }
        let spec = matches!(
            w,
            Write::Apply {
                kind: Kind::GpuNode,
                ..
            }
        );
        (spec && self.nodes.contains(w.name())).then(|| WriteError::NodeNotWritten {
            node: w.name().to_string(),
        })
    }

    /// Notes that `w` was not made.
    fn missed(&mut self, w: &Write, sent: bool) {
        self.config |= sent && w.kind() == Kind::ConfigMap && !matches!(w, Write::Delete { .. });
        if w.kind() == Kind::Node {
            self.nodes.insert(w.name().to_string());
        }
    }
}

impl Writer {
    pub fn new(client: Client, instance: Option<String>) -> Writer {
        let reporter = Reporter {
            controller: FIELD_MANAGER.into(),
            instance,
        };
        Writer {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            in_flight: WRITES_IN_FLIGHT,
            metrics: None,
        }
    }

    /// Counts every write made from now on in `metrics` (`objects_written_total`).
    pub fn count_in(&mut self, metrics: Arc<Metrics>) {
        self.metrics = Some(metrics);
    }

    /// At most `n` writes of a stage in flight at once (0 counts as 1).
    pub fn set_in_flight(&mut self, n: usize) {
        self.in_flight = n.max(1);
    }

    fn api(&self, kind: Kind, namespace: Option<&str>) -> Api<DynamicObject> {
        let ar = kind.api_resource();
        match namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &ar),
            None => Api::all_with(self.client.clone(), &ar),
        }
    }

    /// [`Writer::write`] with the write it was and its place in the stage.
    async fn write_keyed<'w>(&self, i: usize, w: &'w Write) -> (usize, &'w Write, Result<(), kube::Error>) {
        (i, w, self.write(w).await)
    }

    async fn write(&self, w: &Write) -> Result<(), kube::Error> {
        let apply = apply_params(FIELD_MANAGER);
        match w {
            Write::Apply {
                kind,
                namespace,
                name,
                object,
            } => {
                self.api(*kind, namespace.as_deref())
                    .patch(name, &apply, &Patch::Apply(object))
                    .await?;
            }
            Write::Status { kind, name, object } => {
                self.api(*kind, None)
                    .patch_status(name, &apply, &Patch::Apply(object))
                    .await?;
            }
            Write::Patch { kind, name, patch } => {
                self.api(*kind, None)
                    .patch(name, &PatchParams::default(), &Patch::Merge(patch))
                    .await?;
            }
            Write::NodePatch(p) => {
                let ops: json_patch::Patch = serde_json::from_value(p.operations()).map_err(kube::Error::SerdeError)?;
                self.api(Kind::Node, None)
                    .patch(&p.name, &PatchParams::default(), &Patch::Json::<()>(ops))
                    .await?;
            }
            Write::Evict {
                namespace,
                name,
                uid,
                node,
            } => match super::evict::evict(&self.client, namespace, name, uid, node).await? {
                super::evict::Outcome::Evicted => tracing::info!(write = %w, "evicted from a busy GPU"),
                super::evict::Outcome::Gone => {}
                super::evict::Outcome::Refused(why) => {
                    tracing::warn!(write = %w, "eviction refused: {why}")
                }
            },
            Write::Delete { kind, namespace, name } => {
                match self
                    .api(*kind, namespace.as_deref())
                    .delete(name, &DeleteParams::background())
                    .await
                {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// Makes every write, stage by stage: consecutive writes of one stage of the table of kinds
    /// and one action ([`Write::stage`]: the device plugin's config, node patches, GpuNode specs,
    /// statuses, namespaces, quotas, ...) go out together, at most `in_flight`
    /// ([`WRITES_IN_FLIGHT`] by default) at once, and a stage starts once the one before it has
    /// finished, so what must come first still does (a config before the labels naming it, a
    /// node's taints before its GpuNode spec, bindings deleted before their policies). One at a
    /// time, a pass of a thousand nodes' first specs took a minute (make bench-fleet: 2,700 writes
    /// at about 45 a second).
    pub async fn write_all(&self, writes: &[Write]) -> Outcome {
        let mut outcome = Outcome::default();
        let mut behind = Behind::default();
        let mut start = 0;
        for stage in writes.chunk_by(|a, b| a.stage() == b.stage() && a.action() == b.action()) {
            let mut send = Vec::with_capacity(stage.len());
            for (i, w) in (start..).zip(stage) {
                match behind.holds_back(w) {
                    Some(why) => {
                        tracing::warn!(write = %w, "{why}; the next pass retries it");
                        behind.missed(w, false);
                        outcome.failed.push(Failure::of(i, w, why));
                    }
                    None => send.push((i, w)),
                }
            }
            start += stage.len();
            for (i, w, result) in self.send_stage(send).await {
                match result {
                    Ok(()) => tracing::info!(write = %w, "wrote"),
                    Err(e) => {
                        tracing::warn!(write = %w, error = %e, "write failed; the next pass retries it");
                        behind.missed(w, true);
                        outcome.failed.push(Failure::of(i, w, WriteError::Failed(e)));
                    }
                }
            }
        }
        outcome.failed.sort_by_key(|f| f.index);
        outcome
    }

    /// Makes one stage's writes, at most `in_flight` at once; their results in the diff's order,
    /// whatever order they finished in.
    async fn send_stage<'w>(&self, send: Vec<(usize, &'w Write)>) -> Vec<(usize, &'w Write, Result<(), kube::Error>)> {
        // A sliding window without closures over the writes: a closure's future would not be
        // `Send` for every lifetime, and the controller's loop runs on spawned tasks. The next
        // write goes out as soon as any finishes (not the oldest: one slow write would hold the
        // window), so `in_flight` stay in flight while the stage lasts.
        let mut results = Vec::with_capacity(send.len());
        let mut pending = send.into_iter();
        let mut in_flight = futures::stream::FuturesUnordered::new();
        for (i, w) in pending.by_ref().take(self.in_flight) {
            in_flight.push(self.write_keyed(i, w));
        }
        while let Some(r) = in_flight.next().await {
            if let (Some(metrics), (_, w, Ok(()))) = (&self.metrics, &r) {
                metrics.written(&w.kind().to_string(), w.action());
            }
            results.push(r);
            if let Some((i, w)) = pending.next() {
                in_flight.push(self.write_keyed(i, w));
            }
        }
        results.sort_unstable_by_key(|r| r.0);
        results
    }

    /// Publishes events; a failure is logged, never fatal (events are for people).
    pub async fn publish(&self, notes: &[Note]) {
        for n in notes {
            let ar = n.kind.api_resource();
            let reference = ObjectReference {
                api_version: Some(ar.api_version.clone()),
                kind: Some(ar.kind.clone()),
                name: Some(n.name.clone()),
                ..ObjectReference::default()
            };
            let event = Event {
                type_: if n.warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                reason: n.reason.clone(),
                note: Some(n.message.chars().take(1000).collect()),
                action: "Reconcile".into(),
                secondary: None,
            };
            if let Err(e) = self.recorder.publish(&event, &reference).await {
                tracing::warn!(object = %n.name, reason = %n.reason, error = %e, "could not publish an event");
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
