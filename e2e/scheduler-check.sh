#!/usr/bin/env bash
# Checks `controlplane up --scheduler` (e2e/controlplane/scheduler.go): on a control plane of its
# own (target/e2e/scheduler-check-PID/, always stopped; kept on failure), with a fake node n1 (the
# test plays the kubelet: Ready status, no not-ready taint) and a ResourceSlice of driver
# gpu.example.com with two devices whose attribute `tenant` is "a" and "b":
#   - a pod with a ResourceClaimTemplate of DeviceClass a.example: the ResourceClaim controller
#     creates its claim, the scheduler allocates the tenant-a device, reserves the claim for the
#     pod and binds the pod to n1; once the pod has succeeded, the controller deletes the claim;
#   - a pod with limits example.com/b-gpu: 1, which DeviceClass b.example maps to DRA
#     (spec.extendedResourceName): the scheduler creates a claim for it itself and allocates the
#     tenant-b device.
# Needs e2e/bin/controlplane (e2e/run.sh build). Prints PASS/FAIL lines; exit status 1 on a FAIL.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT="$(pwd)"
CONTROLPLANE="$ROOT/e2e/bin/controlplane"
KUBECTL="$ROOT/e2e/bin/kubectl"
DIR="$ROOT/target/e2e/scheduler-check-$$"
NS=dra-check
TIMEOUT=60

[[ -x "$CONTROLPLANE" && -x "$KUBECTL" ]] || { echo "FAIL: no e2e/bin/controlplane; run e2e/run.sh build" >&2; exit 1; }

pass() { echo "PASS: $*"; }
fail() {
	echo "FAIL: $*"
	exit 1
}
k() { "$KUBECTL" --kubeconfig "$DIR/kubeconfig" "$@"; }

finish() {
	local status=$?
	"$CONTROLPLANE" down --dir "$DIR" >/dev/null 2>&1 || true
	if ((status == 0)); then
		rm -rf "$DIR"
	else
		echo "control plane state and log kept in ${DIR#"$ROOT"/}/" >&2
	fi
	exit "$status"
}
trap finish EXIT

# wait_for WHAT CMD...: CMD until it succeeds (PASS), or FAIL after TIMEOUT seconds.
wait_for() {
	local what="$1" end=$((SECONDS + TIMEOUT))
	shift
	until "$@" >/dev/null 2>&1; do
		((SECONDS < end)) || fail "$what (not within ${TIMEOUT}s)"
		sleep 0.2
	done
	pass "$what"
}

mkdir -p "$DIR"
t0=$SECONDS
"$CONTROLPLANE" up --dir "$DIR" --scheduler --die-with-parent=true >"$DIR/controlplane.log" 2>&1 &
cp_pid=$!
until [[ -f "$DIR/ready" ]]; do
	kill -0 "$cp_pid" 2>/dev/null || fail "control plane exited before it was ready (see its log)"
	((SECONDS - t0 < 180)) || fail "control plane not ready after 180s"
	sleep 0.1
done
pass "control plane with --scheduler ready in $((SECONDS - t0))s"

# The node, made Ready through the status subresource and freed of the not-ready taint that
# the TaintNodesByCondition admission plugin put on it (test/integration/dra/dra.go createNodes).
k create -f - >/dev/null <<'EOF'
apiVersion: v1
kind: Node
metadata:
  name: n1
  labels: {kubernetes.io/hostname: n1}
EOF
k patch node n1 --subresource=status --type=merge -p '{"status":{
  "capacity":{"cpu":"8","memory":"32Gi","pods":"110"},
  "allocatable":{"cpu":"8","memory":"32Gi","pods":"110"},
  "phase":"Running",
  "conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","message":"fake"}]}}' >/dev/null
k patch node n1 --type=merge -p '{"spec":{"taints":null}}' >/dev/null
[[ -z "$(k get node n1 -o jsonpath='{.spec.taints}')" ]] || fail "node n1 still tainted"

k apply -f - >/dev/null <<'EOF'
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata:
  name: n1-gpu.example.com
spec:
  driver: gpu.example.com
  nodeName: n1
  pool: {name: n1, generation: 1, resourceSliceCount: 1}
  devices:
  - name: gpu-0
    attributes:
      tenant: {string: "a"}
  - name: gpu-1
    attributes:
      tenant: {string: "b"}
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: a.example
spec:
  selectors:
  - cel:
      expression: device.driver == "gpu.example.com" && device.attributes["gpu.example.com"].tenant == "a"
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: b.example
spec:
  extendedResourceName: example.com/b-gpu
  selectors:
  - cel:
      expression: device.driver == "gpu.example.com" && device.attributes["gpu.example.com"].tenant == "b"
---
apiVersion: v1
kind: Namespace
metadata:
  name: dra-check
EOF
# The ServiceAccount admission plugin refuses pods until the namespace has its default account.
wait_for "namespace $NS has its default ServiceAccount" k -n "$NS" get serviceaccount default

k -n "$NS" apply -f - >/dev/null <<'EOF'
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: gpu-a
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {deviceClassName: a.example}
---
apiVersion: v1
kind: Pod
metadata:
  name: pa
spec:
  resourceClaims:
  - name: gpu
    resourceClaimTemplateName: gpu-a
  containers:
  - name: c
    image: pause
    resources:
      claims: [{name: gpu}]
---
apiVersion: v1
kind: Pod
metadata:
  name: pb
spec:
  containers:
  - name: c
    image: pause
    resources:
      limits: {example.com/b-gpu: "1"}
EOF

jp() { k -n "$NS" get "$1" -o jsonpath="$2"; } # OBJECT JSONPATH
tenant_of() { k get resourceslice n1-gpu.example.com -o jsonpath="{.spec.devices[?(@.name==\"$1\")].attributes.tenant.string}"; }
bound() { [[ "$(jp "pod/$1" '{.spec.nodeName}')" == n1 ]]; }
allocated() { [[ -n "$(jp "resourceclaim/$1" '{.status.allocation.devices.results[0].device}')" ]]; }

# check_claim CLAIM POD TENANT: allocated from gpu.example.com on n1 to a device of TENANT,
# reserved for POD (name and uid).
check_claim() {
	local claim="$1" pod="$2" tenant="$3" device driver pool reserved
	device="$(jp "resourceclaim/$claim" '{.status.allocation.devices.results[0].device}')"
	driver="$(jp "resourceclaim/$claim" '{.status.allocation.devices.results[0].driver}')"
	pool="$(jp "resourceclaim/$claim" '{.status.allocation.devices.results[0].pool}')"
	[[ "$driver/$pool" == gpu.example.com/n1 && "$(tenant_of "$device")" == "$tenant" ]] ||
		fail "claim $claim allocated $driver/$pool/$device (tenant $(tenant_of "$device")), not the tenant-$tenant device"
	pass "claim $claim allocated $driver/$pool/$device, the device whose tenant is \"$tenant\""
	reserved="$(jp "resourceclaim/$claim" '{range .status.reservedFor[*]}{.resource}/{.name}/{.uid} {end}')"
	[[ "$reserved" == "pods/$pod/$(jp "pod/$pod" '{.metadata.uid}') " ]] || fail "claim $claim reservedFor is '$reserved', not pod $pod"
	pass "claim $claim reservedFor pod $pod"
}

# 1. A claim from a ResourceClaimTemplate.
wait_for "pod pa bound to n1 (spec.nodeName)" bound pa
claim_a="$(jp pod/pa '{.status.resourceClaimStatuses[?(@.name=="gpu")].resourceClaimName}')"
[[ -n "$claim_a" ]] || fail "pod pa has no status.resourceClaimStatuses entry for claim gpu"
pass "ResourceClaim controller created claim $claim_a (pod pa status.resourceClaimStatuses)"
[[ "$(jp "resourceclaim/$claim_a" '{.metadata.annotations.resource\.kubernetes\.io/pod-claim-name}')" == gpu ]] ||
	fail "claim $claim_a lacks annotation resource.kubernetes.io/pod-claim-name=gpu"
wait_for "claim $claim_a allocated" allocated "$claim_a"
check_claim "$claim_a" pa a

# 2. A DRA extended resource: the claim is the scheduler's own.
wait_for "pod pb (limits example.com/b-gpu: 1) bound to n1" bound pb
claim_b="$(k -n "$NS" get resourceclaims -o jsonpath='{range .items[?(@.metadata.ownerReferences[0].name=="pb")]}{.metadata.name}{"\n"}{end}')"
[[ -n "$claim_b" && "$claim_b" != *$'\n'* ]] || fail "no single claim owned by pod pb (found: '$claim_b')"
[[ "$(jp "resourceclaim/$claim_b" '{.metadata.annotations.resource\.kubernetes\.io/extended-resource-claim}')" == true ]] ||
	fail "claim $claim_b lacks annotation resource.kubernetes.io/extended-resource-claim=true"
pass "scheduler created claim $claim_b (annotations: $(jp "resourceclaim/$claim_b" '{.metadata.annotations}'), labels: $(jp "resourceclaim/$claim_b" '{.metadata.labels}'))"
check_claim "$claim_b" pb b
ers="$(jp pod/pb '{.status.extendedResourceClaimStatus}')"
[[ "$(jp pod/pb '{.status.extendedResourceClaimStatus.resourceClaimName}')" == "$claim_b" ]] ||
	fail "pod pb status.extendedResourceClaimStatus does not name $claim_b: '$ers'"
pass "pod pb status.extendedResourceClaimStatus: $ers"

# 3. The pod is done (the test as the kubelet): the controller deletes the claim it generated
# (the garbage collector would not: the pod still exists).
k -n "$NS" patch pod pa --subresource=status --type=merge -p '{"status":{"phase":"Succeeded"}}' >/dev/null
gone() { ! k -n "$NS" get resourceclaim "$1" >/dev/null 2>&1; }
wait_for "claim $claim_a deleted once pod pa succeeded" gone "$claim_a"
