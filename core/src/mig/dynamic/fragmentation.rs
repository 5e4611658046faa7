//! Fragmentation of a dynamic pool: free memory slices that no profile anyone asks for can use,
//! because every placement of every wanted shape that would take them collides with an instance
//! or a budget.

use super::{GpuState, Placement};
use crate::mig::Shape;
use serde::Serialize;

/// A pool's free memory slices, and those of them no wanted shape can use now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Fragmentation {
    pub free_slices: u32,
    pub stranded_slices: u32,
}

impl Fragmentation {
    /// Stranded slices over free ones (0 when none is free).
    pub fn ratio(&self) -> f64 {
        match self.free_slices {
            0 => 0.0,
            free => f64::from(self.stranded_slices) / f64::from(free),
        }
    }
}

/// The memory slices of `gpu` that some placement of a `wanted` shape could take now, as bits.
pub fn usable(gpu: &GpuState, wanted: &[Shape]) -> u8 {
    wanted
        .iter()
        .flat_map(|&shape| shape.info().starts.iter().map(move |&start| Placement { shape, start }))
        .filter(|&p| gpu.fits(p))
        .fold(0, |m, p| m | p.mask())
}

/// Free memory slices of `gpu` that no placement of a `wanted` shape can take now.
pub fn stranded(gpu: &GpuState, wanted: &[Shape]) -> u32 {
    (!gpu.occupied() & !usable(gpu, wanted)).count_ones()
}

/// [`Fragmentation`] of a pool's GPUs for the shapes its workloads want.
pub fn of_pool(gpus: &[GpuState], wanted: &[Shape]) -> Fragmentation {
    gpus.iter().fold(Fragmentation::default(), |f, g| Fragmentation {
        free_slices: f.free_slices + g.free_slices(),
        stranded_slices: f.stranded_slices + stranded(g, wanted),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(instances: &[(Shape, u32)]) -> GpuState {
        GpuState {
            instances: instances
                .iter()
                .map(|&(shape, start)| Placement { shape, start })
                .collect(),
        }
    }

    /// Worked by hand from NVIDIA's placement table.
    #[test]
    fn stranded_slices_are_those_no_wanted_placement_reaches() {
        use Shape::*;
        // A 1g at 0: 3g and 4g want slices 0-3 or 4-7; only 3g at 4 fits, so 1-3 are stranded.
        let g = gpu(&[(OneSlice, 0)]);
        assert_eq!(stranded(&g, &[ThreeSlice]), 3);
        assert_eq!(stranded(&g, &[FourSlice]), 7, "4g starts only at 0");
        // Wanting 1g too, every slice but 7 is usable; 7 is reached by no 1g.
        assert_eq!(stranded(&g, &[ThreeSlice, OneSlice]), 0, "3g at 4 takes 7");
        let g = gpu(&[(OneSlice, 0), (ThreeSlice, 4)]);
        assert_eq!(stranded(&g, &[OneSlice]), 0);
        assert_eq!(stranded(&g, &[TwoSlice]), 1, "2g at 2 only: slice 1 stranded");
        // Compute: 2g ×3 leave one compute slice; a 2g cannot use slices 6-7.
        let g = gpu(&[(TwoSlice, 0), (TwoSlice, 2), (TwoSlice, 4)]);
        assert_eq!(stranded(&g, &[TwoSlice]), 2);
        assert_eq!(stranded(&g, &[OneSliceDouble]), 0);
        let pool = of_pool(&[g, gpu(&[])], &[TwoSlice]);
        assert_eq!(
            pool,
            Fragmentation {
                free_slices: 10,
                stranded_slices: 4
            },
            "an empty GPU's 6 and 7"
        );
        assert!((pool.ratio() - 0.4).abs() < 1e-9);
    }
}
