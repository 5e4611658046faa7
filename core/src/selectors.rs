//! Label selectors (a plan's `nodeSelector`) evaluated without a cluster, through kube's own
//! [`Selector`], so that matching follows the API server's rules in one place.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt};
use std::collections::BTreeMap;

/// Problems with a selector's operators and values, as the API server reports them
/// (apimachinery `ValidateLabelSelectorRequirement`: `In`/`NotIn` need values, `Exists`/`DoesNotExist`
/// take none, no other operator).
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

/// The selector as kube's [`Selector`], or `None` when the API server would refuse it.
///
/// kube's conversion alone is not enough: it accepts `In: []` and `Exists` with values, which the
/// API server refuses, so [`selector_problems`] is asked first.
pub fn parse_selector(selector: &LabelSelector) -> Option<Selector> {
    if !selector_problems(selector).is_empty() {
        return None;
    }
    Selector::try_from(selector.clone()).ok()
}

/// Does `selector` select an object with `labels`? An invalid selector selects nothing (validation
/// reports it); an empty one selects everything, as in Kubernetes (plans refuse empty selectors).
pub fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    ParsedSelector::of(selector).matches(labels)
}

/// A selector parsed once, to be matched against every node of a fleet: parsing it for each node
/// was a tenth of a re-plan at 5,000 nodes.
pub struct ParsedSelector(Option<Selector>);

impl ParsedSelector {
    pub fn of(selector: &LabelSelector) -> ParsedSelector {
        ParsedSelector(parse_selector(selector))
    }

    /// As [`selector_matches`]: an invalid selector selects nothing.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.as_ref().is_some_and(|s| s.matches(labels))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn req(key: &str, operator: &str, values: Option<&[&str]>) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: values.map(|v| v.iter().map(|s| s.to_string()).collect()),
        }
    }

    fn sel(match_labels: &[(&str, &str)], exprs: Vec<LabelSelectorRequirement>) -> LabelSelector {
        LabelSelector {
            match_labels: (!match_labels.is_empty()).then(|| labels(match_labels)),
            match_expressions: (!exprs.is_empty()).then_some(exprs),
        }
    }

    #[test]
    fn match_labels_and_expressions_are_anded() {
        let node = labels(&[("a", "1"), ("zone", "x")]);
        assert!(selector_matches(&sel(&[("a", "1")], vec![]), &node));
        assert!(!selector_matches(&sel(&[("a", "2")], vec![]), &node));
        assert!(selector_matches(
            &sel(&[("a", "1")], vec![req("b", "DoesNotExist", None)]),
            &node
        ));
        assert!(!selector_matches(
            &sel(&[("a", "1")], vec![req("b", "Exists", None)]),
            &node
        ));
        assert!(selector_matches(
            &sel(&[], vec![req("zone", "In", Some(&["x", "y"]))]),
            &node
        ));
        assert!(!selector_matches(
            &sel(&[], vec![req("zone", "NotIn", Some(&["x"]))]),
            &node
        ));
        assert!(
            selector_matches(&sel(&[], vec![req("missing", "NotIn", Some(&["x"]))]), &node),
            "NotIn matches a missing key, as in Kubernetes"
        );
        assert!(!selector_matches(
            &sel(&[("a", "1")], vec![req("zone", "In", Some(&["y"]))]),
            &node
        ));
        assert!(
            selector_matches(&LabelSelector::default(), &node),
            "empty selects everything"
        );
    }

    #[test]
    fn invalid_selectors_select_nothing_and_say_why() {
        let node = labels(&[("a", "1")]);
        let bogus = sel(&[], vec![req("a", "Bogus", Some(&["1"]))]);
        assert!(!selector_matches(&bogus, &node));
        assert_eq!(
            selector_problems(&bogus),
            ["matchExpressions[0].operator: \"Bogus\" is not an operator; use In, NotIn, Exists or DoesNotExist"]
        );
        // kube's Selector would accept these two; the API server does not.
        let empty_in = sel(&[], vec![req("b", "NotIn", Some(&[]))]);
        assert!(!selector_matches(&empty_in, &node));
        assert_eq!(
            selector_problems(&empty_in),
            ["matchExpressions[0].values: operator NotIn needs at least one value"]
        );
        let exists_with_values = sel(&[], vec![req("a", "Exists", None), req("a", "Exists", Some(&["1"]))]);
        assert!(!selector_matches(&exists_with_values, &node));
        assert_eq!(
            selector_problems(&exists_with_values),
            ["matchExpressions[1].values: operator Exists takes no values"]
        );
        assert!(parse_selector(&exists_with_values).is_none());
        assert!(parse_selector(&sel(&[("a", "1")], vec![])).is_some());
    }
}
