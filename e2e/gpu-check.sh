#!/usr/bin/env bash
# Checks the agent against a real NVIDIA driver, READ-ONLY for the GPUs' configuration:
#
#   1. `gpu-tenancy agent discover -o json` must agree with `nvidia-smi -q -x` (UUID, name, PCI
#      device ID, memory, MIG mode current/pending) and, on MIG-enabled GPUs, with
#      `nvidia-smi mig -lgip` (profile IDs, names, instance counts) and `-lgipp` (placements).
#   2. `gpu-tenancy agent scrub-check` on one GPU (or MIG instance) must clear all its free memory
#      (GPU_CHECK_SCRUB_BYTES, e.g. 4Gi, for less) and verify every byte of it on the GPU; it
#      prints the bytes cleared and verified and the time and throughput of each. It only touches
#      memory it allocates itself, and frees it; while it holds all free memory, another process
#      on that GPU cannot allocate more, so run it on an idle GPU or set GPU_CHECK_SCRUB_BYTES.
#
# It never changes MIG mode, creates or destroys instances, sets compute modes or resets
# anything: it runs only `discover` and `scrub-check`, and checks that the MIG state is the same
# before and after. Needs: an NVIDIA driver (nvidia-smi, libnvidia-ml.so.1, libcuda.so.1),
# cargo, python3. Usage: e2e/gpu-check.sh [--release]
set -euo pipefail

cd "$(dirname "$0")/.."
profile=debug
if [[ "${1:-}" == "--release" ]]; then profile=release; fi

die() { echo "gpu-check: $*" >&2; exit 1; }
command -v nvidia-smi >/dev/null || die "nvidia-smi not found: this check needs a machine with an NVIDIA GPU and driver"
command -v python3 >/dev/null || die "python3 not found (used to compare the outputs)"
nvidia-smi -L >/dev/null 2>&1 || die "nvidia-smi cannot talk to the driver: $(nvidia-smi -L 2>&1 | head -1)"

if [[ "$profile" == release ]]; then cargo build --release -p gpu-tenancy; else cargo build -p gpu-tenancy; fi
bin="target/$profile/gpu-tenancy"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# What must not change: MIG modes and instances, before and after.
mig_state() {
  nvidia-smi --query-gpu=index,uuid,mig.mode.current,mig.mode.pending,compute_mode --format=csv,noheader 2>/dev/null
  nvidia-smi mig -lgi 2>/dev/null || true
  nvidia-smi mig -lci 2>/dev/null || true
}
mig_state >"$work/before.txt"

"$bin" agent discover -o json >"$work/discover.json"
"$bin" agent discover >"$work/discover.txt"
nvidia-smi -q -x >"$work/smi.xml"
nvidia-smi mig -lgip >"$work/lgip.txt" 2>&1 || true
nvidia-smi mig -lgipp >"$work/lgipp.txt" 2>&1 || true
cat "$work/discover.txt"

python3 - "$work" <<'PY'
import json, re, sys, xml.etree.ElementTree as ET
work = sys.argv[1]
disc = json.load(open(f"{work}/discover.json"))
smi = ET.parse(f"{work}/smi.xml").getroot()
problems = []
def bad(msg): problems.append(msg)

smi_gpus = smi.findall("gpu")  # PCI order, which is NVML's index order
gpus = disc.get("gpus", [])
if len(gpus) != len(smi_gpus):
    bad(f"GPU count: agent {len(gpus)}, nvidia-smi {len(smi_gpus)}")
drv = disc.get("driver", {})
if drv.get("driverVersion") != smi.findtext("driver_version"):
    bad(f"driver version: agent {drv.get('driverVersion')}, nvidia-smi {smi.findtext('driver_version')}")

def mib(text):
    m = re.match(r"\s*(\d+)\s*MiB", text or "")
    return int(m.group(1)) if m else None

for g, x in zip(gpus, smi_gpus):
    i = g["index"]
    if g["uuid"] != x.findtext("uuid"):
        bad(f"GPU {i} UUID: agent {g['uuid']}, nvidia-smi {x.findtext('uuid')}")
    if g["name"] != x.findtext("product_name"):
        bad(f"GPU {i} name: agent {g['name']!r}, nvidia-smi {x.findtext('product_name')!r}")
    pci = (x.findtext("pci/pci_device_id") or "").upper().replace("0X", "0x")
    if g["pciDeviceId"] != pci:
        bad(f"GPU {i} PCI device ID: agent {g['pciDeviceId']}, nvidia-smi {pci}")
    total = mib(x.findtext("fb_memory_usage/total"))
    if total is not None and g["memoryMiB"] != total:
        bad(f"GPU {i} memory: agent {g['memoryMiB']} MiB, nvidia-smi {total} MiB")
    cur, pend = x.findtext("mig_mode/current_mig"), x.findtext("mig_mode/pending_mig")
    mm = g.get("migMode")
    if cur in ("Enabled", "Disabled"):
        want = {"current": cur == "Enabled", "pending": pend == "Enabled"}
        if mm != want:
            bad(f"GPU {i} MIG mode: agent {mm}, nvidia-smi {want}")
    elif mm is not None:
        bad(f"GPU {i}: agent reports a MIG mode {mm}, nvidia-smi says MIG is {cur}")

# nvidia-smi mig -lgip rows: | GPU  Name  ID  Instances Free/Total  Memory GiB  P2P  SM  DEC  ENC |
lgip = {}
for line in open(f"{work}/lgip.txt"):
    m = re.match(r"\|\s+(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)/(\d+)\s", line)
    if m:
        lgip.setdefault(int(m.group(1)), {})[int(m.group(3))] = (m.group(2), int(m.group(5)))
# nvidia-smi mig -lgipp rows: GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1
lgipp = {}
for line in open(f"{work}/lgipp.txt"):
    m = re.match(r"\s*GPU\s+(\d+)\s+Profile ID\s+(\d+)\s+Placements:\s+\{([\d,]*)\}:(\d+)", line)
    if m:
        starts = sorted(int(s) for s in m.group(3).split(",") if s)
        lgipp.setdefault(int(m.group(1)), {})[int(m.group(2))] = (starts, int(m.group(4)))

checked = 0
for g in gpus:
    i = g["index"]
    if i not in lgip:
        continue  # nvidia-smi lists profiles of MIG-enabled GPUs only
    ours = {p["id"]: p for p in g.get("profiles", [])}
    for pid, (name, total) in lgip[i].items():
        p = ours.get(pid)
        if p is None:
            bad(f"GPU {i}: nvidia-smi lists profile ID {pid} ({name}), the agent does not")
            continue
        if p["name"] != name:
            bad(f"GPU {i} profile {pid}: agent name {p['name']}, nvidia-smi {name}")
        if p["maxInstances"] != total:
            bad(f"GPU {i} profile {pid}: agent max instances {p['maxInstances']}, nvidia-smi {total}")
        checked += 1
    for pid, (starts, size) in lgipp.get(i, {}).items():
        p = ours.get(pid)
        if p is None:
            continue
        got = sorted(pl["start"] for pl in p["placements"])
        sizes = {pl["size"] for pl in p["placements"]}
        if got != starts or sizes != {size}:
            bad(f"GPU {i} profile {pid} placements: agent {got}:{sizes}, nvidia-smi {starts}:{size}")
    extra = set(ours) - set(lgip[i])
    if extra:
        bad(f"GPU {i}: the agent reports profile IDs {sorted(extra)} that nvidia-smi does not list")

for p in problems:
    print("MISMATCH:", p)
print(f"discover: {len(gpus)} GPU(s) compared with nvidia-smi, {checked} MIG profile(s) checked, {len(problems)} mismatch(es)")
sys.exit(1 if problems else 0)
PY

# Scrub the first GPU CUDA can use (a non-MIG GPU, or the first MIG instance), verified in full.
device="$(python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
for g in d["gpus"]:
    if not (g.get("migMode") or {}).get("current"):
        print(g["uuid"]); break
    inst = [i for i in g.get("instances", []) if i.get("uuid")]
    if inst:
        print(inst[0]["uuid"]); break
' "$work/discover.json")"
if [[ -z "$device" ]]; then
  echo "scrub-check: skipped (every GPU is in MIG mode without instances; nothing CUDA can open)"
else
  start=$(date +%s%N)
  "$bin" agent scrub-check --device "$device" --bytes "${GPU_CHECK_SCRUB_BYTES:-all}" -o json >"$work/scrub.json"
  wall_ms=$(( ($(date +%s%N) - start) / 1000000 ))
  python3 - "$work/scrub.json" "$wall_ms" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
wall_ms = int(sys.argv[2])
cleared, verified = r["bytesCleared"], r["bytesVerified"]
assert cleared > 0 and verified == cleared, f"every byte cleared must be verified: {r}"
def rate(b, us):
    return f"{b / us / 1e3:.0f} GB/s" if us else "n/a"
print(f"scrub-check: {r['device']}: {cleared} bytes cleared ({100 * cleared / r['freeBytes']:.2f}% of the free "
      f"{r['freeBytes']}, total {r['totalBytes']}), {verified} verified")
print(f"scrub-check: clear {r['clearMicros'] / 1e3:.1f} ms ({rate(cleared, r['clearMicros'])}), "
      f"verify {r['verifyMicros'] / 1e3:.1f} ms ({rate(verified, r['verifyMicros'])}), "
      f"{wall_ms} ms for the whole command (process, driver start, kernel JIT)")
PY
fi

mig_state >"$work/after.txt"
if ! diff -u "$work/before.txt" "$work/after.txt"; then
  die "MIG state or compute modes changed during a read-only check (see diff above)"
fi
echo "gpu-check: OK (read-only: MIG modes, instances and compute modes unchanged)"
