//! Schema bounds (minimum/maximum, minLength/maxLength, pattern, enum, minItems/maxItems,
//! required) read from the CRDs themselves: the schema is walked alongside the valid object of
//! each kind and one case is made per bound met on the way.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use gpu_tenancy_e2e::KINDS;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{JSONSchemaProps, JSONSchemaPropsOrArray};
use serde_json::{Value, json};

use crate::fixtures;
use crate::validation::{Case, schema};

/// The bounds of one schema node that get a case: (bound name, applies).
fn bounds_of(s: &JSONSchemaProps) -> Vec<&'static str> {
    let mut b = Vec::new();
    if s.minimum.is_some() {
        b.push("minimum");
    }
    if s.maximum.is_some() {
        b.push("maximum");
    }
    if s.min_length.is_some_and(|n| n > 0) {
        b.push("minLength");
    }
    if s.max_length.is_some() {
        b.push("maxLength");
    }
    if s.pattern.is_some() {
        b.push("pattern");
    }
    if s.enum_.is_some() {
        b.push("enum");
    }
    if s.min_items.is_some_and(|n| n > 0) {
        b.push("minItems");
    }
    if s.max_items.is_some() {
        b.push("maxItems");
    }
    b
}

/// Every bound of the object schema (status excepted: status is not validated on create), as
/// `schema path/bound` (`spec.gpus[].mode/enum`, `spec.tier/required`).
fn all_bounds(plural: &str) -> BTreeSet<String> {
    fn walk(s: &JSONSchemaProps, path: &str, out: &mut BTreeSet<String>) {
        for b in bounds_of(s) {
            out.insert(format!("{path}/{b}"));
        }
        for r in s.required.iter().flatten() {
            out.insert(format!("{}/required", join(path, r)));
        }
        for (k, p) in s.properties.iter().flatten() {
            if path.is_empty() && (k == "status" || k == "metadata") {
                continue;
            }
            walk(p, &join(path, k), out);
        }
        if let Some(items) = array_items(s) {
            walk(items, &format!("{path}[]"), out);
        }
    }
    let mut out = BTreeSet::new();
    walk(&schema(plural), "", &mut out);
    out
}

pub(crate) fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// Walks each kind's schema alongside its valid object; one case per bound, at the first place
/// the valid object reaches it. Fails if the valid objects leave a bound unreached.
pub(crate) fn schema_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    let mut unreached = Vec::new();
    for (kind, plural, _) in KINDS {
        let mut seen = BTreeSet::new();
        let base = fixtures::valid(kind, "x");
        walk_bounds(kind, &schema(plural), &base, &[], "", &mut seen, &mut cases);
        for b in all_bounds(plural).difference(&seen) {
            unreached.push(format!("{kind} {b}"));
        }
    }
    assert!(
        unreached.is_empty(),
        "bounds in crds/ that the valid objects of e2e/suite/tests/e2e/fixtures.rs never reach (add the field there):\n  {}",
        unreached.join("\n  ")
    );
    cases
}

/// A path (JSON pointer segments) in its Kubernetes rendering (`spec.gpus[0].mode`).
fn render(path: &[String]) -> String {
    let mut s = String::new();
    for seg in path {
        if seg.parse::<usize>().is_ok() {
            write!(s, "[{seg}]").unwrap();
        } else {
            if !s.is_empty() {
                s.push('.');
            }
            s.push_str(seg);
        }
    }
    s
}

fn pointer(path: &[String]) -> String {
    path.iter()
        .map(|p| format!("/{}", p.replace('~', "~0").replace('/', "~1")))
        .collect()
}

fn case_set(kind: &'static str, path: &[String], what: &str, value: Value, expect: &[&str]) -> Case {
    let ptr = pointer(path);
    let field = render(path);
    let mut e = vec![field.clone()];
    e.extend(expect.iter().map(|s| s.to_string()));
    Case {
        id: format!("{kind}/{field}/{what}"),
        kind,
        mutate: Box::new(move |o| *o.pointer_mut(&ptr).unwrap_or_else(|| panic!("no {ptr}")) = value.clone()),
        expect: e,
    }
}

/// A value that breaks `bound` of schema `s`, given the valid value `v`, and what the API
/// server's message says about it.
fn breaking_value(s: &JSONSchemaProps, v: &Value, bound: &str, field: &str) -> (Value, &'static str) {
    let ty = s.type_.as_deref().unwrap_or("");
    match bound {
        "minimum" => {
            let min = s.minimum.unwrap();
            let bad = if s.exclusive_minimum == Some(true) {
                min
            } else {
                min - 1.0
            };
            (num(bad, ty), "should be greater than or equal to")
        }
        "maximum" => {
            let max = s.maximum.unwrap();
            let bad = if s.exclusive_maximum == Some(true) {
                max
            } else {
                max + 1.0
            };
            (num(bad, ty), "should be less than or equal to")
        }
        "minLength" => (
            json!("a".repeat(s.min_length.unwrap() as usize - 1)),
            "should be at least",
        ),
        "maxLength" => (json!("a".repeat(s.max_length.unwrap() as usize + 1)), "Too long"),
        "pattern" => {
            let p = s.pattern.as_deref().unwrap();
            let re = regex::Regex::new(p).unwrap_or_else(|e| panic!("{field}: pattern {p:?}: {e}"));
            let bad = ["not valid!", "-", "~", "UPPER", "0", "a", ""]
                .into_iter()
                .find(|c| {
                    !re.is_match(c)
                        && s.min_length.is_none_or(|n| c.len() as i64 >= n)
                        && s.max_length.is_none_or(|n| c.len() as i64 <= n)
                })
                .unwrap_or_else(|| panic!("{field}: found no string that breaks pattern {p:?}"));
            (json!(bad), "should match")
        }
        "enum" => (json!("NotAnAllowedValue"), "Unsupported value"),
        "minItems" => {
            let n = s.min_items.unwrap() as usize;
            (
                Value::Array(v.as_array().unwrap().iter().take(n - 1).cloned().collect()),
                "should have at least",
            )
        }
        "maxItems" => {
            let n = s.max_items.unwrap() as usize;
            (
                Value::Array(distinct_items(s, v.as_array().unwrap(), n + 1)),
                "Too many",
            )
        }
        other => panic!("unknown bound {other}"),
    }
}

/// `n` items built from the valid ones; for sets and maps, made distinct where the item schema
/// lets us (keys set to fresh numbers/strings), so that "too many" is the only problem.
fn distinct_items(s: &JSONSchemaProps, valid: &[Value], n: usize) -> Vec<Value> {
    let first = valid.first().cloned().unwrap_or(Value::Null);
    let keys: Vec<String> = s.x_kubernetes_list_map_keys.clone().unwrap_or_default();
    let item_schema = array_items(s);
    (0..n)
        .map(|i| {
            if let Some(v) = valid.get(i) {
                return v.clone();
            }
            let mut item = first.clone();
            for k in &keys {
                let max = item_schema
                    .and_then(|is| is.properties.as_ref()?.get(k)?.maximum)
                    .map(|m| m as usize);
                item[k] = match &item[k] {
                    // Stay within the key's own maximum by wrapping; collisions only if n > range.
                    Value::Number(_) => json!(max.map_or(i, |m| i % (m + 1))),
                    _ => json!(format!("k{i}")),
                };
            }
            // A set of free strings: a fresh one, if the item pattern allows it.
            let is_set = s.x_kubernetes_list_type.as_deref() == Some("set");
            if let (true, Some(is), true) = (is_set, item_schema, item.is_string()) {
                let fresh = format!("x{i}");
                let fits = is.enum_.is_none()
                    && is
                        .pattern
                        .as_deref()
                        .is_none_or(|p| regex::Regex::new(p).is_ok_and(|re| re.is_match(&fresh)));
                if fits {
                    item = json!(fresh);
                }
            }
            item
        })
        .collect()
}

fn walk_bounds(
    kind: &'static str,
    s: &JSONSchemaProps,
    v: &Value,
    path: &[String],
    schema_path: &str,
    seen: &mut BTreeSet<String>,
    out: &mut Vec<Case>,
) {
    let field = render(path);
    let ty = s.type_.as_deref().unwrap_or("");
    let type_matches = match ty {
        "integer" | "number" => v.is_number(),
        "string" => v.is_string(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        _ => false,
    };
    if type_matches {
        for bound in bounds_of(s) {
            if seen.insert(format!("{schema_path}/{bound}")) {
                let (bad, says) = breaking_value(s, v, bound, &field);
                out.push(case_set(kind, path, bound, bad, &[says]));
            }
        }
    }
    if let (Some(items), Some(arr)) = (array_items(s), v.as_array()) {
        for (i, item) in arr.iter().enumerate() {
            let mut p = path.to_vec();
            p.push(i.to_string());
            walk_bounds(kind, items, item, &p, &format!("{schema_path}[]"), seen, out);
        }
    }
    if let (Some(props), Some(obj)) = (&s.properties, v.as_object()) {
        for req in s.required.iter().flatten() {
            let key = format!("{}/required", join(schema_path, req));
            if obj.contains_key(req) && seen.insert(key) {
                let ptr = pointer(path);
                let req2 = req.clone();
                let child = join(&field, req);
                out.push(Case {
                    id: format!("{kind}/{child}/required"),
                    kind,
                    mutate: Box::new(move |o| {
                        o.pointer_mut(&ptr)
                            .and_then(Value::as_object_mut)
                            .expect("parent")
                            .remove(&req2);
                    }),
                    expect: vec![child, "Required value".into()],
                });
            }
        }
        for (k, ps) in props {
            if schema_path.is_empty() && (k == "status" || k == "metadata") {
                continue;
            }
            if let Some(child) = obj.get(k) {
                let mut p = path.to_vec();
                p.push(k.clone());
                walk_bounds(kind, ps, child, &p, &join(schema_path, k), seen, out);
            }
        }
    }
}

fn array_items(s: &JSONSchemaProps) -> Option<&JSONSchemaProps> {
    match &s.items {
        Some(JSONSchemaPropsOrArray::Schema(i)) => Some(i),
        _ => None,
    }
}

fn num(x: f64, ty: &str) -> Value {
    if ty == "integer" { json!(x as i64) } else { json!(x) }
}
