#!/usr/bin/env bash
# `make run`: the whole product on simulated GPUs. A local control plane (kube-apiserver + etcd,
# built from the Kubernetes modules), the CRDs, the controller and one agent per node of
# examples/inventory.yaml, each on its own simulated libnvidia-ml.so state; then examples/ is
# applied and everything is watched until Ready. There is no kubelet: the demo creates the Node
# objects with the labels NVIDIA's GPU feature discovery would set.
#
# GPU_TENANCY_DEMO_EXIT=1: exit after the first complete print, 0 only if all became Ready.
# Otherwise it keeps running and prints every change of a GpuTenant or GpuNode until Ctrl-C
# (e2e/run-check.sh, the last step of `make test`, holds it to that).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
DIR="$ROOT/target/demo"
BIN="$ROOT/target/debug/gpu-tenancy"
SIM="$ROOT/target/debug/libnvidia_ml_sim.so"
KUBECTL="$ROOT/e2e/bin/kubectl"
CARGO="${CARGO:-cargo}"
TIMEOUT="${GPU_TENANCY_DEMO_TIMEOUT:-180}"

say() { printf '\033[1mdemo:\033[0m %s\n' "$*" >&2; }
die() { printf 'demo: error: %s\n' "$*" >&2; exit 1; }

PIDS=()
cleanup() {
	# A watch is a subshell with kubectl as its child: stop the child too.
	for p in "${PIDS[@]}"; do pkill -P "$p" 2>/dev/null || true; kill "$p" 2>/dev/null || true; done
	[[ -x "$ROOT/e2e/bin/controlplane" ]] && "$ROOT/e2e/bin/controlplane" down --dir "$DIR/controlplane" >/dev/null 2>&1 || true
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

say "building gpu-tenancy and the simulated NVML library ..."
"$CARGO" build -p gpu-tenancy -p nvml-sim
say "building the control plane (the first build takes several minutes; later ones seconds) ..."
e2e/run.sh build

rm -rf "$DIR"
mkdir -p "$DIR"
say "starting a control plane (logs: target/demo/controlplane/) ..."
"$ROOT/e2e/bin/controlplane" up --dir "$DIR/controlplane" --die-with-parent=true >"$DIR/controlplane.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 1800); do [[ -f "$DIR/controlplane/ready" ]] && break; sleep 0.1; done
[[ -f "$DIR/controlplane/ready" ]] || die "the control plane did not start (see target/demo/controlplane.log)"
export KUBECONFIG="$DIR/controlplane/kubeconfig"
k() { "$KUBECTL" "$@"; }

say "installing the CRDs ..."
k apply --server-side -f crds/ >/dev/null
k wait --for condition=established --timeout=60s crd --all >/dev/null
k create namespace nvidia-device-plugin >/dev/null
k create namespace gpu-tenancy-system >/dev/null

# The fleet of examples/inventory.yaml: name, labels, simulated GPUs.
node() { # NAME LABELS_JSON SIM_GPUS_YAML
	local name="$1" labels="$2" gpus="$3"
	printf '{"apiVersion":"v1","kind":"Node","metadata":{"name":"%s","labels":%s}}' "$name" "$labels" | k apply -f - >/dev/null
	printf 'gpus:\n%s\n' "$gpus" >"$DIR/sim-$name.yaml"
	GPU_TENANCY_SIM_CONFIG="$DIR/sim-$name.yaml" GPU_TENANCY_SIM_STATE="$DIR/sim-$name.state.json" \
		GPU_TENANCY_NVML_LIB="$SIM" GPU_TENANCY_CUDA_LIB="$SIM" RUST_LOG=warn \
		"$BIN" agent run --node-name "$name" --poll 5 >"$DIR/agent-$name.log" 2>&1 &
	PIDS+=($!)
	say "node $name: agent started on simulated GPUs (log: target/demo/agent-$name.log)"
}
H100='{"nvidia.com/gpu.product":"NVIDIA-H100-80GB-HBM3","nvidia.com/gpu.present":"true"}'
node gpu-h100-1 "$H100" '- {pciDeviceId: "0x233010DE", count: 4, numaNode: 0}
- {pciDeviceId: "0x233010DE", count: 4, numaNode: 1}'
node gpu-h100-2 "$H100" '- {pciDeviceId: "0x233010DE", count: 8}'
node gpu-a100-1 '{"nvidia.com/gpu.product":"NVIDIA-A100-SXM4-40GB","nvidia.com/gpu.present":"true"}' '- {pciDeviceId: "0x20B010DE", count: 8}'
node gpu-h200-1 '{"nvidia.com/gpu.product":"NVIDIA-H200","gputenancy.io/pool":"experiments","nvidia.com/gpu.present":"true"}' '- {pciDeviceId: "0x233510DE", count: 8}'
node gpu-h200-2 '{"nvidia.com/gpu.product":"NVIDIA-H200","gputenancy.io/pool":"training","nvidia.com/gpu.present":"true"}' '- {pciDeviceId: "0x233510DE", count: 4, numaNode: 0}
- {pciDeviceId: "0x233510DE", count: 4, numaNode: 1}'

say "starting the controller (log: target/demo/controller.log) ..."
RUST_LOG=info "$BIN" controller --no-leader-election --metrics-addr 127.0.0.1:0 >"$DIR/controller.log" 2>&1 &
PIDS+=($!)

say "applying examples/ (policy, tenants, plans) ..."
k apply -f examples/policy.yaml -f examples/tenants.yaml -f examples/plans.yaml >/dev/null

# Ready: every tenant, plan, policy and GPU node has Ready=True for its current generation.
not_ready() {
	k get gputenancy -o json | python3 -c '
import json, sys
items = json.load(sys.stdin)["items"]
bad = []
for o in items:
    st = o.get("status") or {}
    ready = [c for c in st.get("conditions", []) if c["type"] == "Ready"]
    if st.get("observedGeneration") != o["metadata"].get("generation") or not ready or ready[0]["status"] != "True":
        bad.append(o["kind"] + "/" + o["metadata"]["name"])
print(" ".join(bad) if items else "nothing yet")
'
}
say "waiting until every tenant, plan and node is Ready (at most ${TIMEOUT}s) ..."
start=$SECONDS
while :; do
	pending="$(not_ready)"
	[[ -z "$pending" ]] && break
	if ((SECONDS - start > TIMEOUT)); then
		k get gputenancy || true
		k get gpunodes -o yaml >"$DIR/gpunodes.yaml" 2>&1 || true
		cp -r "$DIR" "$ROOT/target/demo-failed" 2>/dev/null || true
		die "not Ready after ${TIMEOUT}s: $pending (logs in target/demo/)"
	fi
	sleep 2
done
say "everything is Ready after $((SECONDS - start))s"
echo
k get gputenancy
echo
k get gpunodes -o wide
echo
say "tenant grants"
k get gputenants -o custom-columns='TENANT:.metadata.name,TIER:.spec.tier,GRANTED:.status.summary,MEMORY MiB:.status.grantedMemoryMiB,ISOLATED:.status.conditions[?(@.type=="Isolated")].reason'
echo
if [[ "${GPU_TENANCY_DEMO_EXIT:-}" == 1 ]]; then
	exit 0
fi
say "running; try: KUBECONFIG=$KUBECONFIG $KUBECTL edit gputenant team-beta   (Ctrl-C stops everything)"
# kubectl watches one resource type per command ("you may only specify a single resource type"
# with --watch-only): one watch per kind, each started again when the API server ends its watch.
watch_kind() {
	while :; do
		k get "$1" --watch-only || true
		sleep 1
	done
}
watch_kind gputenants &
PIDS+=($!)
watch_kind gpunodes &
PIDS+=($!)
# Until Ctrl-C (or a TERM): the traps above stop the watches, agents, controller and control plane.
while :; do sleep 1; done
