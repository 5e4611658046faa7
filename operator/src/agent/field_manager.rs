//! The field manager the agent writes as: its GpuNode's status and its node's ResourceSlices
//! (the DRA claims have their own, [`super::dra::CLAIMS_FIELD_MANAGER`]).

/// Field manager of what the agent writes.
pub const FIELD_MANAGER: &str = "gpu-tenancy-agent";
