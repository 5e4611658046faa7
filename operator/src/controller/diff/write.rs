//! What the controller writes: the kinds of object, and one write (apply, status, patch, eviction,
//! delete) with what it says for logs and metrics.

use super::node_patch::NodePatch;
pub use crate::controller::kinds::Kind;
use crate::controller::metrics::WriteAction;
use serde_json::Value;
use std::fmt;

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

/// When in a pass a write goes out ([`crate::controller::kinds::owned_kinds`]): applies, patches
/// and statuses row by row, then evictions, then the bindings' deletes, then the other deletes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    Write,
    Evict,
    BindingDelete,
    Delete,
}

impl Write {
    /// Its place in a pass: the phase, then the row of its kind in the table.
    pub fn stage(&self) -> (Phase, usize) {
        let kind = self.kind();
        let phase = match self {
            Write::Evict { .. } => Phase::Evict,
            Write::Delete { .. } if kind.row().is_some_and(|r| r.binding) => Phase::BindingDelete,
            Write::Delete { .. } => Phase::Delete,
            _ => Phase::Write,
        };
        (phase, kind.order())
    }

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
