//! What a pod holds through its claims, counted at Prepare against its tenant's
//! `maxGpusPerPod`: every claim the pod names (a template named twice makes two claims) and the
//! claim its extended resources were allocated through. The admission policies cannot count them:
//! a pod names its claims, and what they hold is in other objects.

use super::devices::DRIVER;
use super::prepare::Refusal;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};

/// Why a pod's devices could not be counted, or were too many.
#[derive(Debug, thiserror::Error)]
pub enum PodError {
    #[error("{0}")]
    Refused(Refusal),
    #[error("reading pod {namespace}/{name}, which claim {claim} is reserved for: {why}")]
    Read {
        namespace: String,
        name: String,
        claim: String,
        why: String,
    },
}

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
struct ClaimNotCreated {
    entry: String,
}

/// The names of every claim `pod` holds, once per entry of its `resourceClaims` (a claim named
/// twice counts twice), and the claim its extended resources were allocated through. An entry
/// whose claim is not created yet cannot be counted: an error.
fn pod_claims(pod: &Pod) -> Result<Vec<String>, ClaimNotCreated> {
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
            (Some(name), _) | (None, Some(name)) => out.push(name),
            (None, None) => {
                return Err(ClaimNotCreated {
                    entry: entry.name.clone(),
                });
            }
        }
    }
    if let Some(ext) = status.and_then(|s| s.extended_resource_claim_status.as_ref()) {
        out.push(ext.resource_claim_name.clone());
    }
    Ok(out)
}

/// Refuses `claim` (of `tenant`) when a pod it is reserved for holds, through all its claims,
/// more than `max` devices of this driver, or when it is reserved for no pod (what its pod holds
/// cannot be counted).
pub async fn within_limit(client: &Client, claim: &ResourceClaim, tenant: &str, max: u32) -> Result<(), PodError> {
    let namespace = claim.namespace().unwrap_or_default();
    let pods: Vec<(String, String)> = claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .into_iter()
        .flatten()
        .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or_default().is_empty())
        .map(|r| (r.name.clone(), r.uid.clone()))
        .collect();
    if pods.is_empty() {
        return Err(PodError::Refused(Refusal::NotReserved {
            tenant: tenant.to_string(),
        }));
    }
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let claim_api: Api<ResourceClaim> = Api::namespaced(client.clone(), &namespace);
    for (pod_name, pod_uid) in pods {
        let pod_err = |why: String| PodError::Read {
            namespace: namespace.clone(),
            name: pod_name.clone(),
            claim: claim.name_any(),
            why,
        };
        // The agent may list pods (to find a busy GPU's), not get them.
        let pod = pod_api
            .list(&ListParams::default().fields(&format!("metadata.name={pod_name}")))
            .await
            .map_err(|e| pod_err(e.to_string()))?
            .items
            .into_iter()
            .find(|p| p.uid().as_deref() == Some(pod_uid.as_str()))
            .ok_or_else(|| pod_err(format!("no pod of UID {pod_uid}")))?;
        let mut holds = 0u32;
        for claim_name in pod_claims(&pod).map_err(|e| pod_err(e.to_string()))? {
            let other = if claim_name == claim.name_any() {
                claim.clone()
            } else {
                claim_api
                    .get(&claim_name)
                    .await
                    .map_err(|e| pod_err(format!("its claim {claim_name}: {e}")))?
            };
            holds += u32::try_from(devices_of(&other, None).len()).unwrap_or(u32::MAX);
        }
        if holds > max {
            return Err(PodError::Refused(Refusal::TooManyForPod {
                pod: format!("{namespace}/{pod_name}"),
                tenant: tenant.to_string(),
                holds,
                max,
            }));
        }
    }
    Ok(())
}
