//! The best placement possible: whether a multiset of instances fits on a number of GPUs when
//! every instance may be placed anew (no placement policy, no order of arrival). An exact bound
//! for any policy that places instances as they come and never moves a busy one.
//!
//! One GPU's possible contents are the count vectors (instances per shape) the placement solver
//! can place; only the maximal ones matter, since whatever fits in a set fits in a set above it.
//! A multiset fits on `n` GPUs when `n` maximal sets cover it, found by a search over what is
//! left to cover, memoized.

use crate::mig::{Shape, solve_shapes};
use std::collections::HashSet;

/// Instances per shape, in `Shape::ALL` order.
pub type Counts = [u8; 7];

/// Every count vector one GPU can hold that no other it can hold contains.
pub fn maximal_sets() -> Vec<Counts> {
    let limits: Vec<u8> = Shape::ALL.iter().map(|s| s.info().max_instances as u8).collect();
    let mut feasible = Vec::new();
    let mut counts = [0u8; 7];
    loop {
        let shapes: Vec<Shape> = Shape::ALL
            .iter()
            .zip(counts)
            .flat_map(|(&s, n)| std::iter::repeat_n(s, usize::from(n)))
            .collect();
        if solve_shapes(&shapes, &[]).is_ok() {
            feasible.push(counts);
        }
        // The next vector, odometer-style; done after the last.
        let Some(i) = (0..7).find(|&i| counts[i] < limits[i]) else {
            break;
        };
        counts[i] += 1;
        counts[..i].fill(0);
    }
    let contains = |a: &Counts, b: &Counts| a.iter().zip(b).all(|(x, y)| x >= y);
    feasible
        .iter()
        .filter(|c| !feasible.iter().any(|d| d != *c && contains(d, c)))
        .copied()
        .collect()
}

/// Whether `demand` fits on `gpus` GPUs placed anew, each holding a subset of one of `sets`
/// ([`maximal_sets`]).
pub fn fits(demand: Counts, gpus: usize, sets: &[Counts]) -> bool {
    fits_memo(demand, gpus, sets, &mut HashSet::new())
}

fn fits_memo(demand: Counts, gpus: usize, sets: &[Counts], failed: &mut HashSet<(Counts, usize)>) -> bool {
    if demand.iter().all(|&n| n == 0) {
        return true;
    }
    if gpus == 0 || failed.contains(&(demand, gpus)) {
        return false;
    }
    // The biggest shape still wanted must go on some GPU: only sets holding one are tried.
    let first = (0..7).rev().find(|&i| demand[i] > 0).expect("some demand");
    let mut tried = HashSet::new();
    for set in sets.iter().filter(|s| s[first] > 0) {
        let mut left = demand;
        for (l, s) in left.iter_mut().zip(set) {
            *l = l.saturating_sub(*s);
        }
        if tried.insert(left) && fits_memo(left, gpus - 1, sets, failed) {
            return true;
        }
    }
    failed.insert((demand, gpus));
    false
}

/// The fewest GPUs `demand` fits on (up to `most`), or `None`.
pub fn fewest_gpus(demand: Counts, most: usize, sets: &[Counts]) -> Option<usize> {
    (0..=most).find(|&n| fits(demand, n, sets))
}

/// `shape`'s index in [`Counts`].
pub fn index(shape: Shape) -> usize {
    Shape::ALL
        .iter()
        .position(|s| *s == shape)
        .expect("every shape is in Shape::ALL")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Whether `instances` fit on `gpus` GPUs, by trying every assignment of instances to GPUs
    /// and the placement solver on each: the oracle [`fits`] must agree with.
    fn fits_by_assignment(instances: &[Shape], gpus: usize) -> bool {
        fn go(instances: &[Shape], bins: &mut Vec<Vec<Shape>>) -> bool {
            let Some((first, rest)) = instances.split_first() else {
                return bins.iter().all(|b| solve_shapes(b, &[]).is_ok());
            };
            for i in 0..bins.len() {
                bins[i].push(*first);
                let ok = solve_shapes(&bins[i], &[]).is_ok() && go(rest, bins);
                bins[i].pop();
                if ok {
                    return true;
                }
            }
            false
        }
        go(instances, &mut vec![Vec::new(); gpus])
    }

    #[test]
    fn maximal_sets_are_full_gpus() {
        let sets = maximal_sets();
        // A whole GPU, 4g+3g, 7 × 1g: each is maximal.
        let one = |pairs: &[(Shape, u8)]| {
            let mut c = [0u8; 7];
            for &(s, n) in pairs {
                c[index(s)] = n;
            }
            c
        };
        for set in [
            one(&[(Shape::SevenSlice, 1)]),
            one(&[(Shape::FourSlice, 1), (Shape::ThreeSlice, 1)]),
            one(&[(Shape::OneSlice, 7)]),
        ] {
            assert!(sets.contains(&set), "{set:?}");
        }
        assert!(
            !sets.contains(&one(&[(Shape::ThreeSlice, 1)])),
            "3g alone is not maximal"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// The search agrees with trying every assignment, on up to 3 GPUs.
        #[test]
        fn fits_agrees_with_every_assignment(
            picks in proptest::collection::vec(0usize..7, 0..9),
            gpus in 1usize..=3,
        ) {
            let shapes: Vec<Shape> = picks.iter().map(|&i| Shape::ALL[i]).collect();
            let mut demand = [0u8; 7];
            for s in &shapes {
                demand[index(*s)] += 1;
            }
            let sets = maximal_sets();
            prop_assert_eq!(fits(demand, gpus, &sets), fits_by_assignment(&shapes, gpus), "{:?} on {}", shapes, gpus);
        }
    }
}
