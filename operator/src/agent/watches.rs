//! The agent's watches, each started once and shared by the pass and its mode: its own GpuNode
//! (the pass's spec changes; the DRA mode's devices and slices) and the GpuTenants (which tenant
//! owns a namespace: the metrics' attribution, the DRA mode's Prepare).

use super::spec_changes::spec_changes;
use crate::api::{GpuNode, GpuTenant};
use futures::{Stream, StreamExt};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::watch;

/// The shared watches of one agent.
#[derive(Clone)]
pub struct Watches {
    /// This node's GpuNode as the watch last saw it; `None` before it is seen and once it is gone
    /// ([`spec_changes`]). Every change is sent, status changes included.
    pub gpu_node: watch::Receiver<Option<GpuNode>>,
    /// Every GpuTenant.
    pub tenants: Store<GpuTenant>,
}

impl Watches {
    /// Starts both watches in the background (each retries with the watcher's backoff).
    pub fn start(client: &Client, node: &str) -> Watches {
        let (tx, gpu_node) = watch::channel(None);
        let events = watcher(
            Api::<GpuNode>::all(client.clone()),
            watcher::Config::default().fields(&format!("metadata.name={node}")),
        )
        .default_backoff();
        let node_name = node.to_string();
        tokio::spawn(spec_changes(events).for_each(move |seen| {
            match seen {
                Ok(n) => {
                    tx.send_replace(n);
                }
                Err(e) => tracing::warn!(node = %node_name, error = %e, "watching the GpuNode failed; retrying"),
            }
            futures::future::ready(())
        }));
        let (tenants, writer) = reflector::store::<GpuTenant>();
        let tenant_watch = watcher(Api::<GpuTenant>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .reflect(writer)
            .for_each(|_| futures::future::ready(()));
        tokio::spawn(tenant_watch);
        Watches { gpu_node, tenants }
    }

    /// The GpuNode's changes as [`super::run_node`] reads them: one item per change sent after
    /// this call.
    pub fn gpu_node_changes(&self) -> impl Stream<Item = Option<GpuNode>> + use<> {
        futures::stream::unfold(self.gpu_node.clone(), |mut rx| async move {
            rx.changed().await.ok()?;
            let n = rx.borrow_and_update().clone();
            Some((n, rx))
        })
    }
}
