#!/usr/bin/env bash
# `make run`: the whole product on simulated GPUs. A local control plane (kube-apiserver + etcd,
# built from the Kubernetes modules, with kube-scheduler and the ResourceClaim controller), the
# CRDs, the controller and one agent per node of examples/inventory.yaml, each on its own
# simulated libnvidia-ml.so state, plus one node of a DRA pool (examples/dra/) whose agent runs as
# the DRA kubelet plugin; then examples/ is applied and everything is watched until Ready. As root,
# every node runs Kubernetes' own kubelet (e2e/bin/kubelet) on a CRI runtime that runs no
# containers but resolves their CDI devices as containerd does, registering its Node with the
# labels NVIDIA's GPU feature discovery would set: the two DRA teams' example pods start with the
# devices the agent prepared, and on each device-plugin node a device plugin advertising what
# NVIDIA's would for the config the controller rendered (e2e/bin/kubelet device-plugin) lets the
# device-plugin tenants' example pods (examples/device-plugin/) start, their agents reading the
# kubelet's pod-resources API. The kubelet needs root (it mounts pod volumes, and each runs in a
# mount namespace of its own: its device manager's directory is fixed); without root the
# device-plugin nodes are Node objects only and a fake kubelet (e2e/suite/src/bin/fake-kubelet.rs)
# prepares the DRA claims. A Prometheus (e2e/bin/prometheus, when built) scrapes every agent and the
# controller every 2 s; simulated processes of each tenant run on devices the plan granted it, and
# `gpu-tenancy report` shows their GPU-hours and efficiency.
#
# GPU_TENANCY_DEMO_EXIT=1: exit after the first complete print, 0 only if all became Ready.
# Otherwise it keeps running and prints every change of a GpuTenant or GpuNode until Ctrl-C
# (e2e/run-check.sh, the last step of `make test`, holds it to that). GPU_TENANCY_DEMO_REPORT_AFTER
# (seconds, default 60): when, after it is running, it prints the report once.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
DIR="$ROOT/target/demo"
BIN="$ROOT/target/debug/gpu-tenancy"
FAKE_KUBELET="$ROOT/target/debug/fake-kubelet"
KUBELET="$ROOT/e2e/bin/kubelet"
SIM="$ROOT/target/debug/libnvidia_ml_sim.so"
SIM_CTL="$ROOT/target/debug/sim-ctl"
PROMETHEUS="$ROOT/e2e/bin/prometheus"
KUBECTL="$ROOT/e2e/bin/kubectl"
CARGO="${CARGO:-cargo}"
TIMEOUT="${GPU_TENANCY_DEMO_TIMEOUT:-180}"
REPORT_AFTER="${GPU_TENANCY_DEMO_REPORT_AFTER:-60}"

say() { printf '\033[1mdemo:\033[0m %s\n' "$*" >&2; }
die() { printf 'demo: error: %s\n' "$*" >&2; exit 1; }
# A port no one listens on now, for a metrics endpoint or Prometheus (the OS picks it).
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

PIDS=()
# The kubelet mounts each pod's volumes (tmpfs) under its root directory.
unmount_kubelets() {
	local r
	for r in "$DIR"/dra-*/root "$DIR"/dp-*/root; do
		[[ -d "$r" ]] && umount -R "$r" 2>/dev/null || true
	done
}
cleanup() {
	# Newest first (the watches, the controller, the agents), the control plane last, so nothing
	# retries against an API server that is gone. A watch is a subshell with kubectl as its
	# child: stop the child too. Whatever has not ended after 15 s (a loaded machine) is killed.
	local i p
	# What the stop did and when, for a stop that takes long (target/demo/stop.log).
	stoplog() { printf '%s %s\n' "$(date +%T.%N)" "$*" >>"$DIR/stop.log" 2>/dev/null || true; }
	stoplog "stopping ${#PIDS[@]} processes"
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
		kill -0 "$p" 2>/dev/null && stoplog "still running after 15 s, killed: $p $(ps -o comm= -p "$p" 2>/dev/null)"
		pkill -KILL -P "$p" 2>/dev/null || true
		kill -KILL "$p" 2>/dev/null || true
	done
	stoplog "processes stopped; unmounting the kubelet's volumes, stopping the control plane"
	unmount_kubelets
	[[ -x "$ROOT/e2e/bin/controlplane" ]] && "$ROOT/e2e/bin/controlplane" down --dir "$DIR/controlplane" --timeout 15s >/dev/null 2>&1 || true
	stoplog "stopped"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

say "building gpu-tenancy and the simulated NVML library ..."
"$CARGO" build -p gpu-tenancy -p nvml-sim
"$CARGO" build -p gpu-tenancy-e2e --bin fake-kubelet
say "building the control plane (the first build takes several minutes; later ones seconds) ..."
e2e/run.sh build

unmount_kubelets
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

# Every metrics endpoint (agents, controller), for Prometheus to scrape.
TARGETS=()

# Kubernetes' own kubelet for a node, as root: its root directory, the runtime's socket and CDI
# specs under DIR. The node lifecycle controller does not run here, so the demo lifts the
# not-ready taint the API server gives a new Node, as it would.
real_kubelet() { # NAME LABELS_JSON DIR: the runtime and the kubelet, until the Node is Ready
	local name="$1" labels d="$3" port
	labels="$(python3 -c 'import json, sys; print(",".join(k + "=" + v for k, v in json.loads(sys.argv[1]).items()))' "$2")"
	mkdir -p "$d/root" "$d/cdi" "$d/logs" "$d/pki"
	(cd "$d" && exec "$KUBELET" runtime --socket "$d/cri.sock" --cdi-dir "$d/cdi" --record "$d/containers.jsonl") >"$DIR/runtime-$name.log" 2>&1 &
	PIDS+=($!)
	port="$(free_port)"
	cat >"$d/kubelet.yaml" <<-EOF
		apiVersion: kubelet.config.k8s.io/v1beta1
		kind: KubeletConfiguration
		failCgroupV1: false
		cgroupsPerQOS: false
		enforceNodeAllocatable: []
		failSwapOn: false
		cgroupDriver: cgroupfs
		containerRuntimeEndpoint: unix://$d/cri.sock
		authentication: {webhook: {enabled: false}, anonymous: {enabled: false}}
		authorization: {mode: AlwaysAllow}
		evictionHard: {}
		readOnlyPort: 0
		healthzPort: 0
		address: 127.0.0.1
		port: $port
		podLogsDir: $d/logs
	EOF
	# In its own folder: with this runtime the kubelet removes files relative to its working
	# directory. In a mount namespace of its own where the device manager's fixed directory
	# (/var/lib/kubelet/device-plugins, whatever --root-dir says; emptied at its start) is the
	# node's: the kubelets of this machine keep their own device plugins.
	mkdir -p "$d/root/device-plugins"
	(cd "$d" && exec unshare --mount --propagation private -- sh -c \
		'mkdir -p /var/lib/kubelet/device-plugins && mount --bind "$0" /var/lib/kubelet/device-plugins && exec "$@"' \
		"$d/root/device-plugins" "$KUBELET" --config "$d/kubelet.yaml" --kubeconfig "$DIR/controlplane/kubeconfig" \
		--root-dir "$d/root" --cert-dir "$d/pki" --hostname-override "$name" --node-labels "$labels") \
		>"$DIR/kubelet-$name.log" 2>&1 &
	PIDS+=($!)
	local start=$SECONDS
	until [[ "$(k get node "$name" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]]; do
		((SECONDS - start > 90)) && die "the kubelet of $name did not make its Node Ready (log: target/demo/kubelet-$name.log)"
		sleep 0.5
	done
	k patch node "$name" --type=json -p '[{"op":"remove","path":"/spec/taints"}]' >/dev/null 2>&1 || true
}
# The fleet of examples/inventory.yaml: name, labels, simulated GPUs.
# As root the kubelet registers the Node and serves the pod-resources API the agent reads;
# otherwise the demo creates the Node object and nothing answers there.
node() { # NAME LABELS_JSON SIM_GPUS_YAML
	local name="$1" labels="$2" gpus="$3" port socket
	port="$(free_port)"
	TARGETS+=("127.0.0.1:$port")
	if ((EUID == 0)); then
		real_kubelet "$name" "$labels" "$DIR/dp-$name"
		socket="$DIR/dp-$name/root/pod-resources/kubelet.sock"
	else
		printf '{"apiVersion":"v1","kind":"Node","metadata":{"name":"%s","labels":%s}}' "$name" "$labels" | k apply -f - >/dev/null
		socket="$DIR/pod-resources-$name.sock"
	fi
	printf 'gpus:\n%s\n' "$gpus" >"$DIR/sim-$name.yaml"
	# --proc-root: the simulated PIDs are no processes of this machine; a tree of its own (empty:
	# there are no pods) keeps the agent from reading another process's cgroup for one.
	GPU_TENANCY_SIM_CONFIG="$DIR/sim-$name.yaml" GPU_TENANCY_SIM_STATE="$DIR/sim-$name.state.json" \
		GPU_TENANCY_NVML_LIB="$SIM" GPU_TENANCY_CUDA_LIB="$SIM" RUST_LOG=warn \
		"$BIN" agent run --node-name "$name" --poll 5 --metrics-addr "127.0.0.1:$port" \
		--pod-resources-socket "$socket" --proc-root "$DIR/proc-$name" \
		>"$DIR/agent-$name.log" 2>&1 &
	PIDS+=($!)
	if ((EUID == 0)); then
		say "node $name: Kubernetes' kubelet and the agent started on simulated GPUs (logs: target/demo/kubelet-$name.log, agent-$name.log)"
	else
		say "node $name: agent started on simulated GPUs (log: target/demo/agent-$name.log)"
	fi
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
# checkpoint under target/demo/dra-NAME/. As root, Kubernetes' own kubelet registers the Node
# and the plugin (its root directory, the runtime's socket and CDI specs under the same folder).
# Otherwise the Node is faked Ready (as Kubernetes' own DRA
# tests do) and a fake kubelet prepares the claims of the pods bound there.
fake_node() { # NAME LABELS_JSON: a Node object, faked Ready
	local name="$1" labels="$2" now
	printf '{"apiVersion":"v1","kind":"Node","metadata":{"name":"%s","labels":%s}}' "$name" "$labels" | k apply -f - >/dev/null
	now="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
	k patch node "$name" --subresource=status --type=merge -p '{"status":{"capacity":{"cpu":"64","memory":"512Gi","pods":"250"},"allocatable":{"cpu":"64","memory":"512Gi","pods":"250"},"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","message":"make run fakes this node","lastHeartbeatTime":"'"$now"'","lastTransitionTime":"'"$now"'"}]}}' >/dev/null
	# The API server taints a new Node not-ready; the node lifecycle controller (not run here)
	# would lift it once the node is Ready.
	k patch node "$name" --type=merge -p '{"spec":{"taints":null}}' >/dev/null
}
node_dra() { # NAME LABELS_JSON SIM_GPUS_YAML GPU_COUNT
	local name="$1" labels="$2" gpus="$3" count="$4" d="$DIR/dra-$1" port registry plugins cdi
	mkdir -p "$d"
	port="$(free_port)"
	TARGETS+=("127.0.0.1:$port")
	if ((EUID == 0)); then
		real_kubelet "$name" "$labels" "$d"
		registry="$d/root/plugins_registry" plugins="$d/root/plugins" cdi="$d/cdi"
	else
		fake_node "$name" "$labels"
		registry="$d/plugins_registry" plugins="$d/plugins" cdi="$d/cdi"
	fi
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
		"$BIN" agent run --node-name "$name" --poll 5 --mode dra --metrics-addr "127.0.0.1:$port" \
		--kubelet-registry-dir "$registry" --kubelet-plugins-dir "$plugins" \
		--state-dir "$d/state" --cdi-dir "$cdi" --mig-minors-file "$d/mig-minors" \
		--mps-pipe-dir "$d/mps-pipe" --mps-log-dir "$d/mps-log" --proc-root "$DIR/proc-$name" \
		>"$DIR/agent-$name.log" 2>&1 &
	PIDS+=($!)
	if ((EUID == 0)); then
		say "node $name: Kubernetes' kubelet and its DRA agent started (logs: target/demo/kubelet-$name.log, agent-$name.log)"
	else
		"$FAKE_KUBELET" "$name" "$d" >"$DIR/kubelet-$name.log" 2>&1 &
		PIDS+=($!)
		say "node $name: DRA agent and fake kubelet started, not root (logs: target/demo/agent-$name.log, kubelet-$name.log)"
	fi
}
# NVIDIA's CDI spec of a DRA node's GPUs and MIG instances, named by UUID, as the GPU Operator's
# toolkit writes it (nvidia-ctk cdi generate --device-name-strategy=uuid) once the instances exist:
# Prepare names these devices beside its own, and the runtime refuses a container without them.
nvidia_cdi_spec() { # NAME
	local d="$DIR/dra-$1"
	((EUID == 0)) || return 0
	k get resourceslices -o json | python3 -c '
import json, sys
node, out = sys.argv[1], sys.argv[2]
uuids = sorted({d["attributes"]["uuid"]["string"] for s in json.load(sys.stdin)["items"]
                if s["spec"].get("nodeName") == node for d in s["spec"].get("devices", [])
                if "uuid" in d.get("attributes", {})})
spec = {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
        "devices": [{"name": u, "containerEdits": {"env": ["NVIDIA_DRIVER_DEVICE=" + u]}} for u in uuids],
        "containerEdits": {"env": ["NVIDIA_DRIVER_CAPABILITIES=compute,utility"]}}
json.dump(spec, open(out, "w"), indent=1)
' "$1" "$d/cdi/nvidia.json"
}
node_dra gpu-h100-dra-1 '{"gputenancy.io/pool":"dra","nvidia.com/gpu.present":"true"}' '- {pciDeviceId: "0x233010DE", count: 2}' 2

say "starting the controller (log: target/demo/controller.log) ..."
CONTROLLER_PORT="$(free_port)"
TARGETS+=("127.0.0.1:$CONTROLLER_PORT")
RUST_LOG=info "$BIN" controller --no-leader-election --metrics-addr "127.0.0.1:$CONTROLLER_PORT" >"$DIR/controller.log" 2>&1 &
PIDS+=($!)

# Prometheus scraping every agent and the controller, its data in target/demo/prometheus/.
PROM_URL=
if [[ -x "$PROMETHEUS" ]]; then
	PROM_PORT="$(free_port)"
	PROM_URL="http://127.0.0.1:$PROM_PORT"
	mkdir -p "$DIR/prometheus"
	{
		echo "global: {scrape_interval: 2s, evaluation_interval: 2s}"
		echo "scrape_configs:"
		echo "- job_name: gpu-tenancy"
		echo "  static_configs:"
		echo "  - targets:"
		printf '    - "%s"\n' "${TARGETS[@]}"
	} >"$DIR/prometheus/prometheus.yml"
	"$PROMETHEUS" --config.file="$DIR/prometheus/prometheus.yml" --storage.tsdb.path="$DIR/prometheus/data" \
		--web.listen-address="127.0.0.1:$PROM_PORT" >"$DIR/prometheus.log" 2>&1 &
	PIDS+=($!)
	say "Prometheus on $PROM_URL scrapes ${#TARGETS[@]} targets (the agents, the controller) every 2s (log: target/demo/prometheus.log)"
else
	say "e2e/bin/prometheus is not built (make prometheus-build): running without Prometheus, so without the report"
fi

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
nvidia_cdi_spec gpu-h100-dra-1
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
say "DRA: the example pods, on the DRA node's kubelet"
k get pods -A --field-selector spec.nodeName=gpu-h100-dra-1 -o custom-columns='NAMESPACE:.metadata.namespace,POD:.metadata.name,NODE:.spec.nodeName,PHASE:.status.phase'
echo
say "DRA: who got which device (kube-scheduler allocated, the agent prepared it after checking the tenant)"
k get resourceclaims -A -o custom-columns='NAMESPACE:.metadata.namespace,CLAIM:.metadata.name,CLASS:.spec.devices.requests[*].exactly.deviceClassName,NODE:.status.allocation.devices.results[*].pool,DEVICES:.status.allocation.devices.results[*].device'
echo
k get gpunode gpu-h100-dra-1 -o jsonpath='{range .status.claims[*]}{.device}{"\t"}{.tenant}{"\t"}{.claim}{"\n"}{end}' | awk 'BEGIN {printf "%-16s %-8s %s\n", "DEVICE", "TENANT", "CLAIM"} {printf "%-16s %-8s %s\n", $1, $2, $3}'
echo

# NVIDIA's device plugin on each device-plugin node, as root: e2e/bin/kubelet device-plugin
# advertises what NVIDIA's plugin would for the config the controller rendered for the node (the
# key its nvidia.com/device-plugin.config label names in the plugin's ConfigMap) on the node's
# GPUs and MIG devices as its GpuNode reports them, and registers with the node's kubelet. Like
# NVIDIA's it reads the devices once, at start; nothing here restarts it after a later change of
# the node's layout or config (in a cluster the agent and config-manager do).
DP_NODES=(gpu-h100-1 gpu-h100-2 gpu-a100-1 gpu-h200-1 gpu-h200-2)
device_plugin() { # NAME
	local name="$1" d="$DIR/dp-$1" args
	k get node "$name" -o json >"$d/node.json"
	k get gpunode "$name" -o json >"$d/gpunode.json"
	k get configmap -n nvidia-device-plugin gpu-tenancy-device-plugin-configs -o json >"$d/configs.json"
	mapfile -t args < <(python3 -c '
import json, sys
d = sys.argv[1]
key = json.load(open(d + "/node.json"))["metadata"]["labels"]["nvidia.com/device-plugin.config"]
open(d + "/device-plugin.yaml", "w").write(json.load(open(d + "/configs.json"))["data"][key])
gpus, mig_gpus, mig = [], [], []
for g in json.load(open(d + "/gpunode.json"))["status"]["gpus"]:
    if (g.get("migMode") or {}).get("current"):
        mig_gpus.append(g["uuid"])
        mig += [i["uuid"] + "=" + i["profile"] for i in g.get("instances", []) if i.get("uuid")]
    else:
        gpus.append(g["uuid"])
for flag, v in (("--gpus", gpus), ("--mig-gpus", mig_gpus), ("--mig-devices", mig)):
    print(flag)
    print(",".join(v))
' "$d")
	(cd "$d" && exec "$KUBELET" device-plugin --plugin-dir "$d/root/device-plugins" --config "$d/device-plugin.yaml" "${args[@]}") \
		>"$DIR/device-plugin-$name.log" 2>&1 &
	PIDS+=($!)
}
if ((EUID == 0)); then
	say "starting a device plugin on each device-plugin node, for its rendered config (logs: target/demo/device-plugin-NODE.log) ..."
	for n in "${DP_NODES[@]}"; do device_plugin "$n"; done
	say "applying examples/device-plugin/pods.yaml: pods of acme, team-gamma, team-beta and research ..."
	k apply -f examples/device-plugin/pods.yaml >/dev/null
	start=$SECONDS
	until [[ "$(k get pods -A --field-selector=status.phase=Running -o name 2>/dev/null | grep -c -E 'pod/(inference|finetune|train|worker|notebook)$')" == 5 ]]; do
		if ((SECONDS - start > 90)); then
			k get pods -A -o wide || true
			die "the device-plugin example pods did not start within 90s (logs: target/demo/kubelet-NODE.log, device-plugin-NODE.log)"
		fi
		sleep 1
	done
	say "the example pods, on the nodes' kubelets (the device-plugin ones with the devices their kubelet's device manager allocated)"
	k get pods -A -o wide
	echo
else
	say "not root: the device-plugin nodes run no kubelet, so examples/device-plugin/pods.yaml is not applied"
fi

# Simulated work of each tenant on devices its grant holds, for the report: TENANT DEVICE MiB SM%.
# DEVICE `gpu` is a whole GPU the tenant is granted (Exclusive, MPS or time-sliced; one it holds
# alone where there is one, since NVML's utilization of a GPU several tenants share goes to
# `shared`), or a MIG profile: an instance of the tenant's. Each takes the first such device not
# yet taken on the nodes below, in that order, as their GpuNode specs grant them.
WORKLOADS=(
	"team-gamma gpu 60000 95"
	"team-gamma gpu 50000 75"
	"acme gpu 40000 30"
	"acme 3g.40gb 30000 80"
	"team-beta 2g.20gb 12000 80"
	"team-beta gpu 9000 60"
	"team-delta gpu 6000 20"
	"research gpu 20000 50"
)
# Each node's devices, one a line: `NODE gpu INDEX MODE TENANT...` for a GPU (no tenants on a MIG
# GPU), `NODE mig INDEX START PROFILE TENANT` for each of its MIG instances.
devices() { # NODE
	k get gpunode "$1" -o jsonpath='{range .spec.gpus[*]}gpu {.index} {.mode} {.tenants[*]}{"\n"}{range .migInstances[*]}mig {.placement.start} {.profile} {.tenant}{"\n"}{end}{end}' |
		awk -v node="$1" '$1 == "gpu" {gpu = $2; print node, $0; next} {print node, "mig", gpu, $2, $3, $4}'
}
DEVICES="$(for n in gpu-h100-1 gpu-h100-2 gpu-a100-1 gpu-h200-1 gpu-h200-2; do devices "$n"; done)"
TAKEN="|"
# The first device of kind DEVICE granted to TENANT and not taken: `NODE GPU START MODE` (START
# `-` for a whole GPU), nothing if there is none.
pick() { # TENANT DEVICE
	awk -v t="$1" -v want="$2" -v taken="$TAKEN" '
		$2 == "gpu" { key = $1 " " $3 " -" }
		$2 == "mig" { key = $1 " " $3 " " $4 }
		index(taken, "|" key "|") { next }
		want == "gpu" && $2 == "gpu" && $4 != "MIG" {
			held = 0
			for (i = 5; i <= NF; i++) if ($i == t) held = 1
			if (held && NF == 5 && alone == "") alone = key " " $4
			if (held && any == "") any = key " " $4
		}
		want != "gpu" && $2 == "mig" && $5 == want && $6 == t && mig == "" { mig = key " MIG" }
		END { print (want == "gpu" ? (alone != "" ? alone : any) : mig) }' <<<"$DEVICES"
}
say "starting simulated processes on devices the plan granted each tenant (sim-ctl attach) ..."
started=0
pid=4101
printf '%-12s %-12s %-4s %-10s %-12s %-6s %-4s %s\n' NODE TENANT GPU INSTANCE MODE MiB SM% PID
for w in "${WORKLOADS[@]}"; do
	read -r tenant want mib sm <<<"$w"
	read -r node gpu start mode <<<"$(pick "$tenant" "$want")" || true
	if [[ -z "${node:-}" ]]; then
		say "no $want of $tenant left to run a process on: skipped"
		continue
	fi
	TAKEN+="$node $gpu $start|"
	args=(attach --gpu "$gpu" --pid "$pid" --tenant "$tenant" --mib "$mib" --sm-util "$sm")
	instance=-
	if [[ "$start" != - ]]; then
		args+=(--start "$start")
		instance="$want@$start"
	fi
	GPU_TENANCY_SIM_CONFIG="$DIR/sim-$node.yaml" GPU_TENANCY_SIM_STATE="$DIR/sim-$node.state.json" \
		"$SIM_CTL" "${args[@]}" || die "sim-ctl ${args[*]} on $node failed"
	printf '%-12s %-12s %-4s %-10s %-12s %-6s %-4s %s\n' "$node" "$tenant" "$gpu" "$instance" "$mode" "$mib" "$sm" "$pid"
	started=$((started + 1))
	pid=$((pid + 1))
	unset node
done
say "$started of ${#WORKLOADS[@]} simulated processes running; they keep their devices busy, so a change that moves one waits (busyGpuPolicy Wait)"
say "end one with: GPU_TENANCY_SIM_CONFIG=target/demo/sim-NODE.yaml GPU_TENANCY_SIM_STATE=target/demo/sim-NODE.state.json target/debug/sim-ctl detach --pid PID"
echo

if [[ -n "$PROM_URL" ]]; then
	for _ in $(seq 1 300); do curl -sf "$PROM_URL/-/ready" >/dev/null 2>&1 && break; sleep 0.1; done
	curl -sf "$PROM_URL/-/ready" >/dev/null 2>&1 || die "Prometheus is not ready on $PROM_URL (see target/demo/prometheus.log)"
fi
if [[ "${GPU_TENANCY_DEMO_EXIT:-}" == 1 ]]; then
	exit 0
fi
say "running; try: KUBECONFIG=$KUBECONFIG $KUBECTL edit gputenant team-beta   (Ctrl-C stops everything)"
if [[ -n "$PROM_URL" ]]; then
	REPORT="target/debug/gpu-tenancy report --prometheus $PROM_URL --since 10m --plot target/demo/report.png"
	say "showback from Prometheus, once it has a minute or so of data: $REPORT   (printed once below in ${REPORT_AFTER}s)"
	(
		# Waited for in the background, as in watch_kind: a stop takes the sleep or the report along.
		child=
		trap 'kill "$child" 2>/dev/null; exit 0' TERM
		sleep "$REPORT_AFTER" &
		child=$!
		wait "$child"
		say "$REPORT"
		$REPORT &
		child=$!
		wait "$child" || say "the report failed (Prometheus: target/demo/prometheus.log)"
	) &
	PIDS+=($!)
fi
# kubectl watches one resource type per command ("you may only specify a single resource type"
# with --watch-only): one watch per kind, each started again when the API server ends its watch.
DEMO_PID=$$
watch_kind() {
	# Its children run in the background and are waited for, so a stop (TERM) reaches this loop
	# at once and it takes its child along: none is left behind, whatever the loop was doing. It
	# also ends with make run if a stop misses it ($$ is make run's shell in this subshell too).
	local child=
	trap 'kill "$child" 2>/dev/null; exit 0' TERM
	while kill -0 "$DEMO_PID" 2>/dev/null; do
		k get "$1" --watch-only &
		child=$!
		wait "$child" || true
		sleep 1 &
		child=$!
		wait "$child" || true
	done
}
watch_kind gputenants &
PIDS+=($!)
watch_kind gpunodes &
PIDS+=($!)
# Until Ctrl-C (or a TERM): the traps above stop the watches, agents, controller and control plane.
while :; do sleep 1; done
