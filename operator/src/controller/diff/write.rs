//! What the controller writes: the kinds of object, and one write (apply, status, patch, eviction,
//! delete) with what it says for logs and metrics.

use super::node_patch::NodePatch;
use crate::controller::metrics::WriteAction;
use kube::core::ApiResource;
use serde_json::Value;
use std::fmt;

/// The kinds the controller writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    GpuNode,
    SharingPolicy,
    GpuTenant,
    GpuPartitionPlan,
    Namespace,
    ResourceQuota,
    ConfigMap,
    Node,
    ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding,
    MutatingAdmissionPolicy,
    MutatingAdmissionPolicyBinding,
    DeviceClass,
    Pod,
}

impl Kind {
    pub fn api_resource(self) -> ApiResource {
        use k8s_openapi::api::admissionregistration::v1 as adm;
        use k8s_openapi::api::core::v1 as core;
        match self {
            Kind::GpuNode => ApiResource::erase::<crate::api::GpuNode>(&()),
            Kind::SharingPolicy => ApiResource::erase::<crate::api::SharingPolicy>(&()),
            Kind::GpuTenant => ApiResource::erase::<crate::api::GpuTenant>(&()),
            Kind::GpuPartitionPlan => ApiResource::erase::<crate::api::GpuPartitionPlan>(&()),
            Kind::Namespace => ApiResource::erase::<core::Namespace>(&()),
            Kind::ResourceQuota => ApiResource::erase::<core::ResourceQuota>(&()),
            Kind::ConfigMap => ApiResource::erase::<core::ConfigMap>(&()),
            Kind::Node => ApiResource::erase::<core::Node>(&()),
            Kind::ValidatingAdmissionPolicy => ApiResource::erase::<adm::ValidatingAdmissionPolicy>(&()),
            Kind::ValidatingAdmissionPolicyBinding => ApiResource::erase::<adm::ValidatingAdmissionPolicyBinding>(&()),
            Kind::MutatingAdmissionPolicy => ApiResource::erase::<adm::MutatingAdmissionPolicy>(&()),
            Kind::MutatingAdmissionPolicyBinding => ApiResource::erase::<adm::MutatingAdmissionPolicyBinding>(&()),
            Kind::DeviceClass => ApiResource::erase::<k8s_openapi::api::resource::v1::DeviceClass>(&()),
            Kind::Pod => ApiResource::erase::<core::Pod>(&()),
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// One request to the API server.
#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    /// Server-side apply of `object` (creates it if missing), field manager `gpu-tenancy-controller`.
    Apply {
        kind: Kind,
        namespace: Option<String>,
        name: String,
        object: Value,
    },
    /// Server-side apply of `object`'s status on the status subresource.
    Status { kind: Kind, name: String, object: Value },
    /// A JSON merge patch (of a Namespace's labels).
    Patch { kind: Kind, name: String, patch: Value },
    /// A Node's labels and taints, our keys only ([`NodePatch`]).
    NodePatch(NodePatch),
    Delete {
        kind: Kind,
        namespace: Option<String>,
        name: String,
    },
    /// An Eviction of the pod `namespace/name` (of that `uid`) that the agent of `node` asked
    /// for; made only if the pod runs on `node` and asks for a GPU (`controller::evict`).
    Evict {
        namespace: String,
        name: String,
        uid: String,
        node: String,
    },
}

impl Write {
    pub fn kind(&self) -> Kind {
        match self {
            Write::Apply { kind, .. }
            | Write::Status { kind, .. }
            | Write::Patch { kind, .. }
            | Write::Delete { kind, .. } => *kind,
            Write::NodePatch(_) => Kind::Node,
            Write::Evict { .. } => Kind::Pod,
        }
    }

    /// The object's name (without its namespace).
    pub fn name(&self) -> &str {
        match self {
            Write::Apply { name, .. }
            | Write::Status { name, .. }
            | Write::Patch { name, .. }
            | Write::Delete { name, .. }
            | Write::Evict { name, .. } => name,
            Write::NodePatch(p) => &p.name,
        }
    }

    /// What the write does to its object: the metric's label, and the log's first word.
    pub fn action(&self) -> WriteAction {
        match self {
            Write::Apply { .. } => WriteAction::Apply,
            Write::Status { .. } => WriteAction::Status,
            Write::Patch { .. } | Write::NodePatch(_) => WriteAction::Patch,
            Write::Delete { .. } => WriteAction::Delete,
            Write::Evict { .. } => WriteAction::Evict,
        }
    }
}

impl fmt::Display for Write {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Write::Apply {
                kind, namespace, name, ..
            }
            | Write::Delete { kind, namespace, name } => {
                let ns = namespace.as_ref().map(|n| format!("{n}/")).unwrap_or_default();
                write!(f, "{} {kind} {ns}{name}", self.action())
            }
            Write::Status { kind, name, .. } | Write::Patch { kind, name, .. } => {
                write!(f, "{} {kind} {name}", self.action())
            }
            Write::NodePatch(p) => write!(f, "patch Node {}", p.name),
            Write::Evict {
                namespace, name, node, ..
            } => write!(f, "evict Pod {namespace}/{name} (asked by the agent of {node})"),
        }
    }
}
