//! What Prepare decides for one claim, pure: the last line of defence between a tenant's claim
//! and another tenant's GPU. The scheduler allocated the claim's devices; this refuses any device
//! whose tenant is not the tenant owning the claim's namespace, any device the GpuNode does not
//! bind or that may not be handed over yet, and any device another claim holds; and it says which
//! devices must be scrubbed first (a previous claim of another tenant, an unknown past, a UUID
//! not the one recorded, `scrubMemory: Always`).

use super::checkpoint::{Checkpoint, DeviceRecord};
use super::devices::{DraDevice, Unit};
use super::refusal::Refusal;
use crate::api::ScrubMemory;

/// A claim as Prepare sees it: its identity, the tenant owning its namespace, and the devices the
/// scheduler allocated it on this node from this driver, as (request, device name).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimView {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// The tenant that alone lists the namespace, if one does.
    pub tenant: Option<String>,
    pub allocated: Vec<(String, String)>,
}

/// One device Prepare will hand to the claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned {
    pub request: String,
    pub device: DraDevice,
    /// Its UUID (what is scrubbed and recorded).
    pub uuid: String,
    /// Its memory must be scrubbed and verified first.
    pub scrub: bool,
}

/// Must `d`, last recorded as `record`, be scrubbed before a claim of `tenant` gets it?
pub fn needs_scrub(record: Option<&DeviceRecord>, uuid: &str, d: &DraDevice, tenant: &str) -> bool {
    if d.scrub == ScrubMemory::Never {
        return false;
    }
    match record {
        None => true,
        Some(r) if r.uuid() != uuid => true,
        Some(DeviceRecord::Clean { .. }) => false,
        Some(DeviceRecord::Released { tenant: last, .. }) => last != tenant || d.scrub == ScrubMemory::Always,
        // A device in use is refused before this is asked; an unknown holder is the safe answer.
        Some(DeviceRecord::InUse { .. }) => true,
    }
}

/// Decides Prepare for `claim` over the node's `devices` and what `cp` records.
pub fn plan(cp: &Checkpoint, claim: &ClaimView, devices: &[DraDevice]) -> Result<Vec<Planned>, Refusal> {
    if claim.allocated.is_empty() {
        return Err(Refusal::NotAllocated);
    }
    let Some(tenant) = claim.tenant.as_deref() else {
        return Err(Refusal::NoTenant {
            namespace: claim.namespace.clone(),
        });
    };
    let mut out = Vec::new();
    for (request, name) in &claim.allocated {
        let Some(d) = devices.iter().find(|d| &d.name == name) else {
            return Err(Refusal::UnknownDevice { device: name.clone() });
        };
        if d.tenant.as_deref() != Some(tenant) {
            return Err(Refusal::WrongTenant {
                device: name.clone(),
                owner: d.tenant.clone(),
                tenant: tenant.to_string(),
            });
        }
        if let Some(why) = d.not_ready {
            return Err(Refusal::NotReady {
                device: name.clone(),
                why: why.as_str(),
            });
        }
        if let Some(u) = &d.unhealthy {
            return Err(Refusal::Unhealthy {
                device: name.clone(),
                why: u.message.clone(),
            });
        }
        // A share's memory is its GPU's: what is scrubbed and recorded is the GPU.
        let uuid = match (&d.unit, &d.uuid) {
            (_, Some(u)) => u.clone(),
            _ => {
                return Err(Refusal::NotReady {
                    device: name.clone(),
                    why: "its UUID is not known yet",
                });
            }
        };
        let record = cp.devices.get(name);
        if let Some(DeviceRecord::InUse { claim: other, .. }) = record
            && other != &claim.uid
        {
            return Err(Refusal::InUse {
                device: name.clone(),
                claim: other.clone(),
            });
        }
        let scrub = needs_scrub(record, &uuid, d, tenant);
        out.push(Planned {
            request: request.clone(),
            device: d.clone(),
            uuid,
            scrub,
        });
    }
    Ok(out)
}

/// Whether a claim's record still answers for it: every device it was prepared with is still
/// there with the UUID recorded for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recorded {
    Holds,
    /// A device's UUID is not known yet (the agent has not read its GPUs since it started).
    Unknown {
        device: String,
    },
    /// A device is another one now (a MIG instance created again after a reboot has a new UUID):
    /// its past is unknown, so the claim is prepared again, scrubbed first.
    Changed {
        device: String,
    },
}

/// [`Recorded`] for claim `uid`, prepared with `prepared` devices, over the node's `devices` now.
pub fn recorded(cp: &Checkpoint, uid: &str, prepared: &[String], devices: &[DraDevice]) -> Recorded {
    for name in prepared {
        let now = devices.iter().find(|d| &d.name == name).and_then(|d| d.uuid.as_deref());
        let then = match cp.devices.get(name) {
            Some(DeviceRecord::InUse { claim, uuid, .. }) if claim == uid => Some(uuid.as_str()),
            _ => None,
        };
        match (now, then) {
            (None, _) => return Recorded::Unknown { device: name.clone() },
            (Some(n), Some(t)) if n == t => {}
            _ => return Recorded::Changed { device: name.clone() },
        }
    }
    Recorded::Holds
}

/// Whether a share of a GPU would be scrubbed: the whole GPU is, so no other claim may hold any
/// device of that GPU then.
pub fn is_share(d: &DraDevice) -> bool {
    matches!(d.unit, Unit::Share { .. })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::dra::devices::NotReady;
    use crate::api::Mode;

    fn dev(name: &str, tenant: &str, scrub: ScrubMemory) -> DraDevice {
        DraDevice {
            name: name.into(),
            gpu: 0,
            unit: Unit::Gpu,
            mode: Mode::Exclusive,
            tenant: Some(tenant.into()),
            profile: None,
            uuid: Some(format!("UUID-{name}")),
            parent_uuid: None,
            product_name: String::new(),
            numa_node: None,
            memory_mib: 1,
            mps: None,
            memory_cap: None,
            scrub,
            not_ready: None,
            unhealthy: None,
            minor: Some(0),
            instance_ids: None,
        }
    }

    fn claim(tenant: Option<&str>, devices: &[&str]) -> ClaimView {
        ClaimView {
            uid: "c1".into(),
            namespace: "ns".into(),
            name: "claim".into(),
            tenant: tenant.map(String::from),
            allocated: devices.iter().map(|d| ("gpu".to_string(), d.to_string())).collect(),
        }
    }

    #[test]
    fn another_tenants_device_an_unknown_one_and_one_in_use_are_refused() {
        let devices = [
            dev("d0", "a", ScrubMemory::OnTenantChange),
            dev("d1", "b", ScrubMemory::OnTenantChange),
        ];
        let cp = Checkpoint::default();
        assert!(matches!(
            plan(&cp, &claim(Some("a"), &["d1"]), &devices),
            Err(Refusal::WrongTenant { .. })
        ));
        assert!(matches!(
            plan(&cp, &claim(None, &["d0"]), &devices),
            Err(Refusal::NoTenant { .. })
        ));
        assert!(matches!(
            plan(&cp, &claim(Some("a"), &["gone"]), &devices),
            Err(Refusal::UnknownDevice { .. })
        ));
        assert_eq!(plan(&cp, &claim(Some("a"), &[]), &devices), Err(Refusal::NotAllocated));
        let mut held = cp.clone();
        held.devices.insert(
            "d0".into(),
            DeviceRecord::InUse {
                claim: "c0".into(),
                tenant: "a".into(),
                uuid: "UUID-d0".into(),
            },
        );
        assert!(matches!(
            plan(&held, &claim(Some("a"), &["d0"]), &devices),
            Err(Refusal::InUse { .. })
        ));
        let mut busy = devices.clone();
        busy[0].not_ready = Some(NotReady::Busy);
        assert!(matches!(
            plan(&cp, &claim(Some("a"), &["d0"]), &busy),
            Err(Refusal::NotReady { .. })
        ));
        let mut sick = devices.clone();
        sick[0].unhealthy = Some(crate::api::Unhealthy {
            reason: crate::api::HealthReason::EccUncorrectable,
            message: "the driver reported an uncorrectable ECC error".into(),
        });
        let refused = plan(&cp, &claim(Some("a"), &["d0"]), &sick);
        assert!(
            matches!(&refused, Err(Refusal::Unhealthy { why, .. }) if why.contains("ECC")),
            "{refused:?}"
        );
    }

    /// After a reboot a MIG instance is created again with a new UUID: the record no longer
    /// answers for the claim; a device not read yet is waited for.
    #[test]
    fn a_record_answers_only_while_its_devices_are_the_same() {
        let d = dev("d0", "a", ScrubMemory::OnTenantChange);
        let mut cp = Checkpoint::default();
        cp.devices.insert(
            "d0".into(),
            DeviceRecord::InUse {
                claim: "c1".into(),
                tenant: "a".into(),
                uuid: "UUID-d0".into(),
            },
        );
        let names = ["d0".to_string()];
        assert_eq!(recorded(&cp, "c1", &names, std::slice::from_ref(&d)), Recorded::Holds);
        let mut again = d.clone();
        again.uuid = Some("UUID-new".into());
        assert_eq!(
            recorded(&cp, "c1", &names, &[again]),
            Recorded::Changed { device: "d0".into() }
        );
        let mut unread = d.clone();
        unread.uuid = None;
        assert_eq!(
            recorded(&cp, "c1", &names, &[unread]),
            Recorded::Unknown { device: "d0".into() }
        );
        assert_eq!(
            recorded(&cp, "c2", &names, &[d]),
            Recorded::Changed { device: "d0".into() }
        );
    }

    /// Scrub when the past is unknown, another tenant's, of another UUID, or under Always; not
    /// between two claims of one tenant, nor after a scrub, nor under Never.
    #[test]
    fn scrubs_follow_the_previous_holder() {
        let d = dev("d0", "a", ScrubMemory::OnTenantChange);
        let released = |t: &str, u: &str| DeviceRecord::Released {
            tenant: t.into(),
            uuid: u.into(),
        };
        assert!(needs_scrub(None, "UUID-d0", &d, "a"));
        assert!(needs_scrub(Some(&released("b", "UUID-d0")), "UUID-d0", &d, "a"));
        assert!(!needs_scrub(Some(&released("a", "UUID-d0")), "UUID-d0", &d, "a"));
        assert!(needs_scrub(Some(&released("a", "UUID-old")), "UUID-d0", &d, "a"));
        let clean = DeviceRecord::Clean {
            uuid: "UUID-d0".into(),
            tenant: Some("b".into()),
            verified: None,
        };
        assert!(!needs_scrub(Some(&clean), "UUID-d0", &d, "a"));
        let always = dev("d0", "a", ScrubMemory::Always);
        assert!(needs_scrub(Some(&released("a", "UUID-d0")), "UUID-d0", &always, "a"));
        let never = dev("d0", "a", ScrubMemory::Never);
        assert!(!needs_scrub(None, "UUID-d0", &never, "a"));
    }
}
