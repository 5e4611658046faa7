#!/usr/bin/env bash
# make docs-check: the YAML blocks of README.md and docs/ pass `gpu-tenancy validate`, the
# generated reference pages equal what the code generates now, and every relative link resolves.
# Conventions: docs/development/docs.md.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CARGO="${CARGO:-cargo}"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# The binary, built unless GPU_TENANCY_BIN names one already built.
if [[ -n "${GPU_TENANCY_BIN:-}" ]]; then
	BIN="$GPU_TENANCY_BIN"
else
	"$CARGO" build -q -p gpu-tenancy --bin gpu-tenancy
	BIN="$ROOT/target/debug/gpu-tenancy"
fi

PAGES=(README.md)
while IFS= read -r f; do PAGES+=("$f"); done < <(find docs -name '*.md' | sort)

failed=0

# 1. YAML blocks: write each ```yaml block to a file of its own and validate it alone.
python3 - "$WORK/yaml" "${PAGES[@]}" <<'PY'
import os, sys
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
for page in sys.argv[2:]:
    block, start, n = None, 0, 0
    for i, line in enumerate(open(page, encoding="utf-8"), 1):
        s = line.strip()
        if block is None and s.startswith("```"):
            info = s[3:].strip()
            block, start = ([] if info == "yaml" else None), i
            if block is None:
                block = False  # another fence: skip to its end
            continue
        if block is not None and s.startswith("```"):
            if block is not False:
                n += 1
                name = page.replace("/", "__") + f"__L{start}.yaml"
                with open(os.path.join(out, name), "w", encoding="utf-8") as f:
                    f.write("".join(block))
            block = None
            continue
        if block not in (None, False):
            block.append(line)
PY
count=0
for f in "$WORK"/yaml/*.yaml; do
	[[ -e "$f" ]] || continue
	count=$((count + 1))
	where="$(basename "$f" .yaml)"
	where="${where//__//}"
	where="${where%/L*}:${where##*/L}"
	if ! out="$("$BIN" validate -f "$f" 2>&1)"; then
		echo "docs-check: $where: the yaml block does not validate (mark it \`yaml unchecked\` if it is not a gputenancy manifest):" >&2
		sed "s|^$f|  block|" <<<"$out" >&2
		failed=1
	fi
done
echo "docs-check: $count yaml blocks validated"
