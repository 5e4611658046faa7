//! MIG cut on demand, placement policies compared on generated demand traces
//! (docs/development/benchmarks.md): requests accepted and GPUs used per policy, in one run.
//!
//! `cargo run -p gpu-tenancy-core --release --example mig_trace`

use gpu_tenancy_core::mig::Shape;
use gpu_tenancy_core::mig::dynamic::trace::{Policy, Request, generate, run, static_layout};

fn main() {
    use Shape::*;
    let mixes: [(&str, Vec<(Shape, u32)>); 3] = [
        (
            "small-heavy",
            vec![(OneSlice, 6), (TwoSlice, 2), (ThreeSlice, 1), (FourSlice, 1)],
        ),
        (
            "mixed",
            vec![
                (OneSlice, 4),
                (TwoSlice, 2),
                (ThreeSlice, 2),
                (FourSlice, 1),
                (SevenSlice, 1),
            ],
        ),
        (
            "big-heavy",
            vec![(OneSlice, 2), (ThreeSlice, 3), (FourSlice, 2), (SevenSlice, 1)],
        ),
    ];
    println!(
        "{:<12} {:>4} {:>6}  {:>15} {:>15} {:>15} {:>15} {:>15}",
        "mix", "GPUs", "reqs", "first fit", "offered", "best fit", "static", "perfect packing"
    );
    for (name, mix) in &mixes {
        for gpus in [2usize, 4, 8] {
            let mut totals = [(0u32, 0f64); 5];
            let wanted: Vec<Shape> = mix.iter().map(|m| m.0).collect();
            let seeds = 1..=10u64;
            let count = 2000;
            for seed in seeds.clone() {
                // About 90% of the pool's memory slices asked for on average.
                let trace: Vec<Request> = generate(seed, count, mix, 1, mean_duration(mix, gpus));
                let policies = [
                    Policy::FirstFit,
                    Policy::Offered,
                    Policy::BestFit(wanted.clone()),
                    Policy::Static(static_layout(&trace, gpus)),
                    Policy::Optimum,
                ];
                for (t, p) in totals.iter_mut().zip(&policies) {
                    let o = run(&trace, gpus, p);
                    t.0 += o.accepted;
                    t.1 += o.mean_gpus_used;
                }
            }
            let n = seeds.count() as f64;
            let cell = |t: (u32, f64)| format!("{:>6} {:>4.2} GPU", t.0, t.1 / n);
            println!(
                "{name:<12} {gpus:>4} {:>6}  {:>15} {:>15} {:>15} {:>15} {:>15}",
                count * 10,
                cell(totals[0]),
                cell(totals[1]),
                cell(totals[2]),
                cell(totals[3]),
                cell(totals[4])
            );
        }
    }
}

/// A mean duration giving about 90% of `gpus`' memory slices asked for, one arrival per unit.
fn mean_duration(mix: &[(Shape, u32)], gpus: usize) -> u32 {
    let weight: u32 = mix.iter().map(|m| m.1).sum();
    let slices: f64 = mix
        .iter()
        .map(|(s, w)| f64::from(s.info().memory_slices) * f64::from(*w))
        .sum::<f64>()
        / f64::from(weight);
    (0.9 * gpus as f64 * 8.0 / slices).round().max(1.0) as u32
}
