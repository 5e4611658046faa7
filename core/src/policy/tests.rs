use super::*;
use crate::api::{GpuTenantSpec, SharingPolicySpec, Tier};

fn policy(name: &str) -> SharingPolicy {
    SharingPolicy::new(
        name,
        SharingPolicySpec {
            tiers: vec![
                Tier {
                    name: "external".into(),
                    modes: vec![Mode::Mig, Mode::Exclusive],
                    co_location: CoLocation::Forbidden,
                    scrub_memory: ScrubMemory::Always,
                    memory_caps: Default::default(),
                    pod_security: Default::default(),
                    priority_class_names: vec![],
                    idle_lending_percent: None,
                },
                Tier {
                    name: "internal".into(),
                    modes: vec![Mode::Mig, Mode::Mps, Mode::Exclusive],
                    co_location: CoLocation::SameTier,
                    scrub_memory: ScrubMemory::OnTenantChange,
                    memory_caps: Default::default(),
                    pod_security: Default::default(),
                    priority_class_names: vec![],
                    idle_lending_percent: None,
                },
            ],
            memory_headroom_percent: Some(10),
            mps: None,
            time_slicing: None,
            topology: None,
        },
    )
}

fn tenant(name: &str, tier: &str) -> GpuTenant {
    GpuTenant::new(
        name,
        GpuTenantSpec {
            tier: tier.into(),
            policy_ref: "default".into(),
            namespaces: vec![format!("{name}-ns")],
            priority: 0,
            weight: 1,
            resources: vec![],
            limits: None,
        },
    )
}

fn with(mut t: GpuTenant, mode: Mode, profile: Option<&str>, count: u32) -> GpuTenant {
    t.spec.resources.push(ResourceRequest {
        mode,
        profile: profile.map(str::to_string),
        count,
    });
    t
}

fn none() -> std::collections::BTreeSet<String> {
    std::collections::BTreeSet::new()
}

#[test]
fn valid_tenant_carries_its_tier() {
    let c = check_tenants(
        &[policy("default")],
        &[with(tenant("acme", "external"), Mode::Mig, Some("3g.40gb"), 2)],
        &none(),
    );
    assert!(c.invalid.is_empty(), "{:?}", c.invalid);
    assert_eq!(c.valid[0].co_location, CoLocation::Forbidden);
    assert_eq!(c.valid[0].headroom_percent, 10);
}

#[test]
fn tier_must_allow_every_mode() {
    let c = check_tenants(
        &[policy("default")],
        &[with(tenant("acme", "external"), Mode::Mps, None, 2)],
        &none(),
    );
    let p = &c.invalid["acme"][0];
    assert_eq!(
        p.to_string(),
        "GpuTenant/acme: spec.resources[0].mode: tier \"external\" does not allow MPS; it allows MIG, Exclusive"
    );
}

#[test]
fn unknown_policy_and_tier_are_named() {
    let mut t = tenant("a", "external");
    t.spec.policy_ref = "nope".into();
    let c = check_tenants(&[policy("default")], &[t, tenant("b", "gold")], &none());
    assert_eq!(
        c.invalid["a"][0].message,
        "SharingPolicy \"nope\" not found; create it or use one of: default"
    );
    assert_eq!(c.invalid["b"][0].field, "spec.tier");
    assert!(c.invalid["b"][0].message.contains("its tiers are external, internal"));
}

#[test]
fn shared_namespace_invalidates_both() {
    let mut b = tenant("b", "internal");
    b.spec.namespaces = vec!["a-ns".into()];
    let c = check_tenants(&[policy("default")], &[tenant("a", "internal"), b], &none());
    assert!(c.valid.is_empty());
    assert!(c.invalid["a"][0].message.contains("also claimed by GpuTenant/b"));
}

#[test]
fn duplicate_requests_and_bad_limits() {
    let mut t = with(with(tenant("a", "internal"), Mode::Mps, None, 1), Mode::Mps, None, 2);
    t.spec.limits = Some(crate::api::TenantLimits {
        max_gpus_per_pod: None,
        memory: Some("lots".into()),
    });
    let c = check_tenants(&[policy("default")], &[t], &none());
    let fields: Vec<&str> = c.invalid["a"].iter().map(|p| p.field.as_str()).collect();
    assert_eq!(fields, ["spec.resources[1]", "spec.limits.memory"]);
    assert_eq!(
        c.invalid["a"][0].message,
        "repeats spec.resources[0] (MPS); merge the counts"
    );
}

#[test]
fn duplicate_tier_names() {
    let mut p = policy("default");
    p.spec.tiers[1].name = "external".into();
    let problems = check_policies(&[p]);
    assert_eq!(problems[0].field, "spec.tiers[1].name");
}

/// A namespace the admission policies never judge cannot be a tenant's, and a tenant cannot hold
/// both MPS and time-slicing shares (the device plugin counts them under one name).
#[test]
fn exempt_namespaces_and_two_shared_modes_are_refused() {
    let mut t = with(
        with(tenant("a", "internal"), Mode::Mig, Some("1g.10gb"), 1),
        Mode::Mps,
        None,
        2,
    );
    t.spec.namespaces.push("kube-system".into());
    let exempt = std::collections::BTreeSet::from(["kube-system".to_string()]);
    let c = check_tenants(&[policy("default")], &[t], &exempt);
    assert_eq!(c.invalid["a"][0].field, "spec.namespaces[1]");
    assert!(
        c.invalid["a"][0].message.contains("\"kube-system\" is exempt"),
        "{}",
        c.invalid["a"][0]
    );

    let mut p = policy("default");
    p.spec.tiers[1].modes.push(Mode::TimeSlicing);
    let t = with(
        with(tenant("b", "internal"), Mode::TimeSlicing, None, 2),
        Mode::Mps,
        None,
        2,
    );
    let c = check_tenants(&[p], &[t], &none());
    assert_eq!(c.invalid["b"].len(), 1, "{:?}", c.invalid["b"]);
    assert_eq!(c.invalid["b"][0].field, "spec.resources[1].mode");
    assert!(
        c.invalid["b"][0]
            .message
            .starts_with("a tenant may hold MPS or TimeSlicing shares, not both")
    );
}

#[test]
fn the_showback_names_are_reserved() {
    let mut tenants = [
        tenant("unallocated", "internal"),
        tenant("shared", "internal"),
        tenant("unattributed", "internal"),
    ];
    for t in &mut tenants {
        t.spec.policy_ref = "default".into();
    }
    let check = check_tenants(&[policy("default")], &tenants, &none());
    for name in ["unallocated", "shared", "unattributed"] {
        let problems = &check.invalid[name];
        assert!(
            problems
                .iter()
                .any(|p| p.field == "metadata.name" && p.message.contains("reserved")),
            "{problems:?}"
        );
    }
}
