//! The admission policies and bindings of a pass, written so that no namespace that is not
//! exempt is ever under no rule set while it moves between two (a tenant's and the no-tenant
//! one, or two tenants'): a namespace leaves a rule set only once the store shows it under the
//! one it goes to. While both hold it the stricter answer wins (the no-tenant rules give it no
//! GPUs), for the one pass the move takes.
//!
//! - A tenant's binding keeps a namespace it no longer should have until the live no-tenant
//!   binding, or another tenant's live binding that is to keep it, covers it. A deleted tenant's
//!   binding stays while it holds any namespace, and is then deleted.
//! - The no-tenant binding leaves out a tenant's namespace only once that tenant's live binding
//!   (with its policy) covers it.
//! - A live binding is moved to another policy (the tenants' shared policy, from an earlier
//!   version's policy per tenant) only once the store shows that policy, and a policy is deleted
//!   only once no live binding, and no binding this pass writes, names it.
//!
//! "Live" is the controller's store: a write of this pass counts once its watch event is in, so
//! the order within a pass does not matter. An older selector (the label selectors of earlier
//! versions) reads as covering nothing, so an upgrade holds namespaces rather than drop them.

#[cfg(test)]
use super::owned::Seen;
use super::owned::{Contained, owned};
use super::write::{Kind, Write};
use crate::controller::stores::Snapshot;
use crate::desired::{
    CLAIMS_PREFIX, Coverage, Desired, POLICY_PREFIX, TENANTS_CLAIMS_POLICY, TENANTS_POLICY, UNTENANTED_CLAIMS_POLICY,
    UNTENANTED_POLICY, coverage, tenant_bindings, untenanted_bindings,
};
use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use kube::ResourceExt;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// The two halves of every rule set, each with its own bindings: the pod policy and the claims
/// policy. Each is moved between rule sets on its own, by the same rules, so neither ever leaves a
/// namespace under none of its kind; both are bound to the same namespaces once settled.
#[derive(Clone, Copy, Debug)]
enum Half {
    Pods = 0,
    Claims = 1,
}

impl Half {
    const BOTH: [Half; 2] = [Half::Pods, Half::Claims];

    fn tenant_prefix(self) -> &'static str {
        match self {
            Half::Pods => POLICY_PREFIX,
            Half::Claims => CLAIMS_PREFIX,
        }
    }

    fn untenanted(self) -> &'static str {
        match self {
            Half::Pods => UNTENANTED_POLICY,
            Half::Claims => UNTENANTED_CLAIMS_POLICY,
        }
    }

    /// The policy every tenant's binding of this half names.
    fn tenants_policy(self) -> &'static str {
        match self {
            Half::Pods => TENANTS_POLICY,
            Half::Claims => TENANTS_CLAIMS_POLICY,
        }
    }

    /// The tenant a binding name of this half is for.
    fn tenant_of(self, name: &str) -> Option<&str> {
        name.strip_prefix(self.tenant_prefix())
    }

    fn tenant_binding(self, tenant: &str, ns: &BTreeSet<String>) -> Option<ValidatingAdmissionPolicyBinding> {
        tenant_bindings(tenant, ns).map(|b| b[self as usize].clone())
    }

    fn untenanted_binding(self, excluded: &BTreeSet<String>) -> ValidatingAdmissionPolicyBinding {
        untenanted_bindings(excluded)[self as usize].clone()
    }
}

/// Is `name` one of the rule-set bindings or policies (of either half)?
fn of_a_rule_set(name: &str) -> bool {
    Half::BOTH
        .iter()
        .any(|h| name == h.untenanted() || h.tenant_of(name).is_some())
}

/// What the store shows each binding covering, for bindings whose policy is live too (a binding
/// without its policy enforces nothing).
fn live_coverage(live: &Snapshot) -> BTreeMap<String, Coverage> {
    let policies: BTreeSet<String> = live.admission_policies.iter().map(|p| p.name_any()).collect();
    live.admission_bindings
        .iter()
        .filter(|b| policies.contains(&b.spec.policy_name))
        .map(|b| (b.name_any(), coverage(b)))
        .collect()
}

/// The bindings of one half.
fn half_bindings(
    half: Half,
    d: &Desired,
    desired_bindings: &HashMap<&str, &Arc<ValidatingAdmissionPolicyBinding>>,
    covered: &BTreeMap<String, Coverage>,
    live: &Snapshot,
) -> Vec<Arc<ValidatingAdmissionPolicyBinding>> {
    let desired_ns = &d.namespace_rules.tenants;
    let live_tenant_ns = |t: &str| -> BTreeSet<String> {
        match covered.get(&format!("{}{t}", half.tenant_prefix())) {
            Some(Coverage::Only(s)) => s.clone(),
            _ => BTreeSet::new(),
        }
    };
    let none_live = covered.get(half.untenanted());
    // Is `ns` safe under a rule set other than tenant `except`'s, one that is to keep it?
    let safe_elsewhere = |ns: &str, except: &str| {
        none_live.is_some_and(|c| c.covers(ns))
            || desired_ns
                .iter()
                .any(|(t, want)| t != except && want.contains(ns) && live_tenant_ns(t).contains(ns))
    };
    // Until the store shows the tenants' policy, a live binding naming another (an earlier
    // version's policy of its own) stays as it is: moved before its new policy is there, it would
    // enforce nothing.
    let policy_live = live
        .admission_policies
        .iter()
        .any(|p| p.name_any() == half.tenants_policy());
    let stays_as_live = |name: &str| -> Option<Arc<ValidatingAdmissionPolicyBinding>> {
        if policy_live {
            return None;
        }
        live.admission_bindings
            .iter()
            .find(|b| b.name_any() == name && b.spec.policy_name != half.tenants_policy())
            .cloned()
    };

    let tenants: BTreeSet<&str> = desired_ns
        .keys()
        .map(String::as_str)
        .chain(covered.keys().filter_map(|b| half.tenant_of(b)))
        .collect();
    let mut bindings = Vec::new();
    let mut leave_out: BTreeSet<String> = d.namespace_rules.exempt.clone();
    let empty = BTreeSet::new();
    for t in tenants {
        let want = desired_ns.get(t).unwrap_or(&empty);
        let had = live_tenant_ns(t);
        let held: BTreeSet<String> = had
            .difference(want)
            .filter(|ns| !safe_elsewhere(ns, t))
            .cloned()
            .collect();
        leave_out.extend(want.intersection(&had).cloned());
        let name = format!("{}{t}", half.tenant_prefix());
        if let Some(b) = stays_as_live(&name) {
            bindings.push(b);
            continue;
        }
        if held.is_empty() {
            // Bound to what the tenant wants: the desired state's binding, made from the same set.
            if let Some(b) = desired_bindings.get(name.as_str()) {
                bindings.push(Arc::clone(b));
                continue;
            }
        }
        let write: BTreeSet<String> = want.union(&held).cloned().collect();
        if let Some(b) = half.tenant_binding(t, &write) {
            bindings.push(Arc::new(b));
        }
    }
    bindings.push(Arc::new(half.untenanted_binding(&leave_out)));
    bindings
}

/// The validating bindings a pass writes: each rule set's, moved by the rules above, and the
/// other bindings of the desired state, by name.
pub(super) fn bindings(d: &Desired, live: &Snapshot) -> Vec<Arc<ValidatingAdmissionPolicyBinding>> {
    let covered = live_coverage(live);
    let desired_bindings: HashMap<&str, &Arc<ValidatingAdmissionPolicyBinding>> = d
        .admission_bindings
        .iter()
        .filter_map(|b| Some((b.metadata.name.as_deref()?, b)))
        .collect();
    let mut bindings: Vec<Arc<ValidatingAdmissionPolicyBinding>> = Vec::new();
    for half in Half::BOTH {
        bindings.extend(half_bindings(half, d, &desired_bindings, &covered, live));
    }
    // The other bindings of the desired state (the ConfigMap-key policy's).
    bindings.extend(
        d.admission_bindings
            .iter()
            .filter(|b| !of_a_rule_set(&b.name_any()))
            .cloned(),
    );
    crate::api::sort_shared_by_name(&mut bindings);
    bindings
}

/// The validating policies' writes: applies into `writes`, deletes into `deletes`. Policies go
/// before bindings (a binding names its policy); their deletes after the bindings', and only of
/// policies no binding names, live or written now (`bindings`: a binding whose move to another
/// policy failed still enforces its old one).
pub(super) fn policy_writes(
    desired: &[Arc<ValidatingAdmissionPolicy>],
    live: &Snapshot,
    bindings: &[Arc<ValidatingAdmissionPolicyBinding>],
    seen: &mut Contained<Arc<ValidatingAdmissionPolicy>>,
    writes: &mut Vec<Write>,
    deletes: &mut Vec<Write>,
) {
    let named: BTreeSet<&str> = live
        .admission_bindings
        .iter()
        .chain(bindings)
        .map(|b| b.spec.policy_name.as_str())
        .collect();
    let mut policy_deletes = Vec::new();
    owned::<_, ValidatingAdmissionPolicy, _>(
        Kind::ValidatingAdmissionPolicy,
        desired,
        &live.admission_policies,
        seen,
        writes,
        &mut policy_deletes,
    );
    deletes.extend(policy_deletes.into_iter().filter(|w| !named.contains(w.name())));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::NamespaceRules;
    use proptest::prelude::*;
    use serde_json::json;

    const NAMESPACES: [&str; 5] = ["n0", "n1", "n2", "n3", "n4"];
    const TENANTS: [&str; 3] = ["t0", "t1", "t2"];

    fn policy(name: &str) -> ValidatingAdmissionPolicy {
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"validations": [{"expression": "true"}]}}))
            .unwrap()
    }

    /// The admission part of a desired state whose tenants own `owners[i]` (an index into
    /// [`TENANTS`], or none) of each namespace.
    fn desired(owners: &[Option<usize>]) -> Desired {
        let mut rules = NamespaceRules {
            exempt: BTreeSet::from(["kube-system".to_string()]),
            tenants: TENANTS.iter().map(|t| (t.to_string(), BTreeSet::new())).collect(),
        };
        for (ns, owner) in NAMESPACES.iter().zip(owners) {
            if let Some(t) = owner {
                rules.tenants.get_mut(TENANTS[*t]).unwrap().insert(ns.to_string());
            }
        }
        let mut d = Desired {
            namespace_rules: Arc::new(rules.clone()),
            ..Desired::default()
        };
        for name in [TENANTS_POLICY, TENANTS_CLAIMS_POLICY] {
            d.admission_policies.push(Arc::new(policy(name)));
        }
        for (t, ns) in &rules.tenants {
            for b in tenant_bindings(t, ns).into_iter().flatten() {
                d.admission_bindings.push(Arc::new(b));
            }
        }
        for b in untenanted_bindings(&rules.untenanted_excluded()) {
            d.admission_policies.push(Arc::new(policy(&b.name_any())));
            d.admission_bindings.push(Arc::new(b));
        }
        d
    }

    /// What an earlier version left settled for `owners`: a policy of its own per tenant and
    /// half, each tenant's bindings naming it.
    fn earlier_version(owners: &[Option<usize>]) -> Snapshot {
        let d = desired(owners);
        let mut live = Snapshot::default();
        for b in &d.admission_bindings {
            let mut b = (**b).clone();
            if b.spec.policy_name == TENANTS_POLICY || b.spec.policy_name == TENANTS_CLAIMS_POLICY {
                b.spec.policy_name = b.name_any();
            }
            live.admission_policies.push(Arc::new(policy(&b.spec.policy_name)));
            live.admission_bindings.push(Arc::new(b));
        }
        live
    }

    /// Makes the writes whose bit is set in `ok` (the others fail), as the API server would.
    fn apply(live: &mut Snapshot, writes: &[Write], ok: u64) {
        for (i, w) in writes.iter().enumerate() {
            if ok & (1 << (i % 64)) == 0 {
                continue;
            }
            match w {
                Write::Apply { kind, object, name, .. } => match kind {
                    Kind::ValidatingAdmissionPolicy => {
                        live.admission_policies.retain(|p| &p.name_any() != name);
                        live.admission_policies
                            .push(serde_json::from_value(object.clone()).unwrap());
                    }
                    Kind::ValidatingAdmissionPolicyBinding => {
                        live.admission_bindings.retain(|p| &p.name_any() != name);
                        live.admission_bindings
                            .push(serde_json::from_value(object.clone()).unwrap());
                    }
                    _ => unreachable!(),
                },
                Write::Delete { kind, name, .. } => match kind {
                    Kind::ValidatingAdmissionPolicy => live.admission_policies.retain(|p| &p.name_any() != name),
                    Kind::ValidatingAdmissionPolicyBinding => live.admission_bindings.retain(|p| &p.name_any() != name),
                    _ => unreachable!(),
                },
                _ => unreachable!(),
            }
        }
    }

    /// The policy and binding writes of a pass: applies, then binding deletes, then policy
    /// deletes.
    fn pass(d: &Desired, live: &Snapshot) -> Vec<Write> {
        let (mut w, mut bd, mut pd) = (vec![], vec![], vec![]);
        let b = bindings(d, live);
        let mut seen = Seen::default();
        policy_writes(
            &d.admission_policies,
            live,
            &b,
            &mut seen.admission_policies,
            &mut w,
            &mut pd,
        );
        let binding = Kind::ValidatingAdmissionPolicyBinding;
        owned::<_, ValidatingAdmissionPolicyBinding, _>(
            binding,
            &b,
            &live.admission_bindings,
            &mut seen.admission_bindings,
            &mut w,
            &mut bd,
        );
        w.extend(bd);
        w.extend(pd);
        w
    }

    /// The namespaces under no rule set the live objects enforce, for pods or for claims.
    fn uncovered(live: &Snapshot) -> Vec<&'static str> {
        let c = live_coverage(live);
        let covers = |half: Half, ns: &str| {
            c.iter()
                .any(|(name, cov)| (name == half.untenanted() || half.tenant_of(name).is_some()) && cov.covers(ns))
        };
        NAMESPACES
            .iter()
            .copied()
            .filter(|ns| Half::BOTH.iter().any(|h| !covers(*h, ns)))
            .collect()
    }

    /// One pass's writes, all made; their names.
    fn step(d: &Desired, live: &mut Snapshot) -> Vec<String> {
        let w = pass(d, live);
        apply(live, &w, u64::MAX);
        w.iter().map(ToString::to_string).collect()
    }

    fn settle(d: &Desired, live: &mut Snapshot) {
        for _ in 0..4 {
            let w = pass(d, live);
            if w.is_empty() {
                return;
            }
            apply(live, &w, u64::MAX);
        }
        panic!("did not settle: {:?}", pass(d, live));
    }

    fn owners() -> impl Strategy<Value = Vec<Option<usize>>> {
        proptest::collection::vec(proptest::option::of(0..TENANTS.len()), NAMESPACES.len())
    }

    proptest! {
        /// From any settled state to any other, with any writes of any pass failing (and made
        /// again by a later pass), no namespace is ever under no rule set, and the cluster ends
        /// as the new desired state with nothing more to write.
        #[test]
        fn no_namespace_is_ever_under_no_rule_set(
            before in owners(),
            after in owners(),
            failures in proptest::collection::vec(any::<u64>(), 1..6),
        ) {
            let mut live = Snapshot::default();
            settle(&desired(&before), &mut live);
            prop_assert_eq!(uncovered(&live), Vec::<&str>::new());
            let d = desired(&after);
            for ok in failures {
                let w = pass(&d, &live);
                apply(&mut live, &w, ok);
                prop_assert_eq!(uncovered(&live), Vec::<&str>::new(), "after {:?} of {:?}", ok, w);
            }
            settle(&d, &mut live);
            prop_assert_eq!(uncovered(&live), Vec::<&str>::new());
            let mut got: Vec<String> = live.admission_bindings.iter().map(|b| serde_json::to_string(b).unwrap()).collect();
            let mut want: Vec<String> = d.admission_bindings.iter().map(|b| serde_json::to_string(b).unwrap()).collect();
            got.sort();
            want.sort();
            prop_assert_eq!(got, want);
        }

        /// From what an earlier version left (a policy per tenant, its bindings naming it) to the
        /// tenants' shared policies, with any writes failing: no namespace is ever under no rule
        /// set, and the cluster ends as desired, every earlier policy deleted.
        #[test]
        fn an_upgrade_to_the_shared_policies_never_leaves_a_namespace_under_none(
            before in owners(),
            after in owners(),
            failures in proptest::collection::vec(any::<u64>(), 1..6),
        ) {
            let mut live = earlier_version(&before);
            prop_assert_eq!(uncovered(&live), Vec::<&str>::new());
            let d = desired(&after);
            for ok in failures {
                let w = pass(&d, &live);
                apply(&mut live, &w, ok);
                prop_assert_eq!(uncovered(&live), Vec::<&str>::new(), "after {:?} of {:?}", ok, w);
            }
            settle(&d, &mut live);
            prop_assert_eq!(uncovered(&live), Vec::<&str>::new());
            let mut got: Vec<String> = live.admission_policies.iter().map(|p| p.name_any()).collect();
            let mut want: Vec<String> = d.admission_policies.iter().map(|p| p.name_any()).collect();
            got.sort();
            want.sort();
            prop_assert_eq!(got, want);
        }
    }

    /// A deleted tenant's namespace stays under its rules until the no-tenant binding covers it:
    /// the first pass widens the no-tenant binding and keeps the tenant's, the second deletes
    /// the tenant's binding; the tenants' policy stays for the others.
    #[test]
    fn a_removed_tenant_keeps_its_rules_until_the_no_tenant_rules_hold() {
        let mut live = Snapshot::default();
        settle(&desired(&[Some(0), None, None, None, None]), &mut live);
        let d = desired(&[None; 5]);
        assert_eq!(
            step(&d, &mut live),
            [
                "apply ValidatingAdmissionPolicyBinding gputenancy.io-claims-no-tenant",
                "apply ValidatingAdmissionPolicyBinding gputenancy.io-no-tenant"
            ]
        );
        assert_eq!(
            step(&d, &mut live),
            [
                "delete ValidatingAdmissionPolicyBinding gputenancy.io-claims-tenant-t0",
                "delete ValidatingAdmissionPolicyBinding gputenancy.io-tenant-t0",
            ]
        );
    }

    /// An earlier version's tenant binding moves to the tenants' policy only once the store shows
    /// that policy, and the earlier policy is deleted only once no binding names it.
    #[test]
    fn an_upgrade_moves_bindings_after_the_shared_policy_and_deletes_after_the_move() {
        let owners = [Some(0), None, None, None, None];
        let mut live = earlier_version(&owners);
        let d = desired(&owners);
        assert_eq!(
            step(&d, &mut live),
            [
                "apply ValidatingAdmissionPolicy gputenancy.io-tenants",
                "apply ValidatingAdmissionPolicy gputenancy.io-claims-tenants",
            ]
        );
        assert_eq!(
            step(&d, &mut live),
            [
                "apply ValidatingAdmissionPolicyBinding gputenancy.io-claims-tenant-t0",
                "apply ValidatingAdmissionPolicyBinding gputenancy.io-tenant-t0",
            ]
        );
        assert_eq!(
            step(&d, &mut live),
            [
                "delete ValidatingAdmissionPolicy gputenancy.io-claims-tenant-t0",
                "delete ValidatingAdmissionPolicy gputenancy.io-tenant-t0",
            ]
        );
    }
}
