//! Which claims a pod and its containers name, and which devices of this driver a claim was
//! allocated: read from the objects alone, no API call, for the checks of [`super::pods`] and
//! [`super::container_caps`].

use super::devices::DRIVER;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;

/// The (request, device) pairs of this driver allocated to `claim`, on `pool` when given.
pub fn devices_of(claim: &ResourceClaim, pool: Option<&str>) -> Vec<(String, String)> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .map(|d| {
            d.results
                .iter()
                .flatten()
                .filter(|r| r.driver == DRIVER && pool.is_none_or(|p| r.pool == p))
                .map(|r| (r.request.clone(), r.device.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// A pod's claim entry whose claim does not exist yet.
#[derive(Debug, thiserror::Error)]
#[error("its claim {entry} is not created yet (no resourceClaimStatuses entry)")]
pub struct ClaimNotCreated {
    pub entry: String,
}

/// Each entry of `pod`'s `resourceClaims` with the name of its claim (a template's claim named by
/// `status.resourceClaimStatuses`). An entry whose claim is not created yet: an error.
pub fn entries(pod: &Pod) -> Result<Vec<(String, String)>, ClaimNotCreated> {
    let status = pod.status.as_ref();
    let generated = |entry: &str| -> Option<String> {
        status?
            .resource_claim_statuses
            .as_ref()?
            .iter()
            .find(|s| s.name == entry)?
            .resource_claim_name
            .clone()
    };
    let mut out = Vec::new();
    for entry in pod
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .into_iter()
        .flatten()
    {
        match (entry.resource_claim_name.clone(), generated(&entry.name)) {
            (Some(name), _) | (None, Some(name)) => out.push((entry.name.clone(), name)),
            (None, None) => {
                return Err(ClaimNotCreated {
                    entry: entry.name.clone(),
                });
            }
        }
    }
    Ok(out)
}

/// The names of every claim `pod` holds, once per entry of its `resourceClaims` (a claim named
/// twice counts twice), and the claim its extended resources were allocated through. An entry
/// whose claim is not created yet cannot be counted: an error.
pub fn pod_claims(pod: &Pod) -> Result<Vec<String>, ClaimNotCreated> {
    let mut out: Vec<String> = entries(pod)?.into_iter().map(|(_, name)| name).collect();
    if let Some(ext) = pod
        .status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.as_ref())
    {
        out.push(ext.resource_claim_name.clone());
    }
    Ok(out)
}
