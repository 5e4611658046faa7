//! The full plan of a generated fleet: 5,000 nodes x 8 GPUs, 2,000 tenants.

#[path = "../tests/support/fleet.rs"]
mod support;

use criterion::{Criterion, criterion_group, criterion_main};
use gpu_tenancy::planner::{PlanInput, plan};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::hint::black_box;

fn bench(c: &mut Criterion) {
    let f = support::fleet(5000, 8, 2000, 42);
    let now = Time(jiff::Timestamp::from_second(0).unwrap());
    let exempt = Default::default();
    let input = PlanInput {
        policies: &f.policies,
        tenants: &f.tenants,
        plans: &f.plans,
        nodes: &f.nodes,
    };
    let mut group = c.benchmark_group("planner");
    group.sample_size(10);
    group.bench_function("fleet_5000x8_2000_tenants", |b| {
        b.iter(|| black_box(plan(black_box(&input), &exempt, &now)))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
