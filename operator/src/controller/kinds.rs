//! The one table of the kinds the controller reads and writes ([`owned_kinds!`]), and what is
//! derived from it here: the [`Kind`] of every write, the [`TABLE`] of each row's metadata, the
//! permissions the controller's RBAC must grant ([`permissions`]), and the objects `plan -o yaml`
//! prints ([`manifests`]).
//!
//! The table is read by a macro in each module that needs it (the pattern of an "X macro"): the
//! stores and their snapshot ([`super::stores`]), what a pass keeps of the owned objects
//! ([`super::diff::Seen`]), and the diff's stages ([`super::diff`]). Adding a kind is adding a
//! row; the compiler then asks for the desired objects of that kind (a field of
//! [`crate::desired::Desired`]) and the tests for its grants in the RBAC.

use crate::desired::Desired;
use kube::core::ApiResource;
use serde::Serialize;
use std::collections::BTreeSet;
use std::fmt;

/// Calls `$consumer! { rows }` with one row per kind, in the order the controller writes them:
/// a pass's applies, patches and statuses go out row by row in this order, then the evictions
/// agents asked for, then the deletes of bindings (rows written `owned_bindings` or
/// `validating_bindings`), then every other delete, both again in this order.
///
/// Why this order: the device plugin's config before the node labels naming it; a node's taints
/// before its GpuNode spec (a spec that hands a GPU or instance over must not reach the agent,
/// nor the node take new pods, while it lacks the scrub-pending taint,
/// docs/design.md#scrub-on-change-of-hands); the mutating policies before the validating ones (a
/// no-tenant pod is refused without the node affinity the mutating policy adds, so a missing one
/// refuses, never lets a pod through); policies before their bindings, bindings deleted before
/// their policies. DeviceClasses need no place: a class missing refuses, never hands over.
/// Kueue's objects go before the quotas: the flavors and cohorts its queues name, then the
/// queues, then the LocalQueues naming them; a quota that becomes a ceiling (Kueue on) is loosened
/// after the queues that keep the total exist.
///
/// Each row:
/// - `ty`: the type;
/// - `live`: its field in [`super::stores::Stores`] and [`super::stores::Snapshot`], and how a
///   snapshot holds the objects (`copy`: the objects, the few plans and policies; `share`: the
///   store's own references, never copied, see [`super::stores`]);
/// - `watch`: where it is listed (`cluster`: every namespace or cluster-scoped;
///   `device_plugin_namespace`: the device plugin's namespace only) and which objects (`All`, or
///   `Owned`: labelled `gputenancy.io/managed-by=gpu-tenancy`);
/// - `write`: how the diff writes it, from which field of [`Desired`]: `owned` (applied where the
///   live object lacks a desired field, deleted when no longer desired), `owned_bindings` (the
///   same, deleted with the bindings), `namespaces` (applied, our labels removed, never
///   deleted), `node_patches` (our labels and taints), `specs` (GpuNode specs), `status` (the
///   status subresource), `validating_policies` and `validating_bindings` (the admission rule
///   sets, [`super::diff`]'s `admission`);
/// - `seen`: for the kinds written whole, the desired objects' type as a pass keeps them
///   ([`super::diff::Seen`]);
/// - `plan`: what `plan -o yaml` prints of it: `objects` (the desired objects), `specs` (without
///   status), `none` (only a status is written);
/// - `optional`: a kind the API server may not serve (a CRD of another project): watched only
///   when discovery finds it, not waited for, and nothing written for it while it is absent.
macro_rules! owned_kinds {
    ($consumer:ident) => {
        $consumer! {
            ConfigMap {
                ty: k8s_openapi::api::core::v1::ConfigMap,
                live: config_maps share,
                watch: device_plugin_namespace Owned,
                write: owned config_maps,
                seen: k8s_openapi::api::core::v1::ConfigMap,
                plan: objects,
                optional: false,
            }
            Node {
                ty: k8s_openapi::api::core::v1::Node,
                live: nodes share,
                watch: cluster All,
                write: node_patches node_labels,
                plan: objects,
                optional: false,
            }
            GpuNode {
                ty: crate::api::GpuNode,
                live: gpu_nodes share,
                watch: cluster All,
                write: specs nodes,
                plan: specs,
                optional: false,
            }
            SharingPolicy {
                ty: crate::api::SharingPolicy,
                live: policies copy,
                watch: cluster All,
                write: status policies,
                plan: none,
                optional: false,
            }
            GpuTenant {
                ty: crate::api::GpuTenant,
                live: tenants share,
                watch: cluster All,
                write: status tenants,
                plan: none,
                optional: false,
            }
            GpuPartitionPlan {
                ty: crate::api::GpuPartitionPlan,
                live: plans copy,
                watch: cluster All,
                write: status plans,
                plan: none,
                optional: false,
            }
            Namespace {
                ty: k8s_openapi::api::core::v1::Namespace,
                live: namespaces share,
                watch: cluster All,
                write: namespaces namespaces,
                seen: std::sync::Arc<k8s_openapi::api::core::v1::Namespace>,
                plan: objects,
                optional: false,
            }
            ResourceFlavor {
                ty: crate::kueue::ResourceFlavor,
                live: resource_flavors share,
                watch: cluster Owned,
                write: owned resource_flavors,
                seen: crate::kueue::ResourceFlavor,
                plan: objects,
                optional: true,
            }
            Cohort {
                ty: crate::kueue::Cohort,
                live: cohorts share,
                watch: cluster Owned,
                write: owned cohorts,
                seen: crate::kueue::Cohort,
                plan: objects,
                optional: true,
            }
            ClusterQueue {
                ty: crate::kueue::ClusterQueue,
                live: cluster_queues share,
                watch: cluster Owned,
                write: owned cluster_queues,
                seen: crate::kueue::ClusterQueue,
                plan: objects,
                optional: true,
            }
            LocalQueue {
                ty: crate::kueue::LocalQueue,
                live: local_queues share,
                watch: cluster Owned,
                write: owned local_queues,
                seen: crate::kueue::LocalQueue,
                plan: objects,
                optional: true,
            }
            WorkloadPriorityClass {
                ty: crate::kueue::WorkloadPriorityClass,
                live: workload_priority_classes share,
                watch: cluster Owned,
                write: owned workload_priority_classes,
                seen: crate::kueue::WorkloadPriorityClass,
                plan: objects,
                optional: true,
            }
            ResourceQuota {
                ty: k8s_openapi::api::core::v1::ResourceQuota,
                live: quotas share,
                watch: cluster Owned,
                write: owned resource_quotas,
                seen: std::sync::Arc<k8s_openapi::api::core::v1::ResourceQuota>,
                plan: objects,
                optional: false,
            }
            MutatingAdmissionPolicy {
                ty: k8s_openapi::api::admissionregistration::v1::MutatingAdmissionPolicy,
                live: mutating_policies share,
                watch: cluster Owned,
                write: owned mutating_policies,
                seen: k8s_openapi::api::admissionregistration::v1::MutatingAdmissionPolicy,
                plan: objects,
                optional: false,
            }
            MutatingAdmissionPolicyBinding {
                ty: k8s_openapi::api::admissionregistration::v1::MutatingAdmissionPolicyBinding,
                live: mutating_bindings share,
                watch: cluster Owned,
                write: owned_bindings mutating_bindings,
                seen: k8s_openapi::api::admissionregistration::v1::MutatingAdmissionPolicyBinding,
                plan: objects,
                optional: false,
            }
            ValidatingAdmissionPolicy {
                ty: k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy,
                live: admission_policies share,
                watch: cluster Owned,
                write: validating_policies admission_policies,
                seen: std::sync::Arc<k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy>,
                plan: objects,
                optional: false,
            }
            ValidatingAdmissionPolicyBinding {
                ty: k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding,
                live: admission_bindings share,
                watch: cluster Owned,
                write: validating_bindings admission_bindings,
                seen: std::sync::Arc<k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding>,
                plan: objects,
                optional: false,
            }
            DeviceClass {
                ty: k8s_openapi::api::resource::v1::DeviceClass,
                live: device_classes share,
                watch: cluster Owned,
                write: owned device_classes,
                seen: k8s_openapi::api::resource::v1::DeviceClass,
                plan: objects,
                optional: false,
            }
        }
    };
}
pub(crate) use owned_kinds;

/// Kueue's kinds (optional rows): the controller writes queues only where the API server serves
/// them (docs/concepts/queues.md).
pub const KUEUE_KINDS: &[Kind] = &[
    Kind::ResourceFlavor,
    Kind::Cohort,
    Kind::ClusterQueue,
    Kind::LocalQueue,
    Kind::WorkloadPriorityClass,
];

/// Which objects of a kind the controller watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    All,
    /// Only what carries the controller's managed-by label: never cache what is not its own.
    Owned,
}

/// Where a kind is watched and written, and so where its grants are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// Every namespace, or cluster-scoped: the controller's ClusterRole.
    Cluster,
    /// The device plugin's namespace only: a Role there.
    DevicePluginNamespace,
}

/// How the controller writes a kind: which requests, so which verbs it needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writes {
    /// Server-side applied (which may create it) and deleted when no longer desired.
    Owned,
    /// Server-side applied (which may create it) and merge-patched; never deleted.
    Labelled,
    /// Its spec applied to an object its agent created: never created.
    Spec,
    /// Patched in place (a Node's labels and taints).
    Patched,
    /// Only its status subresource, server-side applied.
    Status,
}

impl Writes {
    /// The verbs these writes need, and the subresource they are on.
    pub fn verbs(self) -> (&'static [&'static str], Option<&'static str>) {
        match self {
            Writes::Owned => (&["create", "patch", "delete"], None),
            Writes::Labelled => (&["create", "patch"], None),
            Writes::Spec | Writes::Patched => (&["patch"], None),
            Writes::Status => (&["patch"], Some("status")),
        }
    }
}

/// One row of the table, as data.
#[derive(Clone, Copy, Debug)]
pub struct Row {
    pub kind: Kind,
    pub scope: Scope,
    pub which: Which,
    pub writes: Writes,
    /// Its deletes go before the other rows' deletes: a binding is deleted before its policy.
    pub binding: bool,
    /// `plan -o yaml` prints its desired objects.
    pub planned: bool,
    pub optional: bool,
}

/// What the table's words mean as data.
macro_rules! scope_of {
    (cluster) => {
        Scope::Cluster
    };
    (device_plugin_namespace) => {
        Scope::DevicePluginNamespace
    };
}

macro_rules! writes_of {
    (owned) => {
        Writes::Owned
    };
    (owned_bindings) => {
        Writes::Owned
    };
    (validating_policies) => {
        Writes::Owned
    };
    (validating_bindings) => {
        Writes::Owned
    };
    (namespaces) => {
        Writes::Labelled
    };
    (specs) => {
        Writes::Spec
    };
    (node_patches) => {
        Writes::Patched
    };
    (status) => {
        Writes::Status
    };
}

macro_rules! binding {
    (owned_bindings) => {
        true
    };
    (validating_bindings) => {
        true
    };
    ($other:ident) => {
        false
    };
}

macro_rules! planned {
    (none) => {
        false
    };
    ($other:ident) => {
        true
    };
}

/// Prints one row's desired objects for `plan -o yaml`.
macro_rules! print_row {
    (none, $out:ident, $d:ident, $kind:ident, $desired:ident) => {};
    (objects, $out:ident, $d:ident, $kind:ident, $desired:ident) => {
        for o in &$d.$desired {
            $out.object(Kind::$kind, o);
        }
    };
    // A GpuNode's status is its agent's: the controller writes the spec.
    (specs, $out:ident, $d:ident, $kind:ident, $desired:ident) => {
        for o in &$d.$desired {
            let mut spec = o.clone();
            spec.status = None;
            $out.object(Kind::$kind, &spec);
        }
    };
}

/// What the table gives at run time: [`Kind`], [`TABLE`], [`manifests`].
macro_rules! table {
    ($( $kind:ident {
        ty: $ty:ty,
        live: $field:ident $held:ident,
        watch: $scope:ident $which:ident,
        write: $write:ident $desired:ident,
        $(seen: $seen:ty,)?
        plan: $plan:ident,
        optional: $optional:literal,
    } )*) => {
        /// The kinds the controller writes: one per row of the table, in its order, and the
        /// pods it evicts.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Kind {
            $($kind,)*
            Pod,
        }

        impl Kind {
            /// Every kind, in the order of the table (the order of the writes), the pods last.
            pub const ALL: &[Kind] = &[$(Kind::$kind,)* Kind::Pod];

            pub fn api_resource(self) -> ApiResource {
                match self {
                    $(Kind::$kind => ApiResource::erase::<$ty>(&()),)*
                    Kind::Pod => ApiResource::erase::<k8s_openapi::api::core::v1::Pod>(&()),
                }
            }
        }

        /// The table's rows as data, in its order.
        pub const TABLE: &[Row] = &[$(Row {
            kind: Kind::$kind,
            scope: scope_of!($scope),
            which: Which::$which,
            writes: writes_of!($write),
            binding: binding!($write),
            planned: planned!($plan),
            optional: $optional,
        },)*];

        /// Every object the controller writes for `d` but statuses, kind by kind in the table's
        /// order: what `plan -o yaml` prints.
        pub fn manifests(d: &Desired, out: &mut impl Manifests) {
            $(print_row!($plan, out, d, $kind, $desired);)*
        }

        /// Every field of [`Desired`] is a row's desired objects or named here as none: a field
        /// added without a row fails to compile.
        #[allow(dead_code)]
        fn every_desired_field_is_in_the_table(d: &Desired) {
            let Desired {
                $($desired: _,)*
                // What the validating bindings say, as data; the bindings are written.
                namespace_rules: _,
                // Reports: `plan`'s tables and `-o json` show them.
                changes: _,
                problems: _,
                // Kueue's own Configuration, not an object: `plan -o kueue-config` prints it.
                kueue_device_class_mappings: _,
            } = d;
        }
    };
}

owned_kinds!(table);

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl Kind {
    /// The kind's row of the table (none for [`Kind::Pod`]).
    pub fn row(self) -> Option<&'static Row> {
        TABLE.iter().find(|r| r.kind == self)
    }

    /// Its place in the table's order (the pods after every row).
    pub fn order(self) -> usize {
        Kind::ALL.iter().position(|k| *k == self).unwrap_or(Kind::ALL.len())
    }
}

/// Where [`manifests`] puts the objects.
pub trait Manifests {
    fn object<T: Serialize>(&mut self, kind: Kind, object: &T);
}

/// One permission the controller needs: verb, API group, resource (with `/subresource`) and scope.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Permission {
    pub verb: &'static str,
    pub group: String,
    pub resource: String,
    pub scope: Scope,
}

/// The permissions the table's rows need: list and watch for every row (its watch), and the
/// verbs of its writes. The controller needs a few more that are no row's: the pods it evicts,
/// its events, its Lease, and `get` of GpuTenants (the API server's check on a policy whose
/// parameter is one); deploy/base grants those beside these.
pub fn permissions() -> BTreeSet<Permission> {
    let mut out = BTreeSet::new();
    for row in TABLE {
        let ar = row.kind.api_resource();
        let mut add = |verb: &'static str, resource: String| {
            out.insert(Permission {
                verb,
                group: ar.group.clone(),
                resource,
                scope: row.scope,
            });
        };
        add("list", ar.plural.clone());
        add("watch", ar.plural.clone());
        let (verbs, subresource) = row.writes.verbs();
        let resource = match subresource {
            Some(sub) => format!("{}/{sub}", ar.plural),
            None => ar.plural.clone(),
        };
        for verb in verbs {
            add(verb, resource.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_one_row_but_the_pods() {
        let rows: Vec<Kind> = TABLE.iter().map(|r| r.kind).collect();
        assert_eq!(rows, Kind::ALL[..Kind::ALL.len() - 1]);
        assert_eq!(Kind::Pod.row().map(|r| r.kind), None);
        assert_eq!(Kind::Pod.order(), Kind::ALL.len() - 1);
        for (i, k) in Kind::ALL.iter().enumerate() {
            assert_eq!(k.order(), i);
        }
    }

    /// The grants the table asks for, as the controller's RBAC spells them (operator/tests/deploy_rbac.rs
    /// holds deploy/base to [`permissions`]).
    #[test]
    fn permissions_follow_the_writes() {
        let p = permissions();
        let has = |verb: &str, group: &str, resource: &str| {
            p.iter()
                .any(|x| x.verb == verb && x.group == group && x.resource == resource)
        };
        assert!(has("patch", "gputenancy.io", "gputenants/status"));
        assert!(
            !has("patch", "gputenancy.io", "gputenants"),
            "a tenant's spec is its owner's"
        );
        assert!(has("patch", "gputenancy.io", "gpunodes") && !has("create", "gputenancy.io", "gpunodes"));
        assert!(has("create", "", "namespaces") && !has("delete", "", "namespaces"));
        assert!(has("delete", "resource.k8s.io", "deviceclasses"));
        assert!(
            p.iter()
                .filter(|x| x.scope == Scope::DevicePluginNamespace)
                .all(|x| x.resource == "configmaps")
        );
    }
}
