//! MIG cut on demand (docs/decisions/dynamic-mig-placement.md): a GPU's instances are created as workloads
//! ask for them, not fixed ahead by a plan's layout. Pure geometry: what a GPU may hold next
//! ([`GpuState::fits`]), in which order its placements are offered ([`offer_order`]), how much of
//! a pool's free memory no wanted profile can use ([`fragmentation`]), how to repack idle
//! instances ([`repack`]), the best placement possible ([`optimum`]), placement policies
//! compared on a demand trace ([`trace`]), and how a dynamic GPU is published to the scheduler as
//! partitionable devices ([`publish`]).
//!
//! Every MIG GPU modelled here has the same shapes and placement rules (`Shape::info`): an
//! instance takes consecutive memory slices from one of its shape's starts, and a GPU's instances
//! share 8 memory slices, 7 compute slices and each shape's instance limit.

pub mod fragmentation;
pub mod optimum;
pub mod publish;
pub mod repack;
pub mod trace;

use super::models::{COMPUTE_SLICES, Shape};

/// One instance's place on a GPU: its shape and first memory slice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Placement {
    pub shape: Shape,
    pub start: u32,
}

impl Placement {
    /// The memory slices it takes, as bits.
    pub fn mask(self) -> u8 {
        super::solver::mask(self.shape, self.start)
    }
}

/// One GPU's instances.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuState {
    pub instances: Vec<Placement>,
}

impl GpuState {
    /// The memory slices its instances take, as bits.
    pub fn occupied(&self) -> u8 {
        self.instances.iter().fold(0, |m, p| m | p.mask())
    }

    fn compute(&self) -> u32 {
        self.instances.iter().map(|p| p.shape.info().compute_slices).sum()
    }

    fn count(&self, shape: Shape) -> u32 {
        self.instances.iter().filter(|p| p.shape == shape).count() as u32
    }

    /// Whether an instance at `p` can be created next to the ones there: a start its shape may
    /// take, free memory slices, and the compute and per-shape budgets.
    pub fn fits(&self, p: Placement) -> bool {
        let info = p.shape.info();
        info.starts.contains(&p.start)
            && self.occupied() & p.mask() == 0
            && self.compute() + info.compute_slices <= COMPUTE_SLICES
            && self.count(p.shape) < info.max_instances
    }

    /// Free memory slices.
    pub fn free_slices(&self) -> u32 {
        8 - self.occupied().count_ones()
    }

    pub fn is_empty(&self) -> bool {
        self.instances.is_empty()
    }

    /// Removes the instance at `p`; whether there was one.
    pub fn remove(&mut self, p: Placement) -> bool {
        match self.instances.iter().position(|q| *q == p) {
            Some(i) => {
                self.instances.swap_remove(i);
                true
            }
            None => false,
        }
    }
}

/// The starts of `shape` in the order a dynamic GPU offers them: highest first. The DRA allocator
/// takes the first placement whose counters are free, so this order is the placement policy; from
/// the top, small instances leave the low slices, where 3g, 4g and 7g must start, free longest.
pub fn offer_order(shape: Shape) -> impl Iterator<Item = u32> {
    shape.info().starts.iter().rev().copied()
}

/// Where an instance of `shape` goes on a pool's `gpus`, of the placements that fit: on the GPU
/// left with the fewest free slices (pack GPUs before opening one), then the one that strands the
/// fewest free slices for the `wanted` shapes, then the highest start ([`offer_order`]).
/// The agent publishes its placements in this order again after every change, so the DRA
/// allocator, which takes the first that fits, places this way.
pub fn best_placement(gpus: &[GpuState], shape: Shape, wanted: &[Shape]) -> Option<(usize, Placement)> {
    // Fullest GPU after, fewest stranded slices, highest start.
    type Key = (u32, u32, std::cmp::Reverse<u32>);
    let mut best: Option<(Key, (usize, Placement))> = None;
    for (g, gpu) in gpus.iter().enumerate() {
        for start in offer_order(shape) {
            let p = Placement { shape, start };
            if !gpu.fits(p) {
                continue;
            }
            let mut after = gpu.clone();
            after.instances.push(p);
            let key = (
                after.free_slices(),
                fragmentation::stranded(&after, wanted),
                std::cmp::Reverse(start),
            );
            if best.as_ref().is_none_or(|(k, _)| key < *k) {
                best = Some((key, (g, p)));
            }
        }
    }
    best.map(|(_, at)| at)
}

/// Every placement of `shapes` on one GPU, each shape's in [`offer_order`]: the devices a dynamic
/// GPU publishes.
pub fn placements(shapes: &[Shape]) -> Vec<Placement> {
    shapes
        .iter()
        .flat_map(|&shape| offer_order(shape).map(move |start| Placement { shape, start }))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(shape: Shape, start: u32) -> Placement {
        Placement { shape, start }
    }

    /// NVIDIA's placement rules (docs/nvidia.md#mig-geometry): 3g only at 0 or 4, the 2-slice 1g
    /// at even starts taking two slices, 7g alone, and compute counted apart from memory.
    #[test]
    fn a_gpu_takes_what_nvidia_places() {
        let empty = GpuState::default();
        assert!(empty.fits(at(Shape::ThreeSlice, 4)) && !empty.fits(at(Shape::ThreeSlice, 2)));
        assert!(empty.fits(at(Shape::SevenSlice, 0)));
        let one = GpuState {
            instances: vec![at(Shape::OneSlice, 6)],
        };
        assert!(!one.fits(at(Shape::SevenSlice, 0)), "7g needs the whole GPU");
        assert!(!one.fits(at(Shape::OneSliceDouble, 6)), "1g.2x at 6 takes 6 and 7");
        assert!(one.fits(at(Shape::FourSlice, 0)));
        // 4g and 3g take 7 compute slices: nothing more, though slice 7 is free.
        let full = GpuState {
            instances: vec![at(Shape::FourSlice, 0), at(Shape::ThreeSlice, 4)],
        };
        assert_eq!(full.free_slices(), 0);
        let compute = GpuState {
            instances: vec![at(Shape::TwoSlice, 0), at(Shape::TwoSlice, 2), at(Shape::TwoSlice, 4)],
        };
        assert!(compute.fits(at(Shape::OneSlice, 6)), "2g ×3 and a 1g: 7 compute slices");
        let with = GpuState {
            instances: [compute.instances.clone(), vec![at(Shape::OneSlice, 6)]].concat(),
        };
        assert!(!with.fits(at(Shape::OneSliceDouble, 6)) && with.free_slices() == 1);
        // One 1g with media extensions per GPU.
        let me = GpuState {
            instances: vec![at(Shape::OneSliceMe, 0)],
        };
        assert!(!me.fits(at(Shape::OneSliceMe, 1)) && me.fits(at(Shape::OneSlice, 1)));
    }

    #[test]
    fn placements_are_offered_from_the_top() {
        let p = placements(&[Shape::ThreeSlice, Shape::OneSlice]);
        assert_eq!(p[0], at(Shape::ThreeSlice, 4));
        assert_eq!(p[1], at(Shape::ThreeSlice, 0));
        assert_eq!(p[2], at(Shape::OneSlice, 6));
        assert_eq!(p.len(), 2 + 7);
    }
}
