//! `gpu-tenancy report`: showback from the agents' and the controller's metrics in Prometheus.
//! Per tenant and mode the GPU-hours allocated (share-weighted, `core/src/accounting.rs`) and
//! used (where utilization is known) over a window, the tenant's units granted and requested
//! now, its top namespaces (the GPU-hours its pods there held, by the kubelet), with Kueue the
//! workloads its queue admitted and how long they waited (Kueue's own metrics), and (with
//! `--plot`) allocation and use over time per tenant ([`plot`]).
//!
//! Figures are Prometheus' `increase()` over the window: it extrapolates each counter to the
//! window's edges, so a figure can be off by up to about one scrape interval of the series.

pub mod plot;
pub mod prometheus;

use prometheus::{PromError, Prometheus, Series};
use serde::Serialize;
use std::collections::BTreeMap;

/// One tenant's allocation and use in one mode.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModeRow {
    pub mode: String,
    pub allocated_gpu_hours: f64,
    /// `None` where no agent reported utilization (MIG instances, backends without it).
    pub used_gpu_hours: Option<f64>,
}

/// The GPU-hours of a tenant's allocation its pods in one namespace held.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceRow {
    pub namespace: String,
    pub allocated_gpu_hours: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantRow {
    pub tenant: String,
    /// Units granted and requested now, from the leading controller (`None` for `unallocated`,
    /// `shared` and tenants the controller does not report).
    pub granted_units: Option<f64>,
    pub requested_units: Option<f64>,
    pub modes: Vec<ModeRow>,
    pub allocated_gpu_hours: f64,
    pub used_gpu_hours: Option<f64>,
    /// Used / allocated, over the modes whose use is known.
    pub efficiency: Option<f64>,
    /// Its namespaces by the GPU-hours their pods held, most first (device-plugin mode, where the
    /// agents read the kubelet's pod-resources API; what no pod held is in no namespace).
    pub namespaces: Vec<NamespaceRow>,
    /// With Kueue: the workloads its ClusterQueue admitted in the window (`None`: no queue).
    pub admitted_workloads: Option<f64>,
    /// And their mean wait, from creation or requeue to admission, in seconds (`None`: none admitted).
    pub mean_queue_wait_seconds: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The window, in seconds, ending at `end` (unix seconds, the server's clock).
    pub window_seconds: f64,
    pub end: f64,
    pub tenants: Vec<TenantRow>,
    /// All GPU-hours allocated, `unallocated` included: the fleet's GPUs × the window.
    pub total_gpu_hours: f64,
}

/// Allocation and use over time per tenant, for the plot: GPUs (allocated GPU-seconds per second).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timeline {
    pub allocated: BTreeMap<String, Vec<(f64, f64)>>,
    pub used: BTreeMap<String, Vec<(f64, f64)>>,
}

/// Why `--since` is not a window (`given`: as written).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    #[error("--since {given:?}: not a duration like 30m, 24h or 7d")]
    NotADuration { given: String },
    #[error("--since {given:?}: the unit must be s, m, h, d or w")]
    Unit { given: String },
    #[error("--since {given:?}: the window must be at least 1s")]
    TooShort { given: String },
}

/// A Prometheus duration of `--since` (`90s`, `30m`, `24h`, `7d`, `2w`), in seconds.
pub fn parse_window(s: &str) -> Result<f64, WindowError> {
    let given = || s.to_string();
    let unit_at = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(unit_at);
    let n: f64 = n.parse().map_err(|_| WindowError::NotADuration { given: given() })?;
    let scale = match unit {
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86400.0,
        "w" => 7.0 * 86400.0,
        _ => return Err(WindowError::Unit { given: given() }),
    };
    match n * scale {
        w if w >= 1.0 => Ok(w),
        _ => Err(WindowError::TooShort { given: given() }),
    }
}

/// Prometheus' answers the report is made of: GPU-seconds by (tenant, mode) allocated and used,
/// by (tenant, namespace) held, units granted and requested by tenant.
#[derive(Clone, Debug, Default)]
pub struct Answers {
    pub allocated: Vec<prometheus::Sample>,
    pub used: Vec<prometheus::Sample>,
    pub namespaces: Vec<prometheus::Sample>,
    pub granted: Vec<prometheus::Sample>,
    pub requested: Vec<prometheus::Sample>,
    /// By tenant: Kueue's admission wait, its count and sum of seconds.
    pub admitted: Vec<prometheus::Sample>,
    pub queue_wait: Vec<prometheus::Sample>,
}

/// The tenants' figures from Prometheus' answers. Pure.
pub fn assemble(window_seconds: f64, end: f64, a: &Answers) -> Report {
    let by_tenant = |v: &[prometheus::Sample]| -> BTreeMap<String, f64> {
        v.iter().map(|s| (label(s, "tenant"), s.value)).collect()
    };
    let (granted, requested) = (by_tenant(&a.granted), by_tenant(&a.requested));
    let (admitted, waited) = (by_tenant(&a.admitted), by_tenant(&a.queue_wait));
    let mut tenants = mode_rows(&a.allocated, &a.used);
    let mut held = held_by_tenant(&a.namespaces);
    // Tenants the controller grants but no agent has allocated anything to yet.
    for t in granted.keys().chain(requested.keys()).chain(admitted.keys()) {
        tenants.entry(t.clone()).or_default();
    }
    let rows: Vec<TenantRow> = tenants
        .into_iter()
        .map(|(tenant, modes)| {
            // A float sum of nothing is -0.0; + 0.0 makes it 0.0, which prints as 0.00.
            let allocated: f64 = modes.iter().map(|m| m.allocated_gpu_hours).sum::<f64>() + 0.0;
            let known: Vec<&ModeRow> = modes.iter().filter(|m| m.used_gpu_hours.is_some()).collect();
            let used = (!known.is_empty()).then(|| known.iter().filter_map(|m| m.used_gpu_hours).sum::<f64>());
            let known_allocated: f64 = known.iter().map(|m| m.allocated_gpu_hours).sum();
            let admitted_workloads = admitted.get(&tenant).copied();
            TenantRow {
                namespaces: held.remove(&tenant).unwrap_or_default(),
                mean_queue_wait_seconds: admitted_workloads
                    .filter(|n| *n > 0.0)
                    .and_then(|n| waited.get(&tenant).map(|s| s / n)),
                admitted_workloads,
                granted_units: granted.get(&tenant).copied(),
                requested_units: requested.get(&tenant).copied(),
                efficiency: used.filter(|_| known_allocated > 0.0).map(|u| u / known_allocated),
                allocated_gpu_hours: allocated,
                used_gpu_hours: used,
                modes,
                tenant,
            }
        })
        .collect();
    Report {
        window_seconds,
        end,
        total_gpu_hours: rows.iter().map(|t| t.allocated_gpu_hours).sum::<f64>() + 0.0,
        tenants: rows,
    }
}

fn label(s: &prometheus::Sample, name: &str) -> String {
    s.labels.get(name).cloned().unwrap_or_default()
}

/// Each tenant's modes: GPU-hours allocated, and used where known. Use with no allocation is
/// `unattributed`, whose busy time no tenant's pod made (a series at 0 says nothing worth a row).
fn mode_rows(allocated: &[prometheus::Sample], used: &[prometheus::Sample]) -> BTreeMap<String, Vec<ModeRow>> {
    let key = |s: &prometheus::Sample| (label(s, "tenant"), label(s, "mode"));
    let mut used: BTreeMap<(String, String), f64> = used.iter().map(|s| (key(s), s.value)).collect();
    let mut tenants: BTreeMap<String, Vec<ModeRow>> = BTreeMap::new();
    for s in allocated {
        let (tenant, mode) = key(s);
        let used = used.remove(&(tenant.clone(), mode.clone())).map(|u| u / 3600.0);
        tenants.entry(tenant).or_default().push(ModeRow {
            mode,
            allocated_gpu_hours: s.value / 3600.0,
            used_gpu_hours: used,
        });
    }
    for ((tenant, mode), u) in used.into_iter().filter(|(_, u)| *u > 0.0) {
        tenants.entry(tenant).or_default().push(ModeRow {
            mode,
            allocated_gpu_hours: 0.0,
            used_gpu_hours: Some(u / 3600.0),
        });
    }
    tenants
}

/// Each tenant's namespaces by the GPU-hours their pods held, most first (none at 0).
fn held_by_tenant(namespaces: &[prometheus::Sample]) -> BTreeMap<String, Vec<NamespaceRow>> {
    let mut held: BTreeMap<String, Vec<NamespaceRow>> = BTreeMap::new();
    for s in namespaces.iter().filter(|s| s.value > 0.0) {
        held.entry(label(s, "tenant")).or_default().push(NamespaceRow {
            namespace: label(s, "namespace"),
            allocated_gpu_hours: s.value / 3600.0,
        });
    }
    for v in held.values_mut() {
        v.sort_by(|a, b| b.allocated_gpu_hours.total_cmp(&a.allocated_gpu_hours));
    }
    held
}

/// The leading controller's tenant gauge (a follower keeps exporting what it last led with).
fn leader_only(metric: &str) -> String {
    format!("sum by (tenant) ({metric} and on (job, instance) (gpu_tenancy_controller_is_leader == 1))")
}

/// Kueue's histogram of each workload's wait until admission, per ClusterQueue.
const ADMISSION_WAIT: &str = "kueue_admission_wait_time_seconds";

/// `sum by (tenant)` of the increase of Kueue's series `metric` over window `w`, for the
/// ClusterQueues this operator writes (`gpu-tenancy-<tenant>`), the tenant read from the name.
fn by_queue_tenant(metric: &str, w: &str) -> String {
    let prefix = crate::kueue::PREFIX;
    format!(
        "sum by (tenant) (label_replace(increase({metric}{{cluster_queue=~\"{prefix}.+\"}}[{w}]), \"tenant\", \"$1\", \"cluster_queue\", \"{prefix}(.+)\"))"
    )
}

/// Queries Prometheus for the window of `window_seconds` ending now (the server's clock).
pub async fn report(prom: &Prometheus, window_seconds: f64) -> Result<Report, PromError> {
    let end = prom.now().await?;
    let w = format!("{}s", window_seconds.round() as u64);
    let increase = |m: &str, by: &str| format!("sum by (tenant, {by}) (increase({m}[{w}]))");
    let answers = Answers {
        allocated: prom
            .query(&increase("gpu_tenancy_allocated_gpu_seconds_total", "mode"), Some(end))
            .await?,
        used: prom
            .query(&increase("gpu_tenancy_used_gpu_seconds_total", "mode"), Some(end))
            .await?,
        namespaces: prom
            .query(
                &increase("gpu_tenancy_namespace_allocated_gpu_seconds_total", "namespace"),
                Some(end),
            )
            .await?,
        granted: prom
            .query(&leader_only("gpu_tenancy_controller_tenant_granted"), Some(end))
            .await?,
        requested: prom
            .query(&leader_only("gpu_tenancy_controller_tenant_requested"), Some(end))
            .await?,
        admitted: prom
            .query(&by_queue_tenant(&format!("{ADMISSION_WAIT}_count"), &w), Some(end))
            .await?,
        queue_wait: prom
            .query(&by_queue_tenant(&format!("{ADMISSION_WAIT}_sum"), &w), Some(end))
            .await?,
    };
    Ok(assemble(window_seconds, end, &answers))
}

/// Allocation and use per tenant over the window, about 200 points: the agents' gauges of each
/// tenant's share of each GPU and of the GPUs it keeps busy, summed per tenant. Gauges, not the
/// counters' rates: a rate over a window longer than a series' life ramps up from 0, and a
/// counter restarting with its agent would dip.
pub async fn timeline(prom: &Prometheus, window_seconds: f64, end: f64) -> Result<Timeline, PromError> {
    let step = (window_seconds / 200.0).max(1.0);
    let start = end - window_seconds;
    let by_tenant = |v: Vec<Series>| -> BTreeMap<String, Vec<(f64, f64)>> {
        v.into_iter()
            .map(|s| (s.labels.get("tenant").cloned().unwrap_or_default(), s.points))
            .collect()
    };
    let allocated = "sum by (tenant) (gpu_tenancy_device_share_ratio)";
    let used = "sum by (tenant) (gpu_tenancy_busy_gpus)";
    Ok(Timeline {
        allocated: by_tenant(prom.query_range(allocated, start, end, step).await?),
        used: by_tenant(prom.query_range(used, start, end, step).await?),
    })
}

#[cfg(test)]
mod tests {
    use super::prometheus::Sample;
    use super::*;

    fn s(labels: &[(&str, &str)], value: f64) -> Sample {
        Sample {
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            value,
        }
    }

    fn a_of(r: &Report) -> &TenantRow {
        r.tenants.iter().find(|t| t.tenant == "a").unwrap()
    }

    #[test]
    fn windows_are_prometheus_durations() {
        assert_eq!(parse_window("90s"), Ok(90.0));
        assert_eq!(parse_window("30m"), Ok(1800.0));
        assert_eq!(parse_window("7d"), Ok(604800.0));
        assert_eq!(parse_window("2w"), Ok(1209600.0));
        for bad in ["", "7", "d", "1y", "-1h", "0s", "1.5h"] {
            assert!(parse_window(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn tenants_add_their_modes_and_efficiency_counts_only_known_use() {
        let r = assemble(
            3600.0,
            0.0,
            &Answers {
                allocated: vec![
                    s(&[("tenant", "a"), ("mode", "MIG")], 3600.0),
                    s(&[("tenant", "a"), ("mode", "Exclusive")], 7200.0),
                    s(&[("tenant", "unallocated"), ("mode", "MIG")], 1800.0),
                ],
                used: vec![
                    s(&[("tenant", "a"), ("mode", "Exclusive")], 3600.0),
                    s(&[("tenant", "unattributed"), ("mode", "TimeSlicing")], 900.0),
                    s(&[("tenant", "shared"), ("mode", "MPS")], 0.0),
                ],
                namespaces: vec![
                    s(&[("tenant", "a"), ("namespace", "a-small")], 1800.0),
                    s(&[("tenant", "a"), ("namespace", "a-big")], 5400.0),
                    s(&[("tenant", "a"), ("namespace", "a-gone")], 0.0),
                ],
                granted: vec![s(&[("tenant", "a")], 3.0), s(&[("tenant", "b")], 0.0)],
                requested: vec![s(&[("tenant", "a")], 4.0), s(&[("tenant", "b")], 2.0)],
                admitted: vec![s(&[("tenant", "a")], 4.0), s(&[("tenant", "b")], 0.0)],
                queue_wait: vec![s(&[("tenant", "a")], 10.0), s(&[("tenant", "b")], 0.0)],
            },
        );
        assert_eq!(
            (a_of(&r).admitted_workloads, a_of(&r).mean_queue_wait_seconds),
            (Some(4.0), Some(2.5))
        );
        let b = r.tenants.iter().find(|t| t.tenant == "b").unwrap();
        assert_eq!(
            (b.admitted_workloads, b.mean_queue_wait_seconds),
            (Some(0.0), None),
            "none admitted: no mean"
        );
        let a = &r.tenants[0];
        assert_eq!((a.tenant.as_str(), a.allocated_gpu_hours), ("a", 3.0));
        assert_eq!(a.used_gpu_hours, Some(1.0));
        assert_eq!(a.efficiency, Some(0.5), "1 GPU-h used of the 2 whose use is known");
        assert_eq!((a.granted_units, a.requested_units), (Some(3.0), Some(4.0)));
        let b = r.tenants.iter().find(|t| t.tenant == "b").unwrap();
        assert_eq!(
            (b.allocated_gpu_hours, b.used_gpu_hours, b.efficiency),
            (0.0, None, None)
        );
        assert!(b.allocated_gpu_hours.is_sign_positive(), "0.00, not -0.00");
        assert_eq!(r.total_gpu_hours, 3.5);
        let ns: Vec<(&str, f64)> = a
            .namespaces
            .iter()
            .map(|n| (n.namespace.as_str(), n.allocated_gpu_hours))
            .collect();
        assert_eq!(ns, [("a-big", 1.5), ("a-small", 0.5)], "most first, none at 0");
        let u = r.tenants.iter().find(|t| t.tenant == "unattributed").unwrap();
        assert_eq!(
            (u.allocated_gpu_hours, u.used_gpu_hours, u.efficiency),
            (0.0, Some(0.25), None)
        );
    }
}
