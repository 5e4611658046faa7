//! A controller pass's planning on a real cluster's objects, timed: the copy of the stores it
//! plans from and the desired state (the planner and the rest), a tenant's change at a time,
//! the way the controller did it before its inventory memo (every Node and GpuNode copied and
//! read again) and now (shared, and read again only where they changed), alternating.
//!
//! `kubectl get nodes,gpunodes,gputenants,gpupartitionplans,sharingpolicies -o json > cluster.json`
//! (say at the end of `make bench-fleet`'s convergence), then
//! `target/release/examples/pass_profile cluster.json [COPIES] [CHANGES]`: COPIES times each Node
//! and GpuNode under new names (5 turns a 1,000-node bench fleet into 5,000 nodes; the tenants
//! stay as they are), CHANGES tenant changes (the first MPS tenant ±1 share, a new
//! resourceVersion each time).

use gpu_tenancy::api::{GpuNode, GpuPartitionPlan, GpuTenant, Mode, SharingPolicy};
use gpu_tenancy::controller::stores::Snapshot;
use gpu_tenancy::controller::{PassMemo, desired_with_memo};
use gpu_tenancy::desired::{DesiredMemo, Settings, desired_with};
use gpu_tenancy::inventory::cluster_inventories;
use gpu_tenancy::planner::PlanInput;
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
    let mut s = read(&path, copies)?;
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
        let nodes: Vec<Node> = s.nodes.iter().map(|n| (**n).clone()).collect();
        let gpu_nodes: Vec<GpuNode> = s.gpu_nodes.iter().map(|n| (**n).clone()).collect();
        let inventories = cluster_inventories(&nodes, &gpu_nodes);
        let input = PlanInput {
            policies: &s.policies,
            tenants: &s.tenants,
            plans: &s.plans,
            nodes: &inventories,
        };
        desired_with(&input, &settings, &now, Some(&mut before_memo))
    };
    let mut after_memo = PassMemo::default();
    let mut after = |s: &Snapshot| desired_with_memo(&s.clone(), &settings, &now, Some(&mut after_memo));
    if before(&s) != after(&s) {
        return Err("the two ways differ on the cluster as read".into());
    }
    let (mut times_before, mut times_after) = (vec![], vec![]);
    for step in 1..=changes {
        change_a_tenant(&mut s, step)?;
        let at = Instant::now();
        let b = black_box(before(&s));
        times_before.push(at.elapsed().as_secs_f64() * 1e3);
        let at = Instant::now();
        let a = black_box(after(&s));
        times_after.push(at.elapsed().as_secs_f64() * 1e3);
        if a != b {
            return Err(format!("change {step}: the two ways differ"));
        }
    }
    println!("tenant change, copy and read every node: {}", stats(times_before));
    println!("tenant change, shared and read where changed: {}", stats(times_after));
    Ok(())
}

/// The objects of a `kubectl get -o json` list, each Node and GpuNode `copies` times.
fn read(path: &str, copies: usize) -> Result<Snapshot, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let list: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
    let items = list["items"].as_array().ok_or(format!("{path}: not a list (items)"))?;
    let mut s = Snapshot::default();
    for item in items {
        let parse = |what: &str| format!("{path}: a {what} that does not parse");
        match item["kind"].as_str() {
            Some("Node") => {
                let n: Node = serde_json::from_value(item.clone()).map_err(|_| parse("Node"))?;
                s.nodes.extend(copied(&n, copies).into_iter().map(Arc::new));
            }
            Some("GpuNode") => {
                let n: GpuNode = serde_json::from_value(item.clone()).map_err(|_| parse("GpuNode"))?;
                s.gpu_nodes.extend(copied(&n, copies).into_iter().map(Arc::new));
            }
            Some("GpuTenant") => s
                .tenants
                .push(serde_json::from_value::<GpuTenant>(item.clone()).map_err(|_| parse("GpuTenant"))?),
            Some("GpuPartitionPlan") => s
                .plans
                .push(serde_json::from_value::<GpuPartitionPlan>(item.clone()).map_err(|_| parse("GpuPartitionPlan"))?),
            Some("SharingPolicy") => s
                .policies
                .push(serde_json::from_value::<SharingPolicy>(item.clone()).map_err(|_| parse("SharingPolicy"))?),
            _ => {}
        }
    }
    Ok(s)
}

/// `o` and `copies - 1` more of it, named `NAME-cK`.
fn copied<K: kube::Resource + Clone>(o: &K, copies: usize) -> Vec<K> {
    (0..copies)
        .map(|k| {
            let mut c = o.clone();
            if k > 0 {
                let name = c.meta().name.clone().unwrap_or_default();
                c.meta_mut().name = Some(format!("{name}-c{k}"));
            }
            c
        })
        .collect()
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
    let tenant = &mut s.tenants[t];
    let count = &mut tenant.spec.resources[r].count;
    *count = if step % 2 == 1 { *count + 1 } else { *count - 1 };
    tenant.metadata.resource_version = Some(format!("change-{step}"));
    Ok(())
}

fn stats(mut t: Vec<f64>) -> String {
    t.sort_by(f64::total_cmp);
    format!(
        "median {:6.1} ms (min {:6.1}, max {:6.1})",
        t[t.len() / 2],
        t[0],
        t[t.len() - 1]
    )
}
