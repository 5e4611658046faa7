//! The controller's view of the cluster: one reflector per kind it reads, feeding in-memory stores,
//! and one notification per change so the loop knows when to run a pass.
//!
//! Objects are kept without `managedFields` (the largest part of a Node or a status-heavy object),
//! so memory grows with the fleet, not with the history of its writers. Owned objects
//! (ResourceQuotas, admission policies, DeviceClasses, the device plugin's ConfigMap) are watched by the label
//! `gputenancy.io/managed-by=gpu-tenancy`, so the controller never caches what is not its own.

use crate::api::{GpuNode, GpuPartitionPlan, GpuTenant, SharingPolicy};
use crate::labels::{MANAGED_BY, MANAGED_BY_VALUE};
use futures::{Stream, StreamExt};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, ResourceQuota};
use k8s_openapi::api::resource::v1::DeviceClass;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::Notify;

/// Every kind the controller reads, in one list: its field in [`Stores`] and [`Snapshot`], its
/// type, where it is listed (`cluster`: every namespace or cluster-scoped; `device_plugin_namespace`:
/// the device plugin's namespace only), which objects (`all`, or `owned`: labelled
/// `gputenancy.io/managed-by=gpu-tenancy`) and how a snapshot holds them (`copy`: the objects,
/// the few plans and policies; `share`: the store's own references, never copied: the owned
/// objects, thousands of admission policies at fleet size; the Nodes and GpuNodes, which the pass
/// reads only into inventories, and those only where they changed,
/// [`crate::inventory::ClusterInventories`]; the tenants, whose statuses list every grant (copying
/// 1,665 of them and freeing the copies was 8% of a tenant change's pass at 5,000 nodes); and
/// every namespace).
/// A watch replaces an object when it changes, never edits it in place, so a shared one stays as
/// it was read. Adding a kind here adds its store, its field in a snapshot, its wait for the
/// first list and its watch.
macro_rules! kinds {
    ($($field:ident: $kind:ty, $scope:ident, $which:ident, $hold:ident;)*) => {
        /// Read-only stores of everything the controller looks at.
        #[derive(Clone)]
        pub struct Stores {
            $(pub $field: Store<$kind>,)*
        }

        /// A copy of every store at one moment: what one pass plans from.
        #[derive(Clone, Debug, Default)]
        pub struct Snapshot {
            $(pub $field: Vec<held!($hold, $kind)>,)*
        }

        impl Stores {
            pub fn snapshot(&self) -> Snapshot {
                Snapshot {
                    $($field: $hold(&self.$field),)*
                }
            }

            /// Waits until every store has listed its objects once.
            pub async fn wait_until_ready(&self) -> Result<(), reflector::store::WriterDropped> {
                $(self.$field.wait_until_ready().await?;)*
                Ok(())
            }
        }

        /// Starts nothing by itself: returns the stores and the stream that keeps them current
        /// (poll it, e.g. spawn it). `changed` is notified on every change of any store.
        pub fn stores(client: &Client, device_plugin_namespace: &str, changed: Arc<Notify>) -> (Stores, Driver) {
            let watch = Watch { client, device_plugin_namespace, changed };
            let mut drivers: Vec<Driver> = Vec::new();
            let stores = Stores {
                $($field: {
                    let (store, driver) = watch.$scope::<$kind>(Which::$which);
                    drivers.push(driver);
                    store
                },)*
            };
            (stores, Box::pin(futures::stream::select_all(drivers)))
        }
    };
}

/// The type a snapshot holds a kind's objects as.
macro_rules! held {
    (copy, $kind:ty) => { $kind };
    (share, $kind:ty) => { Arc<$kind> };
}

kinds! {
    policies: SharingPolicy, cluster, All, copy;
    tenants: GpuTenant, cluster, All, share;
    plans: GpuPartitionPlan, cluster, All, copy;
    gpu_nodes: GpuNode, cluster, All, share;
    nodes: Node, cluster, All, share;
    namespaces: Namespace, cluster, All, share;
    quotas: ResourceQuota, cluster, Owned, share;
    config_maps: ConfigMap, device_plugin_namespace, Owned, share;
    admission_policies: ValidatingAdmissionPolicy, cluster, Owned, share;
    admission_bindings: ValidatingAdmissionPolicyBinding, cluster, Owned, share;
    mutating_policies: MutatingAdmissionPolicy, cluster, Owned, share;
    mutating_bindings: MutatingAdmissionPolicyBinding, cluster, Owned, share;
    device_classes: DeviceClass, cluster, Owned, share;
}

fn copy<K>(store: &Store<K>) -> Vec<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    store.state().iter().map(|o| (**o).clone()).collect()
}

/// The store's objects themselves: a store replaces an object on change, never edits it, so a
/// shared one stays as it was read.
fn share<K>(store: &Store<K>) -> Vec<Arc<K>>
where
    K: Resource + Clone + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    store.state()
}

/// Which objects of a kind the controller caches.
enum Which {
    All,
    /// Only what carries the controller's managed-by label: never cache what is not its own.
    Owned,
}

impl Which {
    fn config(&self) -> watcher::Config {
        let config = watcher::Config::default().any_semantic();
        match self {
            Which::All => config,
            Which::Owned => config.labels(&format!("{MANAGED_BY}={MANAGED_BY_VALUE}")),
        }
    }
}

/// What every watch needs: the client, the device plugin's namespace, the change notification.
struct Watch<'a> {
    client: &'a Client,
    device_plugin_namespace: &'a str,
    changed: Arc<Notify>,
}

impl Watch<'_> {
    fn cluster<K>(&self, which: Which) -> (Store<K>, Driver)
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Default + std::hash::Hash + Eq + Clone,
    {
        reflect(Api::<K>::all(self.client.clone()), which.config(), self.changed.clone())
    }

    fn device_plugin_namespace<K>(&self, which: Which) -> (Store<K>, Driver)
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + Debug
            + Send
            + Sync
            + 'static,
        K::DynamicType: Default + std::hash::Hash + Eq + Clone,
    {
        let api = Api::<K>::namespaced(self.client.clone(), self.device_plugin_namespace);
        reflect(api, which.config(), self.changed.clone())
    }
}

/// A stream that keeps stores current; poll it (spawn it) for as long as the stores are used.
pub type Driver = Pin<Box<dyn Stream<Item = ()> + Send>>;

/// One reflector: its store, and a stream that drives it and notifies `changed` on every event.
/// Watch errors are retried by the watcher's own backoff (never a fixed short interval) and logged.
fn reflect<K>(api: Api<K>, config: watcher::Config, changed: Arc<Notify>) -> (Store<K>, Driver)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + std::hash::Hash + Eq + Clone,
{
    let (reader, writer) = reflector::store();
    let kind = K::kind(&K::DynamicType::default()).to_string();
    let stream = watcher(api, config)
        .default_backoff()
        .modify(|o: &mut K| o.managed_fields_mut().clear())
        .reflect(writer)
        .map(move |event| match event {
            Ok(_) => changed.notify_one(),
            Err(e) => tracing::warn!(kind = %kind, error = %e, "watch failed; retrying with backoff"),
        });
    (reader, Box::pin(stream))
}
