//! Why an agent pass failed, by step: what the loop logs and backs off on, and what the step
//! that reads or creates the GpuNode ([`super::join`]) returns.

/// Why a pass failed, by step ([`PassError::step`] names it for logs and metrics).
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    #[error("reading GpuNode {node}: {source}")]
    Read { node: String, source: kube::Error },
    #[error("creating GpuNode {node}: {source}")]
    Create { node: String, source: kube::Error },
    /// The GPU layer's thread ended without an answer (a panic in it).
    #[error("the GPU pass stopped: {0}")]
    Stopped(tokio::task::JoinError),
    /// NVML failed for the whole node (a system query, the device count): nothing was applied.
    #[error("{0}")]
    Apply(crate::gpu::DiscoverError),
    #[error("writing GpuNode {node} status: {source}")]
    Publish { node: String, source: kube::Error },
}

impl PassError {
    /// The step that failed: `read`, `create`, `apply` or `publish`.
    pub fn step(&self) -> &'static str {
        match self {
            PassError::Read { .. } => "read",
            PassError::Create { .. } => "create",
            PassError::Stopped(_) | PassError::Apply(_) => "apply",
            PassError::Publish { .. } => "publish",
        }
    }
}
