# End-to-end tests against a real Kubernetes control plane (included by the root Makefile).
#
#   make e2e-build   build e2e/bin/controlplane (embedded etcd + kube-apiserver) and e2e/bin/kubectl
#   make prometheus-build  build e2e/bin/promtool and e2e/bin/prometheus from Prometheus' Go
#                    module (e2e/prometheus); `make rules-check` builds promtool by itself
#   make e2e-up      start a control plane in the background; prints `export KUBECONFIG=...`
#   make e2e-down    stop it
#   make e2e         run e2e/suite against a fresh control plane, torn down afterwards;
#                    with GPU_TENANCY_E2E_KUBECONFIG set, against that cluster (starts nothing)
#                    E2E_ARGS="name_filter" narrows the tests run. Ends with the fault scenarios
#                    (tests/faults), their random kills kept short (GPU_TENANCY_FAULTS_SECONDS=15)
#   make e2e-faults  only the fault scenarios, random kills for FAULTS_SECONDS (300) seconds;
#                    FAULTS_SEED=N repeats a run (the seed is printed)
#
# Everything listens on 127.0.0.1; state and logs live under target/e2e/.

E2E_RUN ?= e2e/run.sh
E2E_ARGS ?=

.PHONY: e2e-build e2e-up e2e-down e2e e2e-faults prometheus-build

FAULTS_SECONDS ?= 300
FAULTS_SEED ?=

e2e-build:
	@$(E2E_RUN) build

prometheus-build:
	@$(E2E_RUN) build-prometheus

e2e-up:
	@$(E2E_RUN) up

e2e-down:
	@$(E2E_RUN) down

e2e:
	@$(E2E_RUN) test $(E2E_ARGS)

e2e-faults:
	@GPU_TENANCY_FAULTS_SECONDS=$(FAULTS_SECONDS) GPU_TENANCY_FAULTS_SEED=$(FAULTS_SEED) $(E2E_RUN) faults $(E2E_ARGS)
