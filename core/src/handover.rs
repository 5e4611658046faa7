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
//!
//! [`HandOverEvidence`] (its type is the API's) is what a DRA hand-over leaves for the tenant and for auditors: what was
//! done to the device's memory before the claim got it, and how the previous holder relates to the
//! claim's tenant, never who it was (docs/concepts/dra.md#hand-over-evidence). The agent writes it in
//! the ResourceClaim's `status.devices` and in the GpuNode's `status.claims`.

use crate::api::Mode;
pub use crate::api::evidence::{HandOverEvidence, PreviousHolder, ScrubEvidence};

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
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn the_previous_holder_is_a_relation_never_a_name() {
        assert_eq!(PreviousHolder::of(Some("a"), "a"), PreviousHolder::SameTenant);
        assert_eq!(PreviousHolder::of(Some("b"), "a"), PreviousHolder::OtherTenant);
        assert_eq!(PreviousHolder::of(None, "a"), PreviousHolder::Unknown);
        // What a tenant reads, written out by hand: the field names and values of the docs.
        let e = HandOverEvidence {
            scrub: ScrubEvidence::Scrubbed,
            bytes_verified: Some(4096),
            scrubbed_at: Some(Time(jiff::Timestamp::from_second(1_800_000_000).unwrap())),
            handed_over_at: Some(Time(jiff::Timestamp::from_second(1_800_000_001).unwrap())),
            previous_holder: PreviousHolder::OtherTenant,
        };
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            serde_json::json!({"scrub": "Scrubbed", "bytesVerified": 4096, "scrubbedAt": "2027-01-15T08:00:00Z",
                "handedOverAt": "2027-01-15T08:00:01Z", "previousHolder": "OtherTenant"})
        );
        assert_eq!(
            serde_json::to_value(HandOverEvidence::unknown()).unwrap(),
            serde_json::json!({"scrub": "Unknown", "previousHolder": "Unknown"})
        );
    }

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
