//! `metav1.Condition` helpers with kstatus semantics (docs/nvidia.md#kubernetes-conventions).

pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Condition types every resource publishes.
pub struct ConditionSet;

impl ConditionSet {
    pub const READY: &'static str = "Ready";
    pub const RECONCILING: &'static str = "Reconciling";
    pub const STALLED: &'static str = "Stalled";
    pub const VALID: &'static str = "Valid";
    pub const CAPACITY_SHORT: &'static str = "CapacityShort";
    /// On a GpuTenant: whether Kubernetes enforces which GPUs its pods get, or only how many.
    pub const ISOLATED: &'static str = "Isolated";
    /// On a GpuTenant with MPS or time-sliced shares: how their memory is capped.
    pub const MEMORY_CAPPED: &'static str = "MemoryCapped";
    /// On a GpuNode: compute processes on a GPU or MIG instance no tenant is granted.
    pub const UNGRANTED_USE: &'static str = "UngrantedUse";
    /// On a GpuNode: an MPS or time-sliced GPU whose memory is nearly all used.
    pub const SHARED_MEMORY_PRESSURE: &'static str = "SharedMemoryPressure";
}

/// Sets one condition in a list keyed by `type`. `lastTransitionTime` only moves when the status
/// flips, so re-publishing the same state leaves the object byte-identical (no write on no change).
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: impl Into<String> + AsRef<str>,
    observed_generation: Option<i64>,
    now: &Time,
) {
    let status = if status { "True" } else { "False" };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        // Fields are replaced only where they differ: most passes re-publish the same state, and
        // a fleet's thousands of objects each carry several conditions.
        Some(existing) => {
            if existing.status != status {
                existing.last_transition_time = now.clone();
                existing.status = status.to_string();
            }
            if existing.reason != reason {
                existing.reason = reason.to_string();
            }
            if existing.message != message.as_ref() {
                existing.message = message.into();
            }
            existing.observed_generation = observed_generation;
        }
        None => {
            conditions.push(Condition {
                type_: type_.to_string(),
                status: status.to_string(),
                reason: reason.to_string(),
                message: message.into(),
                observed_generation,
                last_transition_time: now.clone(),
            });
            conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
        }
    }
}

/// Whether [`set_condition`] with these values would leave `conditions` as they are: a status
/// shared with others is then not copied to be written.
pub fn condition_holds(
    conditions: &[Condition],
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    observed_generation: Option<i64>,
) -> bool {
    let status = if status { "True" } else { "False" };
    conditions.iter().find(|c| c.type_ == type_).is_some_and(|c| {
        c.status == status && c.reason == reason && c.message == message && c.observed_generation == observed_generation
    })
}

/// `Some(true)` for `True`, `Some(false)` for `False`, `None` when absent or `Unknown`.
pub fn condition_status(conditions: &[Condition], type_: &str) -> Option<bool> {
    conditions
        .iter()
        .find(|c| c.type_ == type_)
        .and_then(|c| match c.status.as_str() {
            "True" => Some(true),
            "False" => Some(false),
            _ => None,
        })
}

/// The schema of a condition list: a list map keyed by `type`, so server-side apply merges
/// conditions from different field managers instead of replacing the whole list.
pub(crate) fn conditions_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = generator.subschema_for::<Vec<Condition>>();
    schema.insert("x-kubernetes-list-type".into(), "map".into());
    schema.insert("x-kubernetes-list-map-keys".into(), serde_json::json!(["type"]));
    schema
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Time {
        Time(jiff::Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn transition_time_moves_only_on_flip() {
        let mut c = Vec::new();
        set_condition(&mut c, "Ready", false, "Pending", "waiting", Some(1), &at(10));
        set_condition(&mut c, "Ready", false, "Pending", "still waiting", Some(2), &at(20));
        assert_eq!(c[0].last_transition_time, at(10));
        assert_eq!(c[0].message, "still waiting");
        set_condition(&mut c, "Ready", true, "Applied", "done", Some(2), &at(30));
        assert_eq!(c[0].last_transition_time, at(30));
        assert_eq!(condition_status(&c, "Ready"), Some(true));
        assert_eq!(condition_status(&c, "Stalled"), None);
    }

    #[test]
    fn conditions_stay_sorted_by_type() {
        let mut c = Vec::new();
        for t in ["Valid", "Ready", "Stalled", "Reconciling"] {
            set_condition(&mut c, t, true, "X", "", None, &at(0));
        }
        let types: Vec<_> = c.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["Ready", "Reconciling", "Stalled", "Valid"]);
    }
}
