//! Comparing what the API server holds with what a loop would write: "write only on change".

use serde_json::Value;

/// Does `live` already hold every field of `want`? Objects: each key of `want`, recursively;
/// lists: same length, element by element; anything else: equal. Fields the API server adds
/// (defaults, metadata) do not count as differences.
pub fn contains(live: &Value, want: &Value) -> bool {
    match (live, want) {
        (Value::Object(l), Value::Object(w)) => w.iter().all(|(k, v)| match l.get(k) {
            Some(lv) => contains(lv, v),
            None => {
                v.is_null() || v.as_object().is_some_and(|o| o.is_empty()) || v.as_array().is_some_and(|a| a.is_empty())
            }
        }),
        (Value::Array(l), Value::Array(w)) => l.len() == w.len() && l.iter().zip(w).all(|(a, b)| contains(a, b)),
        (l, w) => l == w,
    }
}
