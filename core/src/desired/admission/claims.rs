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

use super::cel::{exact, list, quote, shown, validation_with};
use crate::desired::settings::Settings;
use crate::dra::{DRIVER, NOT_READY_TAINT, UNHEALTHY_TAINT};
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

/// The rules of every rule set; `who` is a CEL string expression, `allowed` a CEL list of the
/// classes it may name and `offer` a CEL string expression telling a claim that names another
/// what it may name.
fn common(who: &str, allowed: &str, offer: &str) -> Vec<Validation> {
    vec![
        validation_with(
            &format!("variables.classes.exists(c, !(c in {allowed}))"),
            format!(
                "{who} + ': a claim may not name device class ' + variables.classes.filter(c, !(c in {allowed})).distinct().join(', ') + ': ' + {offer}"
            ),
        ),
        validation_with(
            "variables.subrequests.exists(s, has(s.adminAccess) && s.adminAccess)",
            format!("{who} + ': a claim may not ask for adminAccess: it reaches devices other claims hold'"),
        ),
        validation_with(
            &format!(
                "variables.subrequests.exists(s, has(s.tolerations) && s.tolerations.exists(t, !has(t.key) || t.key == '' || t.key == {} || t.key == {}))",
                quote(NOT_READY_TAINT),
                quote(UNHEALTHY_TAINT)
            ),
            format!(
                "{who} + ': a claim may not tolerate {NOT_READY_TAINT} or {UNHEALTHY_TAINT} (or every taint): a device carries them until it is safe to hand over, and the driver refuses it until then'"
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

/// The tenants' claims rules, one policy for every tenant. The tenant's own classes and its
/// `maxGpusPerPod` are read from the policy's parameter (`variables.ownClasses`,
/// `variables.maxGpus`, [`super::cel::param_variables`]).
pub fn tenant(settings: &Settings) -> Vec<Validation> {
    let who = "variables.who";
    let own = "variables.ownClasses";
    let allowed = format!("({own} + {})", list(&settings.claim_device_classes));
    let offer = format!(
        "'its own device classes are ' + {} + ' (one per kind of device it holds on DRA nodes), and the controller\\'s --claim-device-class trusts {}'",
        shown(own),
        trusted(settings)
    );
    let mut out = common(who, &allowed, &offer);
    out.push(validation_with(
        &format!("variables.subrequests.exists(s, s.deviceClassName in {own} && has(s.allocationMode) && s.allocationMode == 'All')"),
        format!("{who} + ': a claim may not ask for all devices of a class (allocationMode All); ask for a count'"),
    ));
    // Per request its largest alternative: the most it can be allocated.
    let count = format!("(s.deviceClassName in {own} ? (has(s.count) ? s.count : 1) : 0)");
    let devices = format!("variables.alternatives.map(a, (a.map(s, {count}) + [0]).max()).sum()");
    out.push(Validation {
        expression: exact(format!("variables.maxGpus < 0 || {devices} <= variables.maxGpus")),
        message: None,
        message_expression: Some(exact(format!(
            "{who} + ' allows at most ' + string(variables.maxGpus) + ' GPUs per pod (spec.limits.maxGpusPerPod); this claim asks for ' + string({devices}) + ' devices of its classes'"
        ))),
        reason: Some("Forbidden".into()),
    });
    out
}

/// The claims rules of the namespaces of no tenant.
pub fn untenanted(settings: &Settings) -> Vec<Validation> {
    let who = quote("the namespace belongs to no GpuTenant");
    let offer = format!(
        "'a namespace of no tenant gets no GPU device; add it to a tenant\\'s spec.namespaces. The controller\\'s --claim-device-class trusts {}'",
        trusted(settings)
    );
    common(&who, &list(&settings.claim_device_classes), &offer)
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
