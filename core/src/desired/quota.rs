//! Tenant namespaces: their labels (the tenant's name, and the Pod Security level of its tier) and
//! a ResourceQuota on the device plugin's resource names.
//!
//! A tenant's grant is its total across all its namespaces. Kubernetes quota is per namespace and
//! admission cannot see another namespace's usage, so the grant is split: each namespace gets
//! `grant / n`, the first `grant % n` namespaces (in `spec.namespaces` order) one more. The sum of
//! the quotas is the grant, so the namespaces together can never hold more (the trade-off: one
//! namespace cannot borrow what another leaves unused; list the busiest namespace first, or give
//! the tenant one namespace, to put the remainder where it is needed).
//!
//! Every GPU resource name in the fleet is listed, at 0 where the tenant has no grant, so a
//! namespace never uses capacity it was not given. Units on DRA nodes are counted by their
//! tenant's DeviceClass instead (`<class>.deviceclass.resource.k8s.io/devices`, the devices its
//! claims may request, and `requests.<extended resource>`, the pods asking by name; Kubernetes
//! counts a pod's scheduler-made claim in both), not under the device plugin's name. A tenant with problems gets nothing: its
//! namespaces keep a quota of zeros (fail closed). A namespace two tenants claim belongs to
//! neither: it gets zeros and no tenant label. An exempt namespace is left alone.
//!
//! The `gputenancy.io/tenant` label is for people and selectors; no rule is bound to it (the
//! admission bindings name namespaces). Pod Security admission is the API server's own: the
//! tier's level (`baseline` unless `restricted`) is enforced, warned and audited, so privileged
//! containers and host paths are refused there twice. Quotas have no owner reference: garbage
//! collection of a deleted tenant would lift them before its namespaces are under the no-tenant
//! rules; the controller deletes them in order.

use super::admission::NamespaceRules;
use super::dra::DraHoldings;
use super::settings::managed_labels;
use super::tenant_key::TenantKey;
use crate::api::{GpuNode, GpuSpec, GpuTenant, Mode, PodSecurity, SharedVec, SharingPolicy};
use crate::device_plugin::{RESOURCE_GPU, RESOURCE_SHARED, mig_resource, push_resource_name, resource_name};
use crate::dra::claim_quota_key;
use crate::labels::{POD_SECURITY_AUDIT, POD_SECURITY_ENFORCE, POD_SECURITY_WARN, TENANT};
use crate::planner::PlanOutput;
use foldhash::{HashMap, HashMapExt};
use k8s_openapi::api::core::v1::{Namespace, ResourceQuota, ResourceQuotaSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// The prefix of a quota key on a resource's requests.
const REQUESTS: &str = "requests.";

/// Name of the ResourceQuota in each tenant namespace.
pub const QUOTA_NAME: &str = "gpu-tenancy";

/// The Pod Security level of a tenant's namespaces: its tier's, `Baseline` when the tier is unknown.
fn pod_security(tenant: &GpuTenant, policies: &[SharingPolicy]) -> PodSecurity {
    policies
        .iter()
        .find(|p| crate::api::name_of(*p) == tenant.spec.policy_ref)
        .and_then(|p| p.spec.tier(&tenant.spec.tier))
        .map(|t| t.pod_security)
        .unwrap_or_default()
}

/// Every GPU resource name in the fleet or the tenants mention: the device plugin's whole-GPU
/// and shared names, the fleet's MIG profiles (`profiles`) and those the tenants ask for.
fn resource_names<'a>(profiles: impl IntoIterator<Item = &'a str>, tenants: &[Arc<GpuTenant>]) -> BTreeSet<String> {
    let mut names = BTreeSet::from([RESOURCE_GPU.to_string(), RESOURCE_SHARED.to_string()]);
    names.extend(profiles.into_iter().map(mig_resource));
    for t in tenants {
        names.extend(
            t.spec
                .resources
                .iter()
                .filter(|r| r.mode == Mode::Mig)
                .map(|r| resource_name(r.mode, r.profile.as_deref())),
        );
    }
    names
}

/// The MIG profiles a node's GPUs hold, each once.
fn profiles_of(gpus: &[GpuSpec]) -> Vec<&str> {
    let mut profiles: Vec<&str> = Vec::new();
    for i in gpus.iter().flat_map(|g| &g.mig_instances) {
        // A GPU's instances mostly repeat a profile: each run looked up once.
        if profiles.last() != Some(&i.profile.as_str()) && !profiles.contains(&i.profile.as_str()) {
            profiles.push(&i.profile);
        }
    }
    profiles
}

/// The fleet's MIG profiles: the profiles of each node's GPU list, and how many nodes hold each.
/// A pass looks again only at the nodes whose list is not the one it kept (the planner shares a
/// node's list between passes while nothing of the node changes): a fleet's few profiles over
/// hundreds of thousands of instances were looked at instance by instance on every pass.
#[derive(Debug, Default)]
struct FleetProfiles {
    /// By node name, sorted: the node's GPU list (kept, so it is still the one compared) and its
    /// profiles.
    nodes: Vec<(String, SharedVec<GpuSpec>, Vec<String>)>,
    holders: BTreeMap<String, usize>,
}

impl FleetProfiles {
    /// The profiles of `nodes` (sorted by name, as the planner writes them).
    fn of(&mut self, nodes: &[GpuNode]) -> impl Iterator<Item = &str> {
        let mut last = std::mem::take(&mut self.nodes).into_iter().peekable();
        let mut kept = Vec::with_capacity(nodes.len());
        for n in nodes {
            let name = crate::api::name_of(n);
            while let Some(gone) = last.next_if(|(was, _, _)| was.as_str() < name) {
                self.forget(&gone.2);
            }
            match last.next_if(|(was, _, _)| was == name) {
                Some(same) if same.1.same_list(&n.spec.gpus) => kept.push(same),
                other => {
                    if let Some(changed) = other {
                        self.forget(&changed.2);
                    }
                    let profiles: Vec<String> = profiles_of(&n.spec.gpus).into_iter().map(str::to_string).collect();
                    for p in &profiles {
                        *self.holders.entry(p.clone()).or_default() += 1;
                    }
                    kept.push((name.to_string(), n.spec.gpus.clone(), profiles));
                }
            }
        }
        for gone in last {
            self.forget(&gone.2);
        }
        self.nodes = kept;
        self.holders.keys().map(String::as_str)
    }

    fn forget(&mut self, profiles: &[String]) {
        for p in profiles {
            if let Some(n) = self.holders.get_mut(p) {
                *n -= 1;
                if *n == 0 {
                    self.holders.remove(p);
                }
            }
        }
    }
}

/// Per tenant, granted units per quota key: under the device plugin's names those not on DRA
/// nodes, and per DeviceClass those that are (only a valid tenant's grants count).
fn granted(tenant: &GpuTenant, dra: &DraHoldings) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let status = tenant.status.as_ref();
    let valid = tenant.is_valid();
    if !valid {
        return out;
    }
    for a in status.map(|s| s.allocation.as_slice()).unwrap_or_default() {
        let mut key = String::with_capacity(REQUESTS.len() + 32);
        key.push_str(REQUESTS);
        push_resource_name(&mut key, a.mode, a.profile.as_deref());
        *out.entry(key).or_insert(0) += u64::from(a.granted);
    }
    let name = crate::api::name_of(tenant);
    for (kind, units) in dra.of_tenant(name) {
        if let Some(n) = out.get_mut(&format!("{REQUESTS}{}", kind.device_plugin_resource())) {
            *n = n.saturating_sub(units);
        }
        out.insert(claim_quota_key(&kind.class_name(name)), units);
        out.insert(format!("{REQUESTS}{}", kind.extended_resource(name)), units);
    }
    out
}

/// Splits `total` over `n` namespaces: `total / n` each, the first `total % n` one more.
pub fn split(total: u64, n: usize, position: usize) -> u64 {
    let n = n.max(1) as u64;
    total / n + u64::from((position as u64) < total % n)
}

/// What a tenant's namespaces are made of, whichever of them.
#[derive(Debug)]
struct TenantInputs {
    name: String,
    /// The Pod Security level of its tier.
    level: &'static str,
    /// Its grants per quota key: with `ceiling`, what each namespace may hold.
    grants: BTreeMap<String, u64>,
    /// Kueue keeps the tenant's total ([`super::kueue`]): each namespace's quota is a ceiling at
    /// the whole grant and what the tenant may borrow, not an even share of the grant.
    ceiling: bool,
}

impl TenantInputs {
    fn of(t: &GpuTenant, policies: &[SharingPolicy], dra: &DraHoldings, kueue: bool) -> TenantInputs {
        let mut grants = granted(t, dra);
        if kueue {
            for units in grants.values_mut() {
                *units = super::kueue::ceiling(t, policies, *units);
            }
        }
        TenantInputs {
            name: t.name_any(),
            level: pod_security(t, policies).label_value(),
            grants,
            ceiling: kueue,
        }
    }
}

/// What one namespace's Namespace and ResourceQuota are made of, besides the fleet's resource
/// names: equal inputs render equal objects.
#[derive(Debug)]
enum Inputs {
    /// One tenant claims it: that tenant's inputs, the namespace's place among the tenant's
    /// namespaces and how many it has.
    Sole {
        tenant: Arc<TenantInputs>,
        position: usize,
        count: usize,
    },
    /// The tenants claiming it (more than one: it is nobody's).
    Contested(Vec<String>),
}

impl Inputs {
    /// Namespace `ns` of tenant `t`, which alone claims it.
    fn sole(tenant: &Arc<TenantInputs>, t: &GpuTenant, ns: &str) -> Inputs {
        Inputs::Sole {
            tenant: tenant.clone(),
            position: t.spec.namespaces.iter().position(|n| n == ns).unwrap_or(0),
            count: t.spec.namespaces.len(),
        }
    }
}

/// The quotas as the last pass rendered them, for the next pass to take back, rather than
/// render the quota of every tenant namespace on every pass. While the fleet's resource
/// names, the policies and the namespaces' owners ([`NamespaceRules`], the same `Arc` while every
/// tenant's name and namespaces are) are the last pass's, each namespace has the same owner and
/// place among its owner's namespaces: only the namespaces of a tenant whose inputs changed
/// ([`TenantKey`]) are rendered again, in place. Otherwise everything is. The objects are shared
/// with the passes' output and the controller's diff, not copied. `operator/tests/incremental.rs`
/// holds the desired state rendered with the memo equal to one rendered from nothing after random
/// changes.
#[derive(Debug, Default)]
pub struct QuotaMemo {
    profiles: FleetProfiles,
    names: BTreeSet<String>,
    kueue: bool,
    policies: Vec<SharingPolicy>,
    rules: Option<Arc<NamespaceRules>>,
    /// Per tenant that alone claims a namespace: its inputs, and its namespaces' places in the
    /// lists below.
    tenants: HashMap<String, Rendered>,
    namespaces: Vec<Arc<Namespace>>,
    quotas: Vec<Arc<ResourceQuota>>,
}

#[derive(Debug)]
struct Rendered {
    key: TenantKey,
    inputs: Arc<TenantInputs>,
    at: Vec<usize>,
}

/// Every tenant namespace's Namespace and ResourceQuota, sorted by namespace; with a memo, those
/// of tenants whose inputs are the last pass's are taken back.
pub fn render(
    out: &PlanOutput,
    policies: &[SharingPolicy],
    rules: &Arc<NamespaceRules>,
    dra: &DraHoldings,
    kueue: bool,
    memo: Option<&mut QuotaMemo>,
) -> (Vec<Arc<Namespace>>, Vec<Arc<ResourceQuota>>) {
    let quota_keys =
        |names: BTreeSet<String>| -> BTreeSet<String> { names.into_iter().map(|n| format!("{REQUESTS}{n}")).collect() };
    let Some(m) = memo else {
        let mut profiles: BTreeSet<&str> = BTreeSet::new();
        for n in &out.nodes {
            profiles.extend(profiles_of(&n.spec.gpus));
        }
        let names = quota_keys(resource_names(profiles, &out.tenants));
        let all = render_all(&out.tenants, policies, rules, dra, &names, kueue);
        return (all.namespaces, all.quotas);
    };
    let names = quota_keys(resource_names(m.profiles.of(&out.nodes), &out.tenants));
    let same = m.names == names
        && m.kueue == kueue
        && m.policies == policies
        && m.rules.as_ref().is_some_and(|r| Arc::ptr_eq(r, rules));
    if same {
        m.render_changed(&out.tenants, policies, dra);
    } else {
        let all = render_all(&out.tenants, policies, rules, dra, &names, kueue);
        *m = QuotaMemo {
            profiles: std::mem::take(&mut m.profiles),
            names,
            kueue,
            policies: policies.to_vec(),
            rules: Some(rules.clone()),
            tenants: all.tenants,
            namespaces: all.namespaces,
            quotas: all.quotas,
        };
    }
    (m.namespaces.clone(), m.quotas.clone())
}

impl QuotaMemo {
    /// Renders again, in place, the namespaces of every tenant whose inputs changed. The
    /// namespaces' owners are the last pass's, so a tenant not kept claims none alone.
    fn render_changed(&mut self, tenants: &[Arc<GpuTenant>], policies: &[SharingPolicy], dra: &DraHoldings) {
        for t in tenants {
            let name = crate::api::name_of(t.as_ref());
            let Some(r) = self.tenants.get_mut(name) else {
                continue;
            };
            if r.key.is_of(t, name, dra) {
                continue;
            }
            r.key = TenantKey::of(t, name, dra);
            r.inputs = Arc::new(TenantInputs::of(t, policies, dra, self.kueue));
            for &i in &r.at {
                let ns = self.namespaces[i].metadata.name.clone().unwrap_or_default();
                let inputs = Inputs::sole(&r.inputs, t, &ns);
                self.namespaces[i] = Arc::new(namespace(&ns, &inputs));
                self.quotas[i] = Arc::new(quota(&ns, &inputs, &self.names));
            }
        }
    }
}

/// Every tenant namespace's objects, sorted by namespace, and per tenant that alone claims one,
/// its inputs and its namespaces' places.
fn render_all(
    tenants: &[Arc<GpuTenant>],
    policies: &[SharingPolicy],
    rules: &NamespaceRules,
    dra: &DraHoldings,
    names: &BTreeSet<String>,
    kueue: bool,
) -> AllRendered {
    let mut claims: BTreeMap<&str, Vec<&GpuTenant>> = BTreeMap::new();
    for t in tenants {
        for ns in t.spec.namespaces.iter().filter(|ns| !rules.exempt.contains(*ns)) {
            claims.entry(ns.as_str()).or_default().push(t);
        }
    }
    let mut rendered: HashMap<String, Rendered> = HashMap::new();
    let mut namespaces = Vec::with_capacity(claims.len());
    let mut quotas = Vec::with_capacity(claims.len());
    for (ns, owners) in claims {
        let inputs = match owners.as_slice() {
            [t] => {
                let name = crate::api::name_of(*t);
                // A tenant's name, level and grants are the same for each of its namespaces: read once.
                let r = rendered.entry(name.to_string()).or_insert_with(|| Rendered {
                    key: TenantKey::of(t, name, dra),
                    inputs: Arc::new(TenantInputs::of(t, policies, dra, kueue)),
                    at: Vec::new(),
                });
                r.at.push(namespaces.len());
                Inputs::sole(&r.inputs, t, ns)
            }
            _ => Inputs::Contested(owners.iter().map(|t| t.name_any()).collect()),
        };
        namespaces.push(Arc::new(namespace(ns, &inputs)));
        quotas.push(Arc::new(quota(ns, &inputs, names)));
    }
    AllRendered {
        namespaces,
        quotas,
        tenants: rendered,
    }
}

/// Every tenant namespace's objects, and per tenant that alone claims one, its inputs and its
/// namespaces' places.
struct AllRendered {
    namespaces: Vec<Arc<Namespace>>,
    quotas: Vec<Arc<ResourceQuota>>,
    tenants: HashMap<String, Rendered>,
}

/// The tenant's name, when it alone claims the namespace.
fn sole(inputs: &Inputs) -> Option<&str> {
    match inputs {
        Inputs::Sole { tenant, .. } => Some(&tenant.name),
        Inputs::Contested(_) => None,
    }
}

fn labels(inputs: &Inputs) -> BTreeMap<String, String> {
    let mut labels = managed_labels();
    if let Some(t) = sole(inputs) {
        labels.insert(TENANT.into(), t.to_string());
    }
    labels
}

fn namespace(ns: &str, inputs: &Inputs) -> Namespace {
    let mut labels = labels(inputs);
    let level = match inputs {
        Inputs::Sole { tenant, .. } => tenant.level,
        Inputs::Contested(_) => PodSecurity::default().label_value(),
    };
    for key in [POD_SECURITY_ENFORCE, POD_SECURITY_WARN, POD_SECURITY_AUDIT] {
        labels.insert(key.into(), level.into());
    }
    Namespace {
        metadata: ObjectMeta {
            name: Some(ns.to_string()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    }
}

fn quota(ns: &str, inputs: &Inputs, names: &BTreeSet<String>) -> ResourceQuota {
    let none = BTreeMap::new();
    let (grants, position, count) = match inputs {
        // Kueue keeps the total: every namespace may hold all of it.
        Inputs::Sole { tenant, .. } if tenant.ceiling => (&tenant.grants, 0, 1),
        Inputs::Sole {
            tenant,
            position,
            count,
        } => (&tenant.grants, *position, *count),
        Inputs::Contested(_) => (&none, 0, 1),
    };
    let hard = names
        .iter()
        .chain(grants.keys())
        .map(|key| {
            let total = grants.get(key).copied().unwrap_or(0);
            (key.clone(), Quantity(split(total, count, position).to_string()))
        })
        .collect();
    let note = match inputs {
        Inputs::Sole { tenant, .. } if tenant.ceiling => format!(
            "ceiling of GpuTenant {}'s grant, with what it may borrow: its Kueue ClusterQueue keeps the total over its namespaces",
            tenant.name,
        ),
        Inputs::Sole { tenant, .. } if count > 1 => format!(
            "share {} of {count} of GpuTenant {}'s grant, split evenly over its namespaces",
            position + 1,
            tenant.name,
        ),
        Inputs::Sole { tenant, .. } => format!("GpuTenant {}'s grant", tenant.name),
        Inputs::Contested(owners) => format!(
            "claimed by {}: a namespace belongs to one tenant, so it gets no GPUs",
            owners
                .iter()
                .map(|t| format!("GpuTenant/{t}"))
                .collect::<Vec<_>>()
                .join(" and ")
        ),
    };
    ResourceQuota {
        metadata: ObjectMeta {
            name: Some(QUOTA_NAME.into()),
            namespace: Some(ns.to_string()),
            labels: Some(labels(inputs)),
            annotations: Some(BTreeMap::from([("gputenancy.io/quota".to_string(), note)])),
            ..ObjectMeta::default()
        },
        spec: Some(ResourceQuotaSpec {
            hard: Some(hard),
            ..ResourceQuotaSpec::default()
        }),
        ..ResourceQuota::default()
    }
}

#[cfg(test)]
mod tests {
    use super::split;

    /// The namespaces of a tenant never hold more than its grant, and differ by at most one.
    #[test]
    fn split_sums_to_the_grant() {
        for total in 0..40u64 {
            for n in 1..7usize {
                let parts: Vec<u64> = (0..n).map(|i| split(total, n, i)).collect();
                assert_eq!(parts.iter().sum::<u64>(), total, "{total} over {n}");
                assert!(parts.iter().max().unwrap() - parts.iter().min().unwrap() <= 1);
            }
        }
    }
}
