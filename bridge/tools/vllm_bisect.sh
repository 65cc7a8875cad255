#!/usr/bin/env bash
# One attncheck case as a `git bisect run` predicate over a vLLM checkout (docs/adapters/vllm.md):
#
#   cd <vllm checkout> && git bisect start <bad> <good> -- <file of the kernel>
#   git bisect run <attncheck>/bridge/tools/vllm_bisect.sh '<case id>'
#
# Runs the case through py:vllm_triton with ATTNCHECK_VLLM_SRC = the checkout being bisected (the
# current directory's work tree unless ATTNCHECK_VLLM_SRC is set) and exits with git bisect's codes:
#   0    good: passed, refused as expected (or an unexpected pass)
#   1    bad:  failed, error, or a known bug's failure
#   125  skip: this revision cannot be judged (vLLM did not load, the adapter declines the case,
#        or the case is skipped)
#   255  abort: the setup is wrong (no attncheck, unknown case id, no verdict: the adapter could not
#        run at all, e.g. no GPU or no torch)
# Environment: ATTNCHECK_BIN (default: attncheck on PATH), ATTNCHECK_ROOT (default: the attncheck
# checkout holding this script), ATTNCHECK_PYBRIDGE (when the bridge is not beside the binary),
# VLLM_BISECT_TIMEOUT (seconds for the case, default 600), VLLM_BISECT_KERNELS (default
# py:vllm_triton).
set -u
id=${1:?usage: vllm_bisect.sh CASE_ID}
here=$(cd "$(dirname "$0")/../.." && pwd)
bin=${ATTNCHECK_BIN:-$(command -v attncheck || true)}
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
  echo "vllm_bisect: no attncheck executable (set ATTNCHECK_BIN)" >&2
  exit 255
fi
export ATTNCHECK_ROOT=${ATTNCHECK_ROOT:-$here}
src=${ATTNCHECK_VLLM_SRC:-$(git rev-parse --show-toplevel 2>/dev/null || pwd)}
export ATTNCHECK_VLLM_SRC=$src
rev=$(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo "?")
# The id as an anchored regex: its regex characters escaped (the $ in the sed program is literal).
# shellcheck disable=SC2016
pattern="^$(printf '%s' "$id" | sed 's/[.[\*^$()+?{|]/\\&/g')\$"
if ! "$bin" list --tier all --filter "$pattern" 2>/dev/null | grep -qF "$id"; then
  echo "vllm_bisect: case '$id' is not in attncheck's case files ($ATTNCHECK_ROOT/cases)" >&2
  exit 255
fi
out=$(mktemp -d "${TMPDIR:-/tmp}/vllm_bisect.XXXXXX")
trap 'rm -rf "$out"' EXIT
timeout -k 10 "${VLLM_BISECT_TIMEOUT:-600}" "$bin" run --tier all --filter "$pattern" \
  --kernels "${VLLM_BISECT_KERNELS:-py:vllm_triton}" --jobs 1 --out "$out" >"$out/run.log" 2>&1
python3 - "$out/results.jsonl" "$id" "$rev" <<'PY'
import json, sys
path, case, rev = sys.argv[1:4]
try:
    rows = [json.loads(l) for l in open(path) if l.strip()]
except OSError:
    rows = []
r = next((x for x in rows if x.get("id") == case), None)
if r is None:  # attncheck could not run the adapter at all (no device, no torch): not a revision's fault
    log = open(path.replace("results.jsonl", "run.log"), errors="replace").read().strip().splitlines()
    print(f"vllm_bisect {rev}: no verdict; attncheck said:", *log[-5:], sep="\n  ")
    sys.exit(255)
verdict, msg = r.get("verdict", "?"), r.get("message", "").replace("\n", " ")[:200]
print(f"vllm_bisect {rev}: {verdict}: {msg}")
if verdict in ("unsupported", "skipped"):
    sys.exit(125)
if verdict == "known_bug" or r.get("failing", True):
    sys.exit(1)
sys.exit(0)
PY
