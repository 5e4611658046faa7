//! How the memory of an MPS or time-sliced share is capped: the tier's rule
//! ([`MemoryCapPolicy`]) and what a node reports per GPU ([`GpuMemoryCap`]).
//! docs/concepts/isolation.md#memory-limits says which mode and stack give which method.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::fmt;

/// What a tier asks of the memory caps of its tenants' time-sliced shares (an MPS share is
/// always capped: by the driver, else by the MPS daemon).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
pub enum MemoryCapPolicy {
    /// A time-sliced share the node cannot cap is still handed out, and the node's status says
    /// it is not capped. The default: a time-sliced GPU is shared only within a tier (or not at
    /// all, `coLocation: Forbidden`), so an uncapped share can take memory from its own tier,
    /// never from a stranger's.
    #[default]
    BestEffort,
    /// A time-sliced share the node cannot cap is not handed out (DRA mode: published as not
    /// ready with the reason). For tiers whose tenants must not take each other's memory.
    Required,
}

impl MemoryCapPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            MemoryCapPolicy::BestEffort => "BestEffort",
            MemoryCapPolicy::Required => "Required",
        }
    }
}

/// What bounds a share's GPU memory.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
pub enum MemoryCapMethod {
    /// The driver, through the container toolkit's `apply-cuda-memory-limits` hook: an
    /// allocation past the cap fails as out of memory, whatever the container's processes do.
    Driver,
    /// The MPS control daemon's pinned memory limit for its clients (MPS shares only).
    MpsDaemon,
    /// Nothing: the share's memory is bookkeeping only.
    None,
}

impl MemoryCapMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            MemoryCapMethod::Driver => "Driver",
            MemoryCapMethod::MpsDaemon => "MpsDaemon",
            MemoryCapMethod::None => "None",
        }
    }
}

impl fmt::Display for MemoryCapMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why the driver cannot cap a node's shares.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
pub enum MemoryCapReason {
    /// The driver's version could not be read.
    DriverUnknown,
    /// The driver is older than R615.
    DriverTooOld,
    /// No `nvidia-ctk` at the agent's `--nvidia-ctk` path.
    ToolkitMissing,
    /// `nvidia-ctk --version` did not say a version the agent can read.
    ToolkitUnknown,
    /// The container toolkit is older than 1.20.1.
    ToolkitTooOld,
    /// The node does not run cgroup v2.
    NoCgroupV2,
    /// The node serves its GPUs through NVIDIA's device plugin, which sets no memory cap.
    DevicePlugin,
}

impl MemoryCapReason {
    pub fn as_str(self) -> &'static str {
        match self {
            MemoryCapReason::DriverUnknown => "DriverUnknown",
            MemoryCapReason::DriverTooOld => "DriverTooOld",
            MemoryCapReason::ToolkitMissing => "ToolkitMissing",
            MemoryCapReason::ToolkitUnknown => "ToolkitUnknown",
            MemoryCapReason::ToolkitTooOld => "ToolkitTooOld",
            MemoryCapReason::NoCgroupV2 => "NoCgroupV2",
            MemoryCapReason::DevicePlugin => "DevicePlugin",
        }
    }
}

impl fmt::Display for MemoryCapReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the shares of one MPS or time-sliced GPU are capped (`status.memoryCaps[]`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuMemoryCap {
    /// GPU index as NVML numbers it.
    #[schemars(range(max = 63))]
    pub index: u32,
    pub method: MemoryCapMethod,
    /// Why the driver does not cap them (absent when it does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<MemoryCapReason>,
    /// The version found, where the reason is about a version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub found: Option<String>,
}
