//! Which Prepares may go ahead together (pure, over the state the caller locked): a device is
//! reserved for one Prepare at a time, and on a GPU of shares a scrub (which clears the whole GPU)
//! never runs beside a claim that holds the GPU or a Prepare that does not wait for it.

use super::checkpoint::{Checkpoint, DeviceRecord};
use super::devices::DraDevice;
use super::prepare::{self, Planned};
use std::collections::HashMap;

/// Why a Prepare may not go ahead now (the kubelet retries it).
#[derive(Debug, thiserror::Error)]
#[error("device {device} is busy: {why}")]
pub struct Busy {
    pub device: String,
    pub why: String,
}

/// A device a Prepare in progress decided on: its claim's UID, and whether that Prepare scrubs the
/// device's whole GPU (a share's scrub).
pub struct Reservation {
    claim: String,
    scrubs_gpu: bool,
}

impl Reservation {
    pub fn claim(&self) -> &str {
        &self.claim
    }
}

/// Reserves `planned` for claim `uid`, refusing a device another Prepare in progress reserved.
/// A share's scrub clears its whole GPU, so on a GPU of shares: a share to scrub is refused while
/// another claim holds a device of the GPU (its pod could run out of memory while the scrub takes
/// all that is free) or another Prepare reserves one without scrubbing (its pod could start
/// meanwhile); Prepares that all scrub the GPU go ahead together and share one scrub
/// ([`super::scrubs`]); a share without a scrub while another Prepare scrubs its GPU joins that
/// scrub (its pod must not start while the scrub takes the GPU's memory).
pub fn reserve(
    reserved: &mut HashMap<String, Reservation>,
    cp: &Checkpoint,
    devices: &[DraDevice],
    uid: &str,
    planned: &mut [Planned],
) -> Result<(), Busy> {
    for p in planned.iter_mut() {
        if let Some(other) = reserved.get(&p.device.name).filter(|r| r.claim != uid) {
            return Err(Busy {
                device: p.device.name.clone(),
                why: format!("claim {} is being prepared with it", other.claim),
            });
        }
        if !prepare::is_share(&p.device) {
            continue;
        }
        let on_gpu = |dev: &str| devices.iter().any(|d| d.name == dev && d.gpu == p.device.gpu);
        let held = cp.devices.iter().find_map(|(dev, r)| match r {
            DeviceRecord::InUse { claim, .. } if claim != uid && on_gpu(dev) => Some(claim.clone()),
            _ => None,
        });
        let reserving = |scrubbing: bool| {
            reserved
                .iter()
                .find(|(dev, r)| r.claim != uid && r.scrubs_gpu == scrubbing && on_gpu(dev))
                .map(|(_, r)| r.claim.clone())
        };
        if !p.scrub && reserving(true).is_some() {
            p.scrub = true;
        }
        if p.scrub
            && let Some(other) = held.or_else(|| reserving(false))
        {
            return Err(Busy {
                device: p.device.name.clone(),
                why: format!("it must be scrubbed, which clears its whole GPU, and claim {other} uses that GPU"),
            });
        }
    }
    for p in planned.iter() {
        reserved.insert(
            p.device.name.clone(),
            Reservation {
                claim: uid.to_string(),
                scrubs_gpu: p.scrub && prepare::is_share(&p.device),
            },
        );
    }
    Ok(())
}

/// A share of `p`'s GPU is now `tenant`'s: the other shares of that GPU no claim holds may hold
/// `tenant`'s data from now on, whatever their record said (a share's memory is its GPU's), so
/// another tenant's claim on one of them is scrubbed first.
pub fn shared_gpu_used(cp: &mut Checkpoint, devices: &[DraDevice], p: &Planned, tenant: &str) {
    let others: Vec<String> = devices
        .iter()
        .filter(|d| d.gpu == p.device.gpu && prepare::is_share(d) && d.name != p.device.name)
        .filter(|d| d.uuid.as_deref() == Some(p.uuid.as_str()))
        .map(|d| d.name.clone())
        .collect();
    for name in others {
        if !matches!(cp.devices.get(&name), Some(DeviceRecord::InUse { .. })) {
            cp.devices.insert(
                name,
                DeviceRecord::Released {
                    tenant: tenant.to_string(),
                    uuid: p.uuid.clone(),
                },
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::dra::devices::Unit;
    use crate::api::{Mode, ScrubMemory};

    fn share(k: u32) -> DraDevice {
        DraDevice {
            name: format!("gpu-0-ts-a-{k}"),
            gpu: 0,
            unit: Unit::Share { k },
            mode: Mode::TimeSlicing,
            tenant: Some("a".into()),
            profile: None,
            uuid: Some("GPU-0".into()),
            parent_uuid: Some("GPU-0".into()),
            product_name: String::new(),
            numa_node: None,
            memory_mib: 0,
            mps: None,
            memory_cap: None,
            scrub: ScrubMemory::OnTenantChange,
            not_ready: None,
            unhealthy: None,
            minor: None,
            instance_ids: None,
        }
    }

    fn planned(k: u32, scrub: bool) -> Vec<Planned> {
        vec![Planned {
            request: "gpu".into(),
            device: share(k),
            uuid: "GPU-0".into(),
            scrub,
        }]
    }

    /// Prepares that scrub a GPU go ahead together; one that would not scrub joins them; none
    /// scrubs beside a claim that holds the GPU; a device is one Prepare's at a time.
    #[test]
    fn scrubs_of_one_gpu_go_together_and_never_beside_a_holder() {
        let devices: Vec<DraDevice> = (0..4).map(share).collect();
        let cp = Checkpoint::default();
        let mut reserved = HashMap::new();
        reserve(&mut reserved, &cp, &devices, "x", &mut planned(0, true)).unwrap();
        reserve(&mut reserved, &cp, &devices, "y", &mut planned(1, true)).unwrap();
        let mut z = planned(2, false);
        reserve(&mut reserved, &cp, &devices, "z", &mut z).unwrap();
        assert!(z[0].scrub, "a Prepare without a scrub joins the GPU's scrub");
        assert!(matches!(
            reserve(&mut reserved, &cp, &devices, "w", &mut planned(0, false)),
            Err(Busy { .. })
        ));

        let mut held = Checkpoint::default();
        held.devices.insert(
            "gpu-0-ts-a-3".into(),
            DeviceRecord::InUse {
                claim: "h".into(),
                tenant: "a".into(),
                uuid: "GPU-0".into(),
            },
        );
        let mut fresh = HashMap::new();
        assert!(matches!(
            reserve(&mut fresh, &held, &devices, "x", &mut planned(0, true)),
            Err(Busy { .. })
        ));
        reserve(&mut fresh, &held, &devices, "x", &mut planned(0, false)).unwrap();
        // A Prepare reserving without a scrub keeps scrubs off the GPU.
        assert!(matches!(
            reserve(&mut fresh, &Checkpoint::default(), &devices, "y", &mut planned(1, true)),
            Err(Busy { .. })
        ));
    }

    /// A share in use by a tenant leaves the GPU's other free shares released by that tenant: its
    /// next claim needs no scrub, another tenant's does.
    #[test]
    fn a_share_used_marks_the_gpus_free_shares() {
        let devices: Vec<DraDevice> = (0..3).map(share).collect();
        let mut cp = Checkpoint::default();
        cp.devices.insert(
            "gpu-0-ts-a-2".into(),
            DeviceRecord::InUse {
                claim: "h".into(),
                tenant: "a".into(),
                uuid: "GPU-0".into(),
            },
        );
        shared_gpu_used(&mut cp, &devices, &planned(0, false)[0], "a");
        assert_eq!(
            cp.devices.get("gpu-0-ts-a-1"),
            Some(&DeviceRecord::Released {
                tenant: "a".into(),
                uuid: "GPU-0".into()
            })
        );
        assert!(matches!(
            cp.devices.get("gpu-0-ts-a-2"),
            Some(DeviceRecord::InUse { .. })
        ));
        assert!(!prepare::needs_scrub(
            cp.devices.get("gpu-0-ts-a-1"),
            "GPU-0",
            &devices[1],
            "a"
        ));
        assert!(prepare::needs_scrub(
            cp.devices.get("gpu-0-ts-a-1"),
            "GPU-0",
            &devices[1],
            "b"
        ));
    }
}
