//! What each rule set refuses in ResourceClaims and ResourceClaimTemplates: the DRA mode's side of
//! the tenancy rules. Every namespace's claims are under the same rule set as its pods (a tenant's
//! or the no-tenant one), bound to the same namespaces (`controller::diff::admission` moves both
//! together).
//!
//! A claim may name only device classes of its own rule set: a tenant's own classes
//! (`desired::dra`) and the classes the controller's `--claim-device-class` trusts; a namespace of
//! no tenant only the latter. A class's name does not say which devices its selectors reach, so
//! no other class is trusted. Whatever the class, a claim may not:
//! - ask for `adminAccess` (it would reach devices in use by other claims);
//! - tolerate the device taint `gputenancy.io/not-ready`, or every taint (a device not yet safe
//!   to hand over: Prepare would refuse it, so the pod would never start);
//! - pass this driver opaque parameters (the plan sets every device's settings; none is accepted
//!   from a claim, so none is silently ignored);
//! - ask for all devices of one of its tenant's classes (`allocationMode: All`), or more of them
//!   at once than `limits.maxGpusPerPod`.

use super::cel::{exact, list, quote, validation_with};
use super::rules::TenantRules;
use crate::desired::Settings;
use crate::dra::{DRIVER, NOT_READY_TAINT};
use k8s_openapi::api::admissionregistration::v1::Validation;
use serde_json::{Value, json};

/// The variables of a claims policy: the devices part of a claim (or of a template's claim), its
/// requests, each request's alternatives as one list (`exactly`, or each of `firstAvailable`),
/// and the classes they name. `dyn`: one policy reads both kinds.
pub fn variables() -> Value {
    json!([
        {"name": "devices", "expression":
            "request.resource.resource == 'resourceclaims' ? (has(dyn(object).spec.devices) ? dyn(object).spec.devices : {}) : (has(dyn(object).spec.spec) && has(dyn(object).spec.spec.devices) ? dyn(object).spec.spec.devices : {})"},
        {"name": "requests", "expression": "has(variables.devices.requests) ? variables.devices.requests : []"},
        {"name": "alternatives", "expression":
            "variables.requests.map(r, has(r.exactly) ? [r.exactly] : (has(r.firstAvailable) ? r.firstAvailable : []))"},
        {"name": "subrequests", "expression": "variables.alternatives.flatten()"},
        {"name": "classes", "expression": "variables.subrequests.map(s, s.deviceClassName)"},
    ])
}

/// The rules of every rule set; `who` is a CEL string expression, `allowed` the classes it may
/// name and `offer` what to tell a claim that names another.
fn common(who: &str, allowed: &[String], offer: &str) -> Vec<Validation> {
    let allowed = list(allowed);
    vec![
        validation_with(
            &format!("variables.classes.exists(c, !(c in {allowed}))"),
            format!(
                "{who} + ': a claim may not name device class ' + variables.classes.filter(c, !(c in {allowed})).distinct().join(', ') + ': {offer}'"
            ),
        ),
        validation_with(
            "variables.subrequests.exists(s, has(s.adminAccess) && s.adminAccess)",
            format!("{who} + ': a claim may not ask for adminAccess: it reaches devices other claims hold'"),
        ),
        validation_with(
            &format!(
                "variables.subrequests.exists(s, has(s.tolerations) && s.tolerations.exists(t, !has(t.key) || t.key == '' || t.key == {}))",
                quote(NOT_READY_TAINT)
            ),
            format!(
                "{who} + ': a claim may not tolerate {NOT_READY_TAINT} (or every taint): a device carries it until it is safe to hand over, and the driver refuses it until then'"
            ),
        ),
        validation_with(
            &format!(
                "has(variables.devices.config) && variables.devices.config.exists(c, has(c.opaque) && c.opaque.driver == {})",
                quote(DRIVER)
            ),
            format!(
                "{who} + ': a claim may not pass {DRIVER} parameters: the GpuPartitionPlan sets every device\\'s settings, and the driver accepts none from a claim'"
            ),
        ),
    ]
}

/// The classes the settings trust in every namespace.
fn trusted(settings: &Settings) -> String {
    if settings.claim_device_classes.is_empty() {
        "none".into()
    } else {
        settings.claim_device_classes.join(", ")
    }
}

/// A tenant's claims rules.
pub fn tenant(t: &TenantRules, settings: &Settings) -> Vec<Validation> {
    let who = quote(&format!("GpuTenant {} (tier {})", t.name, t.tier));
    let own: Vec<String> = t
        .granted
        .as_ref()
        .map(|g| g.classes.iter().cloned().collect())
        .unwrap_or_default();
    let mut allowed = own.clone();
    allowed.extend(settings.claim_device_classes.iter().cloned());
    let offer = format!(
        "its own device classes are {} (one per kind of device it holds on DRA nodes), and the controller\\'s --claim-device-class trusts {}",
        if own.is_empty() { "none".into() } else { own.join(", ") },
        trusted(settings)
    );
    let mut out = common(&who, &allowed, &offer);
    let own = list(&own);
    out.push(validation_with(
        &format!("variables.subrequests.exists(s, s.deviceClassName in {own} && has(s.allocationMode) && s.allocationMode == 'All')"),
        format!("{who} + ': a claim may not ask for all devices of a class (allocationMode All); ask for a count'"),
    ));
    if let Some(max) = t.max_gpus_per_pod {
        // Per request its largest alternative: the most it can be allocated.
        let count = format!("(s.deviceClassName in {own} ? (has(s.count) ? s.count : 1) : 0)");
        let devices = format!("variables.alternatives.map(a, (a.map(s, {count}) + [0]).max()).sum()");
        out.push(Validation {
            expression: exact(format!("{devices} <= {max}")),
            message: None,
            message_expression: Some(exact(format!(
                "{who} + ' allows at most {max} GPUs per pod (spec.limits.maxGpusPerPod); this claim asks for ' + string({devices}) + ' devices of its classes'"
            ))),
            reason: Some("Forbidden".into()),
        });
    }
    out
}

/// The claims rules of the namespaces of no tenant.
pub fn untenanted(settings: &Settings) -> Vec<Validation> {
    let who = quote("the namespace belongs to no GpuTenant");
    let offer = format!(
        "a namespace of no tenant gets no GPU device; add it to a tenant\\'s spec.namespaces. The controller\\'s --claim-device-class trusts {}",
        trusted(settings)
    );
    common(&who, &settings.claim_device_classes, &offer)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The messages are CEL string expressions: each `who` is quoted, each apostrophe escaped.
    #[test]
    fn messages_quote_what_they_name() {
        let v = untenanted(&Settings::default());
        assert_eq!(v.len(), 4);
        let m = v[0].message_expression.as_deref().unwrap();
        assert!(m.starts_with("'the namespace belongs to no GpuTenant' + "), "{m}");
        assert!(m.contains("tenant\\'s spec.namespaces"), "{m}");
    }
}
