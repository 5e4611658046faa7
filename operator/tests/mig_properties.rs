//! Properties of the MIG solver and layout diff, checked against exhaustive search.

use gpu_tenancy::api::Placement;
use gpu_tenancy::mig::{
    COMPUTE_SLICES, ExistingInstance, MEMORY_SLICES, Shape, diff_layout, model_by_name, solve_shapes,
};
use proptest::prelude::*;

fn shapes() -> impl Strategy<Value = Vec<Shape>> {
    prop::collection::vec(prop::sample::select(Shape::ALL.to_vec()), 0..=8)
}

fn budgets_ok(shapes: &[Shape]) -> bool {
    Shape::ALL
        .iter()
        .all(|s| shapes.iter().filter(|x| *x == s).count() as u32 <= s.info().max_instances)
        && shapes.iter().map(|s| s.info().compute_slices).sum::<u32>() <= COMPUTE_SLICES
        && shapes.iter().map(|s| s.info().memory_slices).sum::<u32>() <= MEMORY_SLICES
}

fn mask(shape: Shape, start: u32) -> u16 {
    ((1u16 << shape.info().memory_slices) - 1) << start
}

/// A placement is valid when every instance starts where its shape may and nothing overlaps.
fn valid(shapes: &[Shape], starts: &[u32]) -> bool {
    let mut used = 0u16;
    for (s, &start) in shapes.iter().zip(starts) {
        if !s.info().starts.contains(&start) {
            return false;
        }
        let m = mask(*s, start);
        if used & m != 0 || (m >> MEMORY_SLICES) != 0 {
            return false;
        }
        used |= m;
    }
    budgets_ok(shapes)
}

/// Tries every combination of starts: the slow, obviously right answer.
fn exhaustive(shapes: &[Shape]) -> bool {
    fn go(shapes: &[Shape], i: usize, starts: &mut Vec<u32>) -> bool {
        if i == shapes.len() {
            return valid(shapes, starts);
        }
        for &s in shapes[i].info().starts {
            starts.push(s);
            if go(shapes, i + 1, starts) {
                return true;
            }
            starts.pop();
        }
        false
    }
    budgets_ok(shapes) && go(shapes, 0, &mut Vec::new())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn every_placement_returned_is_valid(shapes in shapes()) {
        if let Ok(starts) = solve_shapes(&shapes, &[]) {
            prop_assert!(valid(&shapes, &starts), "{shapes:?} -> {starts:?}");
        }
    }

    #[test]
    fn solver_agrees_with_exhaustive_search(shapes in shapes()) {
        prop_assert_eq!(solve_shapes(&shapes, &[]).is_ok(), exhaustive(&shapes), "{:?}", shapes);
    }

    #[test]
    fn diff_never_destroys_an_instance_it_could_keep(current in shapes(), desired in shapes()) {
        let model = model_by_name("H100-80GB").unwrap();
        // Only layouts that can exist are current layouts.
        let Ok(starts) = solve_shapes(&current, &[]) else { return Ok(()) };
        let existing: Vec<ExistingInstance> = current
            .iter()
            .zip(&starts)
            .map(|(s, &start)| ExistingInstance {
                profile: model.profile_for(*s).name.to_string(),
                placement: Placement { start, size: s.info().memory_slices },
                gpu_instance_id: None,
            })
            .collect();
        let names: Vec<&str> = desired.iter().map(|s| model.profile_for(*s).name).collect();
        let Ok(diff) = diff_layout(model, &existing, &names) else {
            prop_assert!(!exhaustive(&desired));
            return Ok(());
        };
        prop_assert_eq!(diff.keep.len() + diff.destroy.len(), existing.len());
        // The result is a valid layout of exactly the desired multiset.
        let result = diff.result();
        let mut got: Vec<Shape> = result.iter().map(|i| model.profile(&i.profile).unwrap().shape).collect();
        let rstarts: Vec<u32> = result.iter().map(|i| i.placement.start).collect();
        prop_assert!(valid(&got, &rstarts));
        let mut want = desired.clone();
        got.sort();
        want.sort();
        prop_assert_eq!(got, want);
        // Keeping any destroyed instance as well would leave no room for the rest.
        let shape_of = |i: &ExistingInstance| model.profile(&i.profile).unwrap().shape;
        let kept: Vec<(Shape, u32)> = diff.keep.iter().map(|k| (shape_of(k), k.placement.start)).collect();
        for d in &diff.destroy {
            let mut fixed = kept.clone();
            fixed.push((shape_of(d), d.placement.start));
            let mut rest = desired.clone();
            let mut fits_multiset = true;
            for (s, _) in &fixed {
                match rest.iter().position(|x| x == s) {
                    Some(p) => { rest.remove(p); }
                    None => fits_multiset = false,
                }
            }
            prop_assert!(!fits_multiset || solve_shapes(&rest, &fixed).is_err(),
                "could have kept {d:?} with {kept:?} for {desired:?}");
        }
    }
}
