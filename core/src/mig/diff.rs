//! Layout diff: the fewest instances to destroy and create to go from what a GPU has to what it
//! should have, keeping every instance that can stay.

use super::models::{GpuModel, Shape};
use super::solver::{LayoutError, instances_at, mask, name_error, resolve_profiles, solve_shapes};
use crate::api::{MigInstanceSpec, Placement};

/// An instance that exists on the GPU now.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ExistingInstance {
    pub profile: String,
    pub placement: Placement,
    /// GPU instance ID as the driver numbers it, when known.
    pub gpu_instance_id: Option<u32>,
}

/// What to do to one GPU. Instances in `keep` are untouched.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LayoutDiff {
    pub keep: Vec<ExistingInstance>,
    pub destroy: Vec<ExistingInstance>,
    pub create: Vec<MigInstanceSpec>,
}

impl LayoutDiff {
    pub fn is_empty(&self) -> bool {
        self.destroy.is_empty() && self.create.is_empty()
    }

    /// The layout after the diff is applied, sorted by placement.
    pub fn result(&self) -> Vec<MigInstanceSpec> {
        let mut out: Vec<MigInstanceSpec> = self
            .keep
            .iter()
            .map(|k| MigInstanceSpec {
                profile: k.profile.clone(),
                placement: k.placement,
                tenant: None,
            })
            .chain(self.create.iter().cloned())
            .collect();
        out.sort_by_key(|i| i.placement);
        out
    }
}

/// Diffs the `current` instances of a GPU against a `desired` multiset of profile names.
///
/// The largest set of current instances that fits the desired multiset and leaves room for the
/// rest is kept; among equally large sets the one found first in instance order wins, so the
/// result is deterministic. Fails only when `desired` cannot fit even on an empty GPU.
pub fn diff_layout<S: AsRef<str>>(
    model: &GpuModel,
    current: &[ExistingInstance],
    desired: &[S],
) -> Result<LayoutDiff, LayoutError> {
    let wanted = resolve_profiles(model, desired).map_err(|e| name_error(model, e))?;
    let wanted_shapes: Vec<Shape> = wanted.iter().map(|p| p.shape).collect();
    // Fail early, with the plain explanation, if the target itself is impossible.
    solve_shapes(&wanted_shapes, &[]).map_err(|e| name_error(model, e))?;

    // Current instances that could be kept: known profile, wanted shape, no overlap with an earlier one.
    let mut candidates: Vec<(usize, Shape)> = Vec::new();
    let mut seen = 0u8;
    for (i, inst) in current.iter().enumerate() {
        let Some(p) = model.profile(&inst.profile) else {
            continue;
        };
        let valid_start =
            p.info().starts.contains(&inst.placement.start) && inst.placement.size == p.info().memory_slices;
        if !valid_start || !wanted_shapes.contains(&p.shape) {
            continue;
        }
        let m = mask(p.shape, inst.placement.start);
        if seen & m == 0 {
            seen |= m;
            candidates.push((i, p.shape));
        }
    }

    let n = candidates.len();
    let mut subsets: Vec<u32> = (0..(1u32 << n)).collect();
    // Largest subsets first; within a size, lexicographic by candidate order.
    subsets.sort_by_key(|s| (std::cmp::Reverse(s.count_ones()), s.reverse_bits()));
    for subset in subsets {
        let kept: Vec<(usize, Shape)> = (0..n)
            .filter(|b| subset & (1 << b) != 0)
            .map(|b| candidates[b])
            .collect();
        let Some(remaining) = remove_multiset(&wanted, &kept) else {
            continue;
        };
        let fixed: Vec<(Shape, u32)> = kept
            .iter()
            .map(|&(i, shape)| (shape, current[i].placement.start))
            .collect();
        let shapes: Vec<Shape> = remaining.iter().map(|p| p.shape).collect();
        if let Ok(starts) = solve_shapes(&shapes, &fixed) {
            let keep_idx: Vec<usize> = kept.iter().map(|k| k.0).collect();
            let create = instances_at(&remaining, &starts);
            return Ok(LayoutDiff {
                keep: keep_idx.iter().map(|&i| current[i].clone()).collect(),
                destroy: current
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !keep_idx.contains(i))
                    .map(|(_, c)| c.clone())
                    .collect(),
                create,
            });
        }
    }
    unreachable!("the empty subset always solves, checked above")
}

/// `wanted` minus the shapes of `kept`, or `None` if `kept` holds a shape more often than `wanted`.
fn remove_multiset(wanted: &[super::models::Profile], kept: &[(usize, Shape)]) -> Option<Vec<super::models::Profile>> {
    let mut rest = wanted.to_vec();
    for &(_, shape) in kept {
        let pos = rest.iter().position(|p| p.shape == shape)?;
        rest.remove(pos);
    }
    Some(rest)
}

/// Diffs current instances against a desired layout whose placements are already fixed (a GpuNode
/// spec): an instance stays exactly when the same profile sits at the same placement.
pub fn diff_placed(current: &[ExistingInstance], desired: &[MigInstanceSpec]) -> LayoutDiff {
    let mut diff = LayoutDiff::default();
    let mut matched = vec![false; desired.len()];
    for inst in current {
        let hit = desired
            .iter()
            .enumerate()
            .position(|(j, d)| !matched[j] && d.profile == inst.profile && d.placement == inst.placement);
        match hit {
            Some(j) => {
                matched[j] = true;
                diff.keep.push(inst.clone());
            }
            None => diff.destroy.push(inst.clone()),
        }
    }
    diff.create = desired
        .iter()
        .zip(&matched)
        .filter(|(_, m)| !**m)
        .map(|(d, _)| d.clone())
        .collect();
    diff
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::models::model_by_name;

    fn h100() -> &'static GpuModel {
        model_by_name("H100-80GB").unwrap()
    }

    fn at(profile: &str, start: u32, size: u32) -> ExistingInstance {
        ExistingInstance {
            profile: profile.into(),
            placement: Placement { start, size },
            gpu_instance_id: None,
        }
    }

    #[test]
    fn identical_layout_is_an_empty_diff() {
        let current = [at("3g.40gb", 0, 4), at("3g.40gb", 4, 4)];
        let d = diff_layout(h100(), &current, &["3g.40gb", "3g.40gb"]).unwrap();
        assert!(d.is_empty());
        assert_eq!(d.keep.len(), 2);
    }

    #[test]
    fn keeps_what_can_stay_and_moves_nothing_else() {
        // 3g at 4 stays; the 3g at 0 makes way for two 2g instances.
        let current = [at("3g.40gb", 0, 4), at("3g.40gb", 4, 4)];
        let d = diff_layout(h100(), &current, &["3g.40gb", "2g.20gb", "2g.20gb"]).unwrap();
        assert_eq!(d.keep, [at("3g.40gb", 4, 4)]);
        assert_eq!(d.destroy, [at("3g.40gb", 0, 4)]);
        assert_eq!(d.create.len(), 2);
        assert_eq!(d.create[0].placement, Placement { start: 0, size: 2 });
    }

    #[test]
    fn a_kept_instance_in_the_way_is_destroyed() {
        // A 3g at 0 would leave no room for the second 2g; the 3g must move to 4.
        let current = [at("3g.40gb", 0, 4)];
        let d = diff_layout(h100(), &current, &["3g.40gb", "2g.20gb", "2g.20gb"]).unwrap();
        assert!(d.keep.is_empty());
        assert_eq!(d.destroy.len(), 1);
        assert_eq!(d.result().len(), 3);
    }

    #[test]
    fn unknown_current_profiles_are_destroyed() {
        let current = [at("9g.99gb", 0, 8)];
        let d = diff_layout(h100(), &current, &["7g.80gb"]).unwrap();
        assert_eq!(d.destroy.len(), 1);
        assert_eq!(d.create.len(), 1);
    }

    #[test]
    fn impossible_targets_are_refused_with_the_reason() {
        let e = diff_layout(h100(), &[], &["7g.80gb", "1g.10gb"]).unwrap_err();
        assert_eq!(e.to_string(), "compute slices 8 > 7");
    }

    #[test]
    fn placed_diff_matches_profile_and_placement() {
        let current = [at("2g.20gb", 0, 2), at("2g.20gb", 2, 2)];
        let desired = [
            MigInstanceSpec {
                profile: "2g.20gb".into(),
                placement: Placement { start: 2, size: 2 },
                tenant: None,
            },
            MigInstanceSpec {
                profile: "2g.20gb".into(),
                placement: Placement { start: 4, size: 2 },
                tenant: None,
            },
        ];
        let d = diff_placed(&current, &desired);
        assert_eq!(d.keep, [at("2g.20gb", 2, 2)]);
        assert_eq!(d.destroy, [at("2g.20gb", 0, 2)]);
        assert_eq!(d.create, [desired[1].clone()]);
    }
}
