//! Queues per tenant with Kueue: the objects that make Kueue admit each tenant's workloads within
//! its grant (docs/concepts/queues.md). Rendered only when Kueue is on ([`super::Settings::kueue`]).
//!
//! - One **ResourceFlavor** per GpuPartitionPlan (a GPU pool), `gpu-tenancy-<plan>`, with the
//!   plan's `nodeSelector.matchLabels` as its node labels (Kueue adds them to an admitted
//!   workload's node selector, so it runs in the pool whose quota it took), and one flavor with
//!   no labels, [`ANY_FLAVOR`], for the resources that are not GPUs.
//! - One **ClusterQueue** per tenant, `gpu-tenancy-<tenant>`: its namespace selector takes only
//!   the namespaces the tenant alone lists, by two labels no tenant user can set: the tenant
//!   label this controller writes on a Namespace (changing a Namespace's labels is a cluster
//!   permission, not the `edit` role's) and `kubernetes.io/metadata.name`, which the API server
//!   sets to the name itself. Its GPU quota per pool and resource name is what the tenant was
//!   granted on that pool's nodes, under the names its pods ask for (the device plugin's, or its
//!   own extended resources on DRA nodes: [`units_by_pool`]). A resource it has no grant of is
//!   not covered, so a workload asking for it is never admitted. CPU, memory and ephemeral
//!   storage are covered by [`ANY_FLAVOR`] at [`UNBOUNDED`], so they never hold a workload back;
//!   any other resource a workload asks for must be excluded in Kueue's Configuration
//!   (`resources.excludeResourcePrefixes`). Its fair-sharing weight is the tenant's weight.
//! - A **LocalQueue** [`LOCAL_QUEUE`] in each of its namespaces.
//! - Per SharingPolicy tier with `idleLendingPercent`, a **Cohort** its tenants' queues join:
//!   each lends and borrows at most that percent of its quota, per pool and resource, and takes
//!   back what it lent by preempting the borrowers (`reclaimWithinCohort: Any`). A tier
//!   that forbids co-location may not set it (the CRD refuses it, and it is ignored here too).
//! - One **WorkloadPriorityClass** per tenant, `gpu-tenancy-<tenant>`, at its priority.
//!
//! Everything is derived from the tenants' grants, so it follows the planner, never decides.

use super::admission::NamespaceRules;
use super::dra::DraHoldings;
use super::settings::managed_labels;
use crate::api::{CoLocation, DeviceAccess, GpuNode, GpuPartitionPlan, GpuTenant, SharingPolicy, Tier};
use crate::device_plugin::resource_name;
use crate::dra::DeviceKind;
use crate::kueue::{
    ClusterQueue, ClusterQueueSpec, Cohort, CohortSpec, DeviceClassMapping, FairSharing, FlavorQuotas, LocalQueue,
    LocalQueueSpec, Preemption, ResourceFlavor, ResourceFlavorSpec, ResourceGroup, ResourceQuota,
    WorkloadPriorityClass,
};
use crate::labels::TENANT;
use crate::problem::Problem;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement, ObjectMeta};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

pub use crate::kueue::{PREFIX, queue_name};
/// The LocalQueue in each tenant namespace: what its workloads name in `kueue.x-k8s.io/queue-name`.
pub const LOCAL_QUEUE: &str = "gpu-tenancy";
/// The flavor of the resources that are not GPUs: no node labels.
pub const ANY_FLAVOR: &str = "gpu-tenancy-any";
/// The resources every queue covers besides GPUs, so a workload's CPU and memory never hold it back.
pub const OTHER_RESOURCES: [&str; 3] = ["cpu", "memory", "ephemeral-storage"];
/// Their quota: more than any cluster has (an exbibyte, a million CPUs).
pub const UNBOUNDED: [&str; 3] = ["1M", "1Ei", "1Ei"];
/// Kubernetes' longest object name (a DNS subdomain).
const MAX_NAME: usize = 253;
/// Kueue's most node labels on one flavor.
const MAX_NODE_LABELS: usize = 8;

/// The Kueue objects of the fleet, each list sorted by name (LocalQueues by namespace).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct KueueObjects {
    pub resource_flavors: Vec<ResourceFlavor>,
    pub cohorts: Vec<Cohort>,
    pub cluster_queues: Vec<ClusterQueue>,
    pub local_queues: Vec<LocalQueue>,
    pub workload_priority_classes: Vec<WorkloadPriorityClass>,
    pub problems: Vec<Problem>,
}

/// The name of the flavor of plan `plan`'s nodes.
pub fn flavor_name(plan: &str) -> String {
    format!("{PREFIX}{plan}")
}

/// The name of the cohort of tier `tier` of policy `policy`. A tier's name has no dot, so the
/// part after the first dot that follows the prefix is the policy's, whatever it holds.
pub fn cohort_name(policy: &str, tier: &str) -> String {
    format!("gpu-tenancy.{tier}.{policy}")
}

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: namespace.map(str::to_string),
        labels: Some(managed_labels()),
        ..ObjectMeta::default()
    }
}

/// Per tenant, per plan, per resource name its pods ask for: the units it was granted on that
/// plan's nodes. A valid tenant's grants only; units on a node no plan governs count nowhere
/// (fail closed: no queue admits them).
pub fn units_by_pool(
    tenants: &[Arc<GpuTenant>],
    nodes: &[GpuNode],
) -> BTreeMap<String, BTreeMap<String, BTreeMap<String, u64>>> {
    let node_pool: BTreeMap<&str, (&str, bool)> = nodes
        .iter()
        .filter_map(|n| {
            let plan = n.spec.plan.as_deref()?;
            Some((
                crate::api::name_of(n),
                (plan, n.spec.device_access == DeviceAccess::Dra),
            ))
        })
        .collect();
    let mut out = BTreeMap::new();
    for t in tenants.iter().filter(|t| t.is_valid()) {
        let name = crate::api::name_of(t.as_ref());
        let mut pools: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
        for g in t.status.iter().flat_map(|s| s.grants.iter()) {
            let Some((plan, dra)) = node_pool.get(g.node.as_str()) else {
                continue;
            };
            let resource = if *dra {
                DeviceKind::of(g.mode, g.profile.as_deref()).extended_resource(name)
            } else {
                resource_name(g.mode, g.profile.as_deref())
            };
            *pools.entry(plan.to_string()).or_default().entry(resource).or_default() += u64::from(g.count);
        }
        out.insert(name.to_string(), pools);
    }
    out
}

/// Kueue's `deviceClassMappings` for the tenants' DeviceClasses: each class counts as the
/// extended resource it names (`<tenant>.gputenancy.io/<kind>`), which is the resource the
/// tenant's ClusterQueue holds its DRA units under ([`units_by_pool`]). So a claim and a pod
/// asking by that name take the same quota. Sorted by name.
pub fn device_class_mappings(holdings: &DraHoldings) -> Vec<DeviceClassMapping> {
    let mut out: Vec<DeviceClassMapping> = holdings
        .0
        .iter()
        .flat_map(|(tenant, kinds)| {
            kinds.keys().map(move |k| DeviceClassMapping {
                name: k.extended_resource(tenant),
                device_class_names: vec![k.class_name(tenant)],
            })
        })
        .collect();
    out.sort();
    out
}

/// The percent a tier's tenants lend and borrow: none for a tier that forbids co-location (a
/// borrowed unit may be a share of a GPU another tenant's pods use).
pub fn lending_percent(tier: &Tier) -> Option<u32> {
    match tier.co_location {
        CoLocation::Forbidden => None,
        CoLocation::SameTier => tier.idle_lending_percent.map(|p| p.min(100)),
    }
}

/// The tier of `tenant` and the percent it lends, if its tier lends.
fn tenant_lending<'p>(tenant: &GpuTenant, policies: &'p [SharingPolicy]) -> Option<(&'p SharingPolicy, u32)> {
    let policy = policies
        .iter()
        .find(|p| crate::api::name_of(*p) == tenant.spec.policy_ref)?;
    let pct = lending_percent(policy.spec.tier(&tenant.spec.tier)?)?;
    Some((policy, pct))
}

/// What a tenant may borrow of `units` (and lends of them): `percent` of them, rounded down.
pub fn share_of(units: u64, percent: u32) -> u64 {
    units.saturating_mul(u64::from(percent)) / 100
}

/// The ceiling of a tenant namespace's quota with Kueue on, per quota key: the whole grant and
/// what the tenant may borrow on top (every namespace may hold all of it; Kueue keeps the total).
pub fn ceiling(tenant: &GpuTenant, policies: &[SharingPolicy], grant: u64) -> u64 {
    match tenant_lending(tenant, policies) {
        Some((_, pct)) => grant.saturating_add(share_of(grant, pct)),
        None => grant,
    }
}

/// Names each tenant's ClusterQueue in its status with Kueue on (every tenant has one), and none
/// without; a status is written only where it differs.
pub fn name_queues(tenants: &mut [Arc<GpuTenant>], kueue: bool) {
    for t in tenants.iter_mut() {
        let queue = kueue.then(|| queue_name(crate::api::name_of(t.as_ref())));
        if t.status.as_ref().is_some_and(|s| s.queue != queue)
            && let Some(status) = Arc::make_mut(t).status.as_mut()
        {
            status.queue = queue;
        }
    }
}

/// Every Kueue object for the fleet.
pub fn render(
    tenants: &[Arc<GpuTenant>],
    nodes: &[GpuNode],
    plans: &[GpuPartitionPlan],
    policies: &[SharingPolicy],
    rules: &NamespaceRules,
) -> KueueObjects {
    let mut out = KueueObjects::default();
    let pools = flavors(plans, &mut out);
    let units = units_by_pool(tenants, nodes);
    let mut cohorts = BTreeSet::new();
    for t in tenants {
        let name = crate::api::name_of(t.as_ref());
        let lending = tenant_lending(t, policies).and_then(|(p, pct)| {
            let cohort = cohort_name(crate::api::name_of(p), &t.spec.tier);
            if cohort.len() > MAX_NAME {
                out.problems.push(Problem::new(
                    "SharingPolicy",
                    crate::api::name_of(p),
                    "metadata.name",
                    format!("the Kueue Cohort of tier {} would be named {cohort}, longer than {MAX_NAME} characters: its tenants lend nothing; shorten the policy's name", t.spec.tier),
                ));
                return None;
            }
            Some((cohort, pct))
        });
        let empty = BTreeMap::new();
        let tenant_units = units.get(name).unwrap_or(&empty);
        let namespaces = rules.tenants.get(name).cloned().unwrap_or_default();
        out.cluster_queues
            .push(cluster_queue(t, tenant_units, &pools, &namespaces, lending.as_ref()));
        for ns in &namespaces {
            out.local_queues.push(LocalQueue {
                metadata: meta(LOCAL_QUEUE, Some(ns)),
                spec: LocalQueueSpec {
                    cluster_queue: queue_name(name),
                },
            });
        }
        let mut wpc = WorkloadPriorityClass::new(
            &queue_name(name),
            t.spec.priority,
            format!("GpuTenant {name}'s priority"),
        );
        wpc.metadata.labels = Some(managed_labels());
        out.workload_priority_classes.push(wpc);
        cohorts.extend(lending.map(|(c, _)| c));
    }
    // A policy's problem is found once per tenant of the tier: said once.
    out.problems.sort();
    out.problems.dedup();
    out.cohorts = cohorts
        .into_iter()
        .map(|c| Cohort {
            metadata: meta(&c, None),
            spec: CohortSpec {},
        })
        .collect();
    out.cluster_queues.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    out.local_queues
        .sort_by(|a, b| a.metadata.namespace.cmp(&b.metadata.namespace));
    out.workload_priority_classes
        .sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    out
}

/// One flavor per plan (the pool's flavor name by plan name) and [`ANY_FLAVOR`]; a plan whose
/// flavor cannot be written is left out, with a problem (its units are in no queue).
fn flavors(plans: &[GpuPartitionPlan], out: &mut KueueObjects) -> BTreeMap<String, String> {
    let mut pools = BTreeMap::new();
    out.resource_flavors.push(ResourceFlavor {
        metadata: meta(ANY_FLAVOR, None),
        spec: ResourceFlavorSpec::default(),
    });
    for p in plans {
        let plan = crate::api::name_of(p);
        let name = flavor_name(plan);
        let labels = p.spec.node_selector.match_labels.clone().unwrap_or_default();
        let why = if name.len() > MAX_NAME {
            Some((
                "metadata.name",
                format!(
                    "its Kueue ResourceFlavor would be named {name}, longer than {MAX_NAME} characters; shorten the plan's name"
                ),
            ))
        } else if labels.len() > MAX_NODE_LABELS {
            Some((
                "spec.nodeSelector.matchLabels",
                format!(
                    "Kueue's ResourceFlavor holds at most {MAX_NODE_LABELS} node labels; select the pool with fewer"
                ),
            ))
        } else {
            None
        };
        if let Some((field, message)) = why {
            out.problems.push(Problem::new(
                "GpuPartitionPlan",
                plan,
                field,
                format!("{message} (until then no tenant's queue admits workloads for this plan's GPUs)"),
            ));
            continue;
        }
        out.resource_flavors.push(ResourceFlavor {
            metadata: meta(&name, None),
            spec: ResourceFlavorSpec { node_labels: labels },
        });
        pools.insert(plan.to_string(), name);
    }
    out.resource_flavors
        .sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    pools
}

/// A tenant's ClusterQueue: GPUs per pool, the other resources unbounded, its namespaces, its
/// weight, and its cohort with the percent it lends and borrows.
fn cluster_queue(
    t: &GpuTenant,
    units: &BTreeMap<String, BTreeMap<String, u64>>,
    pools: &BTreeMap<String, String>,
    namespaces: &BTreeSet<String>,
    lending: Option<&(String, u32)>,
) -> ClusterQueue {
    let name = crate::api::name_of(t);
    let covered: BTreeSet<&str> = units
        .iter()
        .filter(|(plan, _)| pools.contains_key(*plan))
        .flat_map(|(_, r)| r.keys().map(String::as_str))
        .collect();
    let mut groups = Vec::new();
    if !covered.is_empty() {
        let none = BTreeMap::new();
        let flavors = pools
            .iter()
            .filter(|(plan, _)| units.contains_key(*plan))
            .map(|(plan, flavor)| {
                let held = units.get(plan).unwrap_or(&none);
                FlavorQuotas {
                    name: flavor.clone(),
                    resources: covered
                        .iter()
                        .map(|r| gpu_quota(r, held.get(*r).copied().unwrap_or(0), lending.map(|l| l.1)))
                        .collect(),
                }
            })
            .collect();
        groups.push(ResourceGroup {
            covered_resources: covered.iter().map(|r| r.to_string()).collect(),
            flavors,
        });
    }
    groups.push(ResourceGroup {
        covered_resources: OTHER_RESOURCES.iter().map(|r| r.to_string()).collect(),
        flavors: vec![FlavorQuotas {
            name: ANY_FLAVOR.into(),
            resources: OTHER_RESOURCES
                .iter()
                .zip(UNBOUNDED)
                .map(|(r, q)| ResourceQuota {
                    name: r.to_string(),
                    nominal_quota: Quantity(q.into()),
                    borrowing_limit: None,
                    lending_limit: lending.map(|_| Quantity("0".into())),
                })
                .collect(),
        }],
    });
    ClusterQueue {
        metadata: meta(&queue_name(name), None),
        spec: ClusterQueueSpec {
            resource_groups: groups,
            cohort_name: lending.map(|l| l.0.clone()),
            namespace_selector: Some(namespace_selector(name, namespaces)),
            fair_sharing: Some(FairSharing {
                weight: Some(Quantity(t.spec.weight.to_string())),
            }),
            // What a lender lent is idle capacity: it takes it back by preempting the borrowers'
            // workloads when its own need it. Nothing else preempts.
            preemption: lending.map(|_| Preemption {
                reclaim_within_cohort: Some("Any".into()),
                within_cluster_queue: Some("Never".into()),
            }),
        },
    }
}

/// One GPU resource's quota in one pool: the units, and with lending, the share lent and borrowed.
fn gpu_quota(resource: &str, units: u64, lending: Option<u32>) -> ResourceQuota {
    ResourceQuota {
        name: resource.to_string(),
        nominal_quota: Quantity(units.to_string()),
        borrowing_limit: lending.map(|p| Quantity(share_of(units, p).to_string())),
        lending_limit: lending.map(|p| Quantity(share_of(units, p).to_string())),
    }
}

/// The tenant's own namespaces, by the tenant label this controller writes and the name label the
/// API server writes: neither can a tenant user set on a namespace.
pub fn namespace_selector(tenant: &str, namespaces: &BTreeSet<String>) -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([(TENANT.to_string(), tenant.to_string())])),
        // `In` needs at least one value: without namespaces the tenant label alone selects none.
        match_expressions: (!namespaces.is_empty()).then(|| {
            vec![LabelSelectorRequirement {
                key: "kubernetes.io/metadata.name".into(),
                operator: "In".into(),
                values: Some(namespaces.iter().cloned().collect()),
            }]
        }),
    }
}

#[cfg(test)]
mod tests;
