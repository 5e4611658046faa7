//! The controller's Prometheus metrics, served as OpenMetrics text on `/metrics` ([`crate::runtime::http`]).
//!
//! Every name starts with `gpu_tenancy_controller_`. Counters get the `_total` suffix and the pass
//! histogram its `_seconds` unit from `prometheus-client`, as OpenMetrics requires:
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `gpu_tenancy_controller_passes_total` | counter | `result` (`ok`, `error`) |
//! | `gpu_tenancy_controller_pass_duration_seconds` | histogram | |
//! | `gpu_tenancy_controller_errors_total` | counter | `step` (`write`, ...), `kind` (of the object a write was for) |
//! | `gpu_tenancy_controller_objects_written_total` | counter | `kind`, `action` ([`WriteAction`]) |
//! | `gpu_tenancy_controller_tenant_requested` | gauge | `tenant`, `mode`, `profile` |
//! | `gpu_tenancy_controller_tenant_granted` | gauge | `tenant`, `mode`, `profile` |
//! | `gpu_tenancy_controller_is_leader` | gauge | |
//!
//! The tenant gauges are the tenants' `status.allocation` (units requested and granted per mode and
//! MIG profile; `profile` is empty for other modes); [`Metrics::set_tenants`] replaces the whole set,
//! so a deleted tenant's series disappear instead of reporting stale grants forever.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use kube::ResourceExt;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use crate::api::GpuTenant;

/// Prefix of every metric name.
pub const PREFIX: &str = "gpu_tenancy_controller";

/// What a write did to an object: the `action` label of `objects_written_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WriteAction {
    /// Server-side apply of an object (spec, labels, ...).
    Apply,
    /// Server-side apply on the `/status` subresource.
    Status,
    /// A deletion.
    Delete,
    /// Any other patch (e.g. a Node's labels and taints).
    Patch,
    /// An Eviction an agent asked for.
    Evict,
}

impl WriteAction {
    pub const ALL: [WriteAction; 5] = [
        WriteAction::Apply,
        WriteAction::Status,
        WriteAction::Delete,
        WriteAction::Patch,
        WriteAction::Evict,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WriteAction::Apply => "apply",
            WriteAction::Status => "status",
            WriteAction::Delete => "delete",
            WriteAction::Patch => "patch",
            WriteAction::Evict => "evict",
        }
    }
}

impl fmt::Display for WriteAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepLabels {
    step: &'static str,
    /// The kind of object a failed write was for; empty for the steps of no one object.
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WriteLabels {
    kind: String,
    action: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct TenantLabels {
    tenant: String,
    mode: &'static str,
    profile: String,
}

/// The controller's metrics. Cheap to update from any task; share it as `Arc<Metrics>`.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    passes: Family<ResultLabels, Counter>,
    pass_duration: Histogram,
    errors: Family<StepLabels, Counter>,
    written: Family<WriteLabels, Counter>,
    tenant_requested: Family<TenantLabels, Gauge>,
    tenant_granted: Family<TenantLabels, Gauge>,
    /// The tenant series set by the last `set_tenants`, to remove those that are gone.
    tenant_series: Mutex<BTreeSet<TenantLabels>>,
    is_leader: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl crate::runtime::http::Exposition for Metrics {
    fn encode(&self) -> String {
        Metrics::encode(self)
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix(PREFIX);
        let passes = Family::<ResultLabels, Counter>::default();
        // A pass plans the fleet (well under a second at 5,000 nodes, docs/design.md#scale) and makes its
        // writes: 5 ms to about 80 s, doubling.
        let pass_duration = Histogram::new(exponential_buckets(0.005, 2.0, 15));
        let errors = Family::<StepLabels, Counter>::default();
        let written = Family::<WriteLabels, Counter>::default();
        let tenant_requested = Family::<TenantLabels, Gauge>::default();
        let tenant_granted = Family::<TenantLabels, Gauge>::default();
        let is_leader = Gauge::default();

        registry.register(
            "passes",
            "Reconcile passes over the whole fleet, by result",
            passes.clone(),
        );
        registry.register_with_unit(
            "pass_duration",
            "Time of one pass: snapshot, plan, diff and writes",
            Unit::Seconds,
            pass_duration.clone(),
        );
        registry.register(
            "errors",
            "Errors, by the step that failed and the kind of object it was for",
            errors.clone(),
        );
        registry.register(
            "objects_written",
            "Writes to the API server that succeeded, by object kind and action",
            written.clone(),
        );
        registry.register(
            "tenant_requested",
            "Units a tenant requests, per mode and MIG profile (its status.allocation)",
            tenant_requested.clone(),
        );
        registry.register(
            "tenant_granted",
            "Units granted to a tenant, per mode and MIG profile (its status.allocation)",
            tenant_granted.clone(),
        );
        registry.register(
            "is_leader",
            "1 while this replica holds the leader lease and writes, else 0",
            is_leader.clone(),
        );

        Metrics {
            registry,
            passes,
            pass_duration,
            errors,
            written,
            tenant_requested,
            tenant_granted,
            tenant_series: Mutex::new(BTreeSet::new()),
            is_leader,
        }
    }

    /// Counts a finished pass and records its duration.
    pub fn pass(&self, duration: Duration, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.passes.get_or_create(&ResultLabels { result }).inc();
        self.pass_duration.observe(duration.as_secs_f64());
    }

    /// Counts an error in `step` (e.g. `write`; keep the set small) for an object of `kind`
    /// (empty for a step of no one object).
    pub fn error(&self, step: &'static str, kind: &str) {
        let labels = StepLabels {
            step,
            kind: kind.to_owned(),
        };
        self.errors.get_or_create(&labels).inc();
    }

    /// Counts one successful write of an object of `kind` (e.g. `GpuNode`, `ResourceQuota`).
    pub fn written(&self, kind: &str, action: WriteAction) {
        let labels = WriteLabels {
            kind: kind.to_owned(),
            action: action.as_str(),
        };
        self.written.get_or_create(&labels).inc();
    }

    /// Sets the `is_leader` gauge.
    pub fn set_leader(&self, leader: bool) {
        self.is_leader.set(i64::from(leader));
    }

    /// Replaces the tenant gauges with the `status.allocation` of `tenants`: one series per tenant,
    /// mode and profile; series of tenants (or allocations) no longer present are removed.
    pub fn set_tenants<T: std::borrow::Borrow<GpuTenant>>(&self, tenants: &[T]) {
        let mut current: BTreeMap<TenantLabels, (i64, i64)> = BTreeMap::new();
        for tenant in tenants {
            let tenant = tenant.borrow();
            let Some(status) = &tenant.status else { continue };
            for a in &status.allocation {
                let labels = TenantLabels {
                    tenant: tenant.name_any(),
                    mode: a.mode.as_str(),
                    profile: a.profile.clone().unwrap_or_default(),
                };
                // The planner writes one entry per mode and profile; add up should one repeat.
                let entry = current.entry(labels).or_default();
                entry.0 += i64::from(a.requested);
                entry.1 += i64::from(a.granted);
            }
        }
        // One lock for the whole replacement, so concurrent calls cannot interleave their removals.
        let mut series = self.tenant_series.lock().unwrap_or_else(|e| e.into_inner());
        for gone in series.iter().filter(|l| !current.contains_key(*l)) {
            self.tenant_requested.remove(gone);
            self.tenant_granted.remove(gone);
        }
        for (labels, (requested, granted)) in &current {
            self.tenant_requested.get_or_create(labels).set(*requested);
            self.tenant_granted.get_or_create(labels).set(*granted);
        }
        *series = current.into_keys().collect();
    }

    /// Every metric in the OpenMetrics text format (ends with `# EOF`).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail; an Err would only come from a broken label encoder.
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "encoding metrics failed");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{AllocationSummary, GpuTenantStatus, Mode};

    fn tenant(name: &str, allocation: &[(Mode, Option<&str>, u32, u32)]) -> GpuTenant {
        let spec = serde_json::from_value(serde_json::json!({
            "tier": "internal", "policyRef": "default", "namespaces": [format!("{name}-ns")],
            "resources": [{"mode": "Exclusive", "count": 1}]
        }))
        .expect("tenant spec");
        let mut t = GpuTenant::new(name, spec);
        t.status = Some(GpuTenantStatus {
            allocation: allocation
                .iter()
                .map(|&(mode, profile, requested, granted)| AllocationSummary {
                    mode,
                    profile: profile.map(str::to_owned),
                    requested,
                    granted,
                })
                .collect(),
            ..GpuTenantStatus::default()
        });
        t
    }

    /// The sample lines (no comments) of `text` that start with `name`.
    fn samples<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
        text.lines().filter(|l| l.starts_with(name)).collect()
    }

    #[test]
    fn counters_histogram_and_leader_gauge_are_exposed_with_the_prefix() {
        let m = Metrics::new();
        m.pass(Duration::from_millis(30), true);
        m.pass(Duration::from_millis(30), true);
        m.pass(Duration::from_secs(2), false);
        m.error("write", "ResourceQuota");
        m.written("GpuNode", WriteAction::Apply);
        m.written("GpuNode", WriteAction::Apply);
        m.written("GpuTenant", WriteAction::Status);
        m.set_leader(true);
        let text = m.encode();

        let mut passes = samples(&text, "gpu_tenancy_controller_passes_total");
        passes.sort();
        assert_eq!(
            passes,
            [
                r#"gpu_tenancy_controller_passes_total{result="error"} 1"#,
                r#"gpu_tenancy_controller_passes_total{result="ok"} 2"#,
            ]
        );
        assert!(text.contains("# TYPE gpu_tenancy_controller_pass_duration_seconds histogram"));
        assert!(text.contains("# UNIT gpu_tenancy_controller_pass_duration_seconds seconds"));
        assert!(
            text.contains("gpu_tenancy_controller_pass_duration_seconds_count 3"),
            "{text}"
        );
        assert!(
            text.contains(r#"gpu_tenancy_controller_pass_duration_seconds_bucket{le="0.04"} 2"#),
            "{text}"
        );
        assert!(text.contains(r#"gpu_tenancy_controller_errors_total{step="write",kind="ResourceQuota"} 1"#));
        assert!(text.contains(r#"gpu_tenancy_controller_objects_written_total{kind="GpuNode",action="apply"} 2"#));
        assert!(text.contains(r#"gpu_tenancy_controller_objects_written_total{kind="GpuTenant",action="status"} 1"#));
        assert!(text.contains("gpu_tenancy_controller_is_leader 1"));
        assert!(text.ends_with("# EOF\n"));

        m.set_leader(false);
        assert!(m.encode().contains("gpu_tenancy_controller_is_leader 0"));
    }

    #[test]
    fn tenant_gauges_follow_status_allocation_and_removed_tenants_disappear() {
        let m = Metrics::new();
        m.set_tenants(&[
            tenant(
                "alpha",
                &[(Mode::Mig, Some("3g.40gb"), 2, 1), (Mode::Exclusive, None, 1, 1)],
            ),
            tenant("beta", &[(Mode::Mps, None, 4, 4)]),
        ]);
        let text = m.encode();
        let mut granted = samples(&text, "gpu_tenancy_controller_tenant_granted");
        granted.sort();
        assert_eq!(
            granted,
            [
                r#"gpu_tenancy_controller_tenant_granted{tenant="alpha",mode="Exclusive",profile=""} 1"#,
                r#"gpu_tenancy_controller_tenant_granted{tenant="alpha",mode="MIG",profile="3g.40gb"} 1"#,
                r#"gpu_tenancy_controller_tenant_granted{tenant="beta",mode="MPS",profile=""} 4"#,
            ]
        );
        assert!(
            text.contains(r#"gpu_tenancy_controller_tenant_requested{tenant="alpha",mode="MIG",profile="3g.40gb"} 2"#)
        );

        // alpha is deleted, beta's grant changes and drops MPS for TimeSlicing.
        m.set_tenants(&[tenant("beta", &[(Mode::TimeSlicing, None, 2, 1)])]);
        let text = m.encode();
        assert!(!text.contains(r#"tenant="alpha""#), "{text}");
        assert!(!text.contains(r#"mode="MPS""#), "{text}");
        assert_eq!(
            samples(&text, "gpu_tenancy_controller_tenant_granted"),
            [r#"gpu_tenancy_controller_tenant_granted{tenant="beta",mode="TimeSlicing",profile=""} 1"#]
        );
        assert_eq!(
            samples(&text, "gpu_tenancy_controller_tenant_requested"),
            [r#"gpu_tenancy_controller_tenant_requested{tenant="beta",mode="TimeSlicing",profile=""} 2"#]
        );

        // A tenant without a status yet has no series; none at all leaves none.
        let mut fresh = tenant("gamma", &[]);
        fresh.status = None;
        m.set_tenants(&[fresh]);
        assert!(samples(&m.encode(), "gpu_tenancy_controller_tenant_").is_empty());
    }

    #[test]
    fn write_actions_have_their_label_values() {
        let names: Vec<String> = WriteAction::ALL.iter().map(ToString::to_string).collect();
        assert_eq!(names, ["apply", "status", "delete", "patch", "evict"]);
    }
}
