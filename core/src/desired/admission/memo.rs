//! What the admission render keeps between passes
//! (docs/concepts/planner.md#only-what-a-change-can-affect):
//! - each tenant's rules and `status.admission`, while its inputs ([`TenantKey`]) and the
//!   policies are the last pass's;
//! - every binding, while the namespace rules are the same `Arc` (the same tenants with the same
//!   namespaces, the same exempt namespaces): the bindings name nothing else;
//! - otherwise each tenant's bindings, while the namespaces they name are the last pass's, and the
//!   no-tenant ones likewise.
//!
//! Shared with the passes' output, not copied. `operator/tests/incremental.rs` holds the desired
//! state rendered with the memo equal to one rendered from nothing after random changes.

use super::NamespaceRules;
use super::rules::TenantRules;
use crate::api::{GpuTenant, SharingPolicy, TenantAdmission};
use crate::desired::dra::DraHoldings;
use crate::desired::tenant_key::TenantKey;
use foldhash::HashMap;
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding;
use std::collections::BTreeSet;
use std::sync::Arc;

#[derive(Debug, Default)]
pub struct AdmissionMemo {
    pub(super) rules: RulesByTenant,
    pub(super) bindings: BindingsMemo,
    /// The last pass's bindings, sorted, and the namespace rules they were rendered under.
    pub(super) all_bindings: Option<(Arc<NamespaceRules>, Vec<Arc<ValidatingAdmissionPolicyBinding>>)>,
}

impl AdmissionMemo {
    /// The last pass's bindings, when they were rendered under `rules`.
    pub(super) fn bindings_under(
        &self,
        rules: &Arc<NamespaceRules>,
    ) -> Option<Vec<Arc<ValidatingAdmissionPolicyBinding>>> {
        let (was, bindings) = self.all_bindings.as_ref()?;
        Arc::ptr_eq(was, rules).then(|| bindings.clone())
    }
}

/// The bindings the last pass rendered, for the next to take back while the namespaces they
/// name are the same.
#[derive(Debug, Default)]
pub struct BindingsMemo {
    /// Per tenant, the namespaces its bindings name, and the bindings.
    pub(super) tenants: HashMap<String, (BTreeSet<String>, [Arc<ValidatingAdmissionPolicyBinding>; 2])>,
    /// The namespaces the no-tenant bindings leave out, and the bindings.
    pub(super) untenanted: Option<(BTreeSet<String>, [Arc<ValidatingAdmissionPolicyBinding>; 2])>,
}

/// Each tenant's rules and `status.admission` as the last pass worked them out.
#[derive(Debug, Default)]
pub struct RulesByTenant {
    policies: Vec<SharingPolicy>,
    tenants: HashMap<String, KeptRules>,
    /// Passes so far: a tenant not seen in this one is forgotten.
    pass: u64,
}

#[derive(Debug)]
struct KeptRules {
    key: TenantKey,
    rules: Arc<TenantRules>,
    admission: Option<TenantAdmission>,
    pass: u64,
}

impl RulesByTenant {
    /// Starts a pass under `policies`: what was worked out under others is forgotten.
    pub(super) fn start(&mut self, policies: &[SharingPolicy]) {
        if self.policies != policies {
            self.policies = policies.to_vec();
            self.tenants.clear();
        }
        self.pass += 1;
    }

    /// Tenant `t`'s rules and `status.admission`: the last pass's while its inputs are.
    pub(super) fn of(&mut self, t: &GpuTenant, dra: &DraHoldings) -> (Arc<TenantRules>, Option<TenantAdmission>) {
        let name = crate::api::name_of(t);
        let pass = self.pass;
        if let Some(k) = self.tenants.get_mut(name)
            && k.key.is_of(t, name, dra)
        {
            k.pass = pass;
            return (k.rules.clone(), k.admission.clone());
        }
        let rules = Arc::new(TenantRules::of(t, &self.policies, dra));
        let admission = rules.granted.as_ref().map(super::rules::Granted::admission);
        self.tenants.insert(
            name.to_string(),
            KeptRules {
                key: TenantKey::of(t, name, dra),
                rules: rules.clone(),
                admission: admission.clone(),
                pass,
            },
        );
        (rules, admission)
    }

    /// Ends the pass: tenants it did not see are forgotten.
    pub(super) fn finish(&mut self, seen: usize) {
        if self.tenants.len() > seen {
            let pass = self.pass;
            self.tenants.retain(|_, k| k.pass == pass);
        }
    }
}
