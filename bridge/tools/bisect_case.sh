#!/usr/bin/env bash
# One attncheck case as a `git bisect run` predicate over an upstream checkout whose kernels an
# adapter runs from source; the body of vllm_bisect.sh and aiter_bisect.sh (their headers say how
# to use them and which exit codes mean what).
#
#   bisect_case.sh NAME SRC_VARIABLE KERNELS CASE_ID
#
# NAME names the messages and the NAME_BISECT_TIMEOUT / NAME_BISECT_KERNELS overrides (upper case);
# SRC_VARIABLE is the adapter's source variable (ATTNCHECK_VLLM_SRC), set to the checkout being
# bisected unless already set; KERNELS is the default --kernels (py:vllm_triton).
set -u
name=${1:?usage: bisect_case.sh NAME SRC_VARIABLE KERNELS CASE_ID}
src_var=${2:?} kernels=${3:?}
id=${4:?usage: ${name}_bisect.sh CASE_ID}
prefix=$(printf '%s' "$name" | tr '[:lower:]' '[:upper:]')_BISECT
here=$(cd "$(dirname "$0")/../.." && pwd)
bin=${ATTNCHECK_BIN:-$(command -v attncheck || true)}
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
  echo "${name}_bisect: no attncheck executable (set ATTNCHECK_BIN)" >&2
  exit 255
fi
export ATTNCHECK_ROOT=${ATTNCHECK_ROOT:-$here}
src=${!src_var:-$(git rev-parse --show-toplevel 2>/dev/null || pwd)}
export "$src_var=$src"
rev=$(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo "?")
# The id as an anchored regex: its regex characters escaped (the $ in the sed program is literal).
# shellcheck disable=SC2016
pattern="^$(printf '%s' "$id" | sed 's/[.[\*^$()+?{|]/\\&/g')\$"
if ! "$bin" list --tier all --filter "$pattern" 2>/dev/null | grep -qF "$id"; then
  echo "${name}_bisect: case '$id' is not in attncheck's case files ($ATTNCHECK_ROOT/cases)" >&2
  exit 255
fi
out=$(mktemp -d "${TMPDIR:-/tmp}/${name}_bisect.XXXXXX")
trap 'rm -rf "$out"' EXIT
timeout_var=${prefix}_TIMEOUT kernels_var=${prefix}_KERNELS
timeout -k 10 "${!timeout_var:-600}" "$bin" run --tier all --filter "$pattern" \
  --kernels "${!kernels_var:-$kernels}" --jobs 1 --out "$out" >"$out/run.log" 2>&1
python3 - "$out/results.jsonl" "$id" "$rev" "$name" <<'PY'
import json, sys
path, case, rev, name = sys.argv[1:5]
try:
    rows = [json.loads(l) for l in open(path) if l.strip()]
except OSError:
    rows = []
r = next((x for x in rows if x.get("id") == case), None)
if r is None:  # attncheck could not run the adapter at all (no device, no torch): not a revision's fault
    log = open(path.replace("results.jsonl", "run.log"), errors="replace").read().strip().splitlines()
    print(f"{name}_bisect {rev}: no verdict; attncheck said:", *log[-5:], sep="\n  ")
    sys.exit(255)
verdict, msg = r.get("verdict", "?"), r.get("message", "").replace("\n", " ")[:200]
print(f"{name}_bisect {rev}: {verdict}: {msg}")
if verdict in ("unsupported", "skipped"):
    sys.exit(125)
if verdict == "known_bug" or r.get("failing", True):
    sys.exit(1)
sys.exit(0)
PY
