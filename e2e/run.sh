#!/usr/bin/env bash
# End-to-end harness: builds and runs a real Kubernetes control plane (embedded etcd +
# kube-apiserver, built from the Kubernetes Go modules) on 127.0.0.1, and runs the Rust suite
# in e2e/suite against it.
#
#   e2e/run.sh build        build e2e/bin/controlplane, e2e/bin/kubelet (the kubelet, a CRI
#                           runtime that runs no containers and a device plugin advertising what
#                           NVIDIA's would), the e2e/bin/kubectl link and
#                           e2e/bin/helm-render (Helm's own renderer, for deploy/helm) and
#                           e2e/bin/gitops (Argo CD health Lua, Flux apply/wait, kstatus) (if needed)
#   e2e/run.sh up           start a control plane in the background (state: target/e2e/);
#                           with GPU_TENANCY_E2E_SCHEDULER=1 it also runs kube-scheduler and the
#                           ResourceClaim controller (controlplane up --scheduler: pods get bound,
#                           their DRA claims created and allocated; e2e/scheduler-check.sh)
#   e2e/run.sh down         stop it
#   e2e/run.sh test [ARGS]  run the suite against a fresh control plane of its own
#                           (target/e2e/run-PID/, always torn down; logs kept on failure);
#                           with GPU_TENANCY_E2E_KUBECONFIG set, against that cluster instead
#                           (ARGS go to the test binary, e.g. a test name filter); then the
#                           fault scenarios (tests/faults) on a third control plane, their
#                           random kills for GPU_TENANCY_FAULTS_SECONDS (default 15)
#   e2e/run.sh faults [ARGS]  only the fault scenarios, on a fresh control plane; random kills
#                           for GPU_TENANCY_FAULTS_SECONDS (default 300 here: `make e2e-faults`)
#   e2e/run.sh nvml-check   only NVIDIA's NVML client (go-nvml, go-nvlib) against the simulated
#                           libnvidia-ml.so (e2e/nvml-check); `test` runs it first
#   e2e/run.sh build-kueue  build e2e/bin/kueue (Kueue's manager) and e2e/bin/kueue-manifests/
#                           (its CRDs and webhook configurations) from Kueue's Go module
#                           (e2e/kueue; if needed); `build` does it too
#   e2e/run.sh build-prometheus [promtool] [prometheus]
#                           build e2e/bin/promtool and e2e/bin/prometheus (default both; if needed)
#                           from Prometheus' Go module (e2e/prometheus); `make rules-check` builds
#                           promtool this way
#
# Environment: GPU_TENANCY_E2E_KUBECONFIG (use this cluster, start nothing),
# GPU_TENANCY_E2E_KUBECTL (kubectl to use instead of e2e/bin/kubectl),
# GPU_TENANCY_E2E_SCHEDULER (1: `up` starts the control plane with --scheduler; default off, and
# the test runs never use it), CARGO (default cargo), GO (default go).
set -euo pipefail

CALLER_DIR="$(pwd)"
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
BIN_DIR="$ROOT/e2e/bin"
CONTROLPLANE="$BIN_DIR/controlplane"
KUBECTL_LINK="$BIN_DIR/kubectl"
SRC_DIR="$ROOT/e2e/controlplane"
HELM_RENDER="$BIN_DIR/helm-render"
HELM_RENDER_SRC="$ROOT/e2e/helm-render"
GITOPS="$BIN_DIR/gitops"
KUBELET="$BIN_DIR/kubelet"
KUBELET_SRC="$ROOT/e2e/kubelet"
GITOPS_SRC="$ROOT/e2e/gitops"
PROMETHEUS_SRC="$ROOT/e2e/prometheus"
KUEUE_SRC="$ROOT/e2e/kueue"
STATE_DIR="$ROOT/target/e2e"
GO="${GO:-go}"
CARGO="${CARGO:-cargo}"

say() { printf 'e2e: %s\n' "$*" >&2; }
die() { printf 'e2e: error: %s\n' "$*" >&2; exit 1; }

k8s_version() {
	awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ { print $2; exit }' "$SRC_DIR/go.mod"
}

# needs_build [BIN SRC]: the binary (default the control plane) is missing or older than any
# source file of its Go module.
needs_build() {
	local bin="${1:-$CONTROLPLANE}" src="${2:-$SRC_DIR}"
	[[ -x "$bin" ]] || return 0
	[[ -n "$(find "$src" -newer "$bin" \( -name '*.go' -o -name go.mod -o -name go.sum \) -print -quit)" ]]
}

build() {
	command -v "$GO" >/dev/null 2>&1 || die "no Go toolchain ('$GO') on PATH: the control plane is built from the Kubernetes Go modules; install Go (see e2e/controlplane/go.mod for the version)"
	local version
	version="$(k8s_version)"
	[[ -n "$version" ]] || die "cannot read the k8s.io/kubernetes version from e2e/controlplane/go.mod"
	if needs_build; then
		say "building kube-apiserver $version + kubectl + embedded etcd from Kubernetes modules into e2e/bin/ (first build takes many minutes; later builds come from the Go build cache) ..."
		local start=$SECONDS minor="${version#v1.}"
		minor="${minor%%.*}"
		mkdir -p "$BIN_DIR"
		(cd "$SRC_DIR" && "$GO" build -trimpath -buildvcs=false \
			-ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean" \
			-o "$CONTROLPLANE.tmp" .) || die "building the control plane failed (see the Go output above)"
		mv -f "$CONTROLPLANE.tmp" "$CONTROLPLANE"
		say "built e2e/bin/controlplane in $((SECONDS - start))s"
	fi
	# The kubelet and a CRI runtime that runs no containers (e2e/kubelet), from the same
	# Kubernetes module and version ldflags as the control plane: its Go build cache is shared.
	if needs_build "$KUBELET" "$KUBELET_SRC"; then
		say "building e2e/bin/kubelet $version from k8s.io/kubernetes cmd/kubelet ..."
		local kstart=$SECONDS minor="${version#v1.}"
		minor="${minor%%.*}"
		(cd "$KUBELET_SRC" && "$GO" build -trimpath -buildvcs=false \
			-ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean" \
			-o "$KUBELET.tmp" .) || die "building e2e/bin/kubelet failed (see the Go output above)"
		mv -f "$KUBELET.tmp" "$KUBELET"
		say "built e2e/bin/kubelet in $((SECONDS - kstart))s"
	fi
	if [[ "$(readlink "$KUBECTL_LINK" 2>/dev/null)" != "controlplane" ]]; then
		ln -sfn controlplane "$KUBECTL_LINK"
	fi
	# Helm's chart loader and template engine (helm.sh/helm/v3), for the deploy/helm tests: no
	# helm binary needed. A module of its own, so its Kubernetes libraries never meet the
	# control plane's.
	if needs_build "$HELM_RENDER" "$HELM_RENDER_SRC"; then
		say "building e2e/bin/helm-render from helm.sh/helm/v3 ..."
		local hstart=$SECONDS
		(cd "$HELM_RENDER_SRC" && "$GO" build -trimpath -buildvcs=false -ldflags "-s -w" -o "$HELM_RENDER.tmp" .) ||
			die "building e2e/bin/helm-render failed (see the Go output above)"
		mv -f "$HELM_RENDER.tmp" "$HELM_RENDER"
		say "built e2e/bin/helm-render in $((SECONDS - hstart))s"
	fi
	# Argo CD's way of running health Lua (gopher-lua), Flux's apply and wait (fluxcd/pkg/ssa)
	# and kstatus, for the GitOps tests (deploy/argocd): a module of its own, like helm-render.
	if needs_build "$GITOPS" "$GITOPS_SRC"; then
		say "building e2e/bin/gitops from gopher-lua, fluxcd/pkg/ssa and kstatus ..."
		local gstart=$SECONDS
		(cd "$GITOPS_SRC" && "$GO" build -trimpath -buildvcs=false -ldflags "-s -w" -o "$GITOPS.tmp" .) ||
			die "building e2e/bin/gitops failed (see the Go output above)"
		mv -f "$GITOPS.tmp" "$GITOPS"
		say "built e2e/bin/gitops in $((SECONDS - gstart))s"
	fi
	# promtool and the Prometheus server: the rules' tests, and a real Prometheus scraping the
	# agents in the controller scenarios (tests/controller/metrics.rs) and behind `report`.
	build_prometheus
	build_kueue
}

# build_kueue: e2e/bin/kueue, Kueue's manager, and e2e/bin/kueue-manifests/, the CRDs, webhook
# configurations and the ClusterRoles aggregated into Kubernetes' own roles of the same release,
# unchanged (the tests adapt them to the test
# control plane: tests/controller/kueue_manager.rs), if missing or older than
# e2e/kueue/go.mod or go.sum. The version is the one that go.mod requires.
build_kueue() {
	needs_build "$BIN_DIR/kueue" "$KUEUE_SRC" || return 0
	command -v "$GO" >/dev/null 2>&1 || die "no Go toolchain ('$GO') on PATH: Kueue's manager is built from its Go module; install Go (see e2e/kueue/go.mod for the version)"
	local version dir start=$SECONDS
	version="$(awk '$1 == "sigs.k8s.io/kueue" && $2 ~ /^v/ { print $2; exit }' "$KUEUE_SRC/go.mod")"
	[[ -n "$version" ]] || die "cannot read the sigs.k8s.io/kueue version from e2e/kueue/go.mod"
	say "building e2e/bin/kueue $version from sigs.k8s.io/kueue (the first build takes several minutes; later ones come from the Go build cache) ..."
	dir="$(cd "$KUEUE_SRC" && "$GO" list -m -f '{{.Dir}}' sigs.k8s.io/kueue)" ||
		die "cannot find the sigs.k8s.io/kueue module (go list -m in e2e/kueue, above)"
	rm -rf "$BIN_DIR/kueue-manifests"
	mkdir -p "$BIN_DIR/kueue-manifests/crds"
	cp "$dir"/config/components/crd/bases/*.yaml "$BIN_DIR/kueue-manifests/crds/"
	cp "$dir/config/components/webhook/manifests.yaml" "$BIN_DIR/kueue-manifests/webhooks.yaml"
	# The ClusterRoles Kueue aggregates into Kubernetes' admin, edit and view roles.
	mkdir -p "$BIN_DIR/kueue-manifests/rbac"
	local f
	for f in "$dir"/config/components/rbac/*.yaml; do
		if grep -q 'rbac.authorization.k8s.io/aggregate-to-' "$f"; then cp "$f" "$BIN_DIR/kueue-manifests/rbac/"; fi
	done
	chmod -R u+w "$BIN_DIR/kueue-manifests"
	(cd "$KUEUE_SRC" && "$GO" build -trimpath -buildvcs=false \
		-ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$version" \
		-o "$BIN_DIR/kueue.tmp" sigs.k8s.io/kueue/cmd/kueue) ||
		die "building e2e/bin/kueue failed (see the Go output above)"
	mv -f "$BIN_DIR/kueue.tmp" "$BIN_DIR/kueue"
	say "built e2e/bin/kueue in $((SECONDS - start))s"
}

# prometheus_release: the Prometheus release e2e/prometheus/go.mod requires, for --version.
# Prometheus tags its Go module v0.MNN.P for release M.NN.P (v0.316.0 is 3.16.0).
prometheus_release() {
	local v mnn
	v="$(awk '$1 == "github.com/prometheus/prometheus" && $2 ~ /^v0\./ { print $2; exit }' "$PROMETHEUS_SRC/go.mod")"
	[[ "$v" =~ ^v0\.([0-9]+)\.([0-9]+)$ ]] || die "cannot read the github.com/prometheus/prometheus version from e2e/prometheus/go.mod"
	mnn="${BASH_REMATCH[1]}"
	printf '%d.%d.%s\n' "$((10#$mnn / 100))" "$((10#$mnn % 100))" "${BASH_REMATCH[2]}"
}

# build_prometheus [NAME...]: e2e/bin/promtool and/or e2e/bin/prometheus (default both), each
# if missing or older than e2e/prometheus/go.mod or go.sum, from Prometheus' own module (the
# `tool` lines of that go.mod). promtool checks and unit-tests deploy/prometheus; the server is
# there to scrape a local run. Both come from one build of the module's packages: the first
# tool takes about 10 minutes on 2 cores, the other about 2 more, a rebuild seconds.
build_prometheus() {
	command -v "$GO" >/dev/null 2>&1 || die "no Go toolchain ('$GO') on PATH: promtool is built from Prometheus' Go module; install Go (see e2e/prometheus/go.mod for the version)"
	(($#)) || set -- promtool prometheus
	local name release start
	release="$(prometheus_release)"
	for name in "$@"; do
		case "$name" in
		promtool | prometheus) ;;
		*) die "build-prometheus: '$name' is neither promtool nor prometheus" ;;
		esac
		needs_build "$BIN_DIR/$name" "$PROMETHEUS_SRC" || continue
		say "building e2e/bin/$name $release from github.com/prometheus/prometheus (the first build of the module takes about 10 minutes; later ones come from the Go build cache) ..."
		start=$SECONDS
		mkdir -p "$BIN_DIR"
		(cd "$PROMETHEUS_SRC" && "$GO" build -trimpath -buildvcs=false \
			-ldflags "-s -w -X github.com/prometheus/common/version.Version=$release" \
			-o "$BIN_DIR/$name.tmp" "github.com/prometheus/prometheus/cmd/$name") ||
			die "building e2e/bin/$name failed (see the Go output above)"
		mv -f "$BIN_DIR/$name.tmp" "$BIN_DIR/$name"
		say "built e2e/bin/$name in $((SECONDS - start))s"
	done
}

# abs PATH: PATH made absolute relative to the caller's directory (the tests run elsewhere).
abs() {
	case "$1" in
	/*) printf '%s\n' "$1" ;;
	*) printf '%s\n' "$CALLER_DIR/$1" ;;
	esac
}

pid_alive() { # DIR: is the control plane recorded in DIR running? (pid reuse and zombies excluded)
	"$CONTROLPLANE" status --dir "$1" >/dev/null 2>&1
}

# start DIR DIE_WITH_PARENT [UP_FLAGS...]: start a control plane with state in DIR (more flags
# for `controlplane up`, e.g. --scheduler), wait for it to be ready.
start() {
	local dir="$1" die_with_parent="$2" log pid
	shift 2
	mkdir -p "$dir"
	log="$dir/controlplane.log"
	rm -f "$dir/ready"
	if [[ "$die_with_parent" == true ]]; then
		"$CONTROLPLANE" up --dir "$dir" --die-with-parent=true "$@" >"$log" 2>&1 &
	else
		# Detached: survives this shell (and make); stopped by `down`.
		setsid nohup "$CONTROLPLANE" up --dir "$dir" --die-with-parent=false "$@" >"$log" 2>&1 </dev/null &
	fi
	pid=$!
	local waited=0
	while [[ ! -f "$dir/ready" ]]; do
		if ! kill -0 "$pid" 2>/dev/null; then
			tail -n 30 "$log" >&2 || true
			die "the control plane exited before it was ready (log: ${log#"$ROOT"/})"
		fi
		if ((waited >= 1800)); then # 0.1s steps: 180s
			tail -n 30 "$log" >&2 || true
			kill "$pid" 2>/dev/null || true
			die "the control plane was not ready after 180s (log: ${log#"$ROOT"/})"
		fi
		sleep 0.1
		waited=$((waited + 1))
	done
}

stop() { # DIR
	[[ -x "$CONTROLPLANE" ]] || return 0
	"$CONTROLPLANE" down --dir "$1"
}

finish() { # DIR STATUS: stop the control plane of a test run; keep its logs if the run failed
	stop "$1" || true
	if [[ "$2" == 0 ]]; then
		rm -rf "$1"
	else
		say "control plane logs kept in ${1#"$ROOT"/}/ (controlplane.log, etcd.log)"
	fi
}

cmd_up() {
	build
	local flags=()
	case "${GPU_TENANCY_E2E_SCHEDULER:-}" in
	"" | 0 | false) ;;
	1 | true) flags+=(--scheduler) ;;
	*) die "GPU_TENANCY_E2E_SCHEDULER=$GPU_TENANCY_E2E_SCHEDULER: use 1 (with kube-scheduler) or 0" ;;
	esac
	if pid_alive "$STATE_DIR"; then
		say "already running (pid $(cat "$STATE_DIR/controlplane.pid"))${flags[*]:+; GPU_TENANCY_E2E_SCHEDULER only applies to a fresh start (make e2e-down first)}"
	else
		say "starting the control plane${flags[*]:+ with ${flags[*]}} (state: target/e2e/, log: target/e2e/controlplane.log) ..."
		start "$STATE_DIR" false ${flags[@]+"${flags[@]}"}
		say "ready: $(cat "$STATE_DIR/ready") (pid $(cat "$STATE_DIR/controlplane.pid")); stop it with: make e2e-down"
	fi
	echo "export KUBECONFIG=$STATE_DIR/kubeconfig"
}

cmd_down() {
	stop "$STATE_DIR"
}

cmd_test() {
	local kubeconfig
	if [[ -n "${GPU_TENANCY_E2E_KUBECONFIG:-}" ]]; then
		[[ -r "$GPU_TENANCY_E2E_KUBECONFIG" ]] || die "GPU_TENANCY_E2E_KUBECONFIG=$GPU_TENANCY_E2E_KUBECONFIG is not a readable file"
		kubeconfig="$(abs "$GPU_TENANCY_E2E_KUBECONFIG")"
		if [[ -n "${GPU_TENANCY_E2E_KUBECTL:-}" ]]; then
			GPU_TENANCY_E2E_KUBECTL="$(abs "$GPU_TENANCY_E2E_KUBECTL")"
		else
			build # for e2e/bin/kubectl
		fi
		say "running the suite against the cluster in GPU_TENANCY_E2E_KUBECONFIG (starting nothing)"
		run_suite "$kubeconfig" e2e "$@"
		run_suite "$kubeconfig" controller --test-threads=1 "$@"
		run_suite "$kubeconfig" dra --test-threads=1 "$@"
		run_suite "$kubeconfig" dra_cluster --test-threads=1 "$@"
		say "fault scenarios: the API server restart needs the local control plane, so it is not run against GPU_TENANCY_E2E_KUBECONFIG"
		GPU_TENANCY_FAULTS_SECONDS="${GPU_TENANCY_FAULTS_SECONDS:-15}" \
			run_suite "$kubeconfig" faults --test-threads=1 --skip c_apiserver "$@"
		return
	fi
	build
	# Compile the suite before starting anything: a compile error needs no cluster.
	say "building the e2e suite and the gpu-tenancy binary (the controller scenarios run it) ..."
	# Two builds: `--bin` would narrow nvml-sim to its (absent) binaries, leaving its .so unbuilt.
	"$CARGO" build -p gpu-tenancy --bin gpu-tenancy
	"$CARGO" build -p nvml-sim
	nvml_check
	cdi_check
	kubelet_check
	"$CARGO" test -p gpu-tenancy-e2e --no-run
	# A control plane of its own (not the one of `make e2e-up`, nor of a concurrent run), torn
	# down on any exit. Directories of earlier runs whose control plane is gone are removed.
	local old
	for old in "$STATE_DIR"/run-*; do
		if [[ -d "$old" ]] && ! pid_alive "$old"; then rm -rf "$old"; fi
	done
	local dir="$STATE_DIR/run-$$"
	trap 'finish "'"$dir"'" $?' EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
	say "starting a fresh control plane (state: ${dir#"$ROOT"/}) ..."
	local t0=$SECONDS
	start "$dir" true
	say "control plane ready in $((SECONDS - t0))s at $(cat "$dir/ready")"
	run_suite "$dir/kubeconfig" e2e "$@"
	# The controller plans the whole cluster, so its scenarios (tests/controller) get a control
	# plane of their own, and run one at a time.
	finish "$dir" 0
	dir="$STATE_DIR/run-$$-controller"
	trap 'finish "'"$dir"'" $?' EXIT
	say "starting a fresh control plane for the controller scenarios (state: ${dir#"$ROOT"/}) ..."
	start "$dir" true
	run_suite "$dir/kubeconfig" controller --test-threads=1 "$@"
	finish "$dir" 0
	# The DRA mode's node side (tests/dra): a real agent as a kubelet plugin, the test as the
	# kubelet; a control plane with no controller policies, whose claims only the plugin judges.
	dir="$STATE_DIR/run-$$-dra"
	trap 'finish "'"$dir"'" $?' EXIT
	say "starting a fresh control plane for the DRA scenarios (state: ${dir#"$ROOT"/}) ..."
	start "$dir" true
	run_suite "$dir/kubeconfig" dra --test-threads=1 "$@"
	finish "$dir" 0
	# The DRA mode's cluster side (tests/dra_cluster): the real kube-scheduler and ResourceClaim
	# controller allocate the tenants' claims, the controller and agents run, the test is the
	# kubelet of the fake Ready nodes.
	dir="$STATE_DIR/run-$$-dra-cluster"
	trap 'finish "'"$dir"'" $?' EXIT
	say "starting a fresh control plane with kube-scheduler for the DRA cluster scenarios (state: ${dir#"$ROOT"/}) ..."
	start "$dir" true --scheduler
	run_suite "$dir/kubeconfig" dra_cluster --test-threads=1 "$@"
	finish "$dir" 0
	GPU_TENANCY_FAULTS_SECONDS="${GPU_TENANCY_FAULTS_SECONDS:-15}" run_faults "$@"
}

# run_faults [ARGS]: the fault scenarios (tests/faults) on a fresh control plane of their own,
# whose state directory they are told (one of them stops and restarts it with its data).
run_faults() {
	local dir="$STATE_DIR/run-$$-faults"
	trap 'finish "'"$dir"'" $?' EXIT
	say "starting a fresh control plane for the fault scenarios (state: ${dir#"$ROOT"/}; random kills for ${GPU_TENANCY_FAULTS_SECONDS}s) ..."
	start "$dir" true
	GPU_TENANCY_E2E_CONTROLPLANE_DIR="$dir" run_suite "$dir/kubeconfig" faults --test-threads=1 --nocapture "$@"
}

cmd_faults() {
	build
	# Two builds: `--bin` would narrow nvml-sim to its (absent) binaries, leaving its .so unbuilt.
	"$CARGO" build -p gpu-tenancy --bin gpu-tenancy
	"$CARGO" build -p nvml-sim
	"$CARGO" test -p gpu-tenancy-e2e --test faults --no-run
	GPU_TENANCY_FAULTS_SECONDS="${GPU_TENANCY_FAULTS_SECONDS:-300}" run_faults "$@"
}

# kubelet_check: e2e/kubelet's own Go tests (the device plugin's resources for each config the
# controller renders; the real-kubelet scenarios then run it).
kubelet_check() {
	say "checking e2e/kubelet (the device plugin's resources per NVIDIA config) ..."
	(cd "$KUBELET_SRC" && "$GO" test -count=1 ./...) || die "e2e/kubelet's tests failed (above)"
}

# cdi_check: e2e/cdi-check's own Go tests (the CDI project's validation, which the DRA scenarios
# then run over the specs the agent writes).
cdi_check() {
	say "checking e2e/cdi-check (the CDI project's spec validation) ..."
	(cd "$ROOT/e2e/cdi-check" && "$GO" test -count=1 ./...) || die "e2e/cdi-check's tests failed (above)"
}

# nvml_check: e2e/nvml-check's Go tests, NVIDIA's go-nvml and go-nvlib driving the built simulated
# NVML library, its answers held to NVIDIA's published outputs. Needs `cargo build -p nvml-sim`.
nvml_check() {
	command -v "$GO" >/dev/null 2>&1 || die "no Go toolchain ('$GO') on PATH: e2e/nvml-check uses NVIDIA's Go NVML bindings"
	local target="${CARGO_TARGET_DIR:-target}"
	[[ "$target" == /* ]] || target="$ROOT/$target"
	say "checking the simulated NVML library with NVIDIA's go-nvml and go-nvlib (e2e/nvml-check) ..."
	# go-nvml's header marks some functions deprecated; its cgo build would print each.
	(cd "$ROOT/e2e/nvml-check" && NVML_SIM_LIB="$target/debug/libnvidia_ml_sim.so" \
		CGO_CFLAGS="${CGO_CFLAGS:--O2 -g} -Wno-deprecated-declarations" "$GO" test -count=1 ./...) ||
		die "the simulated NVML library disagrees with NVIDIA's client or published outputs (e2e/nvml-check, above)"
}

run_suite() { # KUBECONFIG TEST_BINARY [TEST_ARGS...]
	local kubeconfig="$1" binary="$2"
	shift 2
	GPU_TENANCY_E2E_KUBECONFIG="$kubeconfig" \
		GPU_TENANCY_E2E_KUBECTL="${GPU_TENANCY_E2E_KUBECTL:-$KUBECTL_LINK}" \
		"$CARGO" test -p gpu-tenancy-e2e --test "$binary" -- "$@"
}

case "${1:-}" in
build) build ;;
up) cmd_up ;;
down) cmd_down ;;
test)
	shift
	cmd_test "$@"
	;;
faults)
	shift
	cmd_faults "$@"
	;;
nvml-check)
	"$CARGO" build -p nvml-sim
	nvml_check
	;;
build-kueue) build_kueue ;;
build-prometheus)
	shift
	build_prometheus "$@"
	;;
*)
	echo "usage: e2e/run.sh build|up|down|test|faults|nvml-check|build-kueue|build-prometheus [ARGS...]" >&2
	exit 2
	;;
esac
