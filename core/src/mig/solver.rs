//! Placement solver: where a multiset of MIG profiles goes on a GPU, or precisely why it cannot.

use super::models::{COMPUTE_SLICES, GpuModel, MEMORY_SLICES, Profile, Shape};
use crate::api::{MigInstanceSpec, Placement};
use std::fmt;

/// Why a set of MIG profiles does not fit on a GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LayoutError {
    UnknownProfile {
        profile: String,
        model: &'static str,
        known: Vec<&'static str>,
    },
    TooManyInstances {
        profile: &'static str,
        requested: u32,
        max: u32,
    },
    ComputeExceeded {
        requested: u32,
    },
    MemoryExceeded {
        requested: u32,
    },
    /// Budgets are fine but no arrangement of placements fits.
    NoPlacement {
        profiles: Vec<&'static str>,
        constraints: Vec<String>,
    },
}

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LayoutError::UnknownProfile { profile, model, known } => write!(
                f,
                "unknown MIG profile {profile:?} for {model}; its profiles are {}",
                known.join(", ")
            ),
            LayoutError::TooManyInstances {
                profile,
                requested,
                max,
            } => write!(
                f,
                "{profile} allows {max} instance{} per GPU, {requested} requested",
                if *max == 1 { "" } else { "s" }
            ),
            LayoutError::ComputeExceeded { requested } => {
                write!(f, "compute slices {requested} > {COMPUTE_SLICES}")
            }
            LayoutError::MemoryExceeded { requested } => {
                write!(f, "memory slices {requested} > {MEMORY_SLICES}")
            }
            LayoutError::NoPlacement { profiles, constraints } => write!(
                f,
                "no arrangement of {} fits in {MEMORY_SLICES} memory slices: {}",
                profiles.join(" + "),
                constraints.join("; ")
            ),
        }
    }
}

impl std::error::Error for LayoutError {}

/// Resolves profile names of `model`, failing on the first unknown one.
pub fn resolve_profiles<S: AsRef<str>>(model: &GpuModel, names: &[S]) -> Result<Vec<Profile>, LayoutError> {
    names
        .iter()
        .map(|n| {
            model.profile(n.as_ref()).ok_or_else(|| LayoutError::UnknownProfile {
                profile: n.as_ref().to_string(),
                model: model.key,
                known: model.profile_names().to_vec(),
            })
        })
        .collect()
}

/// Finds placements for `profiles` on an empty GPU of `model`. Instances come back sorted by start.
pub fn solve<S: AsRef<str>>(model: &GpuModel, profiles: &[S]) -> Result<Vec<MigInstanceSpec>, LayoutError> {
    let resolved = resolve_profiles(model, profiles)?;
    let shapes: Vec<Shape> = resolved.iter().map(|p| p.shape).collect();
    let starts = solve_shapes(&shapes, &[])?;
    Ok(instances_at(&resolved, &starts))
}

/// Instances of `profiles` at `starts` (one start per profile), sorted by placement.
pub(crate) fn instances_at(profiles: &[Profile], starts: &[u32]) -> Vec<MigInstanceSpec> {
    let mut out: Vec<MigInstanceSpec> = profiles
        .iter()
        .zip(starts)
        .map(|(p, &start)| MigInstanceSpec {
            profile: p.name.to_string(),
            placement: Placement {
                start,
                size: p.info().memory_slices,
            },
            tenant: None,
        })
        .collect();
    out.sort_by_key(|i| i.placement);
    out
}

/// Memory-slice bitmask of a shape at a start.
pub(crate) fn mask(shape: Shape, start: u32) -> u8 {
    let size = shape.info().memory_slices;
    (((1u16 << size) - 1) << start) as u8
}

/// Checks the budgets every placement must respect, counting `fixed` instances too.
fn check_budgets(shapes: &[Shape], fixed: &[(Shape, u32)]) -> Result<(), LayoutError> {
    let all = || shapes.iter().copied().chain(fixed.iter().map(|f| f.0));
    for shape in Shape::ALL {
        let n = all().filter(|s| *s == shape).count() as u32;
        let info = shape.info();
        if n > info.max_instances {
            return Err(LayoutError::TooManyInstances {
                profile: shape_label(shape),
                requested: n,
                max: info.max_instances,
            });
        }
    }
    let compute: u32 = all().map(|s| s.info().compute_slices).sum();
    if compute > COMPUTE_SLICES {
        return Err(LayoutError::ComputeExceeded { requested: compute });
    }
    let memory: u32 = all().map(|s| s.info().memory_slices).sum();
    if memory > MEMORY_SLICES {
        return Err(LayoutError::MemoryExceeded { requested: memory });
    }
    Ok(())
}

/// Placeholder label for a shape in budget errors; [`solve_named`] rewrites it with the model's name.
fn shape_label(shape: Shape) -> &'static str {
    match shape {
        Shape::OneSlice => "1g",
        Shape::OneSliceMe => "1g+me",
        Shape::OneSliceDouble => "1g (2 memory slices)",
        Shape::TwoSlice => "2g",
        Shape::ThreeSlice => "3g",
        Shape::FourSlice => "4g",
        Shape::SevenSlice => "7g",
    }
}

/// Places `shapes` around instances already `fixed` at their starts. Returns one start per shape,
/// in input order. Backtracking depth-first search, largest shapes first, lowest start first.
pub fn solve_shapes(shapes: &[Shape], fixed: &[(Shape, u32)]) -> Result<Vec<u32>, LayoutError> {
    check_budgets(shapes, fixed)?;
    let mut occupied = 0u8;
    for &(shape, start) in fixed {
        let m = mask(shape, start);
        if occupied & m != 0 {
            return Err(LayoutError::NoPlacement {
                profiles: vec![shape_label(shape)],
                constraints: vec![format!("fixed instances overlap at {start}")],
            });
        }
        occupied |= m;
    }
    // Most constrained first: bigger instances, then fewer possible starts.
    let mut order: Vec<usize> = (0..shapes.len()).collect();
    order.sort_by_key(|&i| {
        let info = shapes[i].info();
        (std::cmp::Reverse(info.memory_slices), info.starts.len(), shapes[i])
    });
    let mut starts = vec![0u32; shapes.len()];
    if place(shapes, &order, 0, occupied, &mut starts) {
        Ok(starts)
    } else {
        Err(LayoutError::NoPlacement {
            profiles: order.iter().map(|&i| shape_label(shapes[i])).collect(),
            constraints: constraints_of(order.iter().map(|&i| shapes[i]), fixed),
        })
    }
}

fn place(shapes: &[Shape], order: &[usize], depth: usize, occupied: u8, starts: &mut [u32]) -> bool {
    let Some(&i) = order.get(depth) else { return true };
    let shape = shapes[i];
    // Identical shapes are interchangeable: start after the previous one to skip symmetric branches.
    let min_start = match depth.checked_sub(1).map(|d| order[d]) {
        Some(prev) if shapes[prev] == shape => starts[prev] + 1,
        _ => 0,
    };
    for &start in shape.info().starts.iter().filter(|&&s| s >= min_start) {
        let m = mask(shape, start);
        if occupied & m == 0 {
            starts[i] = start;
            if place(shapes, order, depth + 1, occupied | m, starts) {
                return true;
            }
        }
    }
    false
}

fn constraints_of(shapes: impl Iterator<Item = Shape>, fixed: &[(Shape, u32)]) -> Vec<String> {
    let mut seen = Vec::new();
    let mut out = Vec::new();
    for shape in shapes {
        if seen.contains(&shape) {
            continue;
        }
        seen.push(shape);
        let info = shape.info();
        let starts: Vec<String> = info.starts.iter().map(u32::to_string).collect();
        let starts = match starts.as_slice() {
            [one] => one.clone(),
            [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
            [] => String::new(),
        };
        out.push(format!(
            "{} needs {} memory slice{} starting at {starts}",
            shape_label(shape),
            info.memory_slices,
            if info.memory_slices == 1 { "" } else { "s" }
        ));
    }
    for (shape, start) in fixed {
        out.push(format!("{} kept at {start}", shape_label(*shape)));
    }
    out
}

/// Like [`solve`], with errors naming the model's profiles (`3g.40gb`) instead of bare shapes.
pub fn solve_named<S: AsRef<str>>(model: &GpuModel, profiles: &[S]) -> Result<Vec<MigInstanceSpec>, LayoutError> {
    solve(model, profiles).map_err(|e| name_error(model, e))
}

/// Rewrites shape labels in an error with the model's profile names.
pub fn name_error(model: &GpuModel, err: LayoutError) -> LayoutError {
    let rename = |label: &str| -> &'static str {
        Shape::ALL
            .into_iter()
            .find(|s| shape_label(*s) == label)
            .map_or("?", |s| model.profile_for(s).name)
    };
    match err {
        LayoutError::TooManyInstances {
            profile,
            requested,
            max,
        } => LayoutError::TooManyInstances {
            profile: rename(profile),
            requested,
            max,
        },
        LayoutError::NoPlacement { profiles, constraints } => {
            let constraints = constraints
                .into_iter()
                .map(|c| {
                    let (label, rest) = split_label(&c);
                    format!("{}{rest}", rename(label))
                })
                .collect();
            LayoutError::NoPlacement {
                profiles: profiles.into_iter().map(rename).collect(),
                constraints,
            }
        }
        other => other,
    }
}

/// Splits "3g needs ..." / "1g (2 memory slices) kept at 2" into the shape label and the rest.
fn split_label(c: &str) -> (&str, &str) {
    for shape in Shape::ALL.iter().rev() {
        let label = shape_label(*shape);
        if let Some(rest) = c.strip_prefix(label)
            && rest.starts_with(' ')
            && !rest.starts_with(" (")
        {
            return (label, rest);
        }
    }
    // The labels that contain a space come first in the match above only when longer; try them.
    let label = shape_label(Shape::OneSliceDouble);
    c.strip_prefix(label).map_or((c, ""), |rest| (label, rest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::models::model_by_name;

    fn h100() -> &'static GpuModel {
        model_by_name("H100-80GB").unwrap()
    }

    fn starts(layout: &[MigInstanceSpec]) -> Vec<(String, u32)> {
        layout.iter().map(|i| (i.profile.clone(), i.placement.start)).collect()
    }

    #[test]
    fn backtracks_to_put_3g_at_4() {
        let layout = solve_named(h100(), &["3g.40gb", "2g.20gb", "2g.20gb"]).unwrap();
        assert_eq!(
            starts(&layout),
            [("2g.20gb".into(), 0), ("2g.20gb".into(), 2), ("3g.40gb".into(), 4)]
        );
    }

    #[test]
    fn full_gpu_and_mixed_layouts_fit() {
        assert_eq!(
            solve_named(h100(), &["7g.80gb"]).unwrap()[0].placement,
            Placement { start: 0, size: 8 }
        );
        let l = solve_named(h100(), &["4g.40gb", "3g.40gb"]).unwrap();
        assert_eq!(starts(&l), [("4g.40gb".into(), 0), ("3g.40gb".into(), 4)]);
        assert_eq!(solve_named(h100(), &["1g.10gb"; 7]).unwrap().len(), 7);
        assert_eq!(solve_named(h100(), &["1g.20gb"; 4]).unwrap().len(), 4);
    }

    #[test]
    fn explains_budget_failures() {
        let err = |p: &[&str]| solve_named(h100(), p).unwrap_err().to_string();
        assert_eq!(
            err(&["4g.40gb", "4g.40gb"]),
            "4g.40gb allows 1 instance per GPU, 2 requested"
        );
        assert_eq!(err(&["4g.40gb", "2g.20gb", "2g.20gb"]), "compute slices 8 > 7");
        assert_eq!(
            err(&["1g.10gb+me", "1g.10gb+me"]),
            "1g.10gb+me allows 1 instance per GPU, 2 requested"
        );
        assert_eq!(
            err(&["1g.20gb", "1g.20gb", "1g.20gb", "3g.40gb"]),
            "memory slices 10 > 8"
        );
        assert!(
            err(&["5g.50gb"]).starts_with("unknown MIG profile \"5g.50gb\" for H100-80GB; its profiles are 1g.10gb,")
        );
    }

    #[test]
    fn explains_placement_failures() {
        // 2g at 0,2,4 leaves slice 6 and 7, where a 2g cannot start; budgets (6 compute, 8 memory) are fine.
        let e = solve_named(h100(), &["3g.40gb", "2g.20gb", "1g.20gb"]);
        assert!(e.is_ok(), "3g@4, 2g@0, 1g.20gb@2 fits: {e:?}");
        let e = solve_named(h100(), &["3g.40gb", "3g.40gb", "1g.10gb"]).unwrap_err();
        assert_eq!(e, LayoutError::MemoryExceeded { requested: 9 });
        let e = solve_named(h100(), &["4g.40gb", "1g.20gb", "1g.20gb", "1g.20gb"])
            .unwrap_err()
            .to_string();
        assert_eq!(e, "memory slices 10 > 8");
        let e = solve_named(h100(), &["2g.20gb", "2g.20gb", "2g.20gb", "1g.20gb"]).unwrap();
        assert_eq!(e.last().unwrap().placement, Placement { start: 6, size: 2 });
        let e = solve_named(h100(), &["4g.40gb", "2g.20gb", "1g.10gb+me"]).unwrap();
        assert_eq!(e.len(), 3);
        assert!(solve_named(h100(), &["3g.40gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb"]).is_ok());
        // Budgets fine, placements not: kept 1g instances at 1 and 5 block both 3g starts.
        let e = solve_shapes(&[Shape::ThreeSlice], &[(Shape::OneSlice, 1), (Shape::OneSlice, 5)]).unwrap_err();
        let e = name_error(h100(), e).to_string();
        assert_eq!(
            e,
            "no arrangement of 3g.40gb fits in 8 memory slices: 3g.40gb needs 4 memory slices starting at 0 or 4; \
             1g.10gb kept at 1; 1g.10gb kept at 5"
        );
    }
}
