//! A controller pass's planning on a real cluster's objects, timed: the copy of the stores it
//! plans from and the desired state (the planner and the rest), a tenant's change at a time,
//! the way the controller did it before its inventory memo (every Node and GpuNode copied and
//! read again) and now (shared, and read again only where they changed), alternating.
//!
//! `kubectl get nodes,gpunodes,gputenants,gpupartitionplans,sharingpolicies -o json > cluster.json`
//! (say at the end of `make bench-fleet`'s convergence), then
//! `target/release/examples/pass_profile cluster.json [COPIES] [CHANGES] [new]`: COPIES times the
//! bench's fleet, its nodes and tenants under new names (5 turns 1,000 nodes and 333 tenants into
//! 5,000 and 1,665), CHANGES tenant changes (the first MPS tenant ±1 share, a new
//! resourceVersion each time); `new` times only the pass as it is now. The planner alone
//! (`plan_with` from its memo) is timed on the same changes too. `PASS_PROFILE_PAUSE_MS=N` waits N
//! ms before each change, as a controller idles between changes (the allocator may give memory
//! back meanwhile, and the next pass fault it in again). `PASS_PROFILE_GROW=K` first plans the
//! fleet grown in K steps (the first 1/K of its nodes, 2/K, ...), as a controller's memo is after a
//! convergence, before the changes. `PASS_PROFILE_CHECK=1` also plans each change from nothing
//! after the pass, as the controller's `--check-incremental` does (the bench runs it so);
//! `PASS_PROFILE_SHUFFLE=1` hands the nodes and tenants over in a hash map's order, as the
//! controller's stores do, not by name. After each pass the memo is started afresh where the
//! controller would start it afresh (after a burst of nodes read again, as growing makes);
//! `PASS_PROFILE_AFRESH=0` keeps it as it is instead. `PASS_PROFILE_DIGEST=1` (with `new`) prints
//! a digest of each pass's desired state, to hold one build's passes equal to another's.
//! `PASS_PROFILE_WRITE_BACK=1` (with `new`) then hands the pass's own writes back, as the watches
//! do after the controller writes them (the GpuNode specs, the tenants' and plans' statuses,
//! each with a new resourceVersion), and times the pass that follows, as a change's second pass.

#[path = "support/stats.rs"]
mod stats;
use stats::{counts, stats};

use gpu_tenancy::api::{GpuNode, GpuPartitionPlan, GpuTenant, Mode, SharingPolicy};
use gpu_tenancy::controller::stores::Snapshot;
use gpu_tenancy::controller::thread_time::ThreadRun;
use gpu_tenancy::controller::{PassMemo, desired_with_memo};
use gpu_tenancy::desired::{DesiredMemo, Settings, desired_with};
use gpu_tenancy::inventory::{NodeInventory, cluster_inventories};
use gpu_tenancy::planner::{PlanInput, PlanMemo, plan_with};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or("usage: pass_profile CLUSTER.json [COPIES] [CHANGES]")?;
    let copies: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(1);
    let changes: u32 = args.next().and_then(|s| s.parse().ok()).unwrap_or(12);
    // `new`: only the pass as it is now (for a profiler).
    let only_new = args.next().as_deref() == Some("new");
    let mut s = read(&path, copies)?;
    if std::env::var_os("PASS_PROFILE_SHUFFLE").is_some() {
        // As a reflector's store hands them out: in its hash map's order, not by name.
        use std::hash::{BuildHasher, RandomState};
        let h = RandomState::new();
        let key = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| h.hash_one(&m.name);
        s.nodes.sort_by_key(|o| key(&o.metadata));
        s.gpu_nodes.sort_by_key(|o| key(&o.metadata));
        s.tenants.sort_by_key(|o| key(&o.metadata));
    }
    let settings = Settings::default();
    let now = Time(jiff::Timestamp::from_second(0).map_err(|e| e.to_string())?);
    println!(
        "{} Nodes, {} GpuNodes, {} tenants, {} plans",
        s.nodes.len(),
        s.gpu_nodes.len(),
        s.tenants.len(),
        s.plans.len()
    );

    // Before: the pass copied every Node and GpuNode out of the stores and read each one again.
    let mut before_memo = DesiredMemo::default();
    let mut before = |s: &Snapshot| {
        let s = &s.clone();
        let inventories = copied_inventories(s);
        desired_with(&input(s, &inventories), &settings, &now, Some(&mut before_memo))
    };
    let after_memo = std::cell::RefCell::new(PassMemo::default());
    let mut after = |s: &Snapshot| desired_with_memo(&s.clone(), &settings, &now, Some(&mut after_memo.borrow_mut()));
    // What the controller does after a pass's writes, unless `PASS_PROFILE_AFRESH=0`.
    let afresh = std::env::var("PASS_PROFILE_AFRESH").as_deref() != Ok("0");
    let start_afresh = |s: &Snapshot| {
        if afresh && let Some(took) = after_memo.borrow_mut().start_afresh_if_worth(s, &settings, &now) {
            println!(
                "memo started afresh, as the controller does after a burst: {:.1} ms",
                took.as_secs_f64() * 1e3
            );
        }
    };
    if let Some(k) = std::env::var("PASS_PROFILE_GROW").ok().and_then(|v| v.parse().ok()) {
        let full = |s: &Snapshot| {
            black_box(gpu_tenancy::controller::desired_of(s, &settings, &now));
        };
        let check = std::env::var_os("PASS_PROFILE_CHECK").is_some();
        grow(&mut after, &s, k, check.then_some(&full as &dyn Fn(&Snapshot)));
    }
    let first = after(&s);
    if before(&s) != first {
        return Err("the two ways differ on the cluster as read".into());
    }
    // On a converged cluster none to GpuNodes and Nodes (a dump of those kinds alone lacks the
    // namespaces, quotas and admission objects, which the diff would create).
    let mut writes: std::collections::BTreeMap<String, usize> = Default::default();
    for w in gpu_tenancy::controller::diff::diff(&first, &s).writes {
        let w = w.to_string();
        *writes
            .entry(w.split(' ').take(2).collect::<Vec<_>>().join(" "))
            .or_default() += 1;
    }
    println!("writes the cluster as read needs, by kind: {writes:?}");
    // The planner alone, from a memo of its own, on the same objects: the part of the pass the
    // 50 ms goal of a change is about (docs/development/benchmarks.md). (The nodes do not change here: their inventories are read once.)
    let inventories = copied_inventories(&s);
    let exempt = settings.exempt();
    let mut plan_memo = PlanMemo::default();
    let mut planning = |s: &Snapshot| plan_with(&input(s, &inventories), &exempt, &now, Some(&mut plan_memo));
    planning(&s);
    let (mut times_before, mut times_after, mut times_planning) = (vec![], vec![], vec![]);
    let mut times_full = vec![];
    let mut faults = vec![];
    let pause = std::env::var("PASS_PROFILE_PAUSE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(std::time::Duration::from_millis);
    let check = std::env::var_os("PASS_PROFILE_CHECK").is_some();
    let digests = std::env::var_os("PASS_PROFILE_DIGEST").is_some();
    let write_back = std::env::var_os("PASS_PROFILE_WRITE_BACK").is_some();
    let mut times_second = vec![];
    let mut cold = std::env::var_os("PASS_PROFILE_COLD").map(|_| vec![0u8; 256 << 20]);
    for step in 1..=changes {
        if let Some(pause) = pause {
            std::thread::sleep(pause);
        }
        change_a_tenant(&mut s, step)?;
        if let Some(cold) = cold.as_mut() {
            for (i, b) in cold.iter_mut().enumerate().step_by(64) {
                *b = b.wrapping_add(i as u8);
            }
            black_box(&cold);
        }
        if only_new {
            // The pass first: after a pause it is the one that finds the memory given back.
            let (at, before) = (Instant::now(), ThreadRun::now());
            let desired = measured(&mut after, &s);
            times_after.push(at.elapsed().as_secs_f64() * 1e3);
            faults.extend(ThreadRun::now().zip(before).map(|(now, then)| now.since(then).faults.0));
            start_afresh(&s);
            if digests {
                println!("change {step}: desired state digest {:016x}", digest(&desired)?);
            }
            if check {
                let at = Instant::now();
                let full = black_box(gpu_tenancy::controller::desired_of(&s, &settings, &now));
                times_full.push(at.elapsed().as_secs_f64() * 1e3);
                if digests && full != desired {
                    return Err(format!("change {step}: the pass differs from a full pass"));
                }
            }
            if write_back {
                written_back(&mut s, &desired, step);
                let at = Instant::now();
                let second = measured(&mut after, &s);
                times_second.push(at.elapsed().as_secs_f64() * 1e3);
                start_afresh(&s);
                if digests {
                    println!(
                        "change {step}, its writes back: desired state digest {:016x}",
                        digest(&second)?
                    );
                }
                if check && digests && gpu_tenancy::controller::desired_of(&s, &settings, &now) != second {
                    return Err(format!(
                        "change {step}, its writes back: the pass differs from a full pass"
                    ));
                }
            }
            let at = Instant::now();
            black_box(planning(&s));
            times_planning.push(at.elapsed().as_secs_f64() * 1e3);
            continue;
        }
        let at = Instant::now();
        black_box(planning(&s));
        times_planning.push(at.elapsed().as_secs_f64() * 1e3);
        let at = Instant::now();
        let b = black_box(before(&s));
        times_before.push(at.elapsed().as_secs_f64() * 1e3);
        let at = Instant::now();
        let a = black_box(after(&s));
        times_after.push(at.elapsed().as_secs_f64() * 1e3);
        start_afresh(&s);
        if a != b {
            return Err(format!("change {step}: the two ways differ"));
        }
    }
    if !only_new {
        println!("tenant change, copy and read every node: {}", stats(times_before));
    }
    println!("tenant change, shared and read where changed: {}", stats(times_after));
    if only_new {
        println!("  its minor page faults: {}", counts(faults));
    }
    if !times_second.is_empty() {
        println!("  the pass after its writes came back: {}", stats(times_second));
    }
    if !times_full.is_empty() {
        println!("  the same change planned from nothing after it: {}", stats(times_full));
    }
    println!(
        "tenant change, the planner alone (plan_with, its memo): {}",
        stats(times_planning)
    );
    Ok(())
}

/// Plans the first 1/`k` of the fleet's nodes, then 2/`k`, ... (not the whole fleet), as a
/// controller converging on a growing fleet does: its memo carries that history.
fn grow(
    pass: &mut impl FnMut(&Snapshot) -> gpu_tenancy::desired::Desired,
    s: &Snapshot,
    k: usize,
    full: Option<&dyn Fn(&Snapshot)>,
) {
    for step in 1..k {
        let mut part = s.clone();
        let n = s.nodes.len() * step / k;
        part.nodes.truncate(n);
        let names: std::collections::BTreeSet<&str> =
            part.nodes.iter().filter_map(|n| n.metadata.name.as_deref()).collect();
        part.gpu_nodes
            .retain(|g| g.metadata.name.as_deref().is_some_and(|name| names.contains(name)));
        let at = Instant::now();
        black_box(pass(&part));
        println!("grown to {n} nodes: {:.1} ms", at.elapsed().as_secs_f64() * 1e3);
        if let Some(full) = full {
            full(&part);
        }
    }
}

/// Every Node and GpuNode copied out of the snapshot and read as the planner's inventories.
fn copied_inventories(s: &Snapshot) -> Vec<NodeInventory> {
    let nodes: Vec<Node> = s.nodes.iter().map(|n| (**n).clone()).collect();
    let gpu_nodes: Vec<GpuNode> = s.gpu_nodes.iter().map(|n| (**n).clone()).collect();
    cluster_inventories(&nodes, &gpu_nodes)
}

/// The planner's input: the snapshot's policies, tenants and plans on `nodes`.
fn input<'a>(s: &'a Snapshot, nodes: &'a [NodeInventory]) -> PlanInput<'a> {
    PlanInput {
        policies: &s.policies,
        tenants: &s.tenants,
        plans: &s.plans,
        nodes,
    }
}

/// A pass after the first, for a profiler: `valgrind --tool=callgrind --toggle-collect='*measured*'`.
#[inline(never)]
fn measured(
    pass: &mut impl FnMut(&Snapshot) -> gpu_tenancy::desired::Desired,
    s: &Snapshot,
) -> gpu_tenancy::desired::Desired {
    black_box(pass(s))
}

/// The pass's own writes as the watches hand them back: each GpuNode whose spec it changes, each
/// tenant and plan whose status it changes, with a new resourceVersion (the agents' writes are
/// not simulated).
fn written_back(s: &mut Snapshot, desired: &gpu_tenancy::desired::Desired, step: u32) {
    let version = Some(format!("written-back-{step}"));
    let at: std::collections::HashMap<&str, usize> = s
        .gpu_nodes
        .iter()
        .enumerate()
        .filter_map(|(i, n)| Some((n.metadata.name.as_deref()?, i)))
        .collect();
    let mut nodes = vec![];
    for d in &desired.nodes {
        if let Some(&i) = d.metadata.name.as_deref().and_then(|n| at.get(n))
            && s.gpu_nodes[i].spec != d.spec
        {
            nodes.push((i, d.spec.clone()));
        }
    }
    for (i, spec) in nodes {
        let n = Arc::make_mut(&mut s.gpu_nodes[i]);
        n.spec = spec;
        n.metadata.generation = Some(n.metadata.generation.unwrap_or(0) + 1);
        n.metadata.resource_version.clone_from(&version);
    }
    for t in &mut s.tenants {
        if let Some(d) = desired.tenants.iter().find(|d| d.metadata.name == t.metadata.name)
            && d.status != t.status
        {
            let t = Arc::make_mut(t);
            t.status.clone_from(&d.status);
            t.metadata.resource_version.clone_from(&version);
        }
    }
    for p in &mut s.plans {
        if let Some(d) = desired.plans.iter().find(|d| d.metadata.name == p.metadata.name)
            && d.status != p.status
        {
            p.status.clone_from(&d.status);
            p.metadata.resource_version.clone_from(&version);
        }
    }
}

/// A digest of everything a pass would write (the clock is fixed here, so condition times are too).
fn digest(desired: &gpu_tenancy::desired::Desired) -> Result<u64, String> {
    use std::hash::{Hash, Hasher};
    let json = serde_json::to_vec(desired).map_err(|e| e.to_string())?;
    let mut h = std::hash::DefaultHasher::new();
    json.hash(&mut h);
    Ok(h.finish())
}

/// The objects of a `kubectl get -o json` list; with `copies` above 1, each Node, GpuNode and
/// GpuTenant that many times ([`copy`]).
fn read(path: &str, copies: usize) -> Result<Snapshot, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let list: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
    let items = list["items"].as_array().ok_or(format!("{path}: not a list (items)"))?;
    let mut s = Snapshot::default();
    for item in items {
        let kind = item["kind"].as_str().unwrap_or_default();
        let copies = if matches!(kind, "Node" | "GpuNode" | "GpuTenant") {
            copies
        } else {
            1
        };
        let text = serde_json::to_string(item).map_err(|e| format!("{path}: {e}"))?;
        for k in 0..copies {
            let text = copy(&text, k);
            let parse = |e: serde_json::Error| format!("{path}: a {kind} that does not parse: {e}");
            match kind {
                "Node" => s
                    .nodes
                    .push(Arc::new(serde_json::from_str::<Node>(&text).map_err(parse)?)),
                "GpuNode" => s
                    .gpu_nodes
                    .push(Arc::new(serde_json::from_str::<GpuNode>(&text).map_err(parse)?)),
                "GpuTenant" => s
                    .tenants
                    .push(Arc::new(serde_json::from_str::<GpuTenant>(&text).map_err(parse)?)),
                "GpuPartitionPlan" => s
                    .plans
                    .push(serde_json::from_str::<GpuPartitionPlan>(&text).map_err(parse)?),
                "SharingPolicy" => s
                    .policies
                    .push(serde_json::from_str::<SharingPolicy>(&text).map_err(parse)?),
                _ => {}
            }
        }
    }
    Ok(s)
}

/// Copy `k` of an object of the bench's fleet (JSON): copy 0 is the object itself; in the others
/// every node name (`fleet-NNNNN`) and tenant name (`fleet-tNNNN`, so also its namespaces) gets
/// `-cK`. Each copy is then the bench's converged fleet again, its own nodes running its own
/// tenants' grants, and a pass over all copies finds nothing to move, as over one fleet.
fn copy(json: &str, k: usize) -> String {
    if k == 0 {
        return json.to_string();
    }
    let mut out = String::with_capacity(json.len() + 64);
    let mut rest = json;
    while let Some(at) = rest.find("fleet-") {
        let (before, from) = rest.split_at(at);
        out.push_str(before);
        let name = &from["fleet-".len()..];
        let tenant = usize::from(name.starts_with('t'));
        let digits = name[tenant..].bytes().take_while(u8::is_ascii_digit).count();
        let end = "fleet-".len() + tenant + digits;
        out.push_str(&from[..end]);
        if digits > 0 {
            out.push_str(&format!("-c{k}"));
        }
        rest = &from[end..];
    }
    out.push_str(rest);
    out
}

/// The first MPS tenant asks for one more share on odd steps, one fewer on even ones, as the
/// API server stores it (a new resourceVersion).
fn change_a_tenant(s: &mut Snapshot, step: u32) -> Result<(), String> {
    let (t, r) = s
        .tenants
        .iter()
        .enumerate()
        .find_map(|(t, tenant)| Some((t, tenant.spec.resources.iter().position(|r| r.mode == Mode::Mps)?)))
        .ok_or("no tenant asks for MPS shares")?;
    let tenant = Arc::make_mut(&mut s.tenants[t]);
    let count = &mut tenant.spec.resources[r].count;
    *count = if step % 2 == 1 { *count + 1 } else { *count - 1 };
    tenant.metadata.resource_version = Some(format!("change-{step}"));
    Ok(())
}
