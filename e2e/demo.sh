#!/usr/bin/env bash
# `make run`: the whole product on simulated GPUs. A local control plane (kube-apiserver + etcd,
# built from the Kubernetes modules, with kube-scheduler and the ResourceClaim controller), the
# CRDs, the controller and one agent per node of examples/inventory.yaml, each on its own
# simulated libnvidia-ml.so state, plus one node of a DRA pool (examples/dra/) whose agent runs as
# the DRA kubelet plugin; then examples/ is applied and everything is watched until Ready. There
# is no kubelet: the demo creates the Node objects with the labels NVIDIA's GPU feature discovery
# would set, and on the DRA node a fake kubelet (e2e/suite/src/bin/fake-kubelet.rs) prepares the
# claims of the pods the scheduler binds there, so the two DRA teams' example pods show which
# device each got.
#
# GPU_TENANCY_DEMO_EXIT=1: exit after the first complete print, 0 only if all became Ready.
# Otherwise it keeps running and prints every change of a GpuTenant or GpuNode until Ctrl-C
# (e2e/run-check.sh, the last step of `make test`, holds it to that).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
DIR="$ROOT/target/demo"
BIN="$ROOT/target/debug/gpu-tenancy"
FAKE_KUBELET="$ROOT/target/debug/fake-kubelet"
SIM="$ROOT/target/debug/libnvidia_ml_sim.so"
KUBECTL="$ROOT/e2e/bin/kubectl"
CARGO="${CARGO:-cargo}"
TIMEOUT="${GPU_TENANCY_DEMO_TIMEOUT:-180}"

say() { printf '\033[1mdemo:\033[0m %s\n' "$*" >&2; }
die() { printf 'demo: error: %s\n' "$*" >&2; exit 1; }

PIDS=()
cleanup() {
	# Newest first (the watches, the controller, the agents), the control plane last, so nothing
	# retries against an API server that is gone. A watch is a subshell with kubectl as its
	# child: stop the child too. Whatever has not ended after 15 s (a loaded machine) is killed.
	local i p
	for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
		p="${PIDS[i]}"
		pkill -P "$p" 2>/dev/null || true
		kill "$p" 2>/dev/null || true
	done
	for _ in $(seq 1 150); do
		local alive=0
		for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
		((alive)) || break
		sleep 0.1
	done
	for p in "${PIDS[@]}"; do
		pkill -KILL -P "$p" 2>/dev/null || true
		kill -KILL "$p" 2>/dev/null || true
	done
	[[ -x "$ROOT/e2e/bin/controlplane" ]] && "$ROOT/e2e/bin/controlplane" down --dir "$DIR/controlplane" --timeout 15s >/dev/null 2>&1 || true
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

say "building gpu-tenancy and the simulated NVML library ..."
"$CARGO" build -p gpu-tenancy -p nvml-sim
"$CARGO" build -p gpu-tenancy-e2e --bin fake-kubelet
say "building the control plane (the first build takes several minutes; later ones seconds) ..."
e2e/run.sh build

rm -rf "$DIR"
mkdir -p "$DIR"
say "starting a control plane (logs: target/demo/controlplane/) ..."
"$ROOT/e2e/bin/controlplane" up --dir "$DIR/controlplane" --die-with-parent=true --scheduler >"$DIR/controlplane.log" 2>&1 &
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
		"$BIN" agent run --node-name "$name" --poll 5 \
		--pod-resources-socket "$DIR/pod-resources-$name.sock" >"$DIR/agent-$name.log" 2>&1 &
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

# A node of the DRA pool (examples/dra/pool.yaml): its agent is also the DRA kubelet plugin, its
# sockets, checkpoint and CDI specs under target/demo/dra-NAME/. The node is faked Ready (as
# Kubernetes' own DRA tests do) so the scheduler places pods there, and a fake kubelet prepares
# their claims.
node_dra() { # NAME LABELS_JSON SIM_GPUS_YAML GPU_COUNT
	local name="$1" labels="$2" gpus="$3" count="$4" d="$DIR/dra-$1" now
	mkdir -p "$d"
	printf '{"apiVersion":"v1","kind":"Node","metadata":{"name":"%s","labels":%s}}' "$name" "$labels" | k apply -f - >/dev/null
	now="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
	k patch node "$name" --subresource=status --type=merge -p '{"status":{"capacity":{"cpu":"64","memory":"512Gi","pods":"250"},"allocatable":{"cpu":"64","memory":"512Gi","pods":"250"},"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","message":"make run fakes this node","lastHeartbeatTime":"'"$now"'","lastTransitionTime":"'"$now"'"}]}}' >/dev/null
	# The API server taints a new Node not-ready; the node lifecycle controller (not run here)
	# would lift it once the node is Ready.
	k patch node "$name" --type=merge -p '{"spec":{"taints":null}}' >/dev/null
	printf 'gpus:\n%s\n' "$gpus" >"$DIR/sim-$name.yaml"
	# The driver's MIG capability minors, as the simulator numbers GPU and compute instances.
	{
		echo "config 1"
		echo "monitor 2"
		local n=3 gpu gi
		for ((gpu = 0; gpu < count; gpu++)); do
			for ((gi = 0; gi < 15; gi++)); do
				echo "gpu$gpu/gi$gi/access $n"
				echo "gpu$gpu/gi$gi/ci0/access $((n + 1))"
				n=$((n + 2))
			done
		done
	} >"$d/mig-minors"
	GPU_TENANCY_SIM_CONFIG="$DIR/sim-$name.yaml" GPU_TENANCY_SIM_STATE="$DIR/sim-$name.state.json" \
		GPU_TENANCY_NVML_LIB="$SIM" GPU_TENANCY_CUDA_LIB="$SIM" RUST_LOG=warn \
		"$BIN" agent run --node-name "$name" --poll 5 --mode dra \
		--kubelet-registry-dir "$d/plugins_registry" --kubelet-plugins-dir "$d/plugins" \
		--state-dir "$d/state" --cdi-dir "$d/cdi" --mig-minors-file "$d/mig-minors" \
		--mps-pipe-dir "$d/mps-pipe" --mps-log-dir "$d/mps-log" >"$DIR/agent-$name.log" 2>&1 &
	PIDS+=($!)
	"$FAKE_KUBELET" "$name" "$d" >"$DIR/kubelet-$name.log" 2>&1 &
	PIDS+=($!)
	say "node $name: DRA agent and fake kubelet started (logs: target/demo/agent-$name.log, kubelet-$name.log)"
}
node_dra gpu-h100-dra-1 '{"gputenancy.io/pool":"dra","nvidia.com/gpu.present":"true"}' '- {pciDeviceId: "0x233010DE", count: 2}' 2

say "starting the controller (log: target/demo/controller.log) ..."
RUST_LOG=info "$BIN" controller --no-leader-election --metrics-addr 127.0.0.1:0 >"$DIR/controller.log" 2>&1 &
PIDS+=($!)

say "applying examples/ (policy, tenants, plans, the DRA pool) ..."
k apply -f examples/policy.yaml -f examples/tenants.yaml -f examples/plans.yaml -f examples/dra/pool.yaml >/dev/null

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
# The DRA pool: the two teams' example claims and pods, and which device each got.
say "applying examples/dra/claims.yaml: claims and pods of vision and speech on the DRA node ..."
k apply -f examples/dra/claims.yaml >/dev/null
start=$SECONDS
until [[ "$(k get pods -A --field-selector=status.phase=Running -o name 2>/dev/null | grep -c -E 'pod/(detector|trainer|asr)$')" == 3 ]]; do
	if ((SECONDS - start > 90)); then
		k get pods -A -o wide || true
		die "the DRA example pods did not start within 90s (logs: target/demo/kubelet-gpu-h100-dra-1.log, agent-gpu-h100-dra-1.log)"
	fi
	sleep 1
done
sleep 2 # the agent publishes status.claims within half a second of a Prepare
say "DRA: who got which device (kube-scheduler allocated, the agent prepared it after checking the tenant)"
k get resourceclaims -A -o custom-columns='NAMESPACE:.metadata.namespace,CLAIM:.metadata.name,CLASS:.spec.devices.requests[*].exactly.deviceClassName,NODE:.status.allocation.devices.results[*].pool,DEVICES:.status.allocation.devices.results[*].device'
echo
k get gpunode gpu-h100-dra-1 -o jsonpath='{range .status.claims[*]}{.device}{"\t"}{.tenant}{"\t"}{.claim}{"\n"}{end}' | awk 'BEGIN {printf "%-16s %-8s %s\n", "DEVICE", "TENANT", "CLAIM"} {printf "%-16s %-8s %s\n", $1, $2, $3}'
echo
if [[ "${GPU_TENANCY_DEMO_EXIT:-}" == 1 ]]; then
	exit 0
fi
say "running; try: KUBECONFIG=$KUBECONFIG $KUBECTL edit gputenant team-beta   (Ctrl-C stops everything)"
# kubectl watches one resource type per command ("you may only specify a single resource type"
# with --watch-only): one watch per kind, each started again when the API server ends its watch.
DEMO_PID=$$
watch_kind() {
	# Ends with make run even if a stop misses it ($$ is make run's shell in this subshell too).
	while kill -0 "$DEMO_PID" 2>/dev/null; do
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
