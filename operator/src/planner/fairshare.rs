//! Weighted max-min fair share ("water-filling") of integer capacity.

/// Splits `capacity` units among claimants with `(demand, weight)`. Nobody gets more than their
/// demand; spare capacity flows to the others in proportion to weight. Whole units left by
/// rounding go to the largest remainders, ties to the earlier claimant, so the result is
/// deterministic for a given order.
pub fn weighted_fair_share(capacity: u64, claims: &[(u64, u64)]) -> Vec<u64> {
    let mut out = vec![0u64; claims.len()];
    let total: u64 = claims.iter().map(|c| c.0).sum();
    if total <= capacity {
        return claims.iter().map(|c| c.0).collect();
    }
    let mut active: Vec<usize> = (0..claims.len())
        .filter(|&i| claims[i].0 > 0 && claims[i].1 > 0)
        .collect();
    let mut left = capacity as f64;
    let mut exact = vec![0f64; claims.len()];
    // Satisfy claimants whose demand is below their proportional share, then re-split the rest.
    loop {
        let weight: f64 = active.iter().map(|&i| claims[i].1 as f64).sum();
        if active.is_empty() || weight == 0.0 {
            break;
        }
        let level = left / weight;
        let (sated, hungry): (Vec<usize>, Vec<usize>) = active
            .iter()
            .partition(|&&i| (claims[i].0 as f64) <= level * claims[i].1 as f64);
        if sated.is_empty() {
            for &i in &hungry {
                exact[i] = level * claims[i].1 as f64;
            }
            break;
        }
        for &i in &sated {
            exact[i] = claims[i].0 as f64;
            left -= claims[i].0 as f64;
        }
        active = hungry;
    }
    let mut given = 0u64;
    for (i, e) in exact.iter().enumerate() {
        out[i] = e.floor() as u64;
        given += out[i];
    }
    let mut order: Vec<usize> = (0..claims.len()).filter(|&i| out[i] < claims[i].0).collect();
    order.sort_by(|&a, &b| {
        let fa = exact[a] - exact[a].floor();
        let fb = exact[b] - exact[b].floor();
        fb.partial_cmp(&fa).unwrap_or(std::cmp::Ordering::Equal).then(a.cmp(&b))
    });
    for i in order {
        if given >= capacity {
            break;
        }
        out[i] += 1;
        given += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn enough_for_everyone() {
        assert_eq!(weighted_fair_share(10, &[(3, 1), (4, 5)]), [3, 4]);
    }

    #[test]
    fn splits_by_weight_and_passes_on_spare() {
        assert_eq!(weighted_fair_share(9, &[(10, 2), (10, 1)]), [6, 3]);
        // The small claimant is sated; the rest is shared 1:1.
        assert_eq!(weighted_fair_share(10, &[(2, 1), (10, 1), (10, 1)]), [2, 4, 4]);
        assert_eq!(weighted_fair_share(5, &[(10, 1), (10, 1)]), [3, 2]);
    }

    proptest! {
        #[test]
        fn never_over_capacity_or_demand(cap in 0u64..200, claims in prop::collection::vec((0u64..60, 1u64..5), 0..8)) {
            let got = weighted_fair_share(cap, &claims);
            let total: u64 = got.iter().sum();
            let demand: u64 = claims.iter().map(|c| c.0).sum();
            prop_assert_eq!(total, cap.min(demand));
            for (g, c) in got.iter().zip(&claims) {
                prop_assert!(*g <= c.0);
            }
        }
    }
}
