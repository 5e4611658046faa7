#!/usr/bin/env bash
# The last step of `make test`: `make run` as a person uses it. It must come up with everything
# Ready, keep running with Prometheus scraping it and the simulated processes started, print a
# change made with kubectl after that and the report of GPU-hours; then it must stop cleanly on
# Ctrl-C (SIGINT) and leave nothing running. Bounded in time; exit 0 only if all of that held.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
LOG="$ROOT/target/run-check.log"
KUBECTL="$ROOT/e2e/bin/kubectl"
UP_TIMEOUT="${GPU_TENANCY_RUN_CHECK_UP_TIMEOUT:-900}"
CHANGE_TIMEOUT="${GPU_TENANCY_RUN_CHECK_CHANGE_TIMEOUT:-90}"
# The report comes this long after make run is running (it waits a minute by default, for data).
export GPU_TENANCY_DEMO_REPORT_AFTER="${GPU_TENANCY_DEMO_REPORT_AFTER:-20}"

say() { printf 'run-check: %s\n' "$*" >&2; }
fail() {
	printf 'run-check: FAILED: %s\n--- last lines of make run (all of it in target/run-check.log) ---\n' "$*" >&2
	tail -n 40 "$LOG" >&2 || true
	exit 1
}

mkdir -p "$ROOT/target"
: >"$LOG"
# Job control gives the demo a process group of its own, so a stop reaches every child.
set -m
# SIGINT as a terminal gives it: a shell that started this one in the background (a CI runner,
# nohup ... &) leaves SIGINT ignored, a disposition bash cannot trap again, and Ctrl-C below
# would then stop nothing.
env --default-signal=INT e2e/demo.sh >"$LOG" 2>&1 &
DEMO=$!
set +m
stop_demo() { kill -INT -- "-$DEMO" 2>/dev/null || true; }
trap 'stop_demo' EXIT

say "make run started (pid $DEMO); waiting until it says everything is Ready and keeps running ..."
start=$SECONDS
until grep -q 'running; try:' "$LOG"; do
	kill -0 "$DEMO" 2>/dev/null || fail "make run exited before it was running"
	((SECONDS - start < UP_TIMEOUT)) || fail "make run was not running after ${UP_TIMEOUT}s"
	sleep 1
done
grep -q 'everything is Ready after' "$LOG" || fail "make run is running but never said everything is Ready"
# The DRA pool: both teams sharing its MIG node are Isolated=True (DraBound), and each example
# pod's devices are shown with their tenant.
for t in vision speech; do
	grep -Eq "^$t[[:space:]].*DraBound" "$LOG" || fail "make run did not show GpuTenant $t Isolated (DraBound)"
	grep -Eq "^gpu-[0-9a-z-]+[[:space:]]+$t[[:space:]]+$t/" "$LOG" || fail "make run did not show which device $t's claims got"
done
grep -Eq 'demo:.* 8 of 8 simulated processes running' "$LOG" || fail "make run did not start the 8 simulated processes"
PROM_URL="$(grep -Eo 'Prometheus on http://127\.0\.0\.1:[0-9]+' "$LOG" | head -n 1 | cut -d' ' -f3)"
[[ -n "$PROM_URL" ]] || fail "make run started no Prometheus (is e2e/bin/prometheus built?)"
curl -sf "$PROM_URL/-/ready" >/dev/null || fail "Prometheus ($PROM_URL) is not ready"
say "running after $((SECONDS - start))s, Prometheus on $PROM_URL"

export KUBECONFIG="$ROOT/target/demo/controlplane/kubeconfig"
# Let the watches print their first lines, then change what a person would: a tenant's request.
sleep 5
before=$(wc -l <"$LOG")
"$KUBECTL" patch gputenant research --type merge \
	-p '{"spec":{"resources":[{"mode":"TimeSlicing","count":8}]}}' >/dev/null ||
	fail "kubectl patch gputenant research failed"
say "patched GpuTenant research to 8 time-slicing shares; waiting for make run to print it ..."
start=$SECONDS
until tail -n +"$((before + 1))" "$LOG" | grep -Eq '^research[[:space:]].*8/8'; do
	kill -0 "$DEMO" 2>/dev/null || fail "make run exited after the change"
	((SECONDS - start < CHANGE_TIMEOUT)) || fail "make run did not print research at 8/8 within ${CHANGE_TIMEOUT}s"
	sleep 1
done
say "printed after $((SECONDS - start))s: $(tail -n +"$((before + 1))" "$LOG" | grep -E '^research[[:space:]]' | tail -n 1)"
sleep 3
kill -0 "$DEMO" 2>/dev/null || fail "make run exited after printing the change"

# The report, printed once: a tenant with GPU-hours allocated (its table's rows are TENANT MODE
# ALLOCATED USED EFFICIENCY..., a mode row's tenant empty), and the plot.
say "waiting for the report (make run prints it ${GPU_TENANCY_DEMO_REPORT_AFTER}s after it is running) ..."
start=$SECONDS
until grep -q '^GPU-hours over the last' "$LOG" && grep -q 'plot written to\|the report failed' "$LOG"; do
	kill -0 "$DEMO" 2>/dev/null || fail "make run exited before it printed the report"
	((SECONDS - start < GPU_TENANCY_DEMO_REPORT_AFTER + 60)) || fail "make run printed no report"
	sleep 1
done
row=$(sed -n '/^GPU-hours over the last/,$p' "$LOG" |
	awk '$1 ~ /^(team-gamma|acme|team-beta|research)$/ && $2 ~ /^(all|Exclusive|MIG|MPS|TimeSlicing)$/ && $3 + 0 > 0' | head -n 1)
[[ -n "$row" ]] || fail "the report shows no tenant with GPU-hours allocated"
# team-gamma's whole GPUs report their utilization: its simulated processes make it busy.
sed -n '/^GPU-hours over the last/,$p' "$LOG" | grep -Eq '^team-gamma[[:space:]]+Exclusive([[:space:]]+[0-9.]+){2}[[:space:]]+[1-9][0-9]*%' ||
	fail "the report shows no efficiency for team-gamma (its simulated processes keep two of its GPUs busy)"
grep -q 'plot written to target/demo/report.png' "$LOG" || fail "the report drew no plot"
say "report printed: $row"
curl -sf "$PROM_URL/-/ready" >/dev/null || fail "Prometheus ($PROM_URL) stopped before Ctrl-C"

say "stopping it with Ctrl-C (SIGINT) ..."
trap - EXIT
kill -INT -- "-$DEMO"
for _ in $(seq 1 60); do kill -0 "$DEMO" 2>/dev/null || break; sleep 1; done
if kill -0 "$DEMO" 2>/dev/null; then
	{
		echo "--- what make run's stop did (target/demo/stop.log), and its processes still running ---"
		cat target/demo/stop.log
		ps -eo pid=,ppid=,pgid=,stat=,etime=,args= | awk -v g="$DEMO" '$3 == g' | cut -c1-200
	} >&2 2>/dev/null || true
	kill -KILL -- "-$DEMO" 2>/dev/null || true
	fail "make run did not stop within 60s of SIGINT"
fi
# Processes of its group still running (a zombie, waiting for a reaper that may not run in a
# container, has ended).
left=$(ps -eo pid=,pgid=,stat=,comm= | awk -v g="$DEMO" '$2 == g && $3 !~ /^Z/ {print $1 " " $4}')
[[ -z "$left" ]] || fail "processes left after make run stopped: $left"
say "ok: Ready, kept running with Prometheus, printed the change and the report, stopped cleanly"
