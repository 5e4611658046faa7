//! What counts as a change of hands of a GPU used whole (docs/design.md#scrub-on-change-of-hands): the one rule
//! the planner (which hand-overs it reports, when a node is tainted `scrub-pending`) and the agent
//! (when it scrubs) both apply.
//!
//! A GPU changes hands when its mode changes, or when its tenants change, but one case: on an MPS
//! or time-sliced GPU, tenants joining the ones it serves, none leaving. The planner puts tenants
//! on one shared GPU only when their tiers' `coLocation` lets them share it (`SameTier`: one tier;
//! a `Forbidden` tenant's GPU is locked to it), and while they share it nothing clears the memory
//! one of them frees before another allocates it: MPS and time-slicing have no scrub between
//! co-tenants, and the running tenant's live memory cannot be scrubbed at all. A scrub when a
//! co-tenant joins would protect only what the running tenant freed before the join, from a tenant
//! that sees everything it frees after; it would also wait for the running tenant's processes to
//! end. So a join is no change of hands, and it neither scrubs nor waits. A tenant leaving still is
//! one (what it leaves must be cleared before the GPU serves anyone without it, and a tenant of
//! another tier only comes after every tenant of the first has left), and so is a mode change.
//! The agent applies this only against a record it trusts (same GPU, a finished hand-over to the
//! tenants it names): an unknown previous owner is still a change of hands (fail closed).

use crate::api::Mode;

/// Whether a GPU used whole by `before` in `before_mode` (`None`: not known) changes hands when it
/// serves `after` in `after_mode`. Both tenant lists sorted or not; names compared as strings.
pub fn gpu_changes_hands<A: AsRef<str>, B: AsRef<str>>(
    before_mode: Option<Mode>,
    before: &[A],
    after_mode: Mode,
    after: &[B],
) -> bool {
    if before_mode != Some(after_mode) {
        return true;
    }
    let has = |list: &[B], t: &A| list.iter().any(|x| x.as_ref() == t.as_ref());
    let kept_all = before.iter().all(|t| has(after, t));
    let same = kept_all && before.len() == after.len();
    let joined_only = after_mode.is_shared() && !before.is_empty() && kept_all;
    !(same || joined_only)
}

#[cfg(test)]
mod tests {
    use super::gpu_changes_hands;
    use crate::api::Mode;

    #[test]
    fn only_a_join_on_a_shared_gpu_keeps_hands() {
        let none: [&str; 0] = [];
        for mode in [Mode::Mps, Mode::TimeSlicing] {
            assert!(!gpu_changes_hands(Some(mode), &["a"], mode, &["a"]));
            assert!(!gpu_changes_hands(Some(mode), &["a"], mode, &["a", "b"]), "b joins a");
            assert!(
                !gpu_changes_hands(Some(mode), &["b"], mode, &["a", "b"]),
                "order does not matter"
            );
            assert!(gpu_changes_hands(Some(mode), &["a", "b"], mode, &["a"]), "b leaves");
            assert!(gpu_changes_hands(Some(mode), &["a"], mode, &["b"]), "a leaves, b comes");
            assert!(gpu_changes_hands(Some(mode), &["a"], mode, &["b", "c"]));
            assert!(
                gpu_changes_hands(Some(mode), &none, mode, &["a"]),
                "a GPU nobody used: whose data?"
            );
            assert!(gpu_changes_hands(None, &["a"], mode, &["a", "b"]), "mode not known");
        }
        assert!(
            gpu_changes_hands(Some(Mode::Mps), &["a"], Mode::TimeSlicing, &["a", "b"]),
            "mode change"
        );
        assert!(
            gpu_changes_hands(Some(Mode::TimeSlicing), &["a"], Mode::Mps, &["a"]),
            "mode change"
        );
        assert!(!gpu_changes_hands(
            Some(Mode::Exclusive),
            &["a"],
            Mode::Exclusive,
            &["a"]
        ));
        assert!(
            gpu_changes_hands(Some(Mode::Exclusive), &["a"], Mode::Exclusive, &["a", "b"]),
            "an exclusive GPU is never joined"
        );
        assert!(!gpu_changes_hands(Some(Mode::Exclusive), &none, Mode::Exclusive, &none));
    }
}
