//! The node agent's metrics (`--metrics-addr`, OpenMetrics): per GPU and MIG instance what it
//! holds and does, per tenant what it is allocated and uses, and the agent's scrubs and MIG
//! changes, and memory used against the driver's caps ([`share_memory`]).
//! docs/operations/metrics.md lists them.
//!
//! Label names are those of NVIDIA's dcgm-exporter where they mean the same thing (`Hostname`,
//! `gpu`, `UUID`, `GPU_I_ID`, `GPU_I_PROFILE`), so `on(UUID, GPU_I_ID)` joins its series with
//! these; `mode` and `tenant` are this product's. (Not `instance` for the MIG instance:
//! Prometheus sets `instance` to the scrape target.) A MIG GPU has a row per instance and none
//! for the whole GPU (as dcgm-exporter's MIG rows), so a sum over rows counts each byte once.
//!
//! Cardinality per node: device rows ≤ GPUs × 7 (MIG) × the few device metrics; share rows ≤
//! GPUs × (tenants per GPU + 1); accounting rows ≤ (tenants on the node + 3 reserved names) × 5
//! modes; namespace rows ≤ the namespaces the node's tenants list; scrub and MIG rows ≤ GPUs × 2
//! and GPUs × 3. No PID label anywhere, and pod labels only on the holder info: those grow
//! without bound.

use crate::accounting::{self, Busy, Holding, Ledger};
use crate::api::{GpuNodeSpec, GpuNodeStatus, GpuStatus};
use crate::gpu::status::GpuEvent;
use crate::runtime::http::Exposition;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

/// Labels as (name, value) pairs: the dcgm-exporter names are not Rust identifiers.
type Labels = Vec<(&'static str, String)>;
type FloatGauge = Gauge<f64, AtomicU64>;
type FloatCounter = Counter<f64, AtomicU64>;

const MIB: f64 = 1024.0 * 1024.0;

/// The families, registered under the prefix `gpu_tenancy`.
struct Families {
    memory_used: Family<Labels, FloatGauge>,
    memory_total: Family<Labels, FloatGauge>,
    utilization: Family<Labels, FloatGauge>,
    processes: Family<Labels, Gauge>,
    share: Family<Labels, FloatGauge>,
    node_gpus: Family<Labels, Gauge>,
    allocated: Family<Labels, FloatCounter>,
    used: Family<Labels, FloatCounter>,
    namespace_allocated: Family<Labels, FloatCounter>,
    busy_gpus: Family<Labels, FloatGauge>,
    scrubs: Family<Labels, Counter>,
    scrub_seconds: Family<Labels, Histogram>,
    mig_changes: Family<Labels, Counter>,
    holders: Family<Labels, Gauge>,
    ungranted: Family<Labels, Gauge>,
    unhealthy: Family<Labels, Gauge>,
    share_memory_used: Family<Labels, FloatGauge>,
    share_memory_cap: Family<Labels, FloatGauge>,
}

/// What the last observation left for the time until the next one.
#[derive(Default)]
struct Held {
    holdings: Vec<Holding>,
    busy: Busy,
    /// (tenant, namespace) → the part of a GPU the namespace's pods hold of the tenant's.
    namespaces: BTreeMap<(String, String), f64>,
    /// Since when `holdings` and `busy` are counted; `None` before the first observation.
    since: Option<Instant>,
    ledger: Ledger,
    /// The prepared claims' memory caps ([`share_memory::caps_of`]).
    caps: Vec<share_memory::ShareCap>,
}

impl Families {
    fn new() -> Families {
        Families {
            memory_used: Family::default(),
            memory_total: Family::default(),
            utilization: Family::default(),
            processes: Family::default(),
            share: Family::default(),
            node_gpus: Family::default(),
            allocated: Family::default(),
            used: Family::default(),
            namespace_allocated: Family::default(),
            busy_gpus: Family::default(),
            scrubs: Family::default(),
            scrub_seconds: Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.05, 2.0, 12))),
            mig_changes: Family::default(),
            holders: Family::default(),
            ungranted: Family::default(),
            unhealthy: Family::default(),
            share_memory_used: Family::default(),
            share_memory_cap: Family::default(),
        }
    }

    /// What each device is and holds: memory, use, shares, health, holders.
    fn register_devices(&self, r: &mut Registry) {
        r.register_with_unit(
            "device_memory_used",
            "Memory the compute processes on a GPU or MIG instance use (NVML's per-process use)",
            Unit::Bytes,
            self.memory_used.clone(),
        );
        r.register_with_unit(
            "device_memory_total",
            "Memory of a GPU or MIG instance",
            Unit::Bytes,
            self.memory_total.clone(),
        );
        r.register_with_unit(
            "device_utilization",
            "Fraction of the time work ran on the GPU (nvmlDeviceGetUtilizationRates, its last sample period) or MIG instance (GPM's GRAPHICS_UTIL since the previous pass, Hopper and later); absent where NVML does not report it",
            Unit::Other("ratio".into()),
            self.utilization.clone(),
        );
        r.register(
            "device_processes",
            "Compute processes on a GPU or MIG instance",
            self.processes.clone(),
        );
        r.register_with_unit(
            "device_share",
            "Fraction of the whole GPU a tenant is granted there (a MIG instance its compute slices of 7, an MPS or time-slicing share its part of the replicas)",
            Unit::Other("ratio".into()),
            self.share.clone(),
        );
        r.register("node_gpus", "GPUs the agent found on the node", self.node_gpus.clone());
        r.register_with_unit(
            "share_memory_used",
            "Memory a tenant's processes use on a GPU where the driver caps its containers (NVML's per-process use, by the processes' pods)",
            Unit::Bytes,
            self.share_memory_used.clone(),
        );
        r.register_with_unit(
            "share_memory_cap",
            "The driver's memory cap of a tenant's MPS or time-slicing shares on a GPU, summed over its prepared devices there (NVIDIA_GPU_MEMORY_LIMIT of the CDI specs written)",
            Unit::Bytes,
            self.share_memory_cap.clone(),
        );
        r.register(
            "device_unhealthy",
            "1 for a GPU or MIG instance the driver reported an error on (label reason: Xid, EccUncorrectable, Unreadable, Unmonitored), else 0 (docs/concepts/health.md)",
            self.unhealthy.clone(),
        );
    }

    /// The accounting (GPU-seconds granted and used) and what the agent did (scrubs, MIG changes).
    fn register_accounting(&self, r: &mut Registry) {
        r.register(
            "allocated_gpu_seconds",
            "GPU-seconds granted, share-weighted (a whole GPU counts 1 per second); tenant unallocated for what no tenant holds: per node the rates add up to its GPUs",
            self.allocated.clone(),
        );
        r.register(
            "used_gpu_seconds",
            "GPU-seconds busy (utilization × time) where NVML reports utilization (a MIG instance's weighted by its part of the GPU); on an MPS or time-sliced GPU split by its processes' samples (tenant unattributed for processes of no known tenant's pod), else tenant shared where several tenants share it",
            self.used.clone(),
        );
        r.register(
            "busy_gpus",
            "GPUs busy now per tenant and mode, at the last pass's reading: the rate used_gpu_seconds advances at (for plots: a gauge needs no rate window)",
            self.busy_gpus.clone(),
        );
        r.register(
            "namespace_allocated_gpu_seconds",
            "GPU-seconds granted to a tenant that pods of one of its namespaces hold, by the kubelet's pod-resources API (device-plugin mode), share-weighted as allocated_gpu_seconds",
            self.namespace_allocated.clone(),
        );
        r.register("scrubs", "Memory scrubs, by result (ok, failed)", self.scrubs.clone());
        r.register_with_unit(
            "scrub_duration",
            "How long a scrub took",
            Unit::Seconds,
            self.scrub_seconds.clone(),
        );
        r.register(
            "mig_changes",
            "MIG changes carried out (create_instance, destroy_instance, mig_mode)",
            self.mig_changes.clone(),
        );
        r.register(
            "device_holder_info",
            "1 for each container holding a GPU, MIG instance or share, by the kubelet's pod-resources API (device-plugin mode); join on UUID and GPU_I_ID for the tenant",
            self.holders.clone(),
        );
        r.register(
            "device_ungranted_processes",
            "Compute processes on a GPU or MIG instance that no grant explains (DRA: no tenant is granted the device; device plugin: no container holds it by the kubelet's pod-resources API); absent where that cannot be told",
            self.ungranted.clone(),
        );
    }
}

/// The agent's metrics for one node.
pub struct AgentMetrics {
    node: String,
    registry: Registry,
    f: Families,
    /// Observations and scrapes take turns: a scrape never sees a half-replaced set of rows.
    held: Mutex<Held>,
    /// True once a pass has been observed: what `/readyz` answers.
    ready: tokio::sync::watch::Sender<bool>,
}

impl std::fmt::Debug for AgentMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentMetrics")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl AgentMetrics {
    pub fn new(node: &str) -> AgentMetrics {
        let mut registry = Registry::with_prefix("gpu_tenancy");
        let f = Families::new();
        f.register_devices(&mut registry);
        f.register_accounting(&mut registry);
        AgentMetrics {
            node: node.into(),
            registry,
            f,
            held: Mutex::new(Held::default()),
            ready: tokio::sync::watch::channel(false).0,
        }
    }

    /// Ready once the first pass has been observed.
    pub fn readiness(&self) -> crate::runtime::http::Readiness {
        crate::runtime::http::Readiness {
            ready: self.ready.subscribe(),
            not_ready: "no pass over the GPUs has completed yet",
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        // A panic while holding it leaves plain numbers behind, still fit to serve.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a pass's result: the spec applied, the GPUs as published, how busy the devices were
    /// (where known) and what the apply did.
    pub fn observe(&self, spec: &GpuNodeSpec, status: &GpuNodeStatus, busy: Busy, events: &[GpuEvent]) {
        let mut held = self.lock();
        self.advance(&mut held, Instant::now());
        let found: Vec<u32> = status.gpus.iter().map(|g| g.index).collect();
        held.holdings = accounting::holdings(spec, &found);
        held.busy = busy;
        // One second of the reading is what each tenant keeps busy, in GPUs.
        let mut now = Ledger::default();
        now.use_busy(&held.holdings, &held.busy, 1.0);
        self.f.busy_gpus.clear();
        for ((tenant, mode), gpus) in &now.used {
            self.f.busy_gpus.get_or_create(&self.account(tenant, mode)).set(*gpus);
        }
        self.devices(spec, status, &held.holdings, &held.busy);
        // Both results exist from the first pass, at 0: an alert on failures sees the first one.
        for g in &status.gpus {
            for result in ["ok", "failed"] {
                let _ = self.f.scrubs.get_or_create(&self.scrub_labels(g.index, result));
            }
        }
        self.count(events);
        self.ready.send_replace(true);
    }

    /// Adds the time since the last advance to the accounting counters, at the holdings and
    /// utilization last observed.
    fn advance(&self, held: &mut Held, now: Instant) {
        let Some(since) = held.since.replace(now) else {
            return;
        };
        let seconds = now.saturating_duration_since(since).as_secs_f64();
        let mut step = Ledger::default();
        step.allocate(&held.holdings, seconds);
        step.use_busy(&held.holdings, &held.busy, seconds);
        step.allocate_namespaces(&held.namespaces, seconds);
        for ((tenant, mode), v) in &step.allocated {
            self.f.allocated.get_or_create(&self.account(tenant, mode)).inc_by(*v);
        }
        for ((tenant, mode), v) in &step.used {
            self.f.used.get_or_create(&self.account(tenant, mode)).inc_by(*v);
        }
        for ((tenant, namespace), v) in &step.namespaces {
            let labels = vec![
                ("Hostname", self.node.clone()),
                ("tenant", tenant.clone()),
                ("namespace", namespace.clone()),
            ];
            self.f.namespace_allocated.get_or_create(&labels).inc_by(*v);
        }
        for (k, v) in step.allocated {
            *held.ledger.allocated.entry(k).or_default() += v;
        }
        for (k, v) in step.namespaces {
            *held.ledger.namespaces.entry(k).or_default() += v;
        }
        for (k, v) in step.used {
            *held.ledger.used.entry(k).or_default() += v;
        }
    }

    fn account(&self, tenant: &str, mode: &str) -> Labels {
        vec![
            ("Hostname", self.node.clone()),
            ("tenant", tenant.into()),
            ("mode", mode.into()),
        ]
    }

    /// Replaces the device rows: GPUs and instances that are gone leave no series behind.
    fn devices(&self, spec: &GpuNodeSpec, status: &GpuNodeStatus, holdings: &[Holding], busy: &Busy) {
        let f = &self.f;
        for family in [&f.memory_used, &f.memory_total, &f.utilization, &f.share] {
            family.clear();
        }
        f.processes.clear();
        f.unhealthy.clear();
        f.node_gpus.clear();
        f.node_gpus
            .get_or_create(&vec![("Hostname", self.node.clone())])
            .set(status.gpus.len() as i64);
        for g in &status.gpus {
            let mode = spec
                .gpus
                .iter()
                .find(|s| s.index == g.index)
                .map_or(accounting::UNPLANNED, |s| s.mode.as_str());
            for row in device_rows(status, g, holdings) {
                let labels = self.device_labels(g, &row, mode);
                f.memory_used.get_or_create(&labels).set(row.used_mib as f64 * MIB);
                f.memory_total.get_or_create(&labels).set(row.total_mib as f64 * MIB);
                f.processes.get_or_create(&labels).set(row.processes as i64);
                let unhealthy = g.unhealthy.as_ref().or_else(|| {
                    let (id, _) = row.instance.as_ref()?;
                    g.instances
                        .iter()
                        .find(|i| i.gpu_instance_id == *id)?
                        .unhealthy
                        .as_ref()
                });
                let mut with_reason = labels.clone();
                with_reason.push(("reason", unhealthy.map_or("", |u| u.reason.as_str()).into()));
                f.unhealthy
                    .get_or_create(&with_reason)
                    .set(i64::from(unhealthy.is_some()));
                let ratio = match &row.instance {
                    None => busy.gpus.get(&g.index),
                    Some((id, _)) => g
                        .instances
                        .iter()
                        .find(|i| i.gpu_instance_id == *id)
                        .and_then(|i| busy.instances.get(&(g.index, i.placement.start))),
                };
                if let Some(b) = ratio {
                    f.utilization.get_or_create(&labels).set(*b);
                }
            }
            for h in holdings.iter().filter(|h| h.gpu == g.index) {
                let row = DeviceRow {
                    instance: h
                        .instance
                        .as_ref()
                        .and_then(|(start, _)| g.instances.iter().find(|i| i.placement.start == *start))
                        .map(|i| (i.gpu_instance_id, i.profile.clone())),
                    tenant: h.tenant.clone(),
                    ..Default::default()
                };
                f.share
                    .get_or_create(&self.device_labels(g, &row, h.mode))
                    .inc_by(h.weight);
            }
        }
    }

    fn device_labels(&self, g: &GpuStatus, row: &DeviceRow, mode: &str) -> Labels {
        let (id, profile) = match &row.instance {
            Some((id, profile)) => (id.to_string(), profile.clone()),
            None => (String::new(), String::new()),
        };
        vec![
            ("Hostname", self.node.clone()),
            ("gpu", g.index.to_string()),
            ("UUID", g.uuid.clone()),
            ("GPU_I_ID", id),
            ("GPU_I_PROFILE", profile),
            ("mode", mode.into()),
            ("tenant", row.tenant.clone()),
        ]
    }

    fn scrub_labels(&self, gpu: u32, result: &str) -> Labels {
        vec![
            ("Hostname", self.node.clone()),
            ("gpu", gpu.to_string()),
            ("result", result.into()),
        ]
    }

    fn count(&self, events: &[GpuEvent]) {
        for e in events {
            match e {
                GpuEvent::Scrub { gpu, ok, seconds } => {
                    let result = if *ok { "ok" } else { "failed" };
                    self.f.scrubs.get_or_create(&self.scrub_labels(*gpu, result)).inc();
                    self.f
                        .scrub_seconds
                        .get_or_create(&vec![("Hostname", self.node.clone())])
                        .observe(*seconds);
                }
                GpuEvent::Mig { gpu, change } => {
                    self.f
                        .mig_changes
                        .get_or_create(&vec![
                            ("Hostname", self.node.clone()),
                            ("gpu", gpu.to_string()),
                            ("change", change.as_str().into()),
                        ])
                        .inc();
                }
            }
        }
    }

    /// Replaces the holder rows: which container holds which device, as the kubelet said this
    /// pass (`None`: not known, no rows). A device ID the GPUs do not have gets no row.
    pub fn holders(&self, status: &GpuNodeStatus, holdings: Option<&crate::agent::pod_resources::Holdings>) {
        let _held = self.lock();
        self.f.holders.clear();
        let Some(h) = holdings else { return };
        for (id, device) in &h.devices {
            let uuid = crate::agent::pod_resources::DeviceId::parse(id).uuid;
            let found = status.gpus.iter().find_map(|g| {
                if g.uuid == uuid {
                    return Some((g, None));
                }
                let i = g.instances.iter().find(|i| i.uuid.as_deref() == Some(uuid))?;
                Some((g, Some((i.gpu_instance_id.to_string(), i.profile.clone()))))
            });
            let Some((g, instance)) = found else { continue };
            let (id, profile) = instance.unwrap_or_default();
            for holder in &device.holders {
                let labels = vec![
                    ("Hostname", self.node.clone()),
                    ("gpu", g.index.to_string()),
                    ("UUID", g.uuid.clone()),
                    ("GPU_I_ID", id.clone()),
                    ("GPU_I_PROFILE", profile.clone()),
                    ("namespace", holder.namespace.clone()),
                    ("pod", holder.pod.clone()),
                    ("container", holder.container.clone()),
                ];
                self.f.holders.get_or_create(&labels).set(1);
            }
        }
    }

    /// Replaces what each tenant's namespaces hold ([`crate::attribution::namespace_holdings`]),
    /// counted from now on.
    pub fn namespaces(&self, held: BTreeMap<(String, String), f64>) {
        let mut h = self.lock();
        self.advance(&mut h, Instant::now());
        h.namespaces = held;
    }

    /// Replaces the ungranted-use rows: every device row at its ungranted processes (0 for most),
    /// none when it cannot be told.
    pub fn ungranted(&self, status: &GpuNodeStatus, signals: &crate::signals::Signals) {
        let held = self.lock();
        self.f.ungranted.clear();
        let Some(found) = &signals.ungranted else { return };
        for g in &status.gpus {
            let mode = held
                .holdings
                .iter()
                .find(|h| h.gpu == g.index)
                .map_or(accounting::UNPLANNED, |h| h.mode);
            for row in device_rows(status, g, &held.holdings) {
                let id = row.instance.as_ref().map(|(id, _)| *id);
                let n: u32 = found
                    .iter()
                    .filter(|u| u.gpu == g.index && u.gpu_instance_id == id)
                    .map(|u| u.processes)
                    .sum();
                self.f
                    .ungranted
                    .get_or_create(&self.device_labels(g, &row, mode))
                    .set(i64::from(n));
            }
        }
    }

    /// The allocated and used GPU-seconds so far, by (tenant, mode) (tests, the report).
    pub fn ledger(&self) -> Ledger {
        let mut held = self.lock();
        self.advance(&mut held, Instant::now());
        held.ledger.clone()
    }
}

impl Exposition for AgentMetrics {
    /// Brings the accounting counters up to now first, so a scrape between passes sees time pass.
    fn encode(&self) -> String {
        let mut held = self.lock();
        self.advance(&mut held, Instant::now());
        let mut out = String::new();
        if let Err(e) = encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "encoding metrics failed");
        }
        out
    }
}

/// One row of the device metrics: a whole GPU, or one MIG instance of a GPU in MIG mode.
#[derive(Clone, Debug, Default, PartialEq)]
struct DeviceRow {
    /// (GPU instance ID, profile); `None` for the whole GPU.
    instance: Option<(u32, String)>,
    tenant: String,
    used_mib: u64,
    total_mib: u64,
    processes: u32,
}

/// A GPU's rows: one per MIG instance when it has any (their processes and memory), else one for
/// the whole GPU.
fn device_rows(status: &GpuNodeStatus, g: &GpuStatus, holdings: &[Holding]) -> Vec<DeviceRow> {
    let used = |gi: Option<u32>| {
        let p = g.processes.iter().filter(|p| gi.is_none() || p.gpu_instance_id == gi);
        let (n, mib) = p.fold((0, 0), |(n, mib), p| (n + 1, mib + p.used_memory_mib.unwrap_or(0)));
        (n, mib)
    };
    if g.instances.is_empty() || !g.mig_mode.is_some_and(|m| m.current) {
        let (processes, used_mib) = used(None);
        return vec![DeviceRow {
            instance: None,
            tenant: accounting::gpu_tenant(holdings, g.index).into(),
            used_mib,
            total_mib: g.memory_mib,
            processes,
        }];
    }
    g.instances
        .iter()
        .map(|i| {
            let (processes, used_mib) = used(Some(i.gpu_instance_id));
            let tenant = holdings
                .iter()
                .find(|h| h.gpu == g.index && h.instance.as_ref().is_some_and(|(s, _)| *s == i.placement.start))
                .map_or(accounting::UNALLOCATED, |h| h.tenant.as_str());
            DeviceRow {
                instance: Some((i.gpu_instance_id, i.profile.clone())),
                tenant: tenant.into(),
                used_mib,
                total_mib: status
                    .profiles_of(g)
                    .iter()
                    .find(|p| p.id == i.profile_id)
                    .map_or(0, |p| p.memory_mib),
                processes,
            }
        })
        .collect()
}

mod share_memory;
pub use share_memory::{ShareCap, ShareMemory, capped_pids, caps_of, follow_caps, rows as share_memory_rows};

#[cfg(test)]
mod tests;
