//! Placement policies for a dynamic pool, compared on a demand trace: requests of MIG instances
//! arriving and departing over time, each accepted at once if the policy can place it, else
//! refused (counted; a real workload would wait).
//!
//! - [`Policy::FirstFit`]: each request takes the first free placement, GPUs in order, each
//!   shape's starts lowest first;
//! - [`Policy::Offered`]: the same, starts in [`super::offer_order`] (highest first): what the DRA
//!   allocator does with the placements a dynamic GPU publishes in that fixed order;
//! - [`Policy::BestFit`]: the placement [`super::best_placement`] picks, the one that strands the
//!   fewest slices for the wanted shapes: what the allocator takes when the agent publishes its
//!   placements in that order again after every change;
//! - [`Policy::Static`]: a layout cut ahead for the average demand ([`static_layout`]); a request
//!   takes a free instance of its shape;
//! - [`Policy::Optimum`]: accepted whenever the instances running and the new one fit on the pool
//!   placed anew ([`super::optimum`]): no policy that never moves a busy instance accepts more.

use super::optimum::{self, Counts, index};
use super::{GpuState, Placement};
use crate::mig::Shape;
use serde::Serialize;

/// One request: an instance of `shape` from `arrival` for `duration` (time units).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub shape: Shape,
    pub arrival: u32,
    pub duration: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Policy {
    FirstFit,
    Offered,
    /// Best fit for the shapes of the trace.
    BestFit(Vec<Shape>),
    /// Each GPU's instances, cut ahead.
    Static(Vec<Vec<Placement>>),
    Optimum,
}

/// What a policy did with a trace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    pub accepted: u32,
    pub refused: u32,
    /// GPUs holding an instance, averaged over the trace's time (for the optimum, the fewest
    /// GPUs its running instances fit on).
    pub mean_gpus_used: f64,
}

/// A trace of `count` requests: one arrives every `gap` units on average, shapes drawn by
/// `mix` weights, durations uniform in `1..=2 × mean_duration`.
pub fn generate(seed: u64, count: usize, mix: &[(Shape, u32)], gap: u32, mean_duration: u32) -> Vec<Request> {
    // Seeded: a trace is reproducible from its seed.
    let mut rng = fastrand::Rng::with_seed(seed);
    let total: u32 = mix.iter().map(|m| m.1).sum();
    let mut t = 0;
    (0..count)
        .map(|_| {
            t += rng.u32(0..=2 * gap);
            let mut pick = rng.u32(0..total);
            let shape = mix
                .iter()
                .find(|(_, w)| {
                    let hit = pick < *w;
                    pick = pick.saturating_sub(*w);
                    hit
                })
                .map_or(mix[0].0, |m| m.0);
            Request {
                shape,
                arrival: t,
                duration: rng.u32(1..=2 * mean_duration),
            }
        })
        .collect()
}

/// A layout for `gpus` GPUs cut for the trace's average demand: each shape's instances in
/// proportion to its average concurrent use (arrivals × duration), GPU by GPU the maximal set
/// that covers most of what is still wanted (bigger shapes weigh more).
pub fn static_layout(requests: &[Request], gpus: usize) -> Vec<Vec<Placement>> {
    let mut load = [0f64; 7];
    for r in requests {
        load[index(r.shape)] += f64::from(r.duration) * f64::from(r.shape.info().memory_slices);
    }
    let total: f64 = load.iter().sum();
    // Wanted instances per shape, scaled to the pool's memory slices.
    let mut wanted = [0f64; 7];
    for (i, s) in Shape::ALL.iter().enumerate() {
        if total > 0.0 {
            wanted[i] = load[i] / total * (gpus as f64 * 8.0) / f64::from(s.info().memory_slices);
        }
    }
    let sets = optimum::maximal_sets();
    (0..gpus)
        .map(|_| {
            let gain = |set: &Counts| -> f64 {
                set.iter()
                    .zip(&wanted)
                    .zip(Shape::ALL)
                    .map(|((&n, &w), s)| f64::from(n).min(w.max(0.0)) * f64::from(s.info().memory_slices))
                    .sum()
            };
            let best = sets
                .iter()
                .max_by(|a, b| gain(a).total_cmp(&gain(b)))
                .copied()
                .unwrap_or_default();
            for (w, n) in wanted.iter_mut().zip(best) {
                *w -= f64::from(n);
            }
            placed(&best)
        })
        .collect()
}

/// A set's instances placed by the solver.
fn placed(set: &Counts) -> Vec<Placement> {
    let shapes: Vec<Shape> = Shape::ALL
        .iter()
        .zip(set)
        .flat_map(|(&s, &n)| std::iter::repeat_n(s, usize::from(n)))
        .collect();
    let starts = crate::mig::solve_shapes(&shapes, &[]).expect("a maximal set is placeable");
    shapes
        .into_iter()
        .zip(starts)
        .map(|(shape, start)| Placement { shape, start })
        .collect()
}

/// Runs `requests` (by arrival) on `gpus` GPUs under `policy`.
pub fn run(requests: &[Request], gpus: usize, policy: &Policy) -> Outcome {
    let mut pool = Pool::new(gpus, policy);
    // Departures: (time, request index); those due leave before an arrival at the same time.
    let mut leaving: std::collections::BinaryHeap<std::cmp::Reverse<(u32, usize)>> = Default::default();
    let mut out = Outcome::default();
    let (mut last, mut used_time) = (0u32, 0f64);
    for (i, r) in requests.iter().enumerate() {
        while let Some(&std::cmp::Reverse((t, j))) = leaving.peek().filter(|e| e.0.0 <= r.arrival) {
            leaving.pop();
            used_time += pool.used() * f64::from(t - last);
            last = t;
            pool.leave(j);
        }
        used_time += pool.used() * f64::from(r.arrival - last);
        last = r.arrival;
        if pool.place(i, r.shape) {
            out.accepted += 1;
            leaving.push(std::cmp::Reverse((r.arrival + r.duration, i)));
        } else {
            out.refused += 1;
        }
    }
    while let Some(std::cmp::Reverse((t, j))) = leaving.pop() {
        used_time += pool.used() * f64::from(t - last);
        last = t;
        pool.leave(j);
    }
    out.mean_gpus_used = if last > 0 { used_time / f64::from(last) } else { 0.0 };
    out
}

/// The pool as a policy sees it.
struct Pool<'p> {
    policy: &'p Policy,
    gpus: Vec<GpuState>,
    /// Per request index: where it runs (GPU, placement), for the policies that place.
    at: std::collections::HashMap<usize, (usize, Placement)>,
    /// The optimum's running instances, and the shapes by request.
    running: Counts,
    shapes: std::collections::HashMap<usize, Shape>,
    sets: Vec<Counts>,
}

impl<'p> Pool<'p> {
    fn new(gpus: usize, policy: &'p Policy) -> Pool<'p> {
        Pool {
            policy,
            gpus: vec![GpuState::default(); gpus],
            at: Default::default(),
            running: [0; 7],
            shapes: Default::default(),
            sets: match policy {
                Policy::Optimum => optimum::maximal_sets(),
                _ => Vec::new(),
            },
        }
    }

    fn place(&mut self, id: usize, shape: Shape) -> bool {
        let found = match self.policy {
            Policy::Optimum => {
                let mut next = self.running;
                next[index(shape)] += 1;
                if !optimum::fits(next, self.gpus.len(), &self.sets) {
                    return false;
                }
                self.running = next;
                self.shapes.insert(id, shape);
                return true;
            }
            Policy::FirstFit => self.first(shape, |s| Box::new(s.info().starts.iter().copied())),
            Policy::Offered => self.first(shape, |s| Box::new(super::offer_order(s))),
            Policy::BestFit(wanted) => super::best_placement(&self.gpus, shape, wanted),
            Policy::Static(layout) => layout.iter().enumerate().find_map(|(g, cut)| {
                cut.iter()
                    .find(|p| p.shape == shape && !self.gpus[g].instances.contains(p))
                    .map(|p| (g, *p))
            }),
        };
        let Some((g, p)) = found else { return false };
        self.gpus[g].instances.push(p);
        self.at.insert(id, (g, p));
        true
    }

    fn first(
        &self,
        shape: Shape,
        starts: impl Fn(Shape) -> Box<dyn Iterator<Item = u32>>,
    ) -> Option<(usize, Placement)> {
        self.gpus.iter().enumerate().find_map(|(g, gpu)| {
            starts(shape)
                .map(|start| Placement { shape, start })
                .find(|p| gpu.fits(*p))
                .map(|p| (g, p))
        })
    }

    fn leave(&mut self, id: usize) {
        if let Some(shape) = self.shapes.remove(&id) {
            self.running[index(shape)] -= 1;
        }
        if let Some((g, p)) = self.at.remove(&id) {
            self.gpus[g].remove(p);
        }
    }

    /// GPUs in use now.
    fn used(&self) -> f64 {
        match self.policy {
            Policy::Optimum => {
                optimum::fewest_gpus(self.running, self.gpus.len(), &self.sets).unwrap_or(self.gpus.len()) as f64
            }
            _ => self.gpus.iter().filter(|g| !g.is_empty()).count() as f64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Shape::*;

    fn mix() -> Vec<(Shape, u32)> {
        vec![
            (OneSlice, 5),
            (TwoSlice, 2),
            (ThreeSlice, 2),
            (FourSlice, 1),
            (SevenSlice, 1),
        ]
    }

    /// Every request is counted once; placing on demand accepts more than a layout cut ahead,
    /// and comes within a few percent of perfect packing (which may place every instance anew).
    #[test]
    fn dynamic_placement_beats_a_static_layout_and_nears_perfect_packing() {
        let wanted: Vec<Shape> = mix().iter().map(|m| m.0).collect();
        for seed in 1..=3 {
            // About 90% of 4 GPUs' memory slices asked for.
            let trace = generate(seed, 1500, &mix(), 1, 11);
            let perfect = run(&trace, 4, &Policy::Optimum);
            let fixed = run(&trace, 4, &Policy::Static(static_layout(&trace, 4)));
            for policy in [Policy::Offered, Policy::BestFit(wanted.clone())] {
                let o = run(&trace, 4, &policy);
                assert_eq!(o.accepted + o.refused, 1500);
                assert!(
                    o.accepted > fixed.accepted,
                    "seed {seed}: {policy:?} {o:?}, static {fixed:?}"
                );
                assert!(
                    f64::from(o.accepted) >= 0.95 * f64::from(perfect.accepted),
                    "seed {seed}: {policy:?} {o:?}, perfect packing {perfect:?}"
                );
            }
        }
    }

    /// Worked by hand: on one GPU, a 1g then a 4g. First fit puts the 1g at 0, where the 4g must
    /// start; offered from the top, the 1g goes to 6 and both run.
    #[test]
    fn offering_from_the_top_keeps_room_for_big_instances() {
        let trace = [
            Request {
                shape: OneSlice,
                arrival: 0,
                duration: 10,
            },
            Request {
                shape: FourSlice,
                arrival: 1,
                duration: 10,
            },
        ];
        assert_eq!(run(&trace, 1, &Policy::FirstFit).accepted, 1);
        assert_eq!(run(&trace, 1, &Policy::Offered).accepted, 2);
        assert_eq!(run(&trace, 1, &Policy::Optimum).accepted, 2);
        let o = run(&trace, 1, &Policy::Offered);
        assert!(
            (o.mean_gpus_used - 1.0).abs() < 1e-9,
            "one GPU busy from 0 to 11: {o:?}"
        );
    }

    #[test]
    fn a_static_layout_follows_the_mix() {
        let trace = generate(7, 500, &[(OneSlice, 1)], 1, 4);
        let layout = static_layout(&trace, 2);
        assert!(layout.iter().flatten().all(|p| p.shape == OneSlice), "{layout:?}");
        assert_eq!(layout.iter().flatten().count(), 14);
    }
}
