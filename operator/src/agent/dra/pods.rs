//! What a pod holds through its claims, counted at Prepare against its tenant's
//! `maxGpusPerPod`: every claim the pod names (a template named twice makes two claims) and the
//! claim its extended resources were allocated through; and what memory cap each of its containers
//! would get from its claims ([`container_caps`]). The admission policies cannot tell: a pod names
//! its claims, and what they hold is in other objects.

use super::container_caps;
use super::devices::DraDevice;
use super::pod_claims::{devices_of, pod_claims};
use super::refusal::Refusal;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use std::collections::BTreeMap;

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

/// What Prepare checks of the pods a claim is reserved for.
pub struct PodChecks<'a> {
    pub tenant: &'a str,
    /// The tenant's `maxGpusPerPod`.
    pub max: Option<u32>,
    /// The memory cap the claim's spec carries, with this node's pool and devices to tell the
    /// caps of the pods' other claims ([`container_caps`]).
    pub cap: Option<u64>,
    pub pool: &'a str,
    pub devices: &'a [DraDevice],
    /// The caps of the claims prepared on this node, by UID, as their specs were written.
    pub written: &'a BTreeMap<String, container_caps::ClaimCap>,
}

/// Refuses `claim` when a pod it is reserved for holds, through all its claims, more devices of
/// this driver than `max`, or has a container that would get another memory cap from another
/// claim than `cap` ([`container_caps::check`]); or when it is reserved for no pod (what its pod
/// holds cannot be told). Each pod and each of its claims is read once.
pub async fn check(client: &Client, claim: &ResourceClaim, checks: &PodChecks<'_>) -> Result<(), PodError> {
    if checks.max.is_none() && checks.cap.is_none() {
        return Ok(());
    }
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
        return Err(PodError::Refused(match checks.max {
            Some(_) => Refusal::NotReserved {
                tenant: checks.tenant.to_string(),
            },
            None => Refusal::CapNotReserved {
                claim: format!("{namespace}/{}", claim.name_any()),
            },
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
        check_pod(
            &claim_api,
            claim,
            &pod,
            &format!("{namespace}/{pod_name}"),
            checks,
            &pod_err,
        )
        .await?;
    }
    Ok(())
}

/// [`check`] for one pod, `pod_ref` (namespace/name), reading each of its claims once; what
/// cannot be read is said by `pod_err`.
async fn check_pod(
    claim_api: &Api<ResourceClaim>,
    claim: &ResourceClaim,
    pod: &Pod,
    pod_ref: &str,
    checks: &PodChecks<'_>,
    pod_err: &(dyn Fn(String) -> PodError + Sync),
) -> Result<(), PodError> {
    let names = pod_claims(pod).map_err(|e| pod_err(e.to_string()))?;
    let mut claims: BTreeMap<String, ResourceClaim> = BTreeMap::new();
    for claim_name in &names {
        if claims.contains_key(claim_name) {
            continue;
        }
        let other = if *claim_name == claim.name_any() {
            claim.clone()
        } else {
            claim_api
                .get(claim_name)
                .await
                .map_err(|e| pod_err(format!("its claim {claim_name}: {e}")))?
        };
        claims.insert(claim_name.clone(), other);
    }
    if let Some(max) = checks.max {
        let holds = names
            .iter()
            .filter_map(|n| claims.get(n))
            .map(|c| u32::try_from(devices_of(c, None).len()).unwrap_or(u32::MAX))
            .fold(0u32, u32::saturating_add);
        if holds > max {
            return Err(PodError::Refused(Refusal::TooManyForPod {
                pod: pod_ref.to_string(),
                tenant: checks.tenant.to_string(),
                holds,
                max,
            }));
        }
    }
    if let Some(cap) = checks.cap {
        let containers = container_caps::consumed(pod).map_err(|e| pod_err(e.to_string()))?;
        let caps: BTreeMap<String, container_caps::ClaimCap> = claims
            .iter()
            .map(|(n, c)| {
                let written = c.uid().and_then(|u| checks.written.get(&u).cloned());
                let cap = written.unwrap_or_else(|| container_caps::claim_cap(c, checks.pool, checks.devices));
                (n.clone(), cap)
            })
            .collect();
        container_caps::check(pod_ref, &containers, &claim.name_any(), cap, &caps).map_err(PodError::Refused)?;
    }
    Ok(())
}
