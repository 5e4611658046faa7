//! ValidatingAdmissionPolicies that keep every namespace's pods to what it was granted
//! (docs/design.md#tier-isolation), enforced by the API server itself.
//!
//! **Every tenant shares two policies; each reads its tenant as the parameter.** One pod policy
//! ([`TENANTS_POLICY`]) and one claims policy ([`TENANTS_CLAIMS_POLICY`]) take the GpuTenant as
//! their parameter (`paramKind`), and each tenant's two bindings name the tenant (`paramRef`).
//! The expressions read the tenant's name, tier and `spec.limits.maxGpusPerPod` from it, and
//! what its pods and claims may ask for (resource names, shared modes, device classes,
//! PriorityClasses) from its `status.admission` (`rules::Granted::admission`), which the
//! controller writes with the rest of its status. So a tenant added, or whose grants grow with
//! the fleet, changes a binding or a status, not a policy: the API server compiles a policy's CEL
//! when it is written and again when its admission plugin reloads it, and it matches every
//! request it admits against every policy's resource rules
//! (docs/decisions/shared-admission-policies.md). Fail closed: a tenant without `status.admission` (not valid,
//! or not yet reconciled) gets no GPU and may name no PriorityClass, and a binding whose tenant
//! is gone refuses every request it matches (`parameterNotFoundAction: Deny`) until the
//! controller has moved its namespaces to the no-tenant rules. Only the controller may write a
//! GpuTenant's status (RBAC).
//!
//! **Every namespace is under exactly one rule set.** Each tenant's bindings hold the
//! namespaces that tenant alone lists, by the immutable `kubernetes.io/metadata.name` label (a
//! label anyone may write, such as `gputenancy.io/tenant`, would let a namespace choose its rules);
//! one more policy is bound to every other namespace ([`UNTENANTED_POLICY`]), but the exempt ones
//! (the cluster's own, the device plugin's, this operator's and those named by the controller's
//! flags). [`NamespaceRules`] says which is which, and the controller orders a change between two
//! rule sets so that no namespace is ever under none (`controller::diff::admission`). The
//! policies and bindings have no owner: garbage collection of a deleted GpuTenant must not take
//! its rules away before its namespaces are under the no-tenant rules, and without a controller
//! they stay (fail closed).
//!
//! What each rule set refuses is in [`rules`] (pods) and [`claims`] (ResourceClaims and their
//! templates: each rule set has a claims policy too, bound to the same namespaces as its pod
//! policy); a policy bound to every namespace that is not exempt refuses ConfigMap and Secret
//! keys named like NVIDIA's device-selecting variables ([`CONFIG_KEYS_POLICY`]). Per tenant whose
//! device-plugin names are all served by DRA, a MutatingAdmissionPolicy renames them in its pods
//! ([`mutation`]).

mod cel;
mod claims;
mod guards;
mod memo;
mod objects;
use objects::{binding, pod_rules, policy, typed};
mod mutation;
mod rules;

use super::dra::DraHoldings;
use super::settings::Settings;
use crate::api::{GpuTenant, SharingPolicy};
use crate::labels::NAMESPACE_NAME;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding, NamedRuleWithOperations, ParamKind,
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding, Variable,
};
use kube::{Resource, ResourceExt};
pub use memo::AdmissionMemo;
use memo::BindingsMemo;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Prefix of each tenant's binding name (`gputenancy.io-tenant-<name>`), of the tenants' pod
/// policy ([`TENANTS_POLICY`]), and of the per-tenant policies of earlier versions.
pub const POLICY_PREFIX: &str = "gputenancy.io-tenant-";
/// The pod policy every tenant's binding names, with the tenant as its parameter.
pub const TENANTS_POLICY: &str = "gputenancy.io-tenants";
/// The claims policy every tenant's claims binding names, with the tenant as its parameter.
pub const TENANTS_CLAIMS_POLICY: &str = "gputenancy.io-claims-tenants";
/// The policy for every namespace that is neither exempt nor a tenant's.
pub const UNTENANTED_POLICY: &str = "gputenancy.io-no-tenant";
/// Prefix of each tenant's claims binding (`gputenancy.io-claims-tenant-<name>`), and of the
/// per-tenant claims policies of earlier versions.
pub const CLAIMS_PREFIX: &str = "gputenancy.io-claims-tenant-";
/// The claims policy for every namespace that is neither exempt nor a tenant's.
pub const UNTENANTED_CLAIMS_POLICY: &str = "gputenancy.io-claims-no-tenant";
pub use cel::OFF_GPU_NODES;
pub use guards::{CONFIG_KEYS_POLICY, NODE_FILES_POLICY};
pub use mutation::MUTATION_PREFIX;

/// The label the API server sets on every namespace to its name; no one can change it.
/// Which rule set governs each namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespaceRules {
    /// Namespaces no policy judges.
    pub exempt: BTreeSet<String>,
    /// Per tenant, the namespaces its policy governs: those it alone lists, not exempt. Every
    /// other namespace that is not exempt is under the no-tenant policy.
    pub tenants: BTreeMap<String, BTreeSet<String>>,
}

impl NamespaceRules {
    pub fn of(tenants: &[Arc<GpuTenant>], exempt: BTreeSet<String>) -> NamespaceRules {
        let mut out = NamespaceRules {
            tenants: tenants.iter().map(|t| (t.name_any(), BTreeSet::new())).collect(),
            exempt: BTreeSet::new(),
        };
        // The owner rule is crate::tenancy's, shared with the DRA driver and the attribution.
        for (ns, owner) in crate::tenancy::NamespaceOwners::of(tenants).owners(&exempt) {
            if let Some(t) = owner {
                out.tenants.entry(t.to_string()).or_default().insert(ns.to_string());
            }
        }
        out.exempt = exempt;
        out
    }

    /// [`NamespaceRules::of`], taken back from `memo` while every tenant's name and namespaces
    /// and the exempt namespaces are the last pass's
    /// (docs/concepts/planner.md#only-what-a-change-can-affect).
    pub fn of_with(tenants: &[Arc<GpuTenant>], exempt: BTreeSet<String>, memo: &mut RulesMemo) -> Arc<NamespaceRules> {
        let same = memo.rules.exempt == exempt
            && memo.tenants.len() == tenants.len()
            && memo.tenants.iter().zip(tenants).all(|((name, namespaces), t)| {
                name == crate::api::name_of(t.as_ref()) && *namespaces == t.spec.namespaces
            });
        if !same {
            memo.rules = Arc::new(NamespaceRules::of(tenants, exempt));
            memo.tenants = tenants
                .iter()
                .map(|t| (crate::api::name_of(t.as_ref()).to_string(), t.spec.namespaces.clone()))
                .collect();
        }
        memo.rules.clone()
    }

    /// The tenant whose rules govern `ns`, if one does.
    pub fn owner(&self, ns: &str) -> Option<&str> {
        self.tenants
            .iter()
            .find(|(_, namespaces)| namespaces.contains(ns))
            .map(|(t, _)| t.as_str())
    }

    /// The namespaces the no-tenant policy leaves alone: exempt or a tenant's.
    pub fn untenanted_excluded(&self) -> BTreeSet<String> {
        self.excluded().into_iter().map(str::to_string).collect()
    }

    /// [`NamespaceRules::untenanted_excluded`], borrowed.
    fn excluded(&self) -> BTreeSet<&str> {
        self.exempt
            .iter()
            .chain(self.tenants.values().flatten())
            .map(String::as_str)
            .collect()
    }
}

/// The last pass's [`NamespaceRules`] and what they were worked out from.
#[derive(Debug, Default)]
pub struct RulesMemo {
    /// Each tenant's name and namespaces, in order.
    tenants: Vec<(String, Vec<String>)>,
    rules: Arc<NamespaceRules>,
}

/// The namespaces a binding of ours applies its policy to, read back from its selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Coverage {
    /// These namespaces (a tenant's binding).
    Only(BTreeSet<String>),
    /// Every namespace but these (the no-tenant binding).
    AllBut(BTreeSet<String>),
    /// A selector this version does not write (an older version's label selector): treated as
    /// covering nothing, so nothing is taken away on its strength.
    Unknown,
}

impl Coverage {
    pub fn covers(&self, ns: &str) -> bool {
        match self {
            Coverage::Only(s) => s.contains(ns),
            Coverage::AllBut(s) => !s.contains(ns),
            Coverage::Unknown => false,
        }
    }
}

/// What `binding` covers: a namespace selector of exactly one expression on the name label.
pub fn coverage(binding: &ValidatingAdmissionPolicyBinding) -> Coverage {
    let Some(selector) = binding
        .spec
        .match_resources
        .as_ref()
        .and_then(|m| m.namespace_selector.as_ref())
    else {
        return Coverage::Unknown;
    };
    if selector.match_labels.as_ref().is_some_and(|l| !l.is_empty()) {
        return Coverage::Unknown;
    }
    match selector.match_expressions.as_deref() {
        Some([e]) if e.key == NAMESPACE_NAME => {
            let values: BTreeSet<String> = e.values.iter().flatten().cloned().collect();
            match e.operator.as_str() {
                "In" => Coverage::Only(values),
                "NotIn" => Coverage::AllBut(values),
                _ => Coverage::Unknown,
            }
        }
        _ => Coverage::Unknown,
    }
}

/// A tenant's policies read the tenant itself as their parameter (its `status.admission`).
fn tenant_param_kind() -> ParamKind {
    ParamKind {
        api_version: Some(format!("{}/{}", GpuTenant::group(&()), GpuTenant::version(&()))),
        kind: Some(GpuTenant::kind(&()).into_owned()),
    }
}

/// A rule set's two bindings (pods, claims) to the same namespaces.
pub type Bindings = [ValidatingAdmissionPolicyBinding; 2];

/// The bindings of the tenants' policies (pods, claims) to `tenant`'s namespaces, with the tenant
/// as their parameter; `None` when it has none (a selector `In` needs values).
pub fn tenant_bindings(tenant: &str, namespaces: &BTreeSet<String>) -> Option<Bindings> {
    (!namespaces.is_empty()).then(|| {
        [
            binding(
                &format!("{POLICY_PREFIX}{tenant}"),
                TENANTS_POLICY,
                "In",
                namespaces,
                Some(tenant),
            ),
            binding(
                &format!("{CLAIMS_PREFIX}{tenant}"),
                TENANTS_CLAIMS_POLICY,
                "In",
                namespaces,
                Some(tenant),
            ),
        ]
    })
}

/// The bindings of the no-tenant policies (pods, claims) to every namespace but `excluded` (never
/// empty: the exempt namespaces are always in it).
pub fn untenanted_bindings(excluded: &BTreeSet<String>) -> Bindings {
    [
        binding(UNTENANTED_POLICY, UNTENANTED_POLICY, "NotIn", excluded, None),
        binding(
            UNTENANTED_CLAIMS_POLICY,
            UNTENANTED_CLAIMS_POLICY,
            "NotIn",
            excluded,
            None,
        ),
    ]
}

/// ResourceClaims and their templates, created or updated.
fn claim_rules() -> Value {
    json!([{
        "apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
        "resources": ["resourceclaims", "resourceclaimtemplates"],
    }])
}

/// Everything the admission part of the desired state holds, each list sorted by name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Admission {
    pub policies: Vec<Arc<ValidatingAdmissionPolicy>>,
    /// Shared with the controller's diff, which writes them unchanged while no namespace moves.
    pub bindings: Vec<Arc<ValidatingAdmissionPolicyBinding>>,
    pub mutating_policies: Vec<MutatingAdmissionPolicy>,
    pub mutating_bindings: Vec<MutatingAdmissionPolicyBinding>,
}

/// Every policy and binding. Sets each tenant's `status.admission`, which the tenants' policies
/// read as their parameter. With a memo, what the last pass worked out from the same inputs is
/// taken back ([`memo`]).
pub fn render(
    policies: &[SharingPolicy],
    tenants: &mut [Arc<GpuTenant>],
    namespaces: &Arc<NamespaceRules>,
    settings: &Settings,
    dra: &DraHoldings,
    memo: Option<&mut AdmissionMemo>,
) -> Admission {
    // Without a memo (`plan`), nothing is kept: a memo that is dropped after the pass.
    let remember = memo.is_some();
    let mut fresh = AdmissionMemo::default();
    let memo = memo.unwrap_or(&mut fresh);
    memo.rules.start(policies);
    let kept = memo.bindings_under(namespaces);
    let mut out = Admission::default();
    let mut last = std::mem::take(&mut memo.bindings);
    for t in tenants.iter_mut() {
        let (rules, admission) = if remember {
            memo.rules.of(t, dra)
        } else {
            let rules = rules::TenantRules::of(t, policies, dra);
            let admission = rules.granted.as_ref().map(rules::Granted::admission);
            (Arc::new(rules), admission)
        };
        // Written only where it differs: a status the planner's memo handed back is shared.
        if t.status.as_ref().is_some_and(|s| s.admission != admission)
            && let Some(status) = Arc::make_mut(t).status.as_mut()
        {
            status.admission = admission;
        }
        let Some(ns) = namespaces.tenants.get(&rules.name).filter(|ns| !ns.is_empty()) else {
            continue;
        };
        if let Some((p, b)) = mutation::tenant(&rules, ns) {
            out.mutating_policies.push(p);
            out.mutating_bindings.push(b);
        }
        if kept.is_some() {
            continue;
        }
        let bindings = match last.tenants.remove(&rules.name) {
            Some((was, bindings)) if was == *ns => bindings,
            _ => match tenant_bindings(&rules.name, ns) {
                Some(b) => b.map(Arc::new),
                None => continue,
            },
        };
        out.bindings.extend(bindings.iter().cloned());
        if remember {
            memo.bindings.tenants.insert(rules.name.clone(), (ns.clone(), bindings));
        }
    }
    memo.rules.finish(tenants.len());
    let (off_gpu, off_gpu_binding) = mutation::untenanted(&namespaces.untenanted_excluded());
    out.mutating_policies.push(off_gpu);
    out.mutating_bindings.push(off_gpu_binding);
    out.policies = policies_of(settings, &namespaces.exempt);
    match kept {
        Some(bindings) => {
            // Everything the bindings name is as it was: the last pass's, sorted.
            memo.bindings = last;
            out.bindings = bindings;
        }
        None => {
            out.bindings
                .extend(untenanted(namespaces, last.untenanted, &mut memo.bindings));
            out.bindings.push(Arc::new(guards::config_keys(&namespaces.exempt).1));
            out.bindings.push(Arc::new(guards::node_files(settings).1));
            if settings.kueue {
                out.bindings.push(Arc::new(guards::queues(&namespaces.exempt).1));
            }
            crate::api::sort_shared_by_name(&mut out.bindings);
            if remember {
                memo.all_bindings = Some((namespaces.clone(), out.bindings.clone()));
            }
        }
    }
    crate::api::sort_shared_by_name(&mut out.policies);
    crate::api::sort_by_name(&mut out.mutating_policies);
    crate::api::sort_by_name(&mut out.mutating_bindings);
    out
}

/// The no-tenant bindings: the last pass's while the namespaces they leave out are the same.
fn untenanted(
    namespaces: &NamespaceRules,
    last: Option<(BTreeSet<String>, [Arc<ValidatingAdmissionPolicyBinding>; 2])>,
    memo: &mut BindingsMemo,
) -> [Arc<ValidatingAdmissionPolicyBinding>; 2] {
    let excluded = namespaces.excluded();
    let untenanted = match last {
        Some((was, bindings)) if was.iter().map(String::as_str).eq(excluded.iter().copied()) => (was, bindings),
        _ => {
            let excluded: BTreeSet<String> = excluded.into_iter().map(str::to_string).collect();
            let bindings = untenanted_bindings(&excluded).map(Arc::new);
            (excluded, bindings)
        }
    };
    let bindings = untenanted.1.clone();
    memo.untenanted = Some(untenanted);
    bindings
}

/// The policies: one pod policy and one claims policy for every tenant (each tenant's binding
/// names the tenant as the parameter: the API server matches every request it admits against
/// each policy, docs/decisions/shared-admission-policies.md), the same two for every namespace
/// no tenant owns, the one on configuration keys and the one on the node's hand-over files.
fn policies_of(settings: &Settings, exempt: &BTreeSet<String>) -> Vec<Arc<ValidatingAdmissionPolicy>> {
    // The names every DeviceClass gets as an extended resource, for the classes trusted anyway.
    let mut allowed = settings.allowed_resources.clone();
    allowed.extend(
        settings
            .claim_device_classes
            .iter()
            .map(|c| format!("deviceclass.resource.kubernetes.io/{c}")),
    );
    let variables: Vec<Variable> = typed(cel::variables(&allowed));
    let claim_variables: Vec<Variable> = typed(claims::variables());
    let params: Vec<Variable> = typed(cel::param_variables());
    let tenant_variables: Vec<Variable> = variables.iter().chain(&params).cloned().collect();
    let tenant_claim_variables: Vec<Variable> = claim_variables.iter().chain(&params).cloned().collect();
    let (pod_rules, claim_rules): (Vec<NamedRuleWithOperations>, Vec<NamedRuleWithOperations>) =
        (typed(pod_rules()), typed(claim_rules()));
    let bypass = rules::BypassExpressions::of(settings);
    vec![
        Arc::new(policy(
            TENANTS_POLICY,
            &pod_rules,
            &tenant_variables,
            rules::tenant(&bypass),
            Some(tenant_param_kind()),
        )),
        Arc::new(policy(
            TENANTS_CLAIMS_POLICY,
            &claim_rules,
            &tenant_claim_variables,
            claims::tenant(settings),
            Some(tenant_param_kind()),
        )),
        Arc::new(policy(
            UNTENANTED_POLICY,
            &pod_rules,
            &variables,
            rules::untenanted(&bypass),
            None,
        )),
        Arc::new(policy(
            UNTENANTED_CLAIMS_POLICY,
            &claim_rules,
            &claim_variables,
            claims::untenanted(settings),
            None,
        )),
        Arc::new(guards::config_keys(exempt).0),
        Arc::new(guards::node_files(settings).0),
    ]
    .into_iter()
    .chain(settings.kueue.then(|| Arc::new(guards::queues(exempt).0)))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> NamespaceRules {
        NamespaceRules {
            exempt: BTreeSet::from(["kube-system".to_string()]),
            tenants: BTreeMap::from([
                ("a".to_string(), BTreeSet::from(["a-1".to_string(), "a-2".to_string()])),
                ("b".to_string(), BTreeSet::new()),
            ]),
        }
    }

    /// A binding reads back as what it was written for, and anything else covers nothing.
    #[test]
    fn bindings_read_back_as_their_coverage() {
        let r = rules();
        let [a, a_claims] = tenant_bindings("a", &r.tenants["a"]).unwrap();
        assert_eq!(coverage(&a), Coverage::Only(r.tenants["a"].clone()));
        assert_eq!(coverage(&a_claims), coverage(&a));
        assert!(tenant_bindings("b", &r.tenants["b"]).is_none());
        let [none, _] = untenanted_bindings(&r.untenanted_excluded());
        let excluded = BTreeSet::from(["a-1", "a-2", "kube-system"].map(String::from));
        assert_eq!(coverage(&none), Coverage::AllBut(excluded));
        assert!(coverage(&none).covers("elsewhere") && !coverage(&none).covers("a-1"));
        let old: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
            "metadata": {"name": "gputenancy.io-tenant-a"},
            "spec": {"policyName": "gputenancy.io-tenant-a",
                     "matchResources": {"namespaceSelector": {"matchLabels": {"gputenancy.io/tenant": "a"}}}}
        }))
        .unwrap();
        assert_eq!(coverage(&old), Coverage::Unknown);
        assert!(!Coverage::Unknown.covers("a-1"));
        assert_eq!(r.owner("a-2"), Some("a"));
        assert_eq!(r.owner("kube-system"), None);
    }

    /// A namespace two tenants list, or an exempt one, is no tenant's.
    #[test]
    fn contested_and_exempt_namespaces_belong_to_no_tenant() {
        let t = |name: &str, ns: &[&str]| {
            GpuTenant::new(
                name,
                crate::api::GpuTenantSpec {
                    tier: "internal".into(),
                    policy_ref: "default".into(),
                    namespaces: ns.iter().map(|s| s.to_string()).collect(),
                    priority: 0,
                    weight: 1,
                    resources: vec![],
                    limits: None,
                },
            )
        };
        let r = NamespaceRules::of(
            &[
                Arc::new(t("a", &["shared", "a-own", "kube-system"])),
                Arc::new(t("b", &["shared"])),
            ],
            BTreeSet::from(["kube-system".to_string()]),
        );
        assert_eq!(r.tenants["a"], BTreeSet::from(["a-own".to_string()]));
        assert!(r.tenants["b"].is_empty());
        assert_eq!(r.owner("shared"), None);
    }
}
