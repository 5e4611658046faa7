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

# 2. The generated reference pages equal what the code generates now.
"$BIN" docs --out-dir "$WORK/reference"
for f in "$WORK"/reference/*.md; do
	page="docs/reference/$(basename "$f")"
	if ! diff -u "$page" "$f" >"$WORK/diff" 2>&1; then
		echo "docs-check: $page is not what the code generates now; run \`make docs\`:" >&2
		head -40 "$WORK/diff" >&2
		failed=1
	fi
done
echo "docs-check: generated reference pages compared"

# 3. Every relative link resolves: the file, and the anchor where one is given (GitHub's heading
# anchors: lower case, punctuation dropped, spaces to hyphens, -1, -2... for repeats).
if ! python3 - "${PAGES[@]}" <<'PY'
import os, re, sys

def anchors(path, cache={}):
    if path not in cache:
        seen, out, fence = {}, set(), False
        for line in open(path, encoding="utf-8"):
            if line.lstrip().startswith("```"):
                fence = not fence
                continue
            m = None if fence else re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
            if not m:
                continue
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
        cache[path] = out
    return cache[path]

bad = 0
for page in sys.argv[1:]:
    fence = False
    for no, line in enumerate(open(page, encoding="utf-8"), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if fence:
            continue
        for target in re.findall(r"\]\(([^)\s]+)\)", re.sub(r"`[^`]*`", "", line)):
            if re.match(r"[a-z]+:", target):
                continue  # http:, https:, mailto:
            path, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            if not os.path.exists(dest):
                print(f"docs-check: {page}:{no}: {target}: no such file", file=sys.stderr)
                bad = 1
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                print(f"docs-check: {page}:{no}: {target}: no heading makes #{anchor}", file=sys.stderr)
                bad = 1
# Citations in code and deploy files: docs/<page>.md#<anchor> must name a page and a heading.
import subprocess
files = subprocess.run(["git", "grep", "-l", "-E", r"docs/[a-z/_-]+\.md"], capture_output=True, text=True).stdout.split()
for f in files:
    if f.endswith(".md") or f.startswith("docs/"):
        continue
    for no, line in enumerate(open(f, encoding="utf-8", errors="replace"), 1):
        for path, anchor in re.findall(r"(docs/[a-z/_-]+\.md)(?:#([\w-]+))?", line):
            if not os.path.exists(path):
                print(f"docs-check: {f}:{no}: {path}: no such file", file=sys.stderr)
                bad = 1
            elif anchor and anchor not in anchors(path):
                print(f"docs-check: {f}:{no}: {path}#{anchor}: no heading makes that anchor", file=sys.stderr)
                bad = 1
sys.exit(bad)
PY
then
	failed=1
fi
echo "docs-check: links checked"

if [[ "$failed" != 0 ]]; then
	echo "docs-check: FAILED" >&2
	exit 1
fi
echo "docs-check: ok"
