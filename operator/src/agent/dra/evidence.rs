//! What a hand-over leaves as evidence, pure: decided from the device's record as it stood when
//! Prepare handed the device to the claim (the record a scrub leaves says what it verified), and
//! written as the claim's `status.devices` entry (docs/concepts/dra.md#hand-over-evidence).
//!
//! Fail closed: `Scrubbed` only where a scrub read back a non-zero number of bytes as zero since
//! the previous holder; where the record cannot say, `Unknown`.

use super::checkpoint::DeviceRecord;
use super::devices::DRIVER;
use crate::api::ScrubMemory;
use crate::handover::{HandOverEvidence, PreviousHolder, ScrubEvidence};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

/// The evidence of handing a device (UUID `uuid`, under `scrub`), last recorded as `record`, to a
/// claim of `tenant` at `now`.
pub fn evidence(
    record: Option<&DeviceRecord>,
    uuid: &str,
    tenant: &str,
    scrub: ScrubMemory,
    now: &Time,
) -> HandOverEvidence {
    // A record of another UUID is another device's (a MIG instance created again): no past known.
    let record = record.filter(|r| r.uuid() == uuid);
    let last = match record {
        Some(DeviceRecord::Clean { tenant, .. }) => tenant.as_deref(),
        Some(DeviceRecord::Released { tenant, .. }) => Some(tenant.as_str()),
        // A device in use is refused before a hand-over; whose it was is not a released past.
        Some(DeviceRecord::InUse { .. }) | None => None,
    };
    let previous_holder = PreviousHolder::of(last, tenant);
    let mut e = HandOverEvidence {
        scrub: ScrubEvidence::Unknown,
        bytes_verified: None,
        scrubbed_at: None,
        handed_over_at: Some(now.clone()),
        previous_holder,
    };
    match record {
        Some(DeviceRecord::Clean { verified: Some(v), .. }) if v.bytes > 0 => {
            e.scrub = ScrubEvidence::Scrubbed;
            e.bytes_verified = Some(v.bytes);
            e.scrubbed_at = Some(v.at.clone());
        }
        // Cleared by a scrub that verified nothing, or recorded before the agent kept what it
        // verified: not claimed as scrubbed.
        Some(DeviceRecord::Clean { .. }) => {}
        _ if scrub == ScrubMemory::Never => e.scrub = ScrubEvidence::Skipped,
        _ if previous_holder == PreviousHolder::SameTenant && scrub == ScrubMemory::OnTenantChange => {
            e.scrub = ScrubEvidence::NotNeeded
        }
        // Prepare scrubs every other case first; an unscrubbed one here is not vouched for.
        _ => {}
    }
    e
}

/// The agent's clock now, to the second: what the API server keeps of a time, so an evidence
/// read back compares equal to the one written.
pub fn now() -> Time {
    let secs = jiff::Timestamp::now().as_second();
    Time(jiff::Timestamp::from_second(secs).unwrap_or(jiff::Timestamp::UNIX_EPOCH))
}

/// The `Ready` condition's reason for `e`.
fn reason(e: &HandOverEvidence) -> &'static str {
    match e.scrub {
        ScrubEvidence::Scrubbed => "Scrubbed",
        ScrubEvidence::NotNeeded => "NoScrubNeeded",
        ScrubEvidence::Skipped => "ScrubSkipped",
        ScrubEvidence::Unknown => "ScrubUnknown",
    }
}

fn message(e: &HandOverEvidence) -> String {
    let before = match e.previous_holder {
        PreviousHolder::OtherTenant => "another tenant's claim held the device before",
        PreviousHolder::SameTenant => "a claim of the same tenant held the device before",
        PreviousHolder::Unknown => "the agent has no record of who held the device before",
    };
    let memory = match (e.scrub, e.bytes_verified) {
        (ScrubEvidence::Scrubbed, Some(b)) => format!("its memory was scrubbed and {b} bytes read back as zero"),
        (ScrubEvidence::NotNeeded, _) => "its memory was not scrubbed (scrubMemory: OnTenantChange)".to_string(),
        (ScrubEvidence::Skipped, _) => "its memory was not scrubbed (scrubMemory: Never)".to_string(),
        _ => "whether its memory was scrubbed is not known".to_string(),
    };
    format!("prepared: {before}; {memory}")
}

/// The claim's `status.devices` entry for device `device` of `node`'s pool (its allocation's
/// `share_id`, if any): a `Ready` condition and the evidence as its data. `fallback`: the
/// condition's time when the evidence has none (a claim prepared before the agent recorded it).
pub fn device_status(node: &str, device: &str, share_id: Option<&str>, e: &HandOverEvidence, fallback: &Time) -> Value {
    let at = e.handed_over_at.as_ref().unwrap_or(fallback);
    let mut entry = json!({
        "driver": DRIVER, "pool": node, "device": device,
        "conditions": [{"type": "Ready", "status": "True", "reason": reason(e), "message": message(e),
            "lastTransitionTime": at}],
        "data": e,
    });
    if let Some(s) = share_id {
        entry["shareID"] = json!(s);
    }
    entry
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::dra::checkpoint::Verified;

    fn at(secs: i64) -> Time {
        Time(jiff::Timestamp::from_second(secs).unwrap())
    }

    fn released(t: &str) -> DeviceRecord {
        DeviceRecord::Released {
            tenant: t.into(),
            uuid: "GPU-0".into(),
        }
    }

    fn clean(t: Option<&str>, bytes: Option<u64>) -> DeviceRecord {
        DeviceRecord::Clean {
            uuid: "GPU-0".into(),
            tenant: t.map(String::from),
            verified: bytes.map(|bytes| Verified { bytes, at: at(100) }),
        }
    }

    /// (record, policy) → (scrub, previous holder, bytes), written out case by case.
    #[test]
    fn the_evidence_says_what_the_record_knows_and_no_more() {
        use PreviousHolder as P;
        use ScrubEvidence as S;
        let on = ScrubMemory::OnTenantChange;
        let case = |record: Option<DeviceRecord>, policy: ScrubMemory| {
            let e = evidence(record.as_ref(), "GPU-0", "a", policy, &at(200));
            assert_eq!(e.handed_over_at, Some(at(200)));
            assert_eq!(e.scrubbed_at.is_some(), e.scrub == S::Scrubbed, "{e:?}");
            (e.scrub, e.previous_holder, e.bytes_verified)
        };
        // b's data scrubbed; a's own scrubbed under Always; an unknown past scrubbed.
        let b_scrubbed = case(Some(clean(Some("b"), Some(4096))), on);
        assert_eq!(b_scrubbed, (S::Scrubbed, P::OtherTenant, Some(4096)));
        let a_always = case(Some(clean(Some("a"), Some(10))), ScrubMemory::Always);
        assert_eq!(a_always, (S::Scrubbed, P::SameTenant, Some(10)));
        let unknown_scrubbed = case(Some(clean(None, Some(4096))), on);
        assert_eq!(unknown_scrubbed, (S::Scrubbed, P::Unknown, Some(4096)));
        // A scrub that verified nothing, a clean record from before the agent kept the bytes.
        assert_eq!(
            case(Some(clean(Some("b"), Some(0))), on),
            (S::Unknown, P::OtherTenant, None)
        );
        assert_eq!(
            case(Some(clean(Some("b"), None)), on),
            (S::Unknown, P::OtherTenant, None)
        );
        // Not scrubbed: a's own claim before; scrubMemory Never.
        assert_eq!(case(Some(released("a")), on), (S::NotNeeded, P::SameTenant, None));
        let never = ScrubMemory::Never;
        assert_eq!(case(Some(released("b")), never), (S::Skipped, P::OtherTenant, None));
        assert_eq!(case(None, never), (S::Skipped, P::Unknown, None));
        // Not reachable through Prepare (it scrubs these first): not vouched for.
        assert_eq!(case(Some(released("b")), on), (S::Unknown, P::OtherTenant, None));
        let always = ScrubMemory::Always;
        assert_eq!(case(Some(released("a")), always), (S::Unknown, P::SameTenant, None));
        assert_eq!(case(None, on), (S::Unknown, P::Unknown, None));
        // A record of another UUID (the instance created again) is no past of this device.
        let other = DeviceRecord::Released {
            tenant: "a".into(),
            uuid: "GPU-old".into(),
        };
        assert_eq!(case(Some(other), on), (S::Unknown, P::Unknown, None));
        let old = DeviceRecord::Clean {
            uuid: "GPU-old".into(),
            tenant: Some("a".into()),
            verified: Some(Verified { bytes: 9, at: at(1) }),
        };
        assert_eq!(case(Some(old), on), (S::Unknown, P::Unknown, None));
    }

    #[test]
    fn the_claims_entry_carries_the_evidence_and_no_tenant_name() {
        let e = evidence(
            Some(&clean(Some("tenant-b"), Some(4096))),
            "GPU-0",
            "tenant-a",
            ScrubMemory::OnTenantChange,
            &at(200),
        );
        let entry = device_status("n1", "gpu-0", None, &e, &at(1));
        assert_eq!(
            entry,
            json!({"driver": "gpu.gputenancy.io", "pool": "n1", "device": "gpu-0",
                "conditions": [{"type": "Ready", "status": "True", "reason": "Scrubbed",
                    "message": "prepared: another tenant's claim held the device before; its memory was scrubbed and 4096 bytes read back as zero",
                    "lastTransitionTime": "1970-01-01T00:03:20Z"}],
                "data": {"scrub": "Scrubbed", "bytesVerified": 4096, "scrubbedAt": "1970-01-01T00:01:40Z",
                    "handedOverAt": "1970-01-01T00:03:20Z", "previousHolder": "OtherTenant"}})
        );
        assert!(!entry.to_string().contains("tenant-b"));
        let old = device_status("n1", "gpu-0", Some("s1"), &HandOverEvidence::unknown(), &at(1));
        assert_eq!(old["conditions"][0]["lastTransitionTime"], "1970-01-01T00:00:01Z");
        assert_eq!(old["conditions"][0]["reason"], "ScrubUnknown");
        assert_eq!(old["shareID"], "s1");
    }
}
