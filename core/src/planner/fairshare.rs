//! Weighted max-min fair share ("water-filling") of integer capacity, rounded by D'Hondt's divisor
//! method.
//!
//! The rounding must be house-monotone: bindings stay put (docs/design.md#minimal-disruption), so more
//! capacity (a tenant removed, a node added) must never shrink anyone's grant. Largest remainders is
//! not (the Alabama paradox: weights 4:1:4 get 1:1:1 of 3 units but 2:0:2 of 4). A divisor method is,
//! by construction: each claimant bids for its k-th unit (k = 1..=demand) with priority weight / k,
//! the bids are ranked once, and `capacity` units go to the first `capacity` bids. The ranking does
//! not depend on the capacity, so one unit more adds one bid and takes none away; removing a claimant
//! or lowering its demand removes only its own bids, so nobody else's share shrinks either.
//! D'Hondt (rather than Webster's weight / (k - 1/2)) never gives a claimant less than the whole part
//! of its exact water-filling share, so only the fractions are rounded.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// Splits `capacity` units among claimants with `(demand, weight)`. Nobody gets more than their
/// demand; spare capacity flows to the others in proportion to weight. The units go one at a time
/// to the claimant with the highest weight / (units it holds + 1) whose demand is not met, ties to
/// the earlier claimant (D'Hondt), so the result is deterministic for a given order, never
/// shrinks anyone's share when the capacity grows, and gives everyone at least the whole part of
/// its exact share. Claimants of weight 0 get only what the others leave, in order.
///
/// Computed without going unit by unit: the exact water level, in integers, decides the whole parts;
/// fewer units than there are claimants are left, and they go bid by bid. O(n log n) for n claimants,
/// whatever the capacity.
pub fn weighted_fair_share(capacity: u64, claims: &[(u64, u64)]) -> Vec<u64> {
    let total: u128 = claims.iter().map(|c| u128::from(c.0)).sum();
    if total <= u128::from(capacity) {
        return claims.iter().map(|c| c.0).collect();
    }
    let Some((left, weight)) = water_level(capacity, claims) else {
        // Every claimant with a weight is sated; the rest goes to the weight-0 ones in order.
        let mut left = capacity - claims.iter().filter(|c| c.1 > 0).map(|c| c.0).sum::<u64>();
        return claims
            .iter()
            .map(|&(demand, w)| {
                if w > 0 {
                    return demand;
                }
                let take = demand.min(left);
                left -= take;
                take
            })
            .collect();
    };
    // Every bid with priority w / k >= weight / left, i.e. k <= left * w / weight: a prefix of the
    // ranking (all of a sated claimant's bids, the whole part of the others' shares), no longer than
    // `capacity` because the whole parts sum to at most `left`.
    let mut out: Vec<u64> = claims
        .iter()
        .map(|&(demand, w)| {
            // A sated claimant's weight is not in `weight`: its whole part may pass u64 (it is
            // over its demand then).
            let whole = u128::from(left) * u128::from(w) / weight;
            demand.min(u64::try_from(whole).unwrap_or(u64::MAX))
        })
        .collect();
    let mut rest = capacity - out.iter().sum::<u64>();
    // The next bids in the ranking, best first. Weight-0 claimants never get here: the claimants
    // that are not sated want more than `left` between them.
    let mut bids: BinaryHeap<Bid> = (0..claims.len())
        .filter(|&i| claims[i].1 > 0 && out[i] < claims[i].0)
        .map(|i| Bid::next(i, claims[i].1, out[i]))
        .collect();
    while rest > 0 {
        let Some(bid) = bids.pop() else { break };
        out[bid.claimant] += 1;
        rest -= 1;
        if out[bid.claimant] < claims[bid.claimant].0 {
            bids.push(Bid::next(bid.claimant, bid.weight, out[bid.claimant]));
        }
    }
    out
}

/// The exact water level: `(left, weight)` when the claimants not sated at the level
/// `left / weight` (units per unit of weight) share `left` units and weigh `weight` together;
/// `None` when every claimant with a weight is sated.
fn water_level(capacity: u64, claims: &[(u64, u64)]) -> Option<(u64, u128)> {
    let mut order: Vec<usize> = (0..claims.len())
        .filter(|&i| claims[i].0 > 0 && claims[i].1 > 0)
        .collect();
    // Lowest demand / weight first: the first to be sated as the level rises (claimants with equal
    // ratios are sated together, so their order does not matter).
    order.sort_unstable_by(|&a, &b| {
        let ((da, wa), (db, wb)) = (claims[a], claims[b]);
        (u128::from(da) * u128::from(wb)).cmp(&(u128::from(db) * u128::from(wa)))
    });
    let mut left = capacity;
    let mut weight: u128 = order.iter().map(|&i| u128::from(claims[i].1)).sum();
    for i in order {
        let (demand, w) = claims[i];
        // Sated when demand / w <= left / weight, i.e. weight <= left * w / demand (in integers).
        if weight > u128::from(left) * u128::from(w) / u128::from(demand) {
            return Some((left, weight));
        }
        left -= demand;
        weight -= u128::from(w);
    }
    None
}

/// A claimant's bid for its next unit, ranked by priority weight / unit, ties to the earlier claimant.
#[derive(PartialEq, Eq)]
struct Bid {
    claimant: usize,
    weight: u64,
    /// Units the claimant holds once this bid wins (at most its demand, so never 0).
    unit: u64,
}

impl Bid {
    fn next(claimant: usize, weight: u64, holds: u64) -> Bid {
        Bid {
            claimant,
            weight,
            unit: holds + 1,
        }
    }
}

impl Ord for Bid {
    fn cmp(&self, other: &Self) -> Ordering {
        (u128::from(self.weight) * u128::from(other.unit))
            .cmp(&(u128::from(other.weight) * u128::from(self.unit)))
            .then(other.claimant.cmp(&self.claimant))
    }
}

impl PartialOrd for Bid {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The rule itself, unit by unit: the next unit goes to the claimant whose demand is not met
    /// with the highest weight / (units held + 1), ties to the earlier claimant.
    fn one_by_one(capacity: u64, claims: &[(u64, u64)]) -> Vec<u64> {
        let mut out = vec![0u64; claims.len()];
        for _ in 0..capacity {
            let mut best: Option<usize> = None;
            for (i, &(demand, w)) in claims.iter().enumerate() {
                if out[i] >= demand {
                    continue;
                }
                let better = best.is_none_or(|b| {
                    u128::from(w) * u128::from(out[b] + 1) > u128::from(claims[b].1) * u128::from(out[i] + 1)
                });
                if better {
                    best = Some(i);
                }
            }
            match best {
                Some(i) => out[i] += 1,
                None => break,
            }
        }
        out
    }

    /// Exact (fractional) water-filling shares, the textbook way: share the rest by weight among
    /// those not yet sated, sate whoever that covers, repeat.
    fn exact_shares(capacity: u64, claims: &[(u64, u64)]) -> Vec<f64> {
        let mut share = vec![0f64; claims.len()];
        let mut hungry: Vec<usize> = (0..claims.len()).filter(|&i| claims[i].0 > 0).collect();
        let mut left = capacity as f64;
        loop {
            let weight: f64 = hungry.iter().map(|&i| claims[i].1 as f64).sum();
            if hungry.is_empty() || weight == 0.0 {
                return share;
            }
            let level = left / weight;
            let (sated, rest): (Vec<usize>, Vec<usize>) = hungry
                .iter()
                .partition(|&&i| claims[i].0 as f64 <= level * claims[i].1 as f64);
            if sated.is_empty() {
                for i in rest {
                    share[i] = level * claims[i].1 as f64;
                }
                return share;
            }
            for i in sated {
                share[i] = claims[i].0 as f64;
                left -= claims[i].0 as f64;
            }
            hungry = rest;
        }
    }

    fn demand(claims: &[(u64, u64)]) -> u128 {
        claims.iter().map(|c| u128::from(c.0)).sum()
    }

    /// Sum, caps and weighted max-min fairness within one unit: a claimant short of its demand
    /// would, with one unit more, stand at least as high (units per weight) as anyone holding units.
    fn check_fair(capacity: u64, claims: &[(u64, u64)], got: &[u64]) -> Result<(), TestCaseError> {
        prop_assert_eq!(got.len(), claims.len());
        let total: u128 = got.iter().map(|&g| u128::from(g)).sum();
        prop_assert_eq!(total, u128::from(capacity).min(demand(claims)));
        for (i, (&g, &(d, w))) in got.iter().zip(claims).enumerate() {
            prop_assert!(g <= d, "claimant {i} got {g} of {d}");
            if g >= d {
                continue;
            }
            for (j, (&h, &(_, v))) in got.iter().zip(claims).enumerate() {
                if w > 0 && v > 0 && h > 0 {
                    // h / v <= (g + 1) / w
                    prop_assert!(
                        u128::from(h) * u128::from(w) <= u128::from(g + 1) * u128::from(v),
                        "claimant {i} ({g}, weight {w}) short while {j} holds {h} (weight {v})"
                    );
                }
                // Weight 0 is served only once everyone with a weight is sated.
                prop_assert!(!(w > 0 && v == 0 && h > 0), "weight-0 claimant {j} served before {i}");
            }
        }
        Ok(())
    }

    #[test]
    fn enough_for_everyone() {
        assert_eq!(weighted_fair_share(10, &[(3, 1), (4, 5)]), [3, 4]);
    }

    #[test]
    fn splits_by_weight_and_passes_on_spare() {
        assert_eq!(weighted_fair_share(9, &[(10, 2), (10, 1)]), [6, 3]);
        // The small claimant is sated; the rest is shared 1:1.
        assert_eq!(weighted_fair_share(10, &[(2, 1), (10, 1), (10, 1)]), [2, 4, 4]);
        // Ties go to the earlier claimant.
        assert_eq!(weighted_fair_share(5, &[(10, 1), (10, 1)]), [3, 2]);
        // Weight 0 gets only what the others leave.
        assert_eq!(weighted_fair_share(5, &[(4, 0), (2, 1), (6, 0)]), [3, 2, 0]);
    }

    /// Largest remainders gave 1:1:1 of 3 units and 2:0:2 of 4 (the Alabama paradox).
    #[test]
    fn more_capacity_never_shrinks_a_share() {
        let shares = |capacity| weighted_fair_share(capacity, &[(10, 4), (10, 1), (10, 4)]);
        assert_eq!(shares(3), [2, 0, 1]);
        assert_eq!(shares(4), [2, 0, 2]);
        // Ties (4/4 against 1/1) go to the earlier claimant.
        assert_eq!(shares(7), [4, 0, 3]);
        assert_eq!(shares(8), [4, 1, 3]);
        for c in 0..30 {
            assert!(shares(c + 1).iter().zip(shares(c)).all(|(more, less)| *more >= less));
        }
    }

    #[test]
    fn huge_numbers_do_not_overflow() {
        let max = u64::MAX;
        let claims = [(max, max), (max - 1, 1), (3, max), (max, 0)];
        let got = weighted_fair_share(max - 2, &claims);
        check_fair(max - 2, &claims, &got).unwrap();
        assert_eq!(got[2], 3);
        assert_eq!(weighted_fair_share(max, &[(max, 1), (max, 1)]), [max / 2 + 1, max / 2]);
    }

    fn claims(max_demand: u64) -> impl Strategy<Value = Vec<(u64, u64)>> {
        prop::collection::vec(
            (
                0..max_demand,
                prop_oneof![4 => 1u64..6, 1 => Just(0u64), 1 => 1u64..1000],
            ),
            0..10,
        )
    }

    proptest! {
        // Cheap cases, and a rounding that breaks monotonicity needs a few hundred to show.
        #![proptest_config(ProptestConfig::with_cases(1024))]
        #[test]
        fn same_as_unit_by_unit(cap in 0u64..300, claims in claims(80)) {
            let got = weighted_fair_share(cap, &claims);
            prop_assert_eq!(&got, &one_by_one(cap, &claims));
            prop_assert_eq!(&got, &weighted_fair_share(cap, &claims), "not deterministic");
            check_fair(cap, &claims, &got)?;
        }

        #[test]
        fn fair_and_never_shrinks_as_capacity_grows(claims in claims(40)) {
            let mut prev = weighted_fair_share(0, &claims);
            for cap in 1..=demand(&claims) as u64 + 1 {
                let got = weighted_fair_share(cap, &claims);
                check_fair(cap, &claims, &got)?;
                prop_assert!(got.iter().zip(&prev).all(|(g, p)| g >= p), "{cap}: {prev:?} -> {got:?}");
                // Nobody below the whole part of its exact share.
                for (g, e) in got.iter().zip(exact_shares(cap, &claims)) {
                    prop_assert!(*g as f64 >= (e + 1e-9).floor(), "{cap}: {got:?}, exact {e}");
                }
                prev = got;
            }
        }

        /// What removing a tenant or lowering a request does at the same or more capacity.
        #[test]
        fn removing_or_shrinking_a_claimant_never_shrinks_another(
            cap in 0u64..300, more in 0u64..20, claims in claims(80), who in any::<prop::sample::Index>(), to in 0u64..80,
        ) {
            prop_assume!(!claims.is_empty());
            let who = who.index(claims.len());
            let before = weighted_fair_share(cap, &claims);
            let mut fewer = claims.clone();
            fewer.remove(who);
            let mut others = before.clone();
            others.remove(who);
            let after = weighted_fair_share(cap + more, &fewer);
            prop_assert!(after.iter().zip(&others).all(|(a, b)| a >= b), "{others:?} -> {after:?}");
            let mut smaller = claims.clone();
            smaller[who].0 = smaller[who].0.min(to);
            let after = weighted_fair_share(cap + more, &smaller);
            for (i, (a, b)) in after.iter().zip(&before).enumerate() {
                prop_assert!(i == who || a >= b, "{before:?} -> {after:?}");
            }
        }

        #[test]
        fn fair_with_any_numbers(cap in any::<u64>(), claims in prop::collection::vec((any::<u64>(), any::<u64>()), 0..8)) {
            let got = weighted_fair_share(cap, &claims);
            check_fair(cap, &claims, &got)?;
        }
    }
}
