//! Repacking a dynamic GPU: its idle instances (no process, no prepared claim) may be destroyed
//! and created again elsewhere on the GPU; its busy ones never move. The repack that leaves the
//! fewest stranded slices for the wanted shapes, moving the fewest instances, and only when it
//! strands fewer than now.

use super::fragmentation::stranded;
use super::{GpuState, Placement};
use crate::mig::Shape;

/// Idle instances to move on one GPU: `(from, to)`, and the stranded slices before and after.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Repack {
    pub moves: Vec<(Placement, Placement)>,
    pub stranded_before: u32,
    pub stranded_after: u32,
}

/// The best repack of `gpu`, whose instances are idle where `idle` says so (same order), for
/// `wanted` shapes; `None` when no arrangement of the idle instances strands fewer slices.
pub fn repack(gpu: &GpuState, idle: &[bool], wanted: &[Shape]) -> Option<Repack> {
    let before = stranded(gpu, wanted);
    let busy = GpuState {
        instances: gpu
            .instances
            .iter()
            .zip(idle)
            .filter(|(_, idle)| !**idle)
            .map(|(p, _)| *p)
            .collect(),
    };
    let moving: Vec<Placement> = gpu
        .instances
        .iter()
        .zip(idle)
        .filter(|(_, idle)| **idle)
        .map(|(p, _)| *p)
        .collect();
    let mut best: Option<(u32, usize, Vec<Placement>)> = None;
    arrangements(&busy, &moving, 0, &mut Vec::new(), &mut |placed| {
        let mut after = busy.clone();
        after.instances.extend_from_slice(placed);
        let score = (stranded(&after, wanted), moved(&moving, placed));
        if best.as_ref().is_none_or(|b| score < (b.0, b.1)) {
            best = Some((score.0, score.1, placed.to_vec()));
        }
    });
    let (after, _, placed) = best?;
    (after < before).then(|| Repack {
        moves: pairs(&moving, &placed),
        stranded_before: before,
        stranded_after: after,
    })
}

/// Calls `found` with every placement of `moving[i..]` around `gpu` (and `placed`), each shape's
/// instances at increasing starts (identical instances are interchangeable).
fn arrangements(
    gpu: &GpuState,
    moving: &[Placement],
    i: usize,
    placed: &mut Vec<Placement>,
    found: &mut impl FnMut(&[Placement]),
) {
    let Some(p) = moving.get(i) else {
        found(placed);
        return;
    };
    let after = placed
        .iter()
        .filter(|q| q.shape == p.shape)
        .map(|q| q.start + 1)
        .max()
        .unwrap_or(0);
    for &start in p.shape.info().starts.iter().filter(|&&s| s >= after) {
        let next = Placement { shape: p.shape, start };
        let mut state = gpu.clone();
        state.instances.extend_from_slice(placed);
        if state.fits(next) {
            placed.push(next);
            arrangements(gpu, moving, i + 1, placed, found);
            placed.pop();
        }
    }
}

/// How many of `from` are not where they were in `to` (instances of one shape are alike).
fn moved(from: &[Placement], to: &[Placement]) -> usize {
    from.iter().filter(|p| !to.contains(p)).count()
}

/// The moves from `from` to `to`: each instance that is not where it was, to a new place of its
/// shape, lowest first.
fn pairs(from: &[Placement], to: &[Placement]) -> Vec<(Placement, Placement)> {
    let mut targets: Vec<Placement> = to.iter().filter(|p| !from.contains(p)).copied().collect();
    targets.sort();
    let mut out = Vec::new();
    for p in from.iter().filter(|p| !to.contains(p)) {
        if let Some(i) = targets.iter().position(|t| t.shape == p.shape) {
            out.push((*p, targets.remove(i)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use Shape::*;

    fn at(shape: Shape, start: u32) -> Placement {
        Placement { shape, start }
    }

    #[test]
    fn idle_instances_move_to_free_room_for_the_wanted_shape() {
        // An idle 1g at 0 keeps a 4g out (it starts only at 0): all 6 free slices are stranded.
        // Moved up (to 4, the first start that frees 0-3), the 4g fits, and only 2 are.
        let g = GpuState {
            instances: vec![at(OneSlice, 0), at(OneSlice, 5)],
        };
        let r = repack(&g, &[true, false], &[FourSlice]).expect("a repack helps");
        assert_eq!(
            r.stranded_after,
            stranded_of(&g, &r, &[FourSlice]),
            "the moves give what it says"
        );
        assert_eq!(r.moves.len(), 1);
        assert_eq!(r.moves[0].0, at(OneSlice, 0));
        assert!(r.moves[0].1.start >= 4, "{r:?}");
        assert!(r.stranded_before > r.stranded_after, "{r:?}");
        // Busy, it stays: nothing to do.
        assert_eq!(repack(&g, &[false, false], &[FourSlice]), None);
        // Already packed: nothing to do.
        let packed = GpuState {
            instances: vec![at(OneSlice, 6), at(OneSlice, 5)],
        };
        assert_eq!(repack(&packed, &[true, true], &[FourSlice]), None);
    }

    fn stranded_of(g: &GpuState, r: &Repack, wanted: &[Shape]) -> u32 {
        let mut after = g.clone();
        for (from, to) in &r.moves {
            assert!(after.remove(*from));
            after.instances.push(*to);
        }
        stranded(&after, wanted)
    }
}
