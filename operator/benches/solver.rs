//! The MIG solver on every profile multiset of an H100, and on the slowest one alone.

use criterion::{Criterion, criterion_group, criterion_main};
use gpu_tenancy::mig::{Shape, solve_shapes};
use std::hint::black_box;
use std::time::Instant;

/// Every multiset of H100 GPU-instance shapes, each shape up to its instance limit (3840 of them,
/// feasible or not: refusing fast matters as much as placing).
fn all_multisets() -> Vec<Vec<Shape>> {
    let mut out = vec![vec![]];
    for shape in Shape::ALL {
        let max = shape.info().max_instances as usize;
        out = out
            .into_iter()
            .flat_map(|base| (0..=max).map(move |n| [base.clone(), vec![shape; n]].concat()))
            .collect();
    }
    out
}

fn bench(c: &mut Criterion) {
    let sets = all_multisets();
    c.bench_function("solver/all_h100_multisets", |b| {
        b.iter(|| {
            for s in &sets {
                let _ = black_box(solve_shapes(black_box(s), &[]));
            }
        })
    });
    // Find the slowest multiset, then measure it alone.
    let worst = sets
        .iter()
        .max_by_key(|s| {
            let t = Instant::now();
            for _ in 0..200 {
                let _ = black_box(solve_shapes(black_box(s), &[]));
            }
            t.elapsed()
        })
        .unwrap()
        .clone();
    eprintln!("slowest multiset: {worst:?}");
    c.bench_function("solver/worst_case", |b| {
        b.iter(|| black_box(solve_shapes(black_box(&worst), &[])))
    });
}

// No plots: criterion's plotting backend needs system fonts a CI machine may not have, and
// the figures are what docs/development/benchmarks.md quotes.
criterion_group! {
    name = benches;
    config = Criterion::default().without_plots();
    targets = bench
}
criterion_main!(benches);
