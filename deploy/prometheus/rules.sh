#!/usr/bin/env bash
# The alerting rules' two forms and their checks (docs/operations/alerts.md).
#
#   deploy/prometheus/rules.sh generate          write prometheusrule.yaml from rules.yaml
#   deploy/prometheus/rules.sh check PROMTOOL    prometheusrule.yaml is current, both files pass
#                                                `promtool check rules` (the PrometheusRule's spec
#                                                extracted), every alert has a test where it fires
#                                                and one where it does not, tests/ pass
#
# rules.yaml is the source. prometheusrule.yaml is a fixed header and rules.yaml from `groups:`
# on, indented under `spec:`: so its spec holds exactly the same groups, comments included, and
# taking the indentation off gives rules.yaml back, with no YAML tool needed.
set -euo pipefail

CALLER_DIR="$(pwd)"
cd "$(dirname "$0")"
RULES=rules.yaml
PROMETHEUS_RULE=prometheusrule.yaml

die() { printf 'rules: error: %s\n' "$*" >&2; exit 1; }

# generate: the PrometheusRule, on stdout.
generate() {
	cat <<'HEADER'
# Generated from rules.yaml by `make prometheus-rule` (deploy/prometheus/rules.sh generate): edit
# rules.yaml, not this file; `make rules-check` fails when this file is stale.
#
# The same groups as a prometheus-operator PrometheusRule. Give it the labels your Prometheus'
# ruleSelector asks for (kube-prometheus-stack: `release: <its Helm release>`), and put it in a
# namespace its ruleNamespaceSelector covers.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: gpu-tenancy
  namespace: gpu-tenancy-system
  labels:
    app.kubernetes.io/name: gpu-tenancy
    app.kubernetes.io/part-of: gpu-tenancy
spec:
HEADER
	groups_of "$RULES" | sed '/./s/^/  /'
}

# groups_of FILE: FILE from its `groups:` line on.
groups_of() {
	grep -q '^groups:$' "$1" || die "$1 has no top-level 'groups:' line"
	sed -n '/^groups:$/,$p' "$1"
}

# spec_of FILE: the PrometheusRule's spec, its indentation taken off (a rules file again).
spec_of() {
	grep -q '^spec:$' "$1" || die "$1 has no top-level 'spec:' line"
	sed -n '/^spec:$/,$p' "$1" | sed '1d; s/^  //'
}

# covered: every alert of rules.yaml has, in tests/, an alert_rule_test where it fires
# (exp_alerts with entries) and one where it does not (`exp_alerts: []`). Reads the tests as
# written there: `alertname:` followed by its `exp_alerts:` line.
covered() {
	local tests=(tests/*.yaml) missing=0 alert
	[[ -e "${tests[0]}" ]] || die "no unit tests in deploy/prometheus/tests/"
	local cases
	cases="$(awk '
		$1 == "alertname:" { name = $2; next }
		$1 == "exp_alerts:" && name != "" { print name, ($2 == "[]" ? "quiet" : "fires"); name = "" }
	' "${tests[@]}" | sort -u)"
	for alert in $(awk '$1 == "-" && $2 == "alert:" { print $3 }' "$RULES"); do
		for kind in fires quiet; do
			if ! grep -qx "$alert $kind" <<<"$cases"; then
				printf 'rules: %s has no test case where it %s\n' "$alert" \
					"$([[ $kind == fires ]] && echo fires || echo "does not fire")" >&2
				missing=1
			fi
		done
	done
	((missing == 0)) || die "every alert needs a case where it fires and one where it does not (deploy/prometheus/tests/)"
}

TMP=""
check() {
	local promtool="$1"
	[[ -x "$promtool" ]] || die "no promtool at $promtool (e2e/run.sh build-prometheus promtool)"
	TMP="$(mktemp -d)"
	trap 'rm -rf "$TMP"' EXIT
	local tmp="$TMP"
	generate >"$tmp/prometheusrule.yaml"
	if ! diff -u "$PROMETHEUS_RULE" "$tmp/prometheusrule.yaml" >&2; then
		die "$PROMETHEUS_RULE is not what rules.yaml generates: run make prometheus-rule"
	fi
	spec_of "$PROMETHEUS_RULE" >"$tmp/prometheusrule-spec.yaml"
	echo "rules: $PROMETHEUS_RULE is current; checking both, its spec as the second file" >&2
	cmp -s "$tmp/prometheusrule-spec.yaml" <(groups_of "$RULES") ||
		die "the groups of $PROMETHEUS_RULE and $RULES differ"
	"$promtool" check rules --lint=all --lint-fatal "$RULES" "$tmp/prometheusrule-spec.yaml"
	covered
	"$promtool" test rules tests/*.yaml
}

case "${1:-}" in
generate) generate >"$PROMETHEUS_RULE.tmp" && mv -f "$PROMETHEUS_RULE.tmp" "$PROMETHEUS_RULE" ;;
check)
	[[ $# -eq 2 ]] || die "usage: rules.sh check PROMTOOL"
	# promtool is named relative to where this was called from.
	promtool="$2"
	[[ "$promtool" == /* ]] || promtool="$CALLER_DIR/$promtool"
	check "$promtool"
	;;
*)
	echo "usage: deploy/prometheus/rules.sh generate | check PROMTOOL" >&2
	exit 2
	;;
esac
