//! The evidence a DRA hand-over leaves for the tenant and for auditors, in the ResourceClaim's
//! `status.devices` and the GpuNode's `status.claims` (docs/concepts/dra.md#hand-over-evidence):
//! what was done to the device's memory before the claim got it, and how the previous holder
//! relates to the claim's tenant, never who it was. [`crate::handover`] holds the rule.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::fmt;

/// What was done to a device's memory between its previous holder and the claim it was handed to.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
pub enum ScrubEvidence {
    /// Cleared and read back as zero, after the previous holder released it.
    Scrubbed,
    /// Not scrubbed: the previous holder was a claim of the same tenant and `scrubMemory` is
    /// `OnTenantChange` (the default).
    NotNeeded,
    /// Not scrubbed: the GPU's `scrubMemory` is `Never`.
    Skipped,
    /// The agent cannot say (a scrub that verified no byte, a claim prepared before the agent
    /// recorded evidence): read it as not scrubbed.
    Unknown,
}

/// How the device's previous holder relates to the claim's tenant. Never a name: a tenant learns
/// only whether its data could have met another tenant's.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
pub enum PreviousHolder {
    /// A claim of another tenant held it last.
    OtherTenant,
    /// A claim of the same tenant held it last.
    SameTenant,
    /// The agent has no trusted record of it (a device it has not handed over since its record
    /// began, one created again with a new UUID, a record set aside as untrusted). The agent can
    /// never know that nobody used a device, so there is no "none".
    Unknown,
}

impl ScrubEvidence {
    pub fn as_str(self) -> &'static str {
        match self {
            ScrubEvidence::Scrubbed => "Scrubbed",
            ScrubEvidence::NotNeeded => "NotNeeded",
            ScrubEvidence::Skipped => "Skipped",
            ScrubEvidence::Unknown => "Unknown",
        }
    }
}

impl PreviousHolder {
    pub fn as_str(self) -> &'static str {
        match self {
            PreviousHolder::OtherTenant => "OtherTenant",
            PreviousHolder::SameTenant => "SameTenant",
            PreviousHolder::Unknown => "Unknown",
        }
    }

    /// `last`: the tenant of the claim that held the device last, if the record knows one.
    pub fn of(last: Option<&str>, tenant: &str) -> PreviousHolder {
        match last {
            None => PreviousHolder::Unknown,
            Some(t) if t == tenant => PreviousHolder::SameTenant,
            Some(_) => PreviousHolder::OtherTenant,
        }
    }
}

impl fmt::Display for ScrubEvidence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for PreviousHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The evidence of one hand-over of a device to a claim.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HandOverEvidence {
    /// What was done to the memory before the claim got the device.
    pub scrub: ScrubEvidence,
    /// Bytes the scrub read back as zero; only with `scrub: Scrubbed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_verified: Option<u64>,
    /// When that scrub finished (the agent's clock); only with `scrub: Scrubbed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrubbed_at: Option<Time>,
    /// When the agent handed the device to the claim (the agent's clock); absent for a claim
    /// prepared before the agent recorded evidence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handed_over_at: Option<Time>,
    pub previous_holder: PreviousHolder,
}

impl HandOverEvidence {
    /// Nothing known: a claim prepared before the agent recorded evidence.
    pub fn unknown() -> HandOverEvidence {
        HandOverEvidence {
            scrub: ScrubEvidence::Unknown,
            bytes_verified: None,
            scrubbed_at: None,
            handed_over_at: None,
            previous_holder: PreviousHolder::Unknown,
        }
    }
}
