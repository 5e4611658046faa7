//! Shares a tenant keeps spread over the shared GPUs it keeps them on: each claimant's need split
//! over the GPUs it may use, within each GPU's room, placing as much as can be placed. Its own
//! module because it is a pure maximum flow, checked against exhaustive search below.

use std::collections::VecDeque;

/// Splits each claimant's `need` over the GPUs it may use (`pairs` of (claimant, GPU)) within
/// each GPU's `room`, placing as much as can be placed (a maximum flow): greedy in pair order, then
/// augmenting paths that move units between a claimant's GPUs to make room for another.
/// Deterministic. Returns units per pair.
pub(super) fn spread(need: &[u32], room: &[u32], pairs: &[(usize, usize)]) -> Vec<u32> {
    let mut need = need.to_vec();
    let mut room = room.to_vec();
    let mut flow = vec![0u32; pairs.len()];
    for (p, &(c, g)) in pairs.iter().enumerate() {
        let n = need[c].min(room[g]);
        flow[p] = n;
        need[c] -= n;
        room[g] -= n;
    }
    if need.iter().all(|&n| n == 0) {
        // Greedy placed everything (nearly always): no path to look for, no index to build.
        return flow;
    }
    let mut by_claimant: Vec<Vec<usize>> = vec![vec![]; need.len()];
    let mut by_gpu: Vec<Vec<usize>> = vec![vec![]; room.len()];
    for (p, &(c, g)) in pairs.iter().enumerate() {
        by_claimant[c].push(p);
        by_gpu[g].push(p);
    }
    while let Some(start) = (0..need.len()).find(|&c| need[c] > 0) {
        // Breadth-first from `start`: claimant → GPU along its pairs; GPU → another claimant
        // whose units there could move. Ends at a GPU with room.
        let mut via_gpu: Vec<Option<usize>> = vec![None; room.len()]; // pair that reached it
        let mut via_claimant: Vec<Option<usize>> = vec![None; need.len()];
        let mut seen = vec![false; need.len()];
        seen[start] = true;
        let mut queue = VecDeque::from([start]);
        let mut end = None;
        'search: while let Some(c) = queue.pop_front() {
            for &p in &by_claimant[c] {
                let g = pairs[p].1;
                if via_gpu[g].is_some() {
                    continue;
                }
                via_gpu[g] = Some(p);
                if room[g] > 0 {
                    end = Some(g);
                    break 'search;
                }
                for &q in &by_gpu[g] {
                    let other = pairs[q].0;
                    if flow[q] > 0 && !seen[other] {
                        seen[other] = true;
                        via_claimant[other] = Some(q);
                        queue.push_back(other);
                    }
                }
            }
        }
        let Some(mut g) = end else {
            // Nothing more fits for `start`; it keeps what it has.
            need[start] = 0;
            continue;
        };
        // Push one unit back along the path.
        room[g] -= 1;
        need[start] -= 1;
        loop {
            let p = via_gpu[g].expect("on the path");
            flow[p] += 1;
            let c = pairs[p].0;
            if c == start {
                break;
            }
            let q = via_claimant[c].expect("on the path");
            flow[q] -= 1;
            g = pairs[q].1;
        }
    }
    flow
}

#[cfg(test)]
mod tests {
    use super::spread;
    use proptest::prelude::*;

    #[test]
    fn moves_a_share_to_make_room() {
        // Greedy puts both of claimant 0's units on GPU 0; claimant 1 only has GPU 0.
        assert_eq!(spread(&[2, 1], &[2, 1], &[(0, 0), (0, 1), (1, 0)]), [1, 1, 1]);
        // Not everything fits: as much as fits, no more than each room.
        assert_eq!(spread(&[3, 3], &[2, 1], &[(0, 0), (1, 0), (1, 1)]), [2, 0, 1]);
    }

    /// Exhaustive best over all splits, for small cases.
    fn best(need: &[u32], room: &[u32], pairs: &[(usize, usize)]) -> u32 {
        fn go(p: usize, need: &mut [u32], room: &mut [u32], pairs: &[(usize, usize)]) -> u32 {
            if p == pairs.len() {
                return 0;
            }
            let (c, g) = pairs[p];
            let mut top = 0;
            for n in 0..=need[c].min(room[g]) {
                need[c] -= n;
                room[g] -= n;
                top = top.max(n + go(p + 1, need, room, pairs));
                need[c] += n;
                room[g] += n;
            }
            top
        }
        go(0, &mut need.to_vec(), &mut room.to_vec(), pairs)
    }

    proptest! {
        #[test]
        fn places_as_much_as_any_split(
            need in prop::collection::vec(0u32..4, 1..4),
            room in prop::collection::vec(0u32..4, 1..4),
            edges in prop::collection::btree_set((0usize..4, 0usize..4), 0..7),
        ) {
            let pairs: Vec<(usize, usize)> =
                edges.into_iter().filter(|&(c, g)| c < need.len() && g < room.len()).collect();
            let got = spread(&need, &room, &pairs);
            for (c, &n) in need.iter().enumerate() {
                prop_assert!(pairs.iter().zip(&got).filter(|(p, _)| p.0 == c).map(|(_, u)| u).sum::<u32>() <= n);
            }
            for (g, &r) in room.iter().enumerate() {
                prop_assert!(pairs.iter().zip(&got).filter(|(p, _)| p.1 == g).map(|(_, u)| u).sum::<u32>() <= r);
            }
            prop_assert_eq!(got.iter().sum::<u32>(), best(&need, &room, &pairs));
            prop_assert_eq!(got.clone(), spread(&need, &room, &pairs));
        }
    }
}
