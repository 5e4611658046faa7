# gpu-tenancy: `make plan` runs it on the examples, `make test` tests it.

CARGO ?= cargo
E2E_PACKAGE := gpu-tenancy-e2e

.PHONY: help build run run-check rules-check prometheus-rule test unit lint fmt crds docs docs-check ptx-check validate plan bench

help:
	@echo "make run       the product on simulated GPUs: control plane, controller, agents, examples/"
	@echo "make plan      offline plan of examples/ on examples/inventory.yaml"
	@echo "make validate  validate examples/"
	@echo "make test      the docs check, unit, property and integration tests, the e2e suites on a real kube-apiserver"
	@echo "               (e2e, controller scenarios, short fault scenarios), then make run until all is Ready"
	@echo "make unit      only the tests that need no control plane"
	@echo "make docs-check  YAML blocks of README and docs/ validate, generated reference pages current, links resolve"
	@echo "make ptx-check the scrub's verification kernel assembles with NVIDIA's ptxas (skipped without one)"
	@echo "make docs      regenerate docs/reference/ (CRD fields, command line) from the code"
	@echo "make rules-check  promtool checks and unit tests of the alerting rules (deploy/prometheus)"
	@echo "make prometheus-rule  regenerate deploy/prometheus/prometheusrule.yaml from rules.yaml"
	@echo "make e2e-faults the fault scenarios with 300 s of random kills (FAULTS_SECONDS, FAULTS_SEED)"
	@echo "make e2e-up    start a local control plane (kube-apiserver + etcd) and print its KUBECONFIG"
	@echo "make bench     criterion benchmarks (solver, planner)"
	@echo "make bench-fleet  the controller against 1,000 simulated nodes (release, ~10 min; BENCH_FLEET_NODES=200 BENCH_FLEET_START_NODES=50 BENCH_FLEET_IDLE=30 BENCH_FLEET_PLAN_NODES=0 for a quick run)"
	@echo "make lint      rustfmt check and clippy with warnings denied"
	@echo "make crds      regenerate crds/ from the Rust types"

build:
	$(CARGO) build --workspace

run:
	@e2e/demo.sh

# The last step is `make run` itself: it must come up Ready, keep running, print a change made
# with kubectl, and stop cleanly on Ctrl-C (e2e/run-check.sh).
test: docs-check ptx-check unit e2e rules-check run-check

# Cheap, so first: every YAML block of README.md and docs/ passes `gpu-tenancy validate`, the
# generated reference pages equal what the code generates, every relative link resolves
# (e2e/docs-check.sh; conventions in docs/development/docs.md).
docs-check:
	@e2e/docs-check.sh

# The scrub's hand-written verification kernel assembles for sm_70 to sm_100 (NVIDIA's ptxas;
# skipped, saying so, where none is installed: e2e/ptx-check.sh).
ptx-check:
	@e2e/ptx-check.sh

docs:
	$(CARGO) run -q -p gpu-tenancy -- docs --out-dir docs/reference

run-check:
	@e2e/run-check.sh

# Build everything first: some tests drive the built binaries and the simulated NVML library.
unit:
	$(CARGO) build --workspace
	$(CARGO) test --workspace --exclude $(E2E_PACKAGE)

# The alerting rules: promtool, built from Prometheus' Go module into e2e/bin/ when missing or
# stale (e2e/prometheus), checks rules.yaml and the PrometheusRule generated from it, and runs
# the unit tests in deploy/prometheus/tests.
rules-check:
	@e2e/run.sh build-prometheus promtool
	@deploy/prometheus/rules.sh check e2e/bin/promtool

prometheus-rule:
	@deploy/prometheus/rules.sh generate

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

crds:
	$(CARGO) run -q -p gpu-tenancy -- crd --out-dir crds

validate:
	$(CARGO) run -q -p gpu-tenancy -- validate -f examples/

plan:
	$(CARGO) run -q -p gpu-tenancy -- plan -f examples/ --inventory examples/inventory.yaml

bench:
	$(CARGO) bench -p gpu-tenancy

# Not part of `make test`: a control plane, the controller and a fleet of simulated agents, measured.
bench-fleet:
	@e2e/bench-fleet.sh

include e2e/e2e.mk
