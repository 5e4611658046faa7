//! The controller's view of the cluster: one reflector per kind it reads, feeding in-memory stores,
//! and one notification per change so the loop knows when to run a pass.
//!
//! Objects are kept without `managedFields` (the largest part of a Node or a status-heavy object),
//! so memory grows with the fleet, not with the history of its writers. Owned objects
//! (ResourceQuotas, admission policies, DeviceClasses, the device plugin's ConfigMap) are watched by the label
//! `gputenancy.io/managed-by=gpu-tenancy`, so the controller never caches what is not its own.

use super::kinds::{Kind, Which, owned_kinds};
use crate::labels::{MANAGED_BY, MANAGED_BY_VALUE};
use crate::runtime::backoff::Backoff;
use futures::{Stream, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList;
use kube::core::ApiResource;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use std::collections::BTreeSet;
use std::fmt::Debug;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::Notify;

/// The stores of the table's kinds ([`super::kinds::owned_kinds`]): per row its field in
/// [`Stores`] and [`Snapshot`], its watch, its wait for the first list. A snapshot holds the few
/// plans and policies as copies (`copy`), everything else as the store's own references
/// (`share`), never copied: the owned objects, thousands of admission policies at fleet size; the
/// Nodes and GpuNodes, which the pass reads only into inventories, and those only where they
/// changed ([`crate::inventory::ClusterInventories`]); the tenants, whose statuses list every
/// grant (copying 1,665 of them and freeing the copies was 8% of a tenant change's pass at 5,000
/// nodes); and every namespace. A watch replaces an object when it changes, never edits it in
/// place, so a shared one stays as it was read.
macro_rules! stores {
    ($( $kind:ident {
        ty: $ty:ty,
        live: $field:ident $held:ident,
        watch: $scope:ident $which:ident,
        write: $write:ident $desired:ident,
        $(seen: $seen:ty,)?
        plan: $plan:ident,
        optional: $optional:literal,
    } )*) => {
        /// Read-only stores of everything the controller looks at.
        #[derive(Clone)]
        pub struct Stores {
            $(pub $field: Store<$ty>,)*
            /// The optional kinds the API server does not serve (discovery): not watched.
            absent: Absent,
            /// Notified when discovery, asked again, finds an absent kind served: these stores
            /// never watch it, so the controller starts again with new ones.
            pub appeared: Arc<Notify>,
        }

        /// A copy of every store at one moment: what one pass plans from.
        #[derive(Clone, Debug, Default)]
        pub struct Snapshot {
            $(pub $field: Vec<held!($held, $ty)>,)*
            /// The optional kinds the API server does not serve: the diff writes none of them.
            pub absent: BTreeSet<Kind>,
        }

        impl Stores {
            pub fn snapshot(&self) -> Snapshot {
                Snapshot {
                    $($field: $held(&self.$field),)*
                    absent: self.absent.kinds(),
                }
            }

            /// Waits until every store has listed its objects once; an optional kind the API
            /// server does not serve is not waited for.
            pub async fn wait_until_ready(&self) -> Result<(), reflector::store::WriterDropped> {
                $(if let Err(e) = self.$field.wait_until_ready().await
                    && !self.absent.contains(Kind::$kind)
                {
                    return Err(e);
                })*
                Ok(())
            }
        }

        /// Starts nothing by itself: returns the stores and the stream that keeps them current
        /// (poll it, e.g. spawn it). `changed` is notified on every change of any store. An
        /// optional kind is watched once discovery finds it served.
        ///
        /// With `rediscovery`, discovery is asked again at that interval for each optional kind
        /// it found absent, and [`Stores::appeared`] is notified once one is served.
        pub fn stores(
            client: &Client,
            device_plugin_namespace: &str,
            changed: Arc<Notify>,
            rediscovery: Option<Duration>,
        ) -> (Stores, Driver) {
            let appeared = Arc::new(Notify::new());
            let watch = Watch { client, device_plugin_namespace, changed, rediscovery, appeared: appeared.clone() };
            let absent = Absent::default();
            let mut drivers: Vec<Driver> = Vec::new();
            let stores = Stores {
                $($field: {
                    let optional = $optional.then(|| Optional { kind: Kind::$kind, absent: absent.clone() });
                    let (store, driver) = watch.$scope::<$ty>(Which::$which, optional);
                    drivers.push(driver);
                    store
                },)*
                absent,
                appeared,
            };
            (stores, Box::pin(futures::stream::select_all(drivers)))
        }

        /// Stores fed by hand, for tests: their writers, and `absent` as discovery would leave it.
        #[cfg(test)]
        pub(crate) struct Writers {
            $(pub $field: reflector::store::Writer<$ty>,)*
        }

        #[cfg(test)]
        pub(crate) fn detached(absent: &[Kind]) -> (Stores, Writers) {
            let found = Absent::default();
            for k in absent {
                found.insert(*k);
            }
            $(let $field = reflector::store::<$ty>();)*
            let stores = Stores { $($field: $field.0,)* absent: found, appeared: Arc::new(Notify::new()) };
            (stores, Writers { $($field: $field.1,)* })
        }
    };
}

/// The type a snapshot holds a kind's objects as.
macro_rules! held {
    (copy, $kind:ty) => { $kind };
    (share, $kind:ty) => { Arc<$kind> };
}

owned_kinds!(stores);

/// The optional kinds discovery found not served; shared by the stores and their watches.
#[derive(Clone, Debug, Default)]
struct Absent(Arc<RwLock<BTreeSet<Kind>>>);

impl Absent {
    fn insert(&self, kind: Kind) {
        self.0.write().unwrap_or_else(|e| e.into_inner()).insert(kind);
    }

    fn contains(&self, kind: Kind) -> bool {
        self.0.read().unwrap_or_else(|e| e.into_inner()).contains(&kind)
    }

    fn kinds(&self) -> BTreeSet<Kind> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// An optional kind's watch: the kind, and where to say it is not served.
struct Optional {
    kind: Kind,
    absent: Absent,
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

/// The watch of `which` objects.
fn config(which: Which) -> watcher::Config {
    let config = watcher::Config::default().any_semantic();
    match which {
        Which::All => config,
        Which::Owned => config.labels(&format!("{MANAGED_BY}={MANAGED_BY_VALUE}")),
    }
}

/// What every watch needs: the client, the device plugin's namespace, the change notification.
struct Watch<'a> {
    client: &'a Client,
    device_plugin_namespace: &'a str,
    changed: Arc<Notify>,
    /// How often discovery is asked again for an absent optional kind (never: `None`).
    rediscovery: Option<Duration>,
    appeared: Arc<Notify>,
}

impl Watch<'_> {
    fn cluster<K>(&self, which: Which, optional: Option<Optional>) -> (Store<K>, Driver)
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Default + std::hash::Hash + Eq + Clone,
    {
        let api = Api::<K>::all(self.client.clone());
        self.reflect(api, which, optional)
    }

    fn device_plugin_namespace<K>(&self, which: Which, optional: Option<Optional>) -> (Store<K>, Driver)
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
        self.reflect(api, which, optional)
    }

    /// The store of `api`'s `which` objects and the stream that keeps it; for an optional kind,
    /// a stream that asks discovery first, and leaves the store never ready (its writer dropped)
    /// where the kind is not served.
    fn reflect<K>(&self, api: Api<K>, which: Which, optional: Option<Optional>) -> (Store<K>, Driver)
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Default + std::hash::Hash + Eq + Clone,
    {
        let (reader, writer) = reflector::store();
        let changed = self.changed.clone();
        let Some(optional) = optional else {
            return (reader, reflect(api, config(which), writer, changed));
        };
        let client = self.client.clone();
        let (rediscovery, appeared) = (self.rediscovery, self.appeared.clone());
        let discovered = async move {
            let resource = ApiResource::erase::<K>(&K::DynamicType::default());
            if served(&client, &resource).await {
                return reflect(api, config(which), writer, changed);
            }
            tracing::info!(kind = %optional.kind, "not served by the API server: not watched, nothing written");
            optional.absent.insert(optional.kind);
            drop(writer);
            let Some(every) = rediscovery else {
                return Box::pin(futures::stream::empty()) as Driver;
            };
            Box::pin(futures::stream::once(async move {
                loop {
                    tokio::time::sleep(every).await;
                    if served(&client, &resource).await {
                        break;
                    }
                }
                tracing::info!(kind = %optional.kind, "now served by the API server: watching it from new stores");
                appeared.notify_one();
            }))
        };
        (reader, Box::pin(futures::stream::once(discovered).flatten()))
    }
}

/// A stream that keeps stores current; poll it (spawn it) for as long as the stores are used.
pub type Driver = Pin<Box<dyn Stream<Item = ()> + Send>>;

/// One reflector: a stream that drives `writer` and notifies `changed` on every event.
/// Watch errors are retried by the watcher's own backoff (never a fixed short interval) and logged.
fn reflect<K>(api: Api<K>, config: watcher::Config, writer: reflector::store::Writer<K>, changed: Arc<Notify>) -> Driver
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + std::hash::Hash + Eq + Clone,
{
    let kind = K::kind(&K::DynamicType::default()).to_string();
    let stream = watcher(api, config)
        .default_backoff()
        .modify(|o: &mut K| o.managed_fields_mut().clear())
        .reflect(writer)
        .map(move |event| match event {
            Ok(_) => changed.notify_one(),
            Err(e) => tracing::warn!(kind = %kind, error = %e, "watch failed; retrying with backoff"),
        });
    Box::pin(stream)
}

/// Whether the API server serves `resource` (discovery of its group and version). Not found is
/// an answer; any other error is retried with backoff, since a kind taken as absent is not
/// watched until discovery is asked again.
async fn served(client: &Client, resource: &ApiResource) -> bool {
    let mut backoff = Backoff::for_api_errors();
    loop {
        let listed = if resource.group.is_empty() {
            client.list_core_api_resources(&resource.version).await
        } else {
            client.list_api_group_resources(&resource.api_version).await
        };
        match listed {
            Ok(list) => return lists(&list, &resource.plural),
            Err(kube::Error::Api(e)) if e.code == 404 => return false,
            Err(e) => {
                let wait = backoff.next();
                tracing::warn!(resource = %resource.plural, error = %e, retry_in = ?wait, "discovery failed; retrying");
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// Whether a group version's discovery lists the resource `plural`.
fn lists(list: &APIResourceList, plural: &str) -> bool {
    list.resources.iter().any(|r| r.name == plural)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::watcher::Event;

    fn listed<K: Resource<DynamicType = ()> + Clone>(writer: &mut reflector::store::Writer<K>) {
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitDone);
    }

    /// Every store listed once but one whose watch never started (its writer dropped): the wait
    /// ends when that kind is one discovery found absent, and fails when it is not.
    #[tokio::test]
    async fn the_readiness_wait_leaves_out_only_an_absent_kind() {
        for absent in [true, false] {
            let kinds: &[Kind] = if absent { &[Kind::DeviceClass] } else { &[] };
            let (stores, w) = detached(kinds);
            let Writers {
                mut config_maps,
                mut nodes,
                mut gpu_nodes,
                mut policies,
                mut tenants,
                mut plans,
                mut namespaces,
                mut quotas,
                mut mutating_policies,
                mut mutating_bindings,
                mut admission_policies,
                mut admission_bindings,
                device_classes,
                mut resource_flavors,
                mut cohorts,
                mut cluster_queues,
                mut local_queues,
                mut workload_priority_classes,
            } = w;
            listed(&mut config_maps);
            listed(&mut nodes);
            listed(&mut gpu_nodes);
            listed(&mut policies);
            listed(&mut tenants);
            listed(&mut plans);
            listed(&mut namespaces);
            listed(&mut quotas);
            listed(&mut mutating_policies);
            listed(&mut mutating_bindings);
            listed(&mut admission_policies);
            listed(&mut admission_bindings);
            listed(&mut resource_flavors);
            listed(&mut cohorts);
            listed(&mut cluster_queues);
            listed(&mut local_queues);
            listed(&mut workload_priority_classes);
            drop(device_classes);
            let waited = tokio::time::timeout(std::time::Duration::from_secs(5), stores.wait_until_ready())
                .await
                .expect("the wait ends");
            assert_eq!(waited.is_ok(), absent, "absent: {absent}");
            assert_eq!(stores.snapshot().absent, kinds.iter().copied().collect());
        }
    }

    /// The requests of an optional kind's watch: discovery of its group version first; not
    /// served, nothing more, the kind is absent and its store never ready; served, the list
    /// that starts its watch.
    #[tokio::test]
    async fn an_optional_kind_is_watched_only_when_discovery_finds_it() {
        use crate::controller::fixtures::mock_client;
        use k8s_openapi::api::resource::v1::DeviceClass;
        for served in [false, true] {
            let (client, mut server) = mock_client();
            let absent = Absent::default();
            let watch = Watch {
                client: &client,
                device_plugin_namespace: "nvidia-device-plugin",
                changed: Arc::new(Notify::new()),
                rediscovery: None,
                appeared: Arc::new(Notify::new()),
            };
            let optional = Optional {
                kind: Kind::DeviceClass,
                absent: absent.clone(),
            };
            let (store, mut driver) = watch.cluster::<DeviceClass>(Which::Owned, Some(optional));
            let driven = tokio::spawn(async move { while driver.next().await.is_some() {} });
            let discovery = server.expect("GET /apis/resource.k8s.io/v1").await;
            if !served {
                discovery.refuse(404, "NotFound");
                driven.await.unwrap();
                assert!(absent.contains(Kind::DeviceClass));
                assert!(store.wait_until_ready().await.is_err(), "never ready");
                server.no_more().await;
                continue;
            }
            discovery.answer(
                200,
                &serde_json::json!({"kind": "APIResourceList", "groupVersion": "resource.k8s.io/v1",
                    "resources": [{"name": "deviceclasses", "singularName": "deviceclass",
                        "namespaced": false, "kind": "DeviceClass", "verbs": ["list", "watch"]}]}),
            );
            let list = server.next().await;
            assert!(
                list.line().starts_with("GET /apis/resource.k8s.io/v1/deviceclasses?")
                    && list
                        .line()
                        .contains("labelSelector=gputenancy.io%2Fmanaged-by%3Dgpu-tenancy"),
                "{}",
                list.line()
            );
            list.answer(
                200,
                &serde_json::json!({"kind": "DeviceClassList", "apiVersion": "resource.k8s.io/v1",
                    "metadata": {"resourceVersion": "1"}, "items": []}),
            );
            tokio::time::timeout(std::time::Duration::from_secs(5), store.wait_until_ready())
                .await
                .expect("listed")
                .expect("ready");
            assert!(!absent.contains(Kind::DeviceClass));
            driven.abort();
        }
    }

    /// An optional kind absent at start: discovery is asked again at the interval, and once it
    /// is served, the stores say so (the controller starts new ones).
    #[tokio::test]
    async fn an_absent_kind_served_later_is_announced() {
        use crate::controller::fixtures::mock_client;
        use k8s_openapi::api::resource::v1::DeviceClass;
        let (client, mut server) = mock_client();
        let appeared = Arc::new(Notify::new());
        let watch = Watch {
            client: &client,
            device_plugin_namespace: "nvidia-device-plugin",
            changed: Arc::new(Notify::new()),
            rediscovery: Some(std::time::Duration::from_millis(10)),
            appeared: appeared.clone(),
        };
        let absent = Absent::default();
        let optional = Optional {
            kind: Kind::DeviceClass,
            absent: absent.clone(),
        };
        let (_store, mut driver) = watch.cluster::<DeviceClass>(Which::Owned, Some(optional));
        let driven = tokio::spawn(async move { while driver.next().await.is_some() {} });
        for _ in 0..2 {
            let discovery = server.expect("GET /apis/resource.k8s.io/v1").await;
            discovery.refuse(404, "NotFound");
        }
        assert!(absent.contains(Kind::DeviceClass));
        let discovery = server.expect("GET /apis/resource.k8s.io/v1").await;
        discovery.answer(
            200,
            &serde_json::json!({"kind": "APIResourceList", "groupVersion": "resource.k8s.io/v1",
                "resources": [{"name": "deviceclasses", "singularName": "deviceclass",
                    "namespaced": false, "kind": "DeviceClass", "verbs": ["list", "watch"]}]}),
        );
        tokio::time::timeout(std::time::Duration::from_secs(5), appeared.notified())
            .await
            .expect("announced once served");
        driven.await.unwrap();
        server.no_more().await;
    }

    #[test]
    fn discovery_finds_a_kind_by_its_plural() {
        let list: APIResourceList = serde_json::from_value(serde_json::json!({
            "groupVersion": "kueue.x-k8s.io/v1beta1",
            "resources": [
                {"name": "clusterqueues", "singularName": "clusterqueue", "namespaced": false,
                 "kind": "ClusterQueue", "verbs": ["list", "watch"]},
                {"name": "clusterqueues/status", "singularName": "", "namespaced": false,
                 "kind": "ClusterQueue", "verbs": ["patch"]}
            ]
        }))
        .unwrap();
        assert!(lists(&list, "clusterqueues"));
        assert!(!lists(&list, "localqueues"));
    }
}
