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

/// Read-only stores of everything the controller looks at.
#[derive(Clone)]
pub struct Stores {
    pub policies: Store<SharingPolicy>,
    pub tenants: Store<GpuTenant>,
    pub plans: Store<GpuPartitionPlan>,
    pub gpu_nodes: Store<GpuNode>,
    pub nodes: Store<Node>,
    pub namespaces: Store<Namespace>,
    pub quotas: Store<ResourceQuota>,
    pub config_maps: Store<ConfigMap>,
    pub admission_policies: Store<ValidatingAdmissionPolicy>,
    pub admission_bindings: Store<ValidatingAdmissionPolicyBinding>,
    pub mutating_policies: Store<MutatingAdmissionPolicy>,
    pub mutating_bindings: Store<MutatingAdmissionPolicyBinding>,
    pub device_classes: Store<DeviceClass>,
}

/// A copy of every store at one moment: what one pass plans from.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub policies: Vec<SharingPolicy>,
    pub tenants: Vec<GpuTenant>,
    pub plans: Vec<GpuPartitionPlan>,
    pub gpu_nodes: Vec<GpuNode>,
    pub nodes: Vec<Node>,
    pub namespaces: Vec<Namespace>,
    pub quotas: Vec<ResourceQuota>,
    pub config_maps: Vec<ConfigMap>,
    pub admission_policies: Vec<ValidatingAdmissionPolicy>,
    pub admission_bindings: Vec<ValidatingAdmissionPolicyBinding>,
    pub mutating_policies: Vec<MutatingAdmissionPolicy>,
    pub mutating_bindings: Vec<MutatingAdmissionPolicyBinding>,
    pub device_classes: Vec<DeviceClass>,
}

fn copy<K>(store: &Store<K>) -> Vec<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    store.state().iter().map(|o| (**o).clone()).collect()
}

impl Stores {
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            policies: copy(&self.policies),
            tenants: copy(&self.tenants),
            plans: copy(&self.plans),
            gpu_nodes: copy(&self.gpu_nodes),
            nodes: copy(&self.nodes),
            namespaces: copy(&self.namespaces),
            quotas: copy(&self.quotas),
            config_maps: copy(&self.config_maps),
            admission_policies: copy(&self.admission_policies),
            admission_bindings: copy(&self.admission_bindings),
            mutating_policies: copy(&self.mutating_policies),
            mutating_bindings: copy(&self.mutating_bindings),
            device_classes: copy(&self.device_classes),
        }
    }

    /// Waits until every store has listed its objects once.
    pub async fn wait_until_ready(&self) -> Result<(), reflector::store::WriterDropped> {
        self.policies.wait_until_ready().await?;
        self.tenants.wait_until_ready().await?;
        self.plans.wait_until_ready().await?;
        self.gpu_nodes.wait_until_ready().await?;
        self.nodes.wait_until_ready().await?;
        self.namespaces.wait_until_ready().await?;
        self.quotas.wait_until_ready().await?;
        self.config_maps.wait_until_ready().await?;
        self.admission_policies.wait_until_ready().await?;
        self.admission_bindings.wait_until_ready().await?;
        self.mutating_policies.wait_until_ready().await?;
        self.mutating_bindings.wait_until_ready().await?;
        self.device_classes.wait_until_ready().await?;
        Ok(())
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

/// Starts nothing by itself: returns the stores and the stream that keeps them current (poll it,
/// e.g. spawn it). `changed` is notified on every change of any store.
pub fn stores(client: &Client, device_plugin_namespace: &str, changed: Arc<Notify>) -> (Stores, Driver) {
    let all = watcher::Config::default().any_semantic();
    let owned = watcher::Config::default()
        .any_semantic()
        .labels(&format!("{MANAGED_BY}={MANAGED_BY_VALUE}"));
    let mut drivers: Vec<Driver> = Vec::new();
    macro_rules! watch {
        ($api:expr, $config:expr) => {{
            let (store, driver) = reflect($api, $config.clone(), changed.clone());
            drivers.push(driver);
            store
        }};
    }
    let stores = Stores {
        policies: watch!(Api::<SharingPolicy>::all(client.clone()), all),
        tenants: watch!(Api::<GpuTenant>::all(client.clone()), all),
        plans: watch!(Api::<GpuPartitionPlan>::all(client.clone()), all),
        gpu_nodes: watch!(Api::<GpuNode>::all(client.clone()), all),
        nodes: watch!(Api::<Node>::all(client.clone()), all),
        namespaces: watch!(Api::<Namespace>::all(client.clone()), all),
        quotas: watch!(Api::<ResourceQuota>::all(client.clone()), owned),
        config_maps: watch!(
            Api::<ConfigMap>::namespaced(client.clone(), device_plugin_namespace),
            owned
        ),
        admission_policies: watch!(Api::<ValidatingAdmissionPolicy>::all(client.clone()), owned),
        admission_bindings: watch!(Api::<ValidatingAdmissionPolicyBinding>::all(client.clone()), owned),
        mutating_policies: watch!(Api::<MutatingAdmissionPolicy>::all(client.clone()), owned),
        mutating_bindings: watch!(Api::<MutatingAdmissionPolicyBinding>::all(client.clone()), owned),
        device_classes: watch!(Api::<DeviceClass>::all(client.clone()), owned),
    };
    (stores, Box::pin(futures::stream::select_all(drivers)))
}
