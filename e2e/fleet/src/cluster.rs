//! The benchmark's own dealings with the API server: applying the generated objects, editing a
//! tenant or a plan, and snapshots of every object's `resourceVersion` (the API server's word on
//! which objects a change touched).

use gpu_tenancy::api::{GpuNode, GpuPartitionPlan, GpuTenant, SharingPolicy};
use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, ResourceQuota};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Debug;

/// Field manager of what the benchmark applies (the objects a platform team would keep in Git).
pub const MANAGER: &str = "gpu-tenancy-fleet";

/// Server-side applies each generated object (SharingPolicy, GpuPartitionPlan, GpuTenant).
pub async fn apply_objects(client: &Client, objects: &[Value]) -> Result<(), String> {
    let pp = PatchParams::apply(MANAGER).force();
    for o in objects {
        let kind = o["kind"].as_str().unwrap_or("");
        let name = o["metadata"]["name"].as_str().unwrap_or("");
        let r = match kind {
            "SharingPolicy" => Api::<SharingPolicy>::all(client.clone())
                .patch(name, &pp, &Patch::Apply(o))
                .await
                .map(|_| ()),
            "GpuPartitionPlan" => Api::<GpuPartitionPlan>::all(client.clone())
                .patch(name, &pp, &Patch::Apply(o))
                .await
                .map(|_| ()),
            "GpuTenant" => Api::<GpuTenant>::all(client.clone())
                .patch(name, &pp, &Patch::Apply(o))
                .await
                .map(|_| ()),
            other => return Err(format!("{other}/{name}: the fleet generates no such kind")),
        };
        r.map_err(|e| format!("applying {kind}/{name}: {e}"))?;
    }
    Ok(())
}

/// Creates namespace `name` if missing.
pub async fn ensure_namespace(client: &Client, name: &str) -> Result<(), String> {
    let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))
        .map_err(|e| format!("namespace {name}: {e}"))?;
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(format!("creating namespace {name}: {e}")),
    }
}

async fn versions_of<K>(api: Api<K>, kind: &str, out: &mut BTreeMap<String, String>) -> Result<(), String>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("listing {kind}: {e}"))?;
    for o in list {
        let key = match o.namespace() {
            Some(ns) => format!("{kind}/{ns}/{}", o.name_any()),
            None => format!("{kind}/{}", o.name_any()),
        };
        out.insert(key, o.resource_version().unwrap_or_default());
    }
    Ok(())
}

/// `Kind/[namespace/]name` → resourceVersion of every object the controller or the agents write.
pub async fn versions(client: &Client) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    versions_of(Api::<SharingPolicy>::all(client.clone()), "SharingPolicy", &mut out).await?;
    versions_of(Api::<GpuTenant>::all(client.clone()), "GpuTenant", &mut out).await?;
    versions_of(
        Api::<GpuPartitionPlan>::all(client.clone()),
        "GpuPartitionPlan",
        &mut out,
    )
    .await?;
    versions_of(Api::<GpuNode>::all(client.clone()), "GpuNode", &mut out).await?;
    versions_of(Api::<Node>::all(client.clone()), "Node", &mut out).await?;
    versions_of(Api::<Namespace>::all(client.clone()), "Namespace", &mut out).await?;
    versions_of(Api::<ResourceQuota>::all(client.clone()), "ResourceQuota", &mut out).await?;
    versions_of(Api::<ConfigMap>::all(client.clone()), "ConfigMap", &mut out).await?;
    versions_of(
        Api::<ValidatingAdmissionPolicy>::all(client.clone()),
        "ValidatingAdmissionPolicy",
        &mut out,
    )
    .await?;
    versions_of(
        Api::<ValidatingAdmissionPolicyBinding>::all(client.clone()),
        "ValidatingAdmissionPolicyBinding",
        &mut out,
    )
    .await?;
    Ok(out)
}

/// Objects created, changed or deleted between two snapshots.
pub fn changed(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) -> Vec<String> {
    let mut out: Vec<String> = after
        .iter()
        .filter(|(k, v)| before.get(*k) != Some(*v))
        .map(|(k, _)| k.clone())
        .collect();
    out.extend(
        before
            .keys()
            .filter(|k| !after.contains_key(*k))
            .map(|k| format!("{k} (deleted)")),
    );
    out
}

/// Each tenant's `status.grants`, to tell whose grants a change moved.
pub async fn grants(client: &Client) -> Result<BTreeMap<String, Value>, String> {
    let list = Api::<GpuTenant>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("listing GpuTenant: {e}"))?;
    Ok(list
        .into_iter()
        .map(|t| {
            let g = t
                .status
                .as_ref()
                .and_then(|s| serde_json::to_value(&s.grants).ok())
                .unwrap_or(Value::Null);
            (t.name_any(), g)
        })
        .collect())
}

/// Units of one tenant's grants (a GpuTenant status's `grants`) that moved: per kind (mode and
/// MIG profile), the units given up on one GPU or instance while as many were taken on another
/// (`min(lost, gained)`; a grant that only grows or only shrinks moves none). MPS and
/// time-slicing grants count their shares.
pub fn moved_units(before: Option<&Value>, after: Option<&Value>) -> u32 {
    type Kind = (String, String);
    type Units = BTreeMap<Kind, BTreeMap<(String, u64, String), u64>>;
    let units = |v: Option<&Value>| {
        let mut out = Units::new();
        for g in v.and_then(Value::as_array).into_iter().flatten() {
            let s = |k: &str| g.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
            let kind = (s("mode"), s("profile"));
            let at = (
                s("node"),
                g.get("gpu").and_then(Value::as_u64).unwrap_or(0),
                s("placement"),
            );
            *out.entry(kind).or_default().entry(at).or_default() += g.get("count").and_then(Value::as_u64).unwrap_or(1);
        }
        out
    };
    let (b, a) = (units(before), units(after));
    let none = BTreeMap::new();
    let mut moved = 0;
    for kind in b.keys().chain(a.keys()).collect::<std::collections::BTreeSet<_>>() {
        let (bk, ak) = (b.get(kind).unwrap_or(&none), a.get(kind).unwrap_or(&none));
        let (mut lost, mut gained) = (0, 0);
        for at in bk.keys().chain(ak.keys()).collect::<std::collections::BTreeSet<_>>() {
            let (x, y) = (bk.get(at).copied().unwrap_or(0), ak.get(at).copied().unwrap_or(0));
            lost += x.saturating_sub(y);
            gained += y.saturating_sub(x);
        }
        moved += lost.min(gained);
    }
    moved as u32
}

/// Tenants whose grants differ, with the grants each lost and gained.
pub fn moved_grants(before: &BTreeMap<String, Value>, after: &BTreeMap<String, Value>) -> BTreeMap<String, Value> {
    let list = |v: Option<&Value>| v.and_then(|v| v.as_array().cloned()).unwrap_or_default();
    after
        .iter()
        .filter(|(k, v)| before.get(*k) != Some(*v))
        .map(|(k, v)| {
            let (b, a) = (list(before.get(k)), list(Some(v)));
            let lost: Vec<&Value> = b.iter().filter(|g| !a.contains(g)).collect();
            let gained: Vec<&Value> = a.iter().filter(|g| !b.contains(g)).collect();
            (k.clone(), serde_json::json!({"lost": lost, "gained": gained}))
        })
        .collect()
}
