//! Device ranges (`all`, `0,2`, `4-7`) and label selectors, evaluated without a cluster.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use std::collections::BTreeMap;

/// Parses an explicit device list (`0,2`, `4-7`, `0-3,6`) into sorted, unique indices.
/// `all` is not a list: callers expand it with the node's GPU count.
pub fn parse_devices(spec: &str) -> Result<Vec<u32>, String> {
    let mut out = Vec::new();
    for part in spec.split(',') {
        let part = part.trim();
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (parse_index(a, spec)?, parse_index(b, spec)?),
            None => {
                let i = parse_index(part, spec)?;
                (i, i)
            }
        };
        if lo > hi {
            return Err(format!("range {part:?} runs backwards; write {hi}-{lo}"));
        }
        if hi > 63 {
            return Err(format!("device index {hi} is out of range (0-63)"));
        }
        out.extend(lo..=hi);
    }
    let n = out.len();
    out.sort_unstable();
    out.dedup();
    if out.len() != n {
        return Err(format!("{spec:?} names a device twice"));
    }
    Ok(out)
}

fn parse_index(s: &str, whole: &str) -> Result<u32, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("{whole:?} is not a device list; write `all`, `0,2` or `4-7`"))
}

/// Indices a group's `devices` names on a node with `count` GPUs.
pub fn expand_devices(spec: &str, count: u32) -> Result<Vec<u32>, String> {
    if spec == "all" {
        Ok((0..count).collect())
    } else {
        parse_devices(spec)
    }
}

/// Does `selector` select a node with `labels`? Same rules as the API server's label selectors.
/// An invalid operator selects nothing (validation reports it).
pub fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    if let Some(ml) = &selector.match_labels
        && !ml.iter().all(|(k, v)| labels.get(k) == Some(v))
    {
        return false;
    }
    selector.match_expressions.iter().flatten().all(|req| {
        let values = req.values.as_deref().unwrap_or_default();
        let value = labels.get(&req.key);
        match req.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    })
}

/// Problems with a selector's operators and values, as the API server would report them.
pub fn selector_problems(selector: &LabelSelector) -> Vec<String> {
    let mut out = Vec::new();
    for (i, req) in selector.match_expressions.iter().flatten().enumerate() {
        let n = req.values.as_ref().map_or(0, Vec::len);
        let ok = match req.operator.as_str() {
            "In" | "NotIn" => n > 0,
            "Exists" | "DoesNotExist" => n == 0,
            other => {
                out.push(format!(
                    "matchExpressions[{i}].operator: {other:?} is not an operator; use In, NotIn, Exists or DoesNotExist"
                ));
                continue;
            }
        };
        if !ok {
            out.push(format!(
                "matchExpressions[{i}].values: operator {} {}",
                req.operator,
                if n == 0 {
                    "needs at least one value"
                } else {
                    "takes no values"
                }
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    #[test]
    fn device_lists() {
        assert_eq!(parse_devices("0-3,6").unwrap(), [0, 1, 2, 3, 6]);
        assert_eq!(parse_devices("4,5").unwrap(), [4, 5]);
        assert_eq!(expand_devices("all", 3).unwrap(), [0, 1, 2]);
        assert!(parse_devices("3-1").unwrap_err().contains("backwards"));
        assert!(parse_devices("0-2,2").unwrap_err().contains("twice"));
        assert!(parse_devices("x").unwrap_err().contains("not a device list"));
        assert!(parse_devices("99").unwrap_err().contains("out of range"));
    }

    #[test]
    fn selectors() {
        let labels = BTreeMap::from([("a".to_string(), "1".to_string())]);
        let mut sel = LabelSelector {
            match_labels: Some(BTreeMap::from([("a".to_string(), "1".to_string())])),
            match_expressions: None,
        };
        assert!(selector_matches(&sel, &labels));
        sel.match_expressions = Some(vec![LabelSelectorRequirement {
            key: "b".into(),
            operator: "DoesNotExist".into(),
            values: None,
        }]);
        assert!(selector_matches(&sel, &labels));
        sel.match_expressions.as_mut().unwrap()[0].operator = "Exists".into();
        assert!(!selector_matches(&sel, &labels));
        sel.match_expressions.as_mut().unwrap()[0].operator = "Bogus".into();
        assert_eq!(selector_problems(&sel).len(), 1);
    }
}
