//! The full plan of a generated fleet: 5,000 nodes x 8 GPUs with 2,000 tenants, and ten times
//! that (50,000 nodes, 20,000 tenants): the ratio of the two is how far from linear it grows.

#[path = "../tests/support/fleet.rs"]
mod support;

use criterion::{Criterion, criterion_group, criterion_main};
use gpu_tenancy::api::Mode;
use gpu_tenancy::planner::{PlanInput, PlanMemo, plan};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::hint::black_box;

// The allocator the binary ships with (`src/main.rs`): the planner's time at 50,000 nodes depends
// on it (glibc's malloc made it superlinear).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn bench(c: &mut Criterion) {
    let now = Time(jiff::Timestamp::from_second(0).unwrap());
    let exempt = Default::default();
    let mut group = c.benchmark_group("planner");
    group.sample_size(10);
    for (nodes, tenants) in [(5000, 2000), (50_000, 20_000)] {
        let f = support::fleet(nodes, 8, tenants, 42);
        let input = PlanInput {
            policies: &f.policies,
            tenants: &f.tenants,
            plans: &f.plans,
            nodes: &f.nodes,
        };
        group.bench_function(format!("fleet_{nodes}x8_{tenants}_tenants"), |b| {
            b.iter(|| black_box(plan(black_box(&input), &exempt, &now)))
        });
    }
    group.finish();
}

/// One tenant's change at 1,000 and 5,000 nodes: a tenant asks for one more MPS share, then one
/// fewer, in turn, on a fleet running its last plan. Planned from the memo of the pass before
/// (the controller's way: its nodes carry revisions, as the cluster's resourceVersions give
/// them), against the full pass of the same inputs.
fn incremental(c: &mut Criterion) {
    let mut group = c.benchmark_group("tenant_change");
    group.sample_size(10);
    for (nodes, tenants) in [(1000, 400), (5000, 2000)] {
        let mut f = support::fleet(nodes, 8, tenants, 42);
        let first = support::run(&f);
        f.nodes = support::with_current(&f.nodes, &first.nodes);
        let t = f
            .tenants
            .iter()
            .position(|t| t.spec.resources.iter().any(|r| r.mode == Mode::Mps))
            .expect("the fleet has MPS tenants");
        let r = f.tenants[t]
            .spec
            .resources
            .iter()
            .position(|r| r.mode == Mode::Mps)
            .unwrap();
        let mut memo = PlanMemo::default();
        let mut step = 0u32;
        let mut change = |f: &mut support::Fleet| {
            step += 1;
            let count = &mut f.tenants[t].spec.resources[r].count;
            *count = if step % 2 == 1 { *count + 1 } else { *count - 1 };
        };
        black_box(support::run_with(&f, Some(&mut memo)));
        group.bench_function(format!("incremental_{nodes}_nodes"), |b| {
            b.iter(|| {
                change(&mut f);
                black_box(support::run_with(&f, Some(&mut memo)))
            })
        });
        group.bench_function(format!("full_{nodes}_nodes"), |b| {
            b.iter(|| {
                change(&mut f);
                black_box(support::run_with(&f, None))
            })
        });
    }
    group.finish();
}

// No plots: criterion's plotting backend needs system fonts a CI machine may not have, and
// the figures are what the README quotes.
criterion_group! {
    name = benches;
    config = Criterion::default().without_plots();
    targets = bench, incremental
}
criterion_main!(benches);
