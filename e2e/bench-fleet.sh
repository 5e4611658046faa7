#!/usr/bin/env bash
# `make bench-fleet`: the controller against a fleet of simulated nodes, measured in one run.
#
# Builds release binaries (speed is measured), starts a fresh control plane of its own
# (target/bench-fleet/controlplane), installs the CRDs, starts the real `gpu-tenancy controller`
# as a process, then `gpu-tenancy-fleet bench` grows a fleet of agents (each the agent's own loop
# on in-memory GPUs) from BENCH_FLEET_START_NODES to BENCH_FLEET_NODES, idles BENCH_FLEET_IDLE
# seconds, changes a tenant and a plan, and prints the table (JSON: target/bench-fleet.json).
# Exit 1 when an invariant target broke (writes while idle, a rollout past maxUnavailable, joining
# nodes publishing statuses before their specs).
#
#   BENCH_FLEET_NODES=1000 BENCH_FLEET_START_NODES=100 BENCH_FLEET_IDLE=300 (defaults)
#   BENCH_FLEET_PLAN_NODES=50000  also time `gpu-tenancy plan` on that many nodes (0: skip)
#   quick: BENCH_FLEET_NODES=200 BENCH_FLEET_START_NODES=50 BENCH_FLEET_IDLE=30 BENCH_FLEET_PLAN_NODES=0
#   BENCH_FLEET_ARGS: more flags for gpu-tenancy-fleet bench (see its --help)
#   BENCH_FLEET_CONTROLLER_ARGS: more flags for the controller (e.g. --writes-in-flight 32)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
DIR="$ROOT/target/bench-fleet"
BIN="$ROOT/target/release"
CONTROLPLANE="$ROOT/e2e/bin/controlplane"
KUBECTL="$ROOT/e2e/bin/kubectl"
CARGO="${CARGO:-cargo}"

say() { printf 'bench-fleet: %s\n' "$*" >&2; }
die() { printf 'bench-fleet: error: %s\n' "$*" >&2; exit 2; }

PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	[[ -x "$CONTROLPLANE" ]] && "$CONTROLPLANE" down --dir "$DIR/controlplane" >/dev/null 2>&1 || true
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

say "building release binaries: gpu-tenancy, gpu-tenancy-fleet, the simulated NVML library ..."
"$CARGO" build --release -p gpu-tenancy -p gpu-tenancy-fleet -p nvml-sim
e2e/run.sh build

rm -rf "$DIR/controlplane"
mkdir -p "$DIR"
say "starting a fresh control plane (logs: target/bench-fleet/) ..."
"$CONTROLPLANE" up --dir "$DIR/controlplane" --die-with-parent=true >"$DIR/controlplane.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 1800); do [[ -f "$DIR/controlplane/ready" ]] && break; sleep 0.1; done
[[ -f "$DIR/controlplane/ready" ]] || die "the control plane did not start (see target/bench-fleet/controlplane.log)"
export KUBECONFIG="$DIR/controlplane/kubeconfig"
"$KUBECTL" apply --server-side -f crds/ >/dev/null
"$KUBECTL" wait --for condition=established --timeout=60s crd --all >/dev/null

# A port of its own, so a concurrent run elsewhere on this machine does not answer for it.
PORT=$((20000 + RANDOM % 20000))
say "starting gpu-tenancy controller (release, no leader election, metrics on 127.0.0.1:$PORT, log: target/bench-fleet/controller.log) ..."
# shellcheck disable=SC2086 # BENCH_FLEET_CONTROLLER_ARGS is a list of flags
RUST_LOG="${RUST_LOG:-info}" "$BIN/gpu-tenancy" controller --no-leader-election --metrics-addr "127.0.0.1:$PORT" \
	--check-incremental --log-format json ${BENCH_FLEET_CONTROLLER_ARGS:-} >"$DIR/controller.log" 2>&1 &
CONTROLLER=$!
PIDS+=("$CONTROLLER")

# shellcheck disable=SC2086 # BENCH_FLEET_ARGS is a list of flags
"$BIN/gpu-tenancy-fleet" bench --controller-pid "$CONTROLLER" --metrics-addr "127.0.0.1:$PORT" \
	--control-plane-pid "$(cat "$DIR/controlplane/controlplane.pid")" \
	--controller-log "$DIR/controller.log" --gpu-tenancy "$BIN/gpu-tenancy" --nvml-sim "$BIN/libnvidia_ml_sim.so" --work-dir "$DIR" \
	--out "$ROOT/target/bench-fleet.json" ${BENCH_FLEET_ARGS:-}
