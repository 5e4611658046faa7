//! Writes each prepared claim's hand-over evidence where its tenant reads it: the ResourceClaim's
//! `status.devices`, one entry per device of this driver in this node's pool
//! ([`super::evidence::device_status`]), by server-side apply under the agent's field manager, so
//! the entries of other drivers are not touched. A claim's entries are read first and written only
//! when they differ; a claim deleted or made again under its name (another UID) is left alone.
//! Unprepare leaves the entries: the API server drops them when the claim is deallocated.

use super::checkpoint::{Checkpoint, PreparedClaim};
use super::devices::DRIVER;
use super::evidence::device_status;
use crate::handover::HandOverEvidence;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, Patch};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use std::collections::HashMap;

/// Why a claim's evidence was not written (retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum EvidenceError {
    #[error("reading ResourceClaim {claim} to write its hand-over evidence: {source}")]
    Read { claim: String, source: kube::Error },
    #[error("writing the hand-over evidence in ResourceClaim {claim}'s status.devices: {source}")]
    Write { claim: String, source: kube::Error },
}

/// The entries `claim` should carry of `node`'s pool: one per device allocated to it from this
/// driver's pool that Prepare handed over, with the allocation's share ID.
pub fn entries(node: &str, claim: &ResourceClaim, prepared: &PreparedClaim) -> Vec<Value> {
    let created = claim
        .metadata
        .creation_timestamp
        .clone()
        .unwrap_or_else(super::evidence::now);
    let results = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref());
    results
        .into_iter()
        .flatten()
        .filter(|r| r.driver == DRIVER && r.pool == node)
        .filter_map(|r| {
            let d = prepared.devices.iter().find(|d| d.device == r.device)?;
            Some(device_status(
                node,
                &r.device,
                r.share_id.as_deref(),
                &d.evidence,
                &created,
            ))
        })
        .collect()
}

/// The entries `claim` carries now of this driver in `node`'s pool, as JSON (what
/// [`entries`] compares with).
pub fn live(node: &str, claim: &ResourceClaim) -> Vec<Value> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.devices.as_ref())
        .into_iter()
        .flatten()
        .filter(|d| d.driver == DRIVER && d.pool == node)
        .filter_map(|d| serde_json::to_value(d).ok())
        .collect()
}

/// Makes claim `uid`'s entries say its evidence; nothing written when they already do, or when
/// the claim is gone or another one now.
async fn write(client: &Client, node: &str, uid: &str, prepared: &PreparedClaim) -> Result<bool, EvidenceError> {
    let name = format!("{}/{}", prepared.namespace, prepared.name);
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &prepared.namespace);
    let claim = match api.get_opt(&prepared.name).await {
        Ok(Some(c)) if c.uid().as_deref() == Some(uid) => c,
        Ok(_) => return Ok(false),
        Err(source) => return Err(EvidenceError::Read { claim: name, source }),
    };
    let want = entries(node, &claim, prepared);
    if want.is_empty() || same(&want, &live(node, &claim)) {
        return Ok(false);
    }
    // The UID makes the write fail rather than land on a claim made again under the name since.
    let body = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": prepared.name, "namespace": prepared.namespace, "uid": uid},
        "status": {"devices": want},
    });
    let pp = crate::runtime::client::apply_params(super::CLAIMS_FIELD_MANAGER);
    match api.patch_status(&prepared.name, &pp, &Patch::Apply(body)).await {
        Ok(_) => Ok(true),
        // Deleted, or made again, meanwhile: nothing of it to write.
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(false),
        Err(source) => Err(EvidenceError::Write { claim: name, source }),
    }
}

/// Whether two lists hold the same entries, in any order.
fn same(a: &[Value], b: &[Value]) -> bool {
    a.len() == b.len() && a.iter().all(|x| b.contains(x))
}

/// What a claim's entries are written from: its devices' evidence.
fn written_from(c: &PreparedClaim) -> Vec<(String, HandOverEvidence)> {
    c.devices
        .iter()
        .map(|d| (d.device.clone(), d.evidence.clone()))
        .collect()
}

/// Keeps the evidence of every claim the checkpoint holds prepared on its claim: after a change,
/// changes within half a second coalesced; a claim whose evidence was written is not read again
/// until its evidence changes.
pub async fn publish(client: Client, node: String, mut saved: tokio::sync::watch::Receiver<Checkpoint>) {
    let mut written: HashMap<String, Vec<(String, HandOverEvidence)>> = HashMap::new();
    let mut backoff = crate::runtime::backoff::Backoff::for_api_errors();
    loop {
        let cp = saved.borrow_and_update().clone();
        written.retain(|uid, _| cp.claims.contains_key(uid));
        let mut failed = false;
        for (uid, c) in &cp.claims {
            let from = written_from(c);
            if written.get(uid) == Some(&from) {
                continue;
            }
            match write(&client, &node, uid, c).await {
                Ok(wrote) => {
                    if wrote {
                        tracing::info!(claim = %format!("{}/{}", c.namespace, c.name), "hand-over evidence written in the claim's status");
                    }
                    written.insert(uid.clone(), from);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the hand-over evidence was not written; retried");
                    failed = true;
                }
            }
        }
        if failed {
            tokio::time::sleep(backoff.next()).await;
            continue;
        }
        backoff.reset();
        if saved.changed().await.is_err() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::dra::checkpoint::PreparedDevice;
    use crate::handover::{PreviousHolder, ScrubEvidence};

    fn claim(results: Value, devices: Value) -> ResourceClaim {
        serde_json::from_value(json!({"metadata": {"name": "c", "namespace": "ns", "uid": "u1",
                "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "x"}}]}},
            "status": {"allocation": {"devices": {"results": results}}, "devices": devices}}))
        .unwrap()
    }

    fn prepared(devices: &[&str]) -> PreparedClaim {
        PreparedClaim {
            namespace: "ns".into(),
            name: "c".into(),
            tenant: "a".into(),
            devices: devices
                .iter()
                .map(|d| PreparedDevice {
                    request: "gpu".into(),
                    device: d.to_string(),
                    cdi_device_ids: vec![],
                    evidence: HandOverEvidence {
                        scrub: ScrubEvidence::NotNeeded,
                        previous_holder: PreviousHolder::SameTenant,
                        ..HandOverEvidence::unknown()
                    },
                })
                .collect(),
            cdi_spec: Value::Null,
        }
    }

    fn checkpoint() -> Checkpoint {
        let mut cp = Checkpoint::default();
        cp.claims.insert("u1".into(), prepared(&["gpu-0"]));
        cp
    }

    fn live_claim(uid: &str, devices: Value) -> Value {
        let mut c = serde_json::to_value(claim(
            json!([{"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-0"}]),
            devices,
        ))
        .unwrap();
        c["metadata"]["uid"] = json!(uid);
        c
    }

    const CLAIM: &str = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c";

    /// The requests of the writer, exactly: a claim without its entry is read and written once
    /// (server-side apply of its status, with its UID); a change of the checkpoint that leaves its
    /// evidence as it was sends nothing; a restart reads the claim and, its entry there, writes
    /// nothing; a claim made again under the name (another UID) is read and left alone.
    #[tokio::test]
    async fn the_writer_reads_and_writes_only_what_changed() {
        let (client, mut api) = crate::controller::fixtures::mock_client();
        let (tx, rx) = tokio::sync::watch::channel(checkpoint());
        let task = tokio::spawn(publish(client.clone(), "n1".into(), rx));
        api.expect(&format!("GET {CLAIM}"))
            .await
            .answer(200, &live_claim("u1", json!([])));
        let patch = api.next().await;
        assert!(
            patch.line().starts_with(&format!("PATCH {CLAIM}/status?")),
            "{}",
            patch.line()
        );
        assert!(
            patch.uri.contains("fieldManager=gpu-tenancy-agent-dra"),
            "{}",
            patch.uri
        );
        assert_eq!(patch.content_type.as_deref(), Some("application/apply-patch+yaml"));
        let written = patch.body.clone();
        assert_eq!(written["metadata"]["uid"], "u1");
        let entries = written["status"]["devices"].as_array().unwrap().clone();
        assert_eq!(entries.len(), 1);
        assert_eq!(
            entries[0]["data"],
            json!({"scrub": "NotNeeded", "previousHolder": "SameTenant"})
        );
        patch.ok();
        // Another device's record changes: this claim's evidence did not.
        let mut cp = checkpoint();
        cp.devices.insert(
            "gpu-9".into(),
            super::super::checkpoint::DeviceRecord::Released {
                tenant: "b".into(),
                uuid: "GPU-9".into(),
            },
        );
        tx.send_replace(cp);
        tokio::time::sleep(std::time::Duration::from_millis(700)).await;
        api.no_more().await;
        task.abort();

        // A restart: the claim read, its entry there, nothing written.
        let (client, mut api) = crate::controller::fixtures::mock_client();
        let (_tx, rx) = tokio::sync::watch::channel(checkpoint());
        let task = tokio::spawn(publish(client, "n1".into(), rx));
        api.expect(&format!("GET {CLAIM}"))
            .await
            .answer(200, &live_claim("u1", Value::Array(entries)));
        api.no_more().await;
        task.abort();

        // The claim deleted and made again: read, not written.
        let (client, mut api) = crate::controller::fixtures::mock_client();
        let (_tx, rx) = tokio::sync::watch::channel(checkpoint());
        let task = tokio::spawn(publish(client, "n1".into(), rx));
        api.expect(&format!("GET {CLAIM}"))
            .await
            .answer(200, &live_claim("u2", json!([])));
        api.no_more().await;
        task.abort();
    }

    /// Only this driver's devices of this node's pool that Prepare handed over; another driver's
    /// entry is neither written nor compared; what the API server returns compares equal.
    #[test]
    fn entries_are_this_drivers_of_this_pool_and_read_back_equal() {
        let results = json!([
            {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-0", "shareID": "7f3c0a52-8a1e-4b4e-9d7e-2f6b1a0c9e11"},
            {"request": "gpu", "driver": DRIVER, "pool": "n2", "device": "gpu-1"},
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0"},
            {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-9"}]);
        let other = json!([{"driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0", "data": {"x": 1}}]);
        let c = claim(results.clone(), other.clone());
        let p = prepared(&["gpu-0", "gpu-1"]);
        let want = entries("n1", &c, &p);
        assert_eq!(want.len(), 1, "{want:?}");
        assert_eq!(
            (&want[0]["device"], &want[0]["pool"], &want[0]["shareID"]),
            (
                &json!("gpu-0"),
                &json!("n1"),
                &json!("7f3c0a52-8a1e-4b4e-9d7e-2f6b1a0c9e11")
            )
        );
        assert_eq!(
            want[0]["data"],
            json!({"scrub": "NotNeeded", "previousHolder": "SameTenant"})
        );
        assert!(live("n1", &c).is_empty(), "another driver's entry is not this agent's");
        // As the API server holds it once written.
        let mut held = other.as_array().unwrap().clone();
        held.extend(want.clone());
        let c = claim(results, Value::Array(held));
        assert!(same(&want, &live("n1", &c)), "{:?} vs {:?}", want, live("n1", &c));
    }
}
