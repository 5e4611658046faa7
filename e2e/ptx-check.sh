#!/usr/bin/env bash
# Assembles the scrub's verification kernel (operator/src/gpu/scrub/verify_zero.ptx) with
# NVIDIA's ptxas for every GPU generation the scrub runs on: the PTX is written by hand and loaded
# by the driver at run time, so nothing else checks that it assembles before it meets a GPU.
#
# ptxas comes from $PTXAS, the PATH, /usr/local/cuda/bin, an installed NVIDIA Python package, or
# that package's wheel fetched into target/ptxas. Without any the check is skipped, saying so,
# and exits 0.
set -euo pipefail

cd "$(dirname "$0")/.."
ptx=operator/src/gpu/scrub/verify_zero.ptx

find_ptxas() {
  if [[ -n "${PTXAS:-}" ]]; then echo "$PTXAS"; return; fi
  if command -v ptxas >/dev/null; then command -v ptxas; return; fi
  if [[ -x /usr/local/cuda/bin/ptxas ]]; then echo /usr/local/cuda/bin/ptxas; return; fi
  python3 - 2>/dev/null <<'PY' || true
import os, nvidia.cuda_nvcc as n
p = os.path.join(list(n.__path__)[0], "bin", "ptxas")
if os.access(p, os.X_OK):
    print(p)
PY
}

# NVIDIA's ptxas from its Python wheel, unpacked once under target/ (a pinned version: the check
# must not change under the kernel), where no CUDA toolkit is installed but a package index is.
fetch_ptxas() {
  local dir=target/ptxas version=12.9.86
  local bin="$dir/nvidia/cuda_nvcc/bin/ptxas"
  if [[ ! -x "$bin" ]] && command -v python3 >/dev/null; then
    mkdir -p "$dir"
    python3 -m pip download --quiet --no-deps --only-binary=:all: "nvidia-cuda-nvcc-cu12==$version" -d "$dir" >/dev/null 2>&1 || return 0
    python3 - "$dir" <<'PY' || return 0
import glob, os, sys, zipfile
d = sys.argv[1]
with zipfile.ZipFile(glob.glob(os.path.join(d, "nvidia_cuda_nvcc_cu12-*.whl"))[0]) as z:
    z.extract("nvidia/cuda_nvcc/bin/ptxas", d)
os.chmod(os.path.join(d, "nvidia/cuda_nvcc/bin/ptxas"), 0o755)
for w in glob.glob(os.path.join(d, "*.whl")):
    os.remove(w)
PY
  fi
  if [[ -x "$bin" ]]; then echo "$bin"; fi
}

ptxas="$(find_ptxas)"
if [[ -z "$ptxas" ]]; then ptxas="$(fetch_ptxas)"; fi
if [[ -z "$ptxas" ]]; then
  echo "ptx-check: skipped: no ptxas found (set PTXAS, or pip install nvidia-cuda-nvcc-cu12)"
  exit 0
fi
# V100, T4, A100, A10, L4/L40, H100/H200, B200; a ptxas older than CUDA 12.8 does not know
# sm_100. On sm_75 (1024 threads per SM), sm_86 and sm_89 (1536) ptxas warns that it ignores
# .minnctapersm, which asks for 2048: the grid there is sized from the threads those SMs run.
archs=(sm_70 sm_75 sm_80 sm_86 sm_89 sm_90)
if [[ "$("$ptxas" --help 2>/dev/null || true)" == *sm_100* ]]; then archs+=(sm_100); fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
for arch in "${archs[@]}"; do
  "$ptxas" -arch="$arch" -o "$out/$arch.cubin" "$ptx" || { echo "ptx-check: $ptx does not assemble for $arch"; exit 1; }
done
echo "ptx-check: $ptx assembles for ${archs[*]} ($("$ptxas" --version | tail -1))"
