//! `gpu-tenancy-fleet bench`: one run against a control plane and a running `gpu-tenancy
//! controller`, measuring side by side what the controller and the agents cost as the fleet grows,
//! idles, takes a tenant change and rolls out a plan change. Prints a table, writes JSON, and fails
//! when an invariant target is broken (writes while idle, more of a plan's nodes changing at once
//! than its maxUnavailable allows, a phase that never converged, joining nodes publishing statuses
//! before their specs).

use crate::cluster;
use crate::fleet::Fleet;
use crate::generate::{self, ROLLOUT_AFTER, ROLLOUT_PLAN};
use crate::probe::{Controller, Metrics};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub start_nodes: usize,
    pub nodes: usize,
    pub tenants: usize,
    pub seed: u64,
    pub idle: Duration,
    /// A phase has converged once nothing was written for this long.
    pub quiet: Duration,
    pub converge_timeout: Duration,
}

/// One convergence phase.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Phase {
    pub name: String,
    pub nodes: usize,
    pub converged: bool,
    /// From the phase's start to its last write.
    pub seconds: f64,
    pub nodes_not_ready: usize,
    pub controller_writes: u64,
    pub controller_writes_by_kind: BTreeMap<String, u64>,
    pub agent_writes: u64,
    pub agent_writes_by_kind: BTreeMap<String, u64>,
    pub controller_rss_mib: f64,
    pub controller_cpu_seconds: f64,
    /// The control plane's CPU from the phase's start to its last write (within the second the
    /// bench polls at), when its PID was given: the API server's work for the phase, which its
    /// wall time on this 2-core machine mostly is.
    pub control_plane_cpu_seconds: Option<f64>,
    pub controller_passes: u64,
    pub pass_mean_seconds: f64,
    pub pass_slowest_bucket_seconds: f64,
    /// The planner alone (`plan_ms` of the controller's `pass done` log lines): median and most.
    pub plan_ms_median: u64,
    pub plan_ms_max: u64,
    /// The desired state alone, median over the phase's logged passes: planned from the memo of
    /// the last pass, and from nothing in the same passes (the reference).
    pub desired_ms_median: Option<u64>,
    pub full_ms_median: Option<u64>,
    /// Of the desired state from the memo, the controller's time on a core: the rest of its
    /// wall time the controller waited for a core other processes had (the bench's own).
    pub desired_cpu_ms_median: Option<u64>,
    /// The most writes one pass made.
    pub pass_max_writes: u64,
    pub nvml_mutations: u64,
    pub injected_nvml_failures: u64,
    pub scrubs: u64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Idle {
    pub seconds: f64,
    pub controller_writes: u64,
    pub controller_writes_by_kind: BTreeMap<String, u64>,
    pub agent_writes: u64,
    pub agent_writes_by_kind: BTreeMap<String, u64>,
    /// The agents' reads of the API server: none, as polls start from what the last pass read.
    pub agent_reads: u64,
    /// The agents' reads of their GPUs: that every agent still polls.
    pub agent_gpu_reads: u64,
    pub controller_cpu_seconds: f64,
    pub controller_passes: u64,
    /// The API server's (and etcd's) CPU while nothing changes: the agents' watches and polls.
    pub control_plane_cpu_seconds: Option<f64>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Rollout {
    pub plan: String,
    pub nodes: usize,
    pub max_unavailable: usize,
    pub seconds: f64,
    pub completed: bool,
    pub max_behind_at_once: usize,
    pub max_unavailable_at_once: usize,
    pub busy_processes_started: u64,
    pub nvml_mutations: u64,
    pub phase: Phase,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub start_nodes: usize,
    pub nodes: usize,
    pub tenants: usize,
    pub phases: Vec<Phase>,
    pub rss_growth_kib_per_node: f64,
    pub idle: Idle,
    pub tenant_change: Phase,
    pub tenant_change_objects: Vec<String>,
    /// Tenants whose grants the change moved (lost and gained), the edited one included.
    pub tenant_change_moved_grants: BTreeMap<String, serde_json::Value>,
    /// Units (instances, GPUs, shares) of the other tenants' grants the change moved
    /// ([`cluster::moved_units`]): 0, or the run fails (docs/design.md#minimal-disruption).
    pub tenant_change_others_moved_units: u32,
    pub rollout: Rollout,
    pub failures: Vec<String>,
}

fn say(msg: &str) {
    eprintln!("bench-fleet: {msg}");
}

/// Counters at the start of a phase.
struct Mark {
    at: Instant,
    metrics: Metrics,
    agent: BTreeMap<String, u64>,
    cpu: f64,
    passes_logged: usize,
    mutations: u64,
    failures: u64,
    scrubs: u64,
    control_plane_cpu: Option<f64>,
}

async fn mark(fleet: &Fleet, ctl: &Controller) -> Result<Mark, String> {
    Ok(Mark {
        at: Instant::now(),
        metrics: ctl.metrics().await?,
        agent: fleet.agent_counts.writes(),
        cpu: ctl.cpu_seconds()?,
        passes_logged: ctl.passes().len(),
        mutations: fleet.tally.mutations.load(Ordering::Relaxed),
        failures: fleet.tally.injected_failures.load(Ordering::Relaxed),
        scrubs: fleet.tally.scrubs.load(Ordering::Relaxed),
        control_plane_cpu: ctl.control_plane_cpu_seconds(),
    })
}

fn delta(now: &BTreeMap<String, u64>, before: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    now.iter()
        .filter_map(|(k, v)| {
            let d = v - before.get(k).copied().unwrap_or(0);
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

/// Waits until every fleet node has reported its current spec and is Ready and nothing was
/// written for `quiet`, then measures the phase since `m`.
async fn converge(name: &str, fleet: &Fleet, ctl: &Controller, m: &Mark, opts: &BenchOptions) -> Result<Phase, String> {
    let nodes = fleet.size();
    let mut last_total = (f64::NAN, u64::MAX);
    let mut last_change = Instant::now();
    let mut control_plane_cpu = ctl.control_plane_cpu_seconds();
    let mut last_say = Instant::now();
    let (converged, not_ready) = loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let metrics = ctl.metrics().await?;
        let agent: u64 = fleet.agent_counts.writes().values().sum();
        let total = (metrics.written_total(), agent);
        if total != last_total {
            last_total = total;
            last_change = Instant::now();
            control_plane_cpu = ctl.control_plane_cpu_seconds();
        }
        let views = fleet.views();
        let reported = views
            .values()
            .filter(|v| !v.behind() && v.observed_generation.is_some())
            .count();
        let ready = views.values().filter(|v| v.ready).count();
        let all = views.len() >= nodes && reported >= nodes && ready >= nodes;
        if all && last_change.elapsed() >= opts.quiet {
            break (true, 0);
        }
        if m.at.elapsed() > opts.converge_timeout {
            say(&format!(
                "{name}: not converged after {}s: {reported}/{nodes} nodes reported their spec, {ready} Ready",
                opts.converge_timeout.as_secs()
            ));
            break (false, nodes.saturating_sub(ready));
        }
        if last_say.elapsed() >= Duration::from_secs(15) {
            last_say = Instant::now();
            say(&format!(
                "{name}: {}s: {}/{nodes} GpuNodes, {reported} reported, {ready} Ready; writes so far: controller {}, agents {}",
                m.at.elapsed().as_secs(),
                views.len(),
                total.0 - m.metrics.written_total(),
                total.1 - m.agent.values().sum::<u64>()
            ));
        }
    };
    let seconds = last_change.saturating_duration_since(m.at).as_secs_f64();
    let mut phase = measure(name, fleet, ctl, m, converged, seconds, not_ready).await?;
    phase.control_plane_cpu_seconds = control_plane_cpu.zip(m.control_plane_cpu).map(|(now, then)| now - then);
    Ok(phase)
}

async fn measure(
    name: &str,
    fleet: &Fleet,
    ctl: &Controller,
    m: &Mark,
    converged: bool,
    seconds: f64,
    nodes_not_ready: usize,
) -> Result<Phase, String> {
    let metrics = ctl.metrics().await?;
    let by_kind = metrics.written_since(&m.metrics);
    let agent = delta(&fleet.agent_counts.writes(), &m.agent);
    let (passes, mean, slowest) = metrics.passes_since(&m.metrics);
    let logged = ctl.passes();
    let mut plan_ms: Vec<u64> = logged.iter().skip(m.passes_logged).map(|p| p.plan_ms).collect();
    plan_ms.sort_unstable();
    let median = |f: fn(&crate::probe::PassLine) -> Option<u64>| {
        let mut v: Vec<u64> = logged.iter().skip(m.passes_logged).filter_map(f).collect();
        v.sort_unstable();
        v.get(v.len() / 2).copied()
    };
    Ok(Phase {
        name: name.to_string(),
        nodes: fleet.size(),
        converged,
        seconds,
        nodes_not_ready,
        controller_writes: by_kind.values().sum(),
        controller_writes_by_kind: by_kind,
        agent_writes: agent.values().sum(),
        agent_writes_by_kind: agent,
        controller_rss_mib: ctl.rss_mib()?,
        controller_cpu_seconds: ctl.cpu_seconds()? - m.cpu,
        control_plane_cpu_seconds: None,
        controller_passes: passes,
        pass_mean_seconds: mean,
        pass_slowest_bucket_seconds: slowest,
        plan_ms_median: plan_ms.get(plan_ms.len() / 2).copied().unwrap_or(0),
        plan_ms_max: plan_ms.last().copied().unwrap_or(0),
        desired_ms_median: median(|p| p.desired_ms),
        full_ms_median: median(|p| p.full_ms),
        desired_cpu_ms_median: median(|p| p.desired_cpu_ms),
        pass_max_writes: logged.iter().skip(m.passes_logged).map(|p| p.writes).max().unwrap_or(0),
        nvml_mutations: fleet.tally.mutations.load(Ordering::Relaxed) - m.mutations,
        injected_nvml_failures: fleet.tally.injected_failures.load(Ordering::Relaxed) - m.failures,
        scrubs: fleet.tally.scrubs.load(Ordering::Relaxed) - m.scrubs,
    })
}

/// The whole benchmark. `harness` is the benchmark's own client (objects, edits, snapshots).
pub async fn run(
    fleet: &Fleet,
    harness: &kube::Client,
    ctl: &Controller,
    opts: &BenchOptions,
) -> Result<Report, String> {
    let mut report = Report {
        start_nodes: opts.start_nodes,
        nodes: opts.nodes,
        tenants: opts.tenants,
        ..Default::default()
    };
    // Busy processes only in the rollout, where they are what maxUnavailable must hold against;
    // elsewhere they would keep writing (a process shows in its GPU's status) and no phase could
    // be told converged. Failed NVML calls stay on throughout.
    fleet.busy_on.store(false, Ordering::Relaxed);
    cluster::ensure_namespace(harness, "nvidia-device-plugin").await?;
    say(&format!(
        "applying the policy, 5 plans and {} tenants (sized for {} nodes) ...",
        opts.tenants, opts.nodes
    ));
    cluster::apply_objects(harness, &generate::objects(opts.tenants, opts.seed)).await?;

    for (from, to) in [(0, opts.start_nodes), (opts.start_nodes, opts.nodes)] {
        if to <= from {
            continue;
        }
        say(&format!(
            "growing the fleet to {to} nodes (Nodes created, agents started) and waiting for convergence ..."
        ));
        let m = mark(fleet, ctl).await?;
        fleet.grow(from, to).await?;
        let phase = converge(&format!("converge at {to} nodes"), fleet, ctl, &m, opts).await?;
        say(&format!(
            "{}: {:.0}s, controller {} writes, agents {} writes, controller RSS {:.1} MiB",
            phase.name, phase.seconds, phase.controller_writes, phase.agent_writes, phase.controller_rss_mib
        ));
        report.phases.push(phase);
    }
    if let [first, .., last] = report.phases.as_slice() {
        report.rss_growth_kib_per_node =
            (last.controller_rss_mib - first.controller_rss_mib) * 1024.0 / (last.nodes - first.nodes).max(1) as f64;
    }

    say(&format!(
        "idle for {}s: nothing changes, every agent keeps polling its GPUs; target: 0 writes, 0 agent reads ...",
        opts.idle.as_secs()
    ));
    let m = mark(fleet, ctl).await?;
    let reads_before = fleet.agent_counts.reads();
    let gpu_reads_before = fleet.tally.gpu_reads.load(Ordering::Relaxed);
    tokio::time::sleep(opts.idle).await;
    let idle_control_plane_cpu = ctl
        .control_plane_cpu_seconds()
        .zip(m.control_plane_cpu)
        .map(|(now, then)| now - then);
    let idle = measure("idle", fleet, ctl, &m, true, m.at.elapsed().as_secs_f64(), 0).await?;
    report.idle = Idle {
        seconds: idle.seconds,
        controller_writes: idle.controller_writes,
        controller_writes_by_kind: idle.controller_writes_by_kind,
        agent_writes: idle.agent_writes,
        agent_writes_by_kind: idle.agent_writes_by_kind,
        agent_reads: fleet.agent_counts.reads() - reads_before,
        agent_gpu_reads: fleet.tally.gpu_reads.load(Ordering::Relaxed) - gpu_reads_before,
        controller_cpu_seconds: idle.controller_cpu_seconds,
        controller_passes: idle.controller_passes,
        control_plane_cpu_seconds: idle_control_plane_cpu,
    };

    let tenant = generate::tenant_name(1);
    say(&format!("changing one tenant ({tenant}: one more MPS share) ..."));
    let before = cluster::versions(harness).await?;
    let grants_before = cluster::grants(harness).await?;
    let m = mark(fleet, ctl).await?;
    bump_tenant(harness, &tenant).await?;
    report.tenant_change = converge("tenant change", fleet, ctl, &m, opts).await?;
    let after = cluster::versions(harness).await?;
    report.tenant_change_objects = cluster::changed(&before, &after);
    let grants_after = cluster::grants(harness).await?;
    report.tenant_change_moved_grants = cluster::moved_grants(&grants_before, &grants_after);
    report.tenant_change_others_moved_units = grants_after
        .iter()
        .filter(|(t, _)| **t != tenant)
        .map(|(t, g)| cluster::moved_units(grants_before.get(t), Some(g)))
        .sum();

    report.rollout = rollout(fleet, harness, ctl, opts).await?;
    report.failures = failures(&report);
    Ok(report)
}

async fn bump_tenant(client: &kube::Client, name: &str) -> Result<(), String> {
    let api: kube::Api<gpu_tenancy::api::GpuTenant> = kube::Api::all(client.clone());
    let t = api
        .get(name)
        .await
        .map_err(|e| format!("reading GpuTenant {name}: {e}"))?;
    let mut spec = serde_json::to_value(&t.spec).map_err(|e| e.to_string())?;
    let resources = spec["resources"]
        .as_array_mut()
        .ok_or_else(|| format!("GpuTenant {name}: spec.resources is not a list"))?;
    let mps = resources
        .iter_mut()
        .find(|r| r["mode"] == "MPS")
        .ok_or_else(|| format!("GpuTenant {name}: spec.resources has no MPS request to change"))?;
    mps["count"] = serde_json::json!(mps["count"].as_u64().unwrap_or(1) + 1);
    let obj = serde_json::json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuTenant", "metadata": {"name": name}, "spec": spec});
    cluster::apply_objects(client, &[obj]).await
}

/// Changes the rollout plan's layout with busy processes on, and watches how many of its nodes
/// change at once until every one has applied the new layout.
async fn rollout(
    fleet: &Fleet,
    harness: &kube::Client,
    ctl: &Controller,
    opts: &BenchOptions,
) -> Result<Rollout, String> {
    let views = fleet.views();
    let pool = views
        .values()
        .filter(|v| v.plan.as_deref() == Some(ROLLOUT_PLAN))
        .count();
    // maxUnavailable 10%: Kubernetes rounds a percentage of unavailable down, never below one.
    let allowed = (pool / 10).max(1);
    say(&format!(
        "plan change: {ROLLOUT_PLAN} on {pool} nodes to {ROLLOUT_AFTER:?} (maxUnavailable 10% = {allowed}), busy processes on ..."
    ));
    fleet.busy_on.store(true, Ordering::Relaxed);
    let processes_before = fleet.tally.processes.load(Ordering::Relaxed);
    fleet.watch_plan(ROLLOUT_PLAN);
    let m = mark(fleet, ctl).await?;
    cluster::apply_objects(harness, &[generate::rollout_plan(&ROLLOUT_AFTER)]).await?;
    let after: Vec<String> = ROLLOUT_AFTER.iter().map(|s| s.to_string()).collect();
    let mut last_say = Instant::now();
    let completed = loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let views = fleet.views();
        let of_plan: Vec<_> = views
            .values()
            .filter(|v| v.plan.as_deref() == Some(ROLLOUT_PLAN))
            .collect();
        let done = of_plan
            .iter()
            .filter(|v| v.spec_profiles == after && !v.behind() && v.ready)
            .count();
        if done == pool {
            break true;
        }
        if m.at.elapsed() > opts.converge_timeout {
            say(&format!(
                "rollout: {done}/{pool} nodes applied after {}s",
                opts.converge_timeout.as_secs()
            ));
            break false;
        }
        if last_say.elapsed() >= Duration::from_secs(10) {
            last_say = Instant::now();
            let w = fleet.plan_watch().unwrap_or_default();
            say(&format!(
                "rollout: {}s: {done}/{pool} applied; most changing at once so far {} (allowed {allowed})",
                m.at.elapsed().as_secs(),
                w.max_behind
            ));
        }
    };
    let seconds = m.at.elapsed().as_secs_f64();
    fleet.busy_on.store(false, Ordering::Relaxed);
    let w = fleet.plan_watch().unwrap_or_default();
    let phase = measure("rollout", fleet, ctl, &m, completed, seconds, 0).await?;
    Ok(Rollout {
        plan: ROLLOUT_PLAN.into(),
        nodes: pool,
        max_unavailable: allowed,
        seconds,
        completed,
        max_behind_at_once: w.max_behind,
        max_unavailable_at_once: w.max_unavailable,
        busy_processes_started: fleet.tally.processes.load(Ordering::Relaxed) - processes_before,
        nvml_mutations: phase.nvml_mutations,
        phase,
    })
}

/// The invariant targets the run broke.
pub fn failures(r: &Report) -> Vec<String> {
    let mut out = Vec::new();
    for p in r.phases.iter().chain([&r.tenant_change]) {
        if !p.converged {
            out.push(format!(
                "{}: did not converge ({} nodes not Ready)",
                p.name, p.nodes_not_ready
            ));
        }
    }
    if let Some(p) = r.phases.first()
        && let Some(extra) = first_statuses_past_specs(p)
    {
        out.push(format!(
            "{}: the agents wrote {extra} GpuNode statuses more than the controller's specs and the injected NVML \
             failures explain (a joining node publishes once, with its spec applied): {:?}",
            p.name, p.agent_writes_by_kind
        ));
    }
    if r.idle.controller_writes > 0 {
        out.push(format!(
            "idle: the controller wrote {} times with nothing changed: {:?}",
            r.idle.controller_writes, r.idle.controller_writes_by_kind
        ));
    }
    if r.tenant_change_others_moved_units > 0 {
        out.push(format!(
            "tenant change: {} units of other tenants' grants moved: {:?}",
            r.tenant_change_others_moved_units, r.tenant_change_moved_grants
        ));
    }
    if r.idle.agent_reads > 0 {
        out.push(format!(
            "idle: the agents read the API server {} times with nothing changed (polls start from what their last pass read)",
            r.idle.agent_reads
        ));
    }
    if r.idle.agent_gpu_reads == 0 && r.idle.seconds >= 1.0 {
        out.push("idle: no agent read its GPUs: the polls that find drift stopped".to_string());
    }
    if r.idle.agent_writes > 0 {
        out.push(format!(
            "idle: the agents wrote {} times with nothing changed: {:?}",
            r.idle.agent_writes, r.idle.agent_writes_by_kind
        ));
    }
    let ro = &r.rollout;
    if !ro.completed {
        out.push(format!("rollout of {}: not every node applied the new layout", ro.plan));
    }
    if ro.max_behind_at_once > ro.max_unavailable {
        out.push(format!(
            "rollout of {}: {} nodes changed at once, maxUnavailable allows {}",
            ro.plan, ro.max_behind_at_once, ro.max_unavailable
        ));
    }
    out
}

/// In a phase of nodes joining an empty fleet, the agents' GpuNode status writes beyond one per
/// spec the controller wrote and one per injected NVML failure (a failed pass reports it, the
/// retry publishes again), if any. A node that declared its GPUs publishes once its spec is
/// applied: statuses written before the spec cost the API server a write of the whole object each
/// (docs/operations/agent.md).
fn first_statuses_past_specs(p: &Phase) -> Option<u64> {
    let count = |m: &BTreeMap<String, u64>, k: &str| m.get(k).copied().unwrap_or(0);
    let statuses = count(&p.agent_writes_by_kind, "PATCH gpunodes/status");
    let explained = count(&p.controller_writes_by_kind, "GpuNode/apply") + p.injected_nvml_failures;
    (statuses > explained).then(|| statuses - explained)
}

/// The width of the table's name column.
const NAME_WIDTH: usize = 58;

/// The table for people.
pub fn table(r: &Report) -> String {
    let mut s = String::new();
    let mut line = |k: &str, v: String| {
        // The values line up in one column: every name fits in front of it (a test runs the table
        // at the largest fleet).
        debug_assert!(k.len() <= NAME_WIDTH, "a name wider than its column: {k}");
        s.push_str(&format!("{k:<NAME_WIDTH$} {v}\n"));
    };
    line(
        "fleet",
        format!("{} -> {} nodes x 8 GPUs, {} tenants", r.start_nodes, r.nodes, r.tenants),
    );
    for p in &r.phases {
        line(&format!("{}: time to converge", p.name), format!("{:.1} s", p.seconds));
        line(
            &format!("{}: controller writes / agent writes", p.name),
            format!("{} / {}", p.controller_writes, p.agent_writes),
        );
        line(
            &format!("{}: controller RSS, CPU in phase", p.name),
            format!("{:.1} MiB, {:.1} s", p.controller_rss_mib, p.controller_cpu_seconds),
        );
        if let Some(cpu) = p.control_plane_cpu_seconds {
            line(
                &format!("{}: control plane CPU, to last write", p.name),
                format!("{cpu:.1} s"),
            );
        }
        line(
            &format!("{}: controller passes, mean, max <=", p.name),
            format!(
                "{}, {:.3} s, {} s",
                p.controller_passes, p.pass_mean_seconds, p.pass_slowest_bucket_seconds
            ),
        );
        line(
            &format!("{}: planner ms median, most", p.name),
            format!("{}, {}", p.plan_ms_median, p.plan_ms_max),
        );
        line(
            &format!("{}: most writes in one pass", p.name),
            p.pass_max_writes.to_string(),
        );
        line(
            &format!("{}: desired ms, memo (on core) / full", p.name),
            incremental_vs_full(p),
        );
        line(
            &format!("{}: NVML mutations, failures, scrubs", p.name),
            format!("{}, {}, {}", p.nvml_mutations, p.injected_nvml_failures, p.scrubs),
        );
    }
    line(
        "controller RSS growth per node",
        format!("{:.1} KiB", r.rss_growth_kib_per_node),
    );
    line(
        &format!(
            "idle {:.0} s: controller writes / agent writes (target 0)",
            r.idle.seconds
        ),
        format!("{} / {}", r.idle.controller_writes, r.idle.agent_writes),
    );
    line(
        "idle: agent reads of the API server / of their GPUs",
        format!("{} / {}", r.idle.agent_reads, r.idle.agent_gpu_reads),
    );
    line(
        "idle: controller CPU, passes; control plane CPU",
        format!(
            "{:.2} s, {}; {}",
            r.idle.controller_cpu_seconds,
            r.idle.controller_passes,
            r.idle
                .control_plane_cpu_seconds
                .map_or("not measured".to_string(), |s| format!("{s:.2} s"))
        ),
    );
    let t = &r.tenant_change;
    line(
        "tenant change: controller writes / agent writes",
        format!("{} / {} in {:.1} s", t.controller_writes, t.agent_writes, t.seconds),
    );
    line(
        "tenant change: controller writes by kind",
        format!("{:?}", t.controller_writes_by_kind),
    );
    line(
        "tenant change: objects changed (API server)",
        format!("{}", r.tenant_change_objects.len()),
    );
    for o in &r.tenant_change_objects {
        line("", o.clone());
    }
    line(
        "tenant change: units moved of other tenants",
        format!("{}", r.tenant_change_others_moved_units),
    );
    for (t, m) in &r.tenant_change_moved_grants {
        line(&format!("tenant change: grants moved of {t}"), m.to_string());
    }
    let ro = &r.rollout;
    line(
        &format!("plan change: {} nodes, maxUnavailable {}", ro.nodes, ro.max_unavailable),
        format!("{:.1} s to all applied (completed: {})", ro.seconds, ro.completed),
    );
    line(
        "plan change: most nodes behind / unavailable at once",
        format!("{} / {}", ro.max_behind_at_once, ro.max_unavailable_at_once),
    );
    line(
        "plan change: controller writes / agent writes",
        format!("{} / {}", ro.phase.controller_writes, ro.phase.agent_writes),
    );
    line(
        "plan change: NVML mutations (per node), busy processes",
        format!(
            "{} ({:.1}), {}",
            ro.nvml_mutations,
            ro.nvml_mutations as f64 / ro.nodes.max(1) as f64,
            ro.busy_processes_started
        ),
    );
    line(
        "plan change: planner ms median, most",
        format!("{}, {}", ro.phase.plan_ms_median, ro.phase.plan_ms_max),
    );
    line(
        "tenant change: planner ms median, most",
        format!("{}, {}", t.plan_ms_median, t.plan_ms_max),
    );
    line(
        "tenant change: desired ms, memo (on core) / full",
        incremental_vs_full(t),
    );
    line(
        "plan change: desired ms, memo (on core) / full",
        incremental_vs_full(&ro.phase),
    );
    line(
        "plan change: controller passes, mean, max <=",
        format!(
            "{}, {:.3} s, {} s",
            ro.phase.controller_passes, ro.phase.pass_mean_seconds, ro.phase.pass_slowest_bucket_seconds
        ),
    );
    s
}

/// The desired state's time planned from the memo (its time on a core) against the full pass of
/// the same passes.
fn incremental_vs_full(p: &Phase) -> String {
    let ms = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    format!(
        "{} ({}) / {}",
        ms(p.desired_ms_median),
        ms(p.desired_cpu_ms_median),
        ms(p.full_ms_median)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn joined(statuses: u64, specs: u64, failures: u64) -> Report {
        Report {
            phases: vec![Phase {
                name: "converge at 10 nodes".into(),
                agent_writes_by_kind: [("PATCH gpunodes/status".to_string(), statuses)].into(),
                controller_writes_by_kind: [("GpuNode/apply".to_string(), specs)].into(),
                injected_nvml_failures: failures,
                ..Phase::default()
            }],
            ..Report::default()
        }
    }

    /// Every line's name fits its column (`table` asserts it) at the largest fleet the bench
    /// runs: phase names carry the node count.
    #[test]
    fn the_tables_names_fit_their_column() {
        let mut r = joined(1, 1, 0);
        r.phases[0].name = "converge at 50000 nodes".into();
        r.phases[0].control_plane_cpu_seconds = Some(1.0);
        r.idle.seconds = 100.0;
        assert!(table(&r).lines().count() > 20);
    }

    fn names_extra_statuses(r: &Report) -> bool {
        failures(r).iter().any(|f| f.contains("GpuNode statuses more than"))
    }

    #[test]
    fn a_joining_fleet_writes_one_status_per_spec_and_injected_failure() {
        assert!(!names_extra_statuses(&joined(10, 10, 0)));
        assert!(!names_extra_statuses(&joined(13, 10, 3)));
        // Statuses published before their specs (the agents' polls, a slow controller pass).
        assert!(names_extra_statuses(&joined(16, 10, 3)));
        assert!(
            failures(&joined(16, 10, 3))
                .iter()
                .any(|f| f.contains("wrote 3 GpuNode statuses"))
        );
    }
}
