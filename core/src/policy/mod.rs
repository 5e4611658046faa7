//! Policy decisions, pure: which tenants are valid and what their tier lets them have, and
//! whether a plan is well-formed. No I/O; every refusal is a [`Problem`] naming object and field.

mod plans;

pub use plans::{
    PlanCheck, check_plan, models_of_selected_nodes, models_selected_by, mps_clients_problem, mps_pinned_problem,
};

use crate::api::{
    CoLocation, GpuTenant, Mode, ResourceRequest, ScrubMemory, SharingPolicy, Tier, TopologyPolicy, quantity_to_mib,
};
use crate::problem::Problem;
use kube::ResourceExt;
use std::collections::BTreeMap;

/// A tenant that passed validation, with everything its policy says about it.
#[derive(Clone, Debug, PartialEq)]
pub struct TenantProfile {
    pub name: String,
    pub tier: String,
    pub priority: i32,
    pub weight: u32,
    pub co_location: CoLocation,
    pub scrub: ScrubMemory,
    /// Its tier's `memoryCaps`.
    pub memory_caps: crate::api::MemoryCapPolicy,
    pub requests: Vec<ResourceRequest>,
    pub memory_limit_mib: Option<u64>,
    pub headroom_percent: u32,
    pub max_mps_clients: u32,
    pub max_time_slicing_replicas: u32,
    pub topology: TopologyPolicy,
}

/// The outcome of checking every tenant against the policies.
#[derive(Clone, Debug, Default)]
pub struct TenantCheck {
    /// Valid tenants, sorted by name.
    pub valid: Vec<TenantProfile>,
    /// Problems per invalid tenant (a tenant with any problem gets nothing: no half-applied state).
    pub invalid: BTreeMap<String, Vec<Problem>>,
}

const KIND: &str = "GpuTenant";

/// Checks tenants against policies: the policy and tier exist, the tier allows every requested
/// mode, requests are not duplicated, limits parse, no namespace belongs to two tenants or is
/// `exempt` from the admission policies, and no tenant asks for both MPS and time-slicing shares.
pub fn check_tenants<T: std::borrow::Borrow<GpuTenant>>(
    policies: &[SharingPolicy],
    tenants: &[T],
    exempt: &std::collections::BTreeSet<String>,
) -> TenantCheck {
    let policies: BTreeMap<String, &SharingPolicy> = policies.iter().map(|p| (p.name_any(), p)).collect();
    let mut check = TenantCheck::default();

    let tenants: Vec<&GpuTenant> = tenants.iter().map(|t| t.borrow()).collect();
    let owners = crate::tenancy::NamespaceOwners::of(&tenants);

    let mut sorted = tenants.clone();
    crate::api::sort_refs_by_name(&mut sorted);
    for t in sorted {
        let name = t.name_any();
        let mut problems = Vec::new();
        problems.extend(reserved_name_problem(&name));
        problems.extend(namespace_problems(t, &name, &owners, exempt));
        let (policy, tier) = policy_and_tier(t, &name, &policies, &mut problems);
        problems.extend(request_problems(t, &name, tier));
        problems.extend(mixed_shares_problem(t, &name));
        let memory_limit_mib = memory_limit(t, &name, &mut problems);

        match (problems.is_empty(), policy, tier) {
            (true, Some(p), Some(tier)) => check.valid.push(TenantProfile {
                name: name.clone(),
                tier: tier.name.clone(),
                priority: t.spec.priority,
                weight: t.spec.weight.max(1),
                co_location: tier.co_location,
                scrub: tier.scrub_memory,
                memory_caps: tier.memory_caps,
                requests: t.spec.resources.clone(),
                memory_limit_mib,
                headroom_percent: p.spec.headroom_percent(),
                max_mps_clients: p.spec.max_mps_clients(),
                max_time_slicing_replicas: p.spec.max_time_slicing_replicas(),
                topology: p.spec.topology.unwrap_or_default(),
            }),
            _ => {
                check.invalid.insert(name, problems);
            }
        }
    }
    check
}

fn problem(name: &str, field: impl Into<String>, message: impl Into<String>) -> Problem {
    Problem::new(KIND, name, field, message)
}

/// The names the agents' showback metrics use for what no single tenant holds.
fn reserved_name_problem(name: &str) -> Option<Problem> {
    crate::accounting::RESERVED.contains(&name).then(|| {
        problem(
            name,
            "metadata.name",
            format!(
                "the name {name:?} is reserved: the agents' showback metrics use it for what no tenant (unallocated) or several tenants (shared) hold, and for use no tenant's pod can be told to have made (unattributed); name the tenant otherwise"
            ),
        )
    })
}

/// Each namespace must be the tenant's own: not exempt from admission, not listed by another tenant.
fn namespace_problems(
    t: &GpuTenant,
    name: &str,
    owners: &crate::tenancy::NamespaceOwners,
    exempt: &std::collections::BTreeSet<String>,
) -> Vec<Problem> {
    let mut problems = Vec::new();
    for (j, ns) in t.spec.namespaces.iter().enumerate() {
        if exempt.contains(ns) {
            problems.push(problem(
                name,
                format!("spec.namespaces[{j}]"),
                format!(
                    "namespace {ns:?} is exempt from gpu-tenancy's admission policies (a namespace of the cluster, of NVIDIA's device plugin or of this operator, or one named by the controller's --exempt-namespace), so no tenant's rules could be enforced there; use a namespace of the tenant's own"
                ),
            ));
        }
        let others: Vec<&&str> = owners.listers(ns).iter().filter(|o| **o != name).collect();
        if !others.is_empty() {
            let others: Vec<String> = others.iter().map(|o| format!("GpuTenant/{o}")).collect();
            problems.push(problem(
                name,
                format!("spec.namespaces[{j}]"),
                format!(
                    "namespace {ns:?} is also claimed by {}; a namespace belongs to one tenant",
                    others.join(", ")
                ),
            ));
        }
    }
    problems
}

/// The tenant's SharingPolicy and its tier, each `None` (with a problem) where it is not defined.
fn policy_and_tier<'p>(
    t: &GpuTenant,
    name: &str,
    policies: &BTreeMap<String, &'p SharingPolicy>,
    problems: &mut Vec<Problem>,
) -> (Option<&'p SharingPolicy>, Option<&'p Tier>) {
    let Some(policy) = policies.get(&t.spec.policy_ref).copied() else {
        let known: Vec<&str> = policies.keys().map(String::as_str).collect();
        problems.push(problem(
            name,
            "spec.policyRef",
            format!(
                "SharingPolicy {:?} not found; create it or use one of: {}",
                t.spec.policy_ref,
                if known.is_empty() {
                    "(none defined)".to_string()
                } else {
                    known.join(", ")
                }
            ),
        ));
        return (None, None);
    };
    let tier = policy.spec.tier(&t.spec.tier);
    if tier.is_none() {
        let known: Vec<&str> = policy.spec.tiers.iter().map(|t| t.name.as_str()).collect();
        problems.push(problem(
            name,
            "spec.tier",
            format!(
                "tier {:?} is not defined in SharingPolicy {:?}; its tiers are {}",
                t.spec.tier,
                t.spec.policy_ref,
                known.join(", ")
            ),
        ));
    }
    (Some(policy), tier)
}

/// Each request: a mode the tier allows, a profile exactly where the mode is MIG, and no kind of
/// capacity asked for twice.
fn request_problems(t: &GpuTenant, name: &str, tier: Option<&Tier>) -> Vec<Problem> {
    let mut problems = Vec::new();
    // A tenant has a few requests: a list scanned, not a map built per tenant.
    let mut seen: Vec<((Mode, Option<&str>), usize)> = Vec::new();
    for (i, r) in t.spec.resources.iter().enumerate() {
        if let Some(tier) = tier
            && !tier.modes.contains(&r.mode)
        {
            let allowed: Vec<&str> = tier.modes.iter().map(|m| m.as_str()).collect();
            problems.push(problem(
                name,
                format!("spec.resources[{i}].mode"),
                format!(
                    "tier {:?} does not allow {}; it allows {}",
                    tier.name,
                    r.mode,
                    allowed.join(", ")
                ),
            ));
        }
        match (r.mode, &r.profile) {
            (Mode::Mig, None) => problems.push(problem(
                name,
                format!("spec.resources[{i}].profile"),
                "a MIG request needs a profile, e.g. 3g.40gb",
            )),
            (m, Some(_)) if m != Mode::Mig => problems.push(problem(
                name,
                format!("spec.resources[{i}].profile"),
                "profile applies only to mode MIG; remove it",
            )),
            _ => {}
        }
        let kind = (r.mode, r.profile.as_deref());
        let repeated = match seen.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, last)) => Some(std::mem::replace(last, i)),
            None => {
                seen.push((kind, i));
                None
            }
        };
        if let Some(first) = repeated {
            problems.push(problem(
                name,
                format!("spec.resources[{i}]"),
                format!(
                    "repeats spec.resources[{first}] ({} {}); merge the counts",
                    r.mode,
                    r.profile.as_deref().unwrap_or("")
                )
                .replace(" )", ")"),
            ));
        }
    }
    problems
}

/// NVIDIA's device plugin advertises MPS and time-slicing shares under one name,
/// nvidia.com/gpu.shared: it ignores `rename` (api/config/v1 DisableResourceNamingInConfig,
/// "Setting the 'rename' field ... is not yet supported"). A quota on that name cannot keep
/// a count per mode, so a tenant with both could use its time-slicing count on MPS GPUs
/// granted to others.
fn mixed_shares_problem(t: &GpuTenant, name: &str) -> Option<Problem> {
    let mut shared = t
        .spec
        .resources
        .iter()
        .enumerate()
        .filter(|(_, r)| r.mode.is_shared())
        .map(|(i, _)| i);
    let (Some(first), Some(second)) = (shared.next(), shared.next()) else {
        return None;
    };
    (t.spec.resources[first].mode != t.spec.resources[second].mode).then(|| {
        problem(
            name,
            format!("spec.resources[{second}].mode"),
            format!(
                "a tenant may hold MPS or TimeSlicing shares, not both (spec.resources[{first}] asks for {}): NVIDIA's device plugin advertises both as nvidia.com/gpu.shared, so a quota could not keep each count; split the team into two GpuTenants",
                t.spec.resources[first].mode
            ),
        )
    })
}

/// The tenant's memory limit in MiB, `None` where it sets none or writes no quantity (a problem).
fn memory_limit(t: &GpuTenant, name: &str, problems: &mut Vec<Problem>) -> Option<u64> {
    let q = t.spec.limits.as_ref().and_then(|l| l.memory.as_deref())?;
    let mib = quantity_to_mib(q);
    if mib.is_none() {
        problems.push(problem(
            name,
            "spec.limits.memory",
            format!("{q:?} is not a memory quantity; write e.g. 160Gi"),
        ));
    }
    mib
}

/// Problems inside SharingPolicies that their schema cannot express.
pub fn check_policies(policies: &[SharingPolicy]) -> Vec<Problem> {
    let mut out = Vec::new();
    for p in policies {
        let name = p.name_any();
        let mut seen = BTreeMap::new();
        for (i, tier) in p.spec.tiers.iter().enumerate() {
            if let Some(first) = seen.insert(tier.name.as_str(), i) {
                out.push(Problem::new(
                    "SharingPolicy",
                    &name,
                    format!("spec.tiers[{i}].name"),
                    format!(
                        "tier {:?} is already defined at spec.tiers[{first}]; tier names must be unique",
                        tier.name
                    ),
                ));
            }
            if tier.modes.is_empty() {
                out.push(Problem::new(
                    "SharingPolicy",
                    &name,
                    format!("spec.tiers[{i}].modes"),
                    "a tier needs at least one mode",
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
