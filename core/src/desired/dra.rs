//! The DRA mode's cluster side: what each tenant holds on DRA nodes, and the DeviceClasses its
//! claims use.
//!
//! **One DeviceClass per tenant and kind of device** (`team-a.mig-1g.10gb.gputenancy.io`): its
//! selector takes only this driver's devices whose `tenant` attribute is the tenant, of that mode
//! (and profile). A claim's own selectors can only narrow its class's, so a claim of tenant A's
//! class can be allocated only A's devices by the scheduler; the admission rules
//! (`admission::rules::claims`) keep each namespace to its tenant's classes, and the agent's
//! Prepare refuses a device whose tenant is not the claim's namespace's anyway (fail closed: a
//! class or a rule missing refuses, never hands over).
//!
//! **Pods written for the device plugin** work through DRA extended resources: each class names
//! the extended resource `<tenant>.gputenancy.io/<kind>`, so the scheduler serves a pod asking
//! `team-a.gputenancy.io/mig-1g.10gb: 1` from team-a's class (making the claim itself), and a
//! MutatingAdmissionPolicy per tenant renames `nvidia.com/mig-1g.10gb` to it in the tenant's pods
//! when all of the tenant's units of that name are on DRA nodes. A class shared by all tenants
//! (`extendedResourceName: nvidia.com/mig-1g.10gb`) cannot be made: a class's selector sees the
//! device, never the claim's namespace, so it would hand any tenant's device to any pod.

use super::settings::managed_labels;
use crate::api::{DeviceAccess, GpuNode, GpuTenant};
use crate::dra::DeviceKind;
use crate::labels::TENANT;
use k8s_openapi::api::resource::v1::DeviceClass;
use kube::ResourceExt;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Per tenant, its units on DRA nodes by kind of device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DraHoldings(pub BTreeMap<String, BTreeMap<DeviceKind, u64>>);

impl DraHoldings {
    /// From the valid tenants' grants and the GpuNode specs written now: a grant counts where its
    /// node's spec says `DRA` (a node still held back by a rollout counts as what it still is).
    pub fn of(nodes: &[GpuNode], tenants: &[Arc<GpuTenant>]) -> DraHoldings {
        let dra: BTreeSet<String> = nodes
            .iter()
            .filter(|n| n.spec.device_access == DeviceAccess::Dra)
            .map(|n| n.name_any())
            .collect();
        let mut out = BTreeMap::new();
        for t in tenants {
            let Some(status) = t.status.as_ref() else { continue };
            if !t.is_valid() {
                continue;
            }
            let mut held: BTreeMap<DeviceKind, u64> = BTreeMap::new();
            for g in status.grants.iter().filter(|g| dra.contains(&g.node) && g.count > 0) {
                *held.entry(DeviceKind::of(g.mode, g.profile.as_deref())).or_default() += u64::from(g.count);
            }
            if !held.is_empty() {
                out.insert(t.name_any(), held);
            }
        }
        DraHoldings(out)
    }

    /// `tenant`'s units on DRA nodes by kind (empty: none).
    pub fn of_tenant(&self, tenant: &str) -> BTreeMap<DeviceKind, u64> {
        self.0.get(tenant).cloned().unwrap_or_default()
    }

    /// `tenant`'s units on DRA nodes served under the device plugin's resource `name`.
    pub fn units_named(&self, tenant: &str, name: &str) -> u64 {
        self.0
            .get(tenant)
            .into_iter()
            .flatten()
            .filter(|(k, _)| k.device_plugin_resource() == name)
            .map(|(_, n)| n)
            .sum()
    }
}

/// Every tenant's DeviceClasses, sorted by name.
pub fn device_classes(holdings: &DraHoldings) -> Vec<DeviceClass> {
    let mut out: Vec<DeviceClass> = holdings
        .0
        .iter()
        .flat_map(|(tenant, kinds)| kinds.keys().map(move |k| class(tenant, k)))
        .collect();
    crate::api::sort_by_name(&mut out);
    out
}

fn class(tenant: &str, kind: &DeviceKind) -> DeviceClass {
    let mut labels = managed_labels();
    labels.insert(TENANT.into(), tenant.into());
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": kind.class_name(tenant), "labels": labels},
        "spec": {
            "selectors": [{"cel": {"expression": kind.selector(tenant)}}],
            "extendedResourceName": kind.extended_resource(tenant),
        }
    }))
    .expect("a DeviceClass built from its own fields deserialises")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ConditionSet, GpuNodeSpec, GpuTenantSpec, GpuTenantStatus, Grant, Mode};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    fn grant(node: &str, mode: Mode, profile: Option<&str>, count: u32) -> Grant {
        Grant {
            node: node.into(),
            gpu: 0,
            gpu_uuid: None,
            mode,
            profile: profile.map(String::from),
            placement: None,
            instance_uuid: None,
            count,
        }
    }

    fn tenant(name: &str, valid: bool, grants: Vec<Grant>) -> GpuTenant {
        let mut t = GpuTenant::new(
            name,
            GpuTenantSpec {
                tier: "internal".into(),
                policy_ref: "default".into(),
                namespaces: vec![],
                priority: 0,
                weight: 1,
                resources: vec![],
                limits: None,
            },
        );
        t.status = Some(GpuTenantStatus {
            grants: grants.into(),
            conditions: vec![Condition {
                type_: ConditionSet::VALID.into(),
                status: if valid { "True" } else { "False" }.into(),
                reason: "R".into(),
                message: String::new(),
                last_transition_time: Time(jiff::Timestamp::UNIX_EPOCH),
                observed_generation: None,
            }],
            ..Default::default()
        });
        t
    }

    fn node(name: &str, access: DeviceAccess) -> GpuNode {
        GpuNode::new(
            name,
            GpuNodeSpec {
                device_access: access,
                ..Default::default()
            },
        )
    }

    /// Only grants on DRA nodes count, by kind, for valid tenants; each gets a class per kind
    /// that selects its own devices of that kind.
    #[test]
    fn classes_follow_the_grants_on_dra_nodes() {
        let nodes = [node("dra", DeviceAccess::Dra), node("dp", DeviceAccess::DevicePlugin)];
        let tenants = [
            tenant(
                "a",
                true,
                vec![
                    grant("dra", Mode::Mig, Some("1g.10gb"), 1),
                    grant("dra", Mode::Mig, Some("1g.10gb"), 1),
                    grant("dp", Mode::Mig, Some("1g.10gb"), 1),
                    grant("dra", Mode::Mps, None, 3),
                ],
            ),
            tenant("b", true, vec![grant("dp", Mode::Exclusive, None, 2)]),
            tenant("c", false, vec![grant("dra", Mode::Exclusive, None, 1)]),
        ];
        let h = DraHoldings::of(&nodes, &tenants.map(Arc::new));
        assert_eq!(
            h.of_tenant("a"),
            BTreeMap::from([(DeviceKind::Mig("1g.10gb".into()), 2), (DeviceKind::Mps, 3)])
        );
        assert!(h.of_tenant("b").is_empty() && h.of_tenant("c").is_empty());
        assert_eq!(h.units_named("a", "nvidia.com/mig-1g.10gb"), 2);
        assert_eq!(h.units_named("a", "nvidia.com/gpu.shared"), 3);
        let classes = device_classes(&h);
        let names: Vec<String> = classes.iter().map(|c| c.name_any()).collect();
        assert_eq!(names, ["a.mig-1g.10gb.gputenancy.io", "a.mps.gputenancy.io"]);
        let spec = classes[0].spec.as_ref().unwrap();
        assert_eq!(
            spec.extended_resource_name.as_deref(),
            Some("a.gputenancy.io/mig-1g.10gb")
        );
        assert_eq!(
            spec.selectors.as_ref().unwrap()[0].cel.as_ref().unwrap().expression,
            "device.driver == 'gpu.gputenancy.io' && device.attributes['gpu.gputenancy.io'].tenant == 'a' && device.attributes['gpu.gputenancy.io'].mode == 'MIG' && device.attributes['gpu.gputenancy.io'].profile == '1g.10gb'"
        );
    }
}
