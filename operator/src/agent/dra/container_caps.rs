//! Whether a container would get one memory cap from all its claims, pure. The driver's cap is a
//! pair of container variables (`NVIDIA_GPU_MEMORY_REQUEST`/`_LIMIT`) that the toolkit's hook
//! applies to each GPU it runs for, while each claim's CDI spec sets them to that claim's cap
//! ([`cdi::claim_cap_mib`]). A container given two claims with different caps gets one of the
//! values (the runtime merges the specs' variables, the last one applied wins) on the GPUs of
//! both: one claim's GPU could get the other claim's larger cap and take a neighbour's memory.
//! So Prepare refuses a claim with a cap when a container of a pod it is reserved for also
//! consumes a claim whose cap differs, or one whose cap cannot be told (fail closed). A claim
//! without one (a whole GPU, a MIG instance, a share the driver does not cap) sets no variable:
//! the container's value is the capped claim's own, so it is allowed beside one.

use super::cdi;
use super::devices::DraDevice;
use super::pod_claims;
use super::refusal::{CapsDiffer, Refusal};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use std::collections::{BTreeMap, BTreeSet};

/// What a claim's CDI spec sets as the container's memory cap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimCap {
    /// No variable: the driver caps none of its devices here.
    None,
    /// This many MiB.
    Mib(u64),
    /// Not known: a device of it is not in this node's table, or its GPU's UUID is not read yet.
    Unknown { why: String },
}

/// The cap `claim`'s spec carries on this node (`pool`), over the node's `devices`: the same
/// rule the spec is written by.
pub fn claim_cap(claim: &ResourceClaim, pool: &str, devices: &[DraDevice]) -> ClaimCap {
    let mut held = Vec::new();
    for (_, name) in pod_claims::devices_of(claim, Some(pool)) {
        let Some(d) = devices.iter().find(|d| d.name == name) else {
            return ClaimCap::Unknown {
                why: format!("its device {name} is not one this node's GpuNode binds"),
            };
        };
        // A device the driver does not cap adds nothing to the cap, whatever its UUID.
        if d.memory_cap != Some(crate::api::MemoryCapMethod::Driver) {
            continue;
        }
        let Some(uuid) = d.uuid.as_deref() else {
            return ClaimCap::Unknown {
                why: format!("the UUID of its device {name}'s GPU is not known yet"),
            };
        };
        held.push((d, uuid));
    }
    match cdi::claim_cap_mib(&held) {
        Some(mib) => ClaimCap::Mib(mib),
        None => ClaimCap::None,
    }
}

/// The cap the spec written for a prepared claim carries: what the runtime applies, even where
/// the node's devices have changed since (a toolkit upgraded or removed).
pub fn written_cap(spec: &serde_json::Value) -> ClaimCap {
    let values: BTreeSet<&str> = spec["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|d| d["containerEdits"]["env"].as_array().into_iter().flatten())
        .filter_map(|e| e.as_str()?.strip_prefix("NVIDIA_GPU_MEMORY_LIMIT="))
        .collect();
    let mut it = values.iter();
    match (it.next(), it.next()) {
        (None, _) => ClaimCap::None,
        (Some(v), None) => v.parse().map_or_else(
            |_| ClaimCap::Unknown {
                why: format!("its CDI spec's NVIDIA_GPU_MEMORY_LIMIT={v} is not a number"),
            },
            ClaimCap::Mib,
        ),
        (Some(_), Some(_)) => ClaimCap::Unknown {
            why: "its CDI spec sets NVIDIA_GPU_MEMORY_LIMIT to several values".into(),
        },
    }
}

/// Each container of `pod` (init containers too) with the names of the claims it consumes: the
/// claims of its `resources.claims` entries, those of the pod's own `resources.claims` (every
/// container's), and the extended resources' claim for the containers it serves.
pub fn consumed(pod: &Pod) -> Result<Vec<(String, BTreeSet<String>)>, pod_claims::ClaimNotCreated> {
    let entries: BTreeMap<String, String> = pod_claims::entries(pod)?.into_iter().collect();
    let spec = pod.spec.as_ref();
    let by_entry = |claims: Option<&Vec<k8s_openapi::api::core::v1::ResourceClaim>>| {
        claims
            .into_iter()
            .flatten()
            .map(|c| {
                entries
                    .get(&c.name)
                    .cloned()
                    .ok_or_else(|| pod_claims::ClaimNotCreated { entry: c.name.clone() })
            })
            .collect::<Result<BTreeSet<String>, _>>()
    };
    let pod_wide = by_entry(spec.and_then(|s| s.resources.as_ref()).and_then(|r| r.claims.as_ref()))?;
    let ext = pod
        .status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.as_ref());
    let containers = spec
        .into_iter()
        .flat_map(|s| s.containers.iter().chain(s.init_containers.iter().flatten()));
    let mut out = Vec::new();
    for c in containers {
        let mut claims = by_entry(c.resources.as_ref().and_then(|r| r.claims.as_ref()))?;
        claims.extend(pod_wide.iter().cloned());
        if let Some(ext) = ext
            && ext.request_mappings.iter().any(|m| m.container_name == c.name)
        {
            claims.insert(ext.resource_claim_name.clone());
        }
        out.push((c.name.clone(), claims));
    }
    Ok(out)
}

/// Refuses `this` claim (whose spec carries `this_cap`) when a container of `pod` consumes it
/// and another claim whose cap differs or is unknown; `caps` has every claim the pod names.
pub fn check(
    pod: &str,
    containers: &[(String, BTreeSet<String>)],
    this: &str,
    this_cap: u64,
    caps: &BTreeMap<String, ClaimCap>,
) -> Result<(), Refusal> {
    for (container, claims) in containers.iter().filter(|(_, c)| c.contains(this)) {
        for other in claims.iter().filter(|o| o.as_str() != this) {
            let differ = |other_cap: Result<u64, String>| {
                Refusal::CapsDiffer(Box::new(CapsDiffer {
                    pod: pod.to_string(),
                    container: container.clone(),
                    claim: this.to_string(),
                    cap: this_cap,
                    other: other.clone(),
                    other_cap,
                }))
            };
            match caps.get(other) {
                None => return Err(differ(Err("it was not read".into()))),
                Some(ClaimCap::Unknown { why }) => return Err(differ(Err(why.clone()))),
                Some(ClaimCap::Mib(mib)) if *mib != this_cap => return Err(differ(Ok(*mib))),
                Some(_) => {}
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::dra::devices::{DRIVER, Unit};
    use crate::api::{MemoryCapMethod, Mode, ScrubMemory};
    use serde_json::json;

    const POOL: &str = "node-1";

    /// A share of GPU `gpu` (UUID `GPU-<gpu>`) of `mib`, capped by `cap`.
    fn share(name: &str, gpu: u32, mib: u64, cap: Option<MemoryCapMethod>) -> DraDevice {
        DraDevice {
            name: name.into(),
            gpu,
            unit: Unit::Share { k: 0 },
            mode: Mode::TimeSlicing,
            tenant: Some("t".into()),
            profile: None,
            uuid: Some(format!("GPU-{gpu}")),
            parent_uuid: None,
            product_name: String::new(),
            numa_node: None,
            memory_mib: mib,
            mps: None,
            memory_cap: cap,
            scrub: ScrubMemory::OnTenantChange,
            not_ready: None,
            unhealthy: None,
            minor: Some(gpu),
            instance_ids: None,
        }
    }

    /// The node's devices: GPU 0 in four driver-capped shares of 20000 MiB, GPU 1 whole, GPU 2 in
    /// shares nothing caps.
    fn table() -> Vec<DraDevice> {
        let mut out: Vec<DraDevice> = (0..4)
            .map(|k| share(&format!("s{k}"), 0, 20000, Some(MemoryCapMethod::Driver)))
            .collect();
        let mut whole = share("whole", 1, 80000, None);
        whole.unit = Unit::Gpu;
        whole.mode = Mode::Exclusive;
        out.push(whole);
        out.push(share("free0", 2, 40000, Some(MemoryCapMethod::None)));
        out
    }

    fn claim(name: &str, devices: &[&str]) -> ResourceClaim {
        let results: Vec<_> = devices
            .iter()
            .map(|d| json!({"request": "gpu", "driver": DRIVER, "pool": POOL, "device": d}))
            .collect();
        serde_json::from_value(
            json!({"metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": results}}}}),
        )
        .unwrap()
    }

    /// A pod whose containers (name, claim entries) consume entries `a`, `b`, ... naming claims
    /// of the same name.
    fn pod(containers: &[(&str, &[&str])], entries: &[&str]) -> Pod {
        let containers: Vec<_> = containers
            .iter()
            .map(|(n, cs)| {
                json!({"name": n, "resources": {"claims": cs.iter().map(|c| json!({"name": c})).collect::<Vec<_>>()}})
            })
            .collect();
        let entries: Vec<_> = entries
            .iter()
            .map(|e| json!({"name": e, "resourceClaimName": e}))
            .collect();
        serde_json::from_value(json!({"metadata": {"name": "p"},
            "spec": {"containers": containers, "resourceClaims": entries}}))
        .unwrap()
    }

    /// Decides for claim `this` of the pod, as Prepare would, with `claims` all the pod names.
    fn decide(pod: &Pod, this: &str, claims: &[ResourceClaim]) -> Result<(), Refusal> {
        let devices = table();
        let caps: BTreeMap<String, ClaimCap> = claims
            .iter()
            .map(|c| (c.metadata.name.clone().unwrap(), claim_cap(c, POOL, &devices)))
            .collect();
        let ClaimCap::Mib(cap) = caps[this] else {
            panic!("{this} has no cap: {:?}", caps[this]);
        };
        check("ns/p", &consumed(pod).unwrap(), this, cap, &caps)
    }

    #[test]
    fn the_cap_is_the_smallest_per_gpu_sum_of_driver_capped_devices_only() {
        let devices = table();
        assert_eq!(claim_cap(&claim("a", &["s0"]), POOL, &devices), ClaimCap::Mib(20000));
        assert_eq!(
            claim_cap(&claim("a", &["s0", "s1"]), POOL, &devices),
            ClaimCap::Mib(40000)
        );
        assert_eq!(
            claim_cap(&claim("a", &["s0", "whole"]), POOL, &devices),
            ClaimCap::Mib(20000)
        );
        assert_eq!(
            claim_cap(&claim("a", &["whole", "free0"]), POOL, &devices),
            ClaimCap::None
        );
        assert!(matches!(
            claim_cap(&claim("a", &["gone"]), POOL, &devices),
            ClaimCap::Unknown { .. }
        ));
        let mut unread = devices.clone();
        unread[0].uuid = None;
        assert!(matches!(
            claim_cap(&claim("a", &["s0"]), POOL, &unread),
            ClaimCap::Unknown { .. }
        ));
        // Another pool's devices are not this node's to cap.
        assert_eq!(claim_cap(&claim("a", &["s0"]), "node-2", &devices), ClaimCap::None);
    }

    /// One share in one claim, two in the other: 20000 and 40000 MiB. Whichever is prepared
    /// second (or first) is refused, naming both claims, the pod and the container.
    #[test]
    fn two_claims_of_different_caps_in_one_container_are_refused_either_way() {
        let claims = [claim("a", &["s0"]), claim("b", &["s1", "s2"])];
        let p = pod(&[("main", &["a", "b"])], &["a", "b"]);
        let refused = decide(&p, "a", &claims).unwrap_err();
        assert_eq!(
            refused,
            Refusal::CapsDiffer(Box::new(CapsDiffer {
                pod: "ns/p".into(),
                container: "main".into(),
                claim: "a".into(),
                cap: 20000,
                other: "b".into(),
                other_cap: Ok(40000),
            }))
        );
        let says = refused.to_string();
        for part in [
            "container main",
            "pod ns/p",
            "claim a",
            "claim b",
            "20000 MiB",
            "40000 MiB",
            "one claim with all the shares",
        ] {
            assert!(says.contains(part), "{part}: {says}");
        }
        assert!(matches!(
            decide(&p, "b", &claims),
            Err(Refusal::CapsDiffer(d)) if d.cap == 40000 && d.other_cap == Ok(20000)
        ));
    }

    #[test]
    fn equal_caps_and_claims_of_different_containers_are_allowed() {
        let claims = [claim("a", &["s0"]), claim("b", &["s1"])];
        let p = pod(&[("main", &["a", "b"])], &["a", "b"]);
        assert_eq!(decide(&p, "a", &claims), Ok(()));
        assert_eq!(decide(&p, "b", &claims), Ok(()));
        let claims = [claim("a", &["s0"]), claim("b", &["s1", "s2"])];
        let apart = pod(&[("one", &["a"]), ("two", &["b"])], &["a", "b"]);
        assert_eq!(decide(&apart, "a", &claims), Ok(()));
        assert_eq!(decide(&apart, "b", &claims), Ok(()));
    }

    /// A whole GPU or a share nothing caps sets no variable: the container's value is the capped
    /// claim's own, and the hook of the capped GPU applies that.
    #[test]
    fn a_capped_claim_beside_one_without_a_cap_is_allowed() {
        let claims = [claim("a", &["s0"]), claim("b", &["whole"]), claim("c", &["free0"])];
        let p = pod(&[("main", &["a", "b", "c"])], &["a", "b", "c"]);
        assert_eq!(decide(&p, "a", &claims), Ok(()));
    }

    /// Fail closed: a claim whose cap cannot be told, or that was not read, refuses.
    #[test]
    fn a_claim_whose_cap_cannot_be_told_refuses() {
        let claims = [claim("a", &["s0"]), claim("b", &["gone"])];
        let p = pod(&[("main", &["a", "b"])], &["a", "b"]);
        assert!(matches!(
            decide(&p, "a", &claims),
            Err(Refusal::CapsDiffer(d)) if d.other_cap.is_err()
        ));
        let caps = BTreeMap::from([("a".to_string(), ClaimCap::Mib(20000))]);
        assert!(matches!(
            check("ns/p", &consumed(&p).unwrap(), "a", 20000, &caps),
            Err(Refusal::CapsDiffer(d)) if d.other_cap.is_err()
        ));
    }

    /// A template's claim by its status, the extended resources' claim for the containers it
    /// serves, the pod's own claims for every container, init containers too.
    #[test]
    fn every_way_a_container_consumes_a_claim_counts() {
        let p: Pod = serde_json::from_value(json!({"metadata": {"name": "p"},
            "spec": {
                "initContainers": [{"name": "init", "resources": {"claims": [{"name": "tpl"}]}}],
                "containers": [{"name": "main"}, {"name": "side"}],
                "resources": {"claims": [{"name": "podwide"}]},
                "resourceClaims": [{"name": "tpl", "resourceClaimTemplateName": "one"},
                    {"name": "podwide", "resourceClaimName": "shared"}]},
            "status": {
                "resourceClaimStatuses": [{"name": "tpl", "resourceClaimName": "p-tpl-x1"}],
                "extendedResourceClaimStatus": {"resourceClaimName": "p-ext", "requestMappings": [
                    {"containerName": "main", "resourceName": "t.gputenancy.io/gpu", "requestName": "container-0-request-0"}]}}}))
        .unwrap();
        let got = consumed(&p).unwrap();
        let want = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<BTreeSet<_>>();
        assert_eq!(
            got,
            vec![
                ("main".to_string(), want(&["shared", "p-ext"])),
                ("side".to_string(), want(&["shared"])),
                ("init".to_string(), want(&["shared", "p-tpl-x1"])),
            ]
        );
        let claims = [
            claim("shared", &["s0"]),
            claim("p-ext", &["s1", "s2"]),
            claim("p-tpl-x1", &["s3"]),
        ];
        let devices = table();
        let caps: BTreeMap<String, ClaimCap> = claims
            .iter()
            .map(|c| (c.metadata.name.clone().unwrap(), claim_cap(c, POOL, &devices)))
            .collect();
        assert!(matches!(
            check("ns/p", &got, "shared", 20000, &caps),
            Err(Refusal::CapsDiffer(d)) if d.container == "main" && d.other == "p-ext"
        ));
        // A template whose claim is not created yet cannot be told.
        let mut early = p.clone();
        early.status.as_mut().unwrap().resource_claim_statuses = None;
        assert!(consumed(&early).is_err());
    }

    #[test]
    fn a_written_spec_says_its_cap() {
        let spec = |envs: &[&[&str]]| json!({"devices": envs.iter().map(|e| json!({"containerEdits": {"env": e}})).collect::<Vec<_>>()});
        assert_eq!(
            written_cap(&spec(&[
                &["NVIDIA_GPU_MEMORY_REQUEST=512", "NVIDIA_GPU_MEMORY_LIMIT=512"],
                &["X=1"]
            ])),
            ClaimCap::Mib(512)
        );
        assert_eq!(written_cap(&spec(&[&["NVIDIA_VISIBLE_DEVICES=GPU-1"]])), ClaimCap::None);
        assert!(matches!(
            written_cap(&spec(&[
                &["NVIDIA_GPU_MEMORY_LIMIT=512"],
                &["NVIDIA_GPU_MEMORY_LIMIT=1024"]
            ])),
            ClaimCap::Unknown { .. }
        ));
        assert!(matches!(
            written_cap(&spec(&[&["NVIDIA_GPU_MEMORY_LIMIT=lots"]])),
            ClaimCap::Unknown { .. }
        ));
    }
}
