//! Changes at fleet size, planned from the memo and from nothing, timed; and a marker function for
//! a profiler: `valgrind --tool=callgrind --toggle-collect='*measured*'
//! target/release/examples/change_profile 5000 4 tenant`; `fresh` for the full pass of a fleet
//! nothing runs on yet.
#[path = "support/stats.rs"]
mod stats;
#[path = "../tests/support/fleet.rs"]
mod support;
use stats::stats;

use gpu_tenancy::desired::DesiredMemo;
use gpu_tenancy::planner::PlanMemo;
use std::hint::black_box;

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[inline(never)]
fn measured(f: &support::Fleet, memo: &mut PlanMemo) {
    black_box(support::run_with(f, Some(memo)));
}

#[inline(never)]
fn measured_full(f: &support::Fleet) {
    black_box(support::run_with(f, None));
}

#[inline(never)]
fn measured_desired(f: &support::Fleet, memo: &mut DesiredMemo) {
    black_box(support::desired_with(f, Some(memo)));
}

fn main() {
    let nodes: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(5000);
    let changes: u32 = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(4);
    let only = std::env::args().nth(3);
    let mut f = support::fleet(nodes, 8, nodes * 2 / 5, 42);
    if only.as_deref() == Some("fresh") {
        // The full pass of a fleet nothing runs on yet (`gpu-tenancy plan` of a new fleet).
        let mut times = vec![];
        for _ in 0..changes {
            let at = std::time::Instant::now();
            measured_full(&f);
            times.push(at.elapsed().as_secs_f64() * 1e3);
        }
        println!("{nodes} nodes, nothing running: planner full {}", stats(times));
        return;
    }
    let first = support::run(&f);
    f.nodes = support::with_current(&f.nodes, &first.nodes);
    let kinds = support::changes::ALL;
    if only.as_deref() == Some("hash") {
        // The outputs' fingerprint, to compare two builds of the planner on the same changes.
        for (kind, change) in &kinds {
            let mut g = f.clone();
            let mut memo = PlanMemo::default();
            let mut hasher = std::hash::DefaultHasher::new();
            for step in 0..changes {
                change(&mut g, step + 1);
                let out = support::run_with(&g, Some(&mut memo));
                std::hash::Hash::hash(&serde_json::to_string(&out).expect("the plan serialises"), &mut hasher);
            }
            println!("{kind}: {:016x}", std::hash::Hasher::finish(&hasher));
        }
        return;
    }
    for (kind, change) in &kinds {
        if only
            .as_deref()
            .is_some_and(|o| o != *kind && !(o == "full" && *kind == "tenant"))
        {
            continue;
        }
        let mut g = f.clone();
        let mut memo = PlanMemo::default();
        let mut dmemo = DesiredMemo::default();
        black_box(support::run_with(&g, Some(&mut memo)));
        black_box(support::desired_with(&g, Some(&mut dmemo)));
        let (mut plan_memo, mut plan_full, mut des_memo, mut des_full) = (vec![], vec![], vec![], vec![]);
        for step in 0..changes {
            change(&mut g, step + 1);
            let at = std::time::Instant::now();
            if only.as_deref() == Some("full") {
                measured_full(&g);
            } else {
                measured(&g, &mut memo);
            }
            plan_memo.push(at.elapsed().as_secs_f64() * 1e3);
            if only.is_some() {
                continue;
            }
            let at = std::time::Instant::now();
            black_box(support::run_with(&g, None));
            plan_full.push(at.elapsed().as_secs_f64() * 1e3);
            let at = std::time::Instant::now();
            measured_desired(&g, &mut dmemo);
            des_memo.push(at.elapsed().as_secs_f64() * 1e3);
            let at = std::time::Instant::now();
            black_box(support::desired_with(&g, None));
            des_full.push(at.elapsed().as_secs_f64() * 1e3);
        }
        println!(
            "{nodes} nodes, {changes} {kind} changes: planner memo {} (last pass: {} cells placed, {} taken back)",
            stats(plan_memo),
            memo.allocation.placed,
            memo.allocation.reused
        );
        if only.is_none() {
            println!("  planner full {}", stats(plan_full));
            println!("  desired memo {}", stats(des_memo));
            println!("  desired full {}", stats(des_full));
        }
    }
}
