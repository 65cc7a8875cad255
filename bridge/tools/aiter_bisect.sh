#!/usr/bin/env bash
# One attncheck case as a `git bisect run` predicate over an AITER checkout (docs/adapters/aiter.md,
# "AITER's Triton kernels"):
#
#   cd <aiter checkout> && git bisect start <bad> <good> -- aiter/ops/triton/
#   git bisect run <attncheck>/bridge/tools/aiter_bisect.sh '<case id>'
#
# Runs the case through py:rocm_aiter with ATTNCHECK_AITER_SRC = the checkout being bisected (the
# current directory's work tree unless ATTNCHECK_AITER_SRC is set), so AITER's Triton files are
# executed from that revision, and exits with git bisect's codes:
#   0    good: passed, refused as expected (or an unexpected pass)
#   1    bad:  failed, error, or a known bug's failure
#   125  skip: this revision cannot be judged (a file did not load, the adapter declines the case,
#        or the case is skipped)
#   255  abort: the setup is wrong (no attncheck, unknown case id, no verdict: the adapter could not
#        run at all, e.g. no GPU or no torch)
# Environment: ATTNCHECK_BIN (default: attncheck on PATH), ATTNCHECK_ROOT (default: the attncheck
# checkout holding this script), ATTNCHECK_PYBRIDGE (when the bridge is not beside the binary),
# AITER_BISECT_TIMEOUT (seconds for the case, default 600), AITER_BISECT_KERNELS (default
# py:rocm_aiter); ATTNCHECK_AITER_MLA / _IMPL / _LSE pass through to the adapter.
set -u
id=${1:?usage: aiter_bisect.sh CASE_ID}
here=$(cd "$(dirname "$0")/../.." && pwd)
bin=${ATTNCHECK_BIN:-$(command -v attncheck || true)}
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
  echo "aiter_bisect: no attncheck executable (set ATTNCHECK_BIN)" >&2
  exit 255
fi
export ATTNCHECK_ROOT=${ATTNCHECK_ROOT:-$here}
src=${ATTNCHECK_AITER_SRC:-$(git rev-parse --show-toplevel 2>/dev/null || pwd)}
export ATTNCHECK_AITER_SRC=$src
rev=$(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo "?")
# The id as an anchored regex: its regex characters escaped (the $ in the sed program is literal).
# shellcheck disable=SC2016
pattern="^$(printf '%s' "$id" | sed 's/[.[\*^$()+?{|]/\\&/g')\$"
if ! "$bin" list --tier all --filter "$pattern" 2>/dev/null | grep -qF "$id"; then
  echo "aiter_bisect: case '$id' is not in attncheck's case files ($ATTNCHECK_ROOT/cases)" >&2
  exit 255
fi
out=$(mktemp -d "${TMPDIR:-/tmp}/aiter_bisect.XXXXXX")
trap 'rm -rf "$out"' EXIT
timeout -k 10 "${AITER_BISECT_TIMEOUT:-600}" "$bin" run --tier all --filter "$pattern" \
  --kernels "${AITER_BISECT_KERNELS:-py:rocm_aiter}" --jobs 1 --out "$out" >"$out/run.log" 2>&1
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
    print(f"aiter_bisect {rev}: no verdict; attncheck said:", *log[-5:], sep="\n  ")
    sys.exit(255)
verdict, msg = r.get("verdict", "?"), r.get("message", "").replace("\n", " ")[:200]
print(f"aiter_bisect {rev}: {verdict}: {msg}")
if verdict in ("unsupported", "skipped"):
    sys.exit(125)
if verdict == "known_bug" or r.get("failing", True):
    sys.exit(1)
sys.exit(0)
PY
