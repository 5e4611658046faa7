//! What more than one resource says: how a GPU is shared ([`Mode`]), and the patterns their
//! schemas check names and quantities against.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a GPU is shared.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
pub enum Mode {
    /// Hardware partitions: separate memory, SMs, L2 and fault containment.
    #[serde(rename = "MIG")]
    Mig,
    /// CUDA Multi-Process Service: concurrent processes on shared SMs, no memory or fault isolation.
    #[serde(rename = "MPS")]
    Mps,
    /// Processes take turns on the whole GPU; no isolation.
    TimeSlicing,
    /// One tenant has the whole GPU.
    Exclusive,
}

impl Mode {
    pub const ALL: [Mode; 4] = [Mode::Mig, Mode::Mps, Mode::TimeSlicing, Mode::Exclusive];

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Mig => "MIG",
            Mode::Mps => "MPS",
            Mode::TimeSlicing => "TimeSlicing",
            Mode::Exclusive => "Exclusive",
        }
    }

    /// Modes where several tenants' processes run on the same, unpartitioned GPU at once.
    pub fn is_shared(self) -> bool {
        matches!(self, Mode::Mps | Mode::TimeSlicing)
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The byte quantities the CRDs accept (a subset of Kubernetes quantities: no exponents, no milli).
pub const QUANTITY_PATTERN: &str = r"^[0-9]+(\.[0-9]+)?(k|K|M|G|T|P|Ki|Mi|Gi|Ti|Pi)?$";

/// MIG profile names as NVIDIA writes them: `3g.40gb`, `1g.10gb+me`, `1g.24gb+gfx`, `1g.24gb-me`.
pub const MIG_PROFILE_PATTERN: &str = r"^[1-7]g\.[0-9]+gb([+-][a-z]+(\.[a-z]+)?)?$";

/// Names of tenants, tiers, policies and namespaces: RFC 1123 labels.
pub const DNS_LABEL_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

/// Names of cluster objects such as PriorityClasses: RFC 1123 subdomains (dot-separated labels).
pub const DNS_SUBDOMAIN_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

/// A run of memory slices: `start:size`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
pub struct Placement {
    #[schemars(range(max = 7))]
    pub start: u32,
    #[schemars(range(min = 1, max = 8))]
    pub size: u32,
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.start, self.size)
    }
}
