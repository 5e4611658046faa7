//! The full plan of a generated fleet: 5,000 nodes x 8 GPUs with 2,000 tenants, and ten times
//! that (50,000 nodes, 20,000 tenants): the ratio of the two is how far from linear it grows.

#[path = "../tests/support/fleet.rs"]
mod support;

use criterion::{Criterion, criterion_group, criterion_main};
use gpu_tenancy::controller::diff::{Seen, diff, diff_with};
use gpu_tenancy::controller::stores::Snapshot;
use gpu_tenancy::planner::{PlanInput, PlanMemo, plan};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Resource;
use std::hint::black_box;
use std::sync::Arc;

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

/// One change at 1,000, 5,000 and 50,000 nodes on a fleet running its last plan, undone by the next:
/// `tenant_change`, a tenant asks for one more MPS share, then one fewer; `node_change`, one
/// node's inventory changes (a GPU's memory as its agent reports it, a new revision), another node
/// each time; `plan_change`, the time-slicing plan's replicas go 4 -> 5 -> 4 (a quarter of the
/// fleet's GPUs change). Planned from the memo of the pass before (the controller's way: its nodes
/// carry revisions, as the cluster's resourceVersions give them), against the full pass of the
/// same inputs.
fn incremental(c: &mut Criterion) {
    let changes: [(&str, support::changes::Change); 3] = [
        ("tenant_change", support::changes::tenant),
        ("node_change", support::changes::node),
        ("plan_change", support::changes::replicas),
    ];
    for (nodes, tenants) in [(1000, 400), (5000, 2000), (50_000, 20_000)] {
        let mut fleet = support::fleet(nodes, 8, tenants, 42);
        let first = support::run(&fleet);
        fleet.nodes = support::with_current(&fleet.nodes, &first.nodes);
        for (group, change) in changes {
            let mut group = c.benchmark_group(group);
            group.sample_size(10);
            let mut f = fleet.clone();
            let mut memo = PlanMemo::default();
            let mut step = 0u32;
            black_box(support::run_with(&f, Some(&mut memo)));
            group.bench_function(format!("incremental_{nodes}_nodes"), |b| {
                b.iter(|| {
                    step += 1;
                    change(&mut f, step);
                    black_box(support::run_with(&f, Some(&mut memo)))
                })
            });
            group.bench_function(format!("full_{nodes}_nodes"), |b| {
                b.iter(|| {
                    step += 1;
                    change(&mut f, step);
                    black_box(support::run_with(&f, None))
                })
            });
            group.finish();
        }
    }
}

/// The controller's pass around the planner at 1,000 and 5,000 nodes on a converged cluster (the
/// live objects are the desired ones, each with a resourceVersion, as the API server holds them
/// once written): the copy of the stores a pass plans from, and the diff of the desired state
/// against it (which finds nothing to write), with what the pass before found already so
/// (`diff_with`, the controller's way) and comparing every object (`diff`). A tenant's change
/// costs the first diff plus the comparisons of the objects it changes.
fn controller_pass(c: &mut Criterion) {
    fn versioned<T: Resource + Clone>(objects: &[T]) -> Vec<T> {
        let mut objects = objects.to_vec();
        for (i, o) in objects.iter_mut().enumerate() {
            o.meta_mut().resource_version = Some((1000 + i).to_string());
        }
        objects
    }
    fn copies<T: Clone>(objects: &[Arc<T>]) -> Vec<T> {
        objects.iter().map(|o| (**o).clone()).collect()
    }
    fn shared<T: Resource + Clone>(objects: &[T]) -> Vec<Arc<T>> {
        versioned(objects).into_iter().map(Arc::new).collect()
    }
    let mut group = c.benchmark_group("controller_pass");
    group.sample_size(10);
    for (nodes, tenants) in [(1000, 400), (5000, 2000)] {
        let f = support::fleet(nodes, 8, tenants, 42);
        let d = support::desired_with(&f, None);
        let live = Snapshot {
            policies: versioned(&d.policies),
            tenants: shared(&copies(&d.tenants)),
            plans: versioned(&d.plans),
            gpu_nodes: shared(&d.nodes),
            nodes: shared(&copies(&d.node_labels)),
            namespaces: shared(&copies(&d.namespaces)),
            quotas: shared(&copies(&d.resource_quotas)),
            config_maps: shared(&d.config_maps),
            admission_policies: shared(&copies(&d.admission_policies)),
            admission_bindings: shared(&copies(&d.admission_bindings)),
            mutating_policies: shared(&d.mutating_policies),
            mutating_bindings: shared(&d.mutating_bindings),
            device_classes: shared(&d.device_classes),
            // A cluster without Kueue, as planned.
            absent: gpu_tenancy::controller::kinds::KUEUE_KINDS.iter().copied().collect(),
            ..Snapshot::default()
        };
        let mut seen = Seen::default();
        assert_eq!(
            diff_with(&d, &live, &mut seen, std::time::Instant::now()).writes,
            vec![],
            "the converged cluster needs no write"
        );
        group.bench_function(format!("snapshot_{nodes}_nodes"), |b| {
            b.iter(|| black_box(live.clone()))
        });
        group.bench_function(format!("diff_seen_{nodes}_nodes"), |b| {
            b.iter(|| black_box(diff_with(&d, &live, &mut seen, std::time::Instant::now())))
        });
        group.bench_function(format!("diff_all_{nodes}_nodes"), |b| {
            b.iter(|| black_box(diff(&d, &live)))
        });
    }
    group.finish();
}

// No plots: criterion's plotting backend needs system fonts a CI machine may not have, and
// the figures are what docs/development/benchmarks.md quotes.
criterion_group! {
    name = benches;
    config = Criterion::default().without_plots();
    targets = bench, incremental, controller_pass
}
criterion_main!(benches);
