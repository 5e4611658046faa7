//! The status subresource: status written with server-side apply (a field manager of its own,
//! PATCH to /status) does not bump metadata.generation; a spec change does; spec sent to
//! /status is ignored.

use gpu_tenancy_e2e::{Cleanup, GROUP, KINDS, Names, VERSION, api, client, ensure_crds};
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::fixtures;

const STATUS_MANAGER: &str = "gpu-tenancy-e2e-status";

fn generation(o: &DynamicObject) -> i64 {
    o.metadata.generation.expect("metadata.generation")
}

#[tokio::test]
async fn status_written_with_server_side_apply_does_not_bump_generation() {
    let client = client().await;
    ensure_crds(&client).await;
    let cleanup = Cleanup::new();
    let names = Names::new("status");

    for (kind, _, _) in KINDS {
        let api = api(&client, kind);
        let name = names.next();
        cleanup.add(kind, &name);
        let created = api
            .create(
                &PostParams::default(),
                &serde_json::from_value(fixtures::valid(kind, &name)).unwrap(),
            )
            .await
            .unwrap_or_else(|e| panic!("creating a valid {kind}: {e}"));
        let g = generation(&created);

        let status = json!({
            "apiVersion": format!("{GROUP}/{VERSION}"),
            "kind": kind,
            "metadata": {"name": name},
            "status": {
                "observedGeneration": g,
                "conditions": [{
                    "type": "Ready",
                    "status": "True",
                    "reason": "Reconciled",
                    "message": "written by the e2e suite",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                    "observedGeneration": g
                }]
            }
        });
        let after = api
            .patch_status(
                &name,
                &PatchParams::apply(STATUS_MANAGER).force(),
                &Patch::Apply(&status),
            )
            .await
            .unwrap_or_else(|e| panic!("{kind}: server-side apply to /status: {e}"));
        assert_eq!(
            generation(&after),
            g,
            "{kind}: a status write bumped metadata.generation"
        );
        assert_eq!(
            after.data["status"]["observedGeneration"],
            json!(g),
            "{kind}: status not stored: {:?}",
            after.data
        );
        assert_eq!(
            after.data["status"]["conditions"][0]["type"], "Ready",
            "{kind}: conditions not stored"
        );
        let managed = after.metadata.managed_fields.clone().unwrap_or_default();
        assert!(
            managed
                .iter()
                .any(|m| m.manager.as_deref() == Some(STATUS_MANAGER) && m.subresource.as_deref() == Some("status")),
            "{kind}: no managedFields entry for {STATUS_MANAGER} on the status subresource: {managed:?}"
        );
        let fresh = api.get(&name).await.unwrap();
        assert_eq!(generation(&fresh), g, "{kind}: generation changed after a status write");

        // Spec sent to /status is ignored.
        let mut spec_via_status = status.clone();
        let mut other = fresh.data.clone();
        bump_spec(kind, &mut other);
        spec_via_status["spec"] = other["spec"].clone();
        let after = api
            .patch_status(
                &name,
                &PatchParams::apply(STATUS_MANAGER).force(),
                &Patch::Apply(&spec_via_status),
            )
            .await
            .unwrap_or_else(|e| panic!("{kind}: server-side apply to /status: {e}"));
        assert_eq!(
            generation(&after),
            g,
            "{kind}: spec sent to /status bumped the generation"
        );
        assert_eq!(
            after.data["spec"], fresh.data["spec"],
            "{kind}: spec sent to /status was stored"
        );

        // A spec change through the main resource bumps the generation and keeps the status.
        let mut changed = fresh.clone();
        bump_spec(kind, &mut changed.data);
        let updated = api
            .replace(&name, &PostParams::default(), &changed)
            .await
            .unwrap_or_else(|e| panic!("{kind}: spec update: {e}"));
        assert_eq!(
            generation(&updated),
            g + 1,
            "{kind}: a spec change must bump metadata.generation"
        );
        assert_eq!(
            updated.data["status"]["observedGeneration"],
            json!(g),
            "{kind}: status lost on spec update"
        );
    }
}

/// A valid spec change for each kind.
fn bump_spec(kind: &str, data: &mut Value) {
    let spec = &mut data["spec"];
    match kind {
        "SharingPolicy" => spec["memoryHeadroomPercent"] = json!(20),
        "GpuTenant" | "GpuPartitionPlan" => spec["priority"] = json!(5),
        "GpuNode" => spec["plan"] = json!("another-plan"),
        other => panic!("no spec change for {other}"),
    }
}
