//! What the renders of one tenant (its quotas, its admission rules) read of it, to tell whether
//! they would render the same as in the last pass without rendering them: building
//! every tenant's quotas and rules again on every pass was a large part of a tenant's change. The policies are not in it: a memo holding keys is forgotten when they change.

use super::dra::DraHoldings;
use crate::api::{AllocationSummary, GpuTenant};
use crate::dra::DeviceKind;
use std::collections::BTreeMap;

/// One tenant's inputs to its renders, besides its name (the memos are by name) and the policies.
#[derive(Debug, PartialEq)]
pub struct TenantKey {
    /// Its tier, by policy and name: the Pod Security level and PriorityClasses it gets.
    policy_ref: String,
    tier: String,
    /// Whether its `Valid` condition is `True` (only a valid tenant's grants count).
    valid: bool,
    /// Its requested and granted units per kind of capacity.
    allocation: Vec<AllocationSummary>,
    /// Its units on DRA nodes.
    dra: Option<BTreeMap<DeviceKind, u64>>,
}

impl TenantKey {
    pub fn of(t: &GpuTenant, name: &str, dra: &DraHoldings) -> TenantKey {
        let status = t.status.as_ref();
        TenantKey {
            policy_ref: t.spec.policy_ref.clone(),
            tier: t.spec.tier.clone(),
            valid: t.is_valid(),
            allocation: status.map(|s| s.allocation.clone()).unwrap_or_default(),
            dra: dra.0.get(name).cloned(),
        }
    }

    /// Whether `t` (named `name`) has these inputs now: [`TenantKey::of`] compared, without
    /// the copies.
    pub fn is_of(&self, t: &GpuTenant, name: &str, dra: &DraHoldings) -> bool {
        let allocation = t.status.as_ref().map_or(&[][..], |s| &s.allocation[..]);
        self.policy_ref == t.spec.policy_ref
            && self.tier == t.spec.tier
            && self.valid == t.is_valid()
            && self.allocation == allocation
            && self.dra.as_ref() == dra.0.get(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ConditionSet, Mode};

    fn tenant(granted: u32) -> GpuTenant {
        let mut t = crate::planner::fixtures::TenantBuilder::new("a", "trusted")
            .want(Mode::Mps, 2)
            .build();
        t.status = Some(crate::api::GpuTenantStatus {
            allocation: vec![AllocationSummary {
                mode: Mode::Mps,
                profile: None,
                requested: 2,
                granted,
            }],
            ..Default::default()
        });
        t
    }

    /// Each input the renders read is in the key: a change to any one is seen.
    #[test]
    fn every_input_is_compared() {
        let none = DraHoldings::default();
        let key = TenantKey::of(&tenant(1), "a", &none);
        assert!(key.is_of(&tenant(1), "a", &none));
        assert!(!key.is_of(&tenant(2), "a", &none), "a grant");
        let mut t = tenant(1);
        t.spec.tier = "untrusted".into();
        assert!(!key.is_of(&t, "a", &none), "the tier");
        let mut t = tenant(1);
        t.spec.policy_ref = "q".into();
        assert!(!key.is_of(&t, "a", &none), "the policy");
        let mut t = tenant(1);
        crate::api::set_condition(
            &mut t.status.as_mut().unwrap().conditions,
            ConditionSet::VALID,
            true,
            "Valid",
            String::new(),
            None,
            &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH),
        );
        assert!(!key.is_of(&t, "a", &none), "validity");
        let held = DraHoldings(BTreeMap::from([(
            "a".to_string(),
            BTreeMap::from([(DeviceKind::Gpu, 1)]),
        )]));
        assert!(!key.is_of(&tenant(1), "a", &held), "units on DRA nodes");
        assert!(TenantKey::of(&tenant(1), "a", &held).is_of(&tenant(1), "a", &held));
    }
}
