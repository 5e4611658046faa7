//! The full plan of a generated fleet: 5,000 nodes x 8 GPUs with 2,000 tenants, and ten times
//! that (50,000 nodes, 20,000 tenants): the ratio of the two is how far from linear it grows.

#[path = "../tests/support/fleet.rs"]
mod support;

use criterion::{Criterion, criterion_group, criterion_main};
use gpu_tenancy::planner::{PlanInput, plan};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::hint::black_box;

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

// No plots: criterion's plotting backend needs system fonts a CI machine may not have, and
// the figures are what the README quotes.
criterion_group! {
    name = benches;
    config = Criterion::default().without_plots();
    targets = bench
}
criterion_main!(benches);
