#!/usr/bin/env bash
# The upstream findings of docs/upstream_findings.md, re-run on a GPU host (torch, Triton, pytest; no
# h5py, no compiled vLLM/AITER extensions needed):
#
#   ATTNCHECK_BIN=<attncheck> bridge/tools/run_upstream_findings.sh [OUT_DIR]
#
# (a) py:rocm_aiter over the quick tier's sparse_mla and indexer_logits_decode with only
#     ATTNCHECK_AITER_SRC set (AITER e4048607): counts per verdict per entry;
# (b) py:vllm_triton over the whole quick tier (no --op) with vLLM main 91a893de: counts, the exit
#     status, and the not-provided ops attncheck reports;
# (c) kv_cache_write with vLLM main: counts (the writer is judged again, not "unsupported");
# (d) every finding: `repro --export pytest`, then the exported test under pytest against the
#     upstream file at its commit, expected to FAIL there;
# then one table. A step that fails is reported and the others still run.
#
# Environment: ATTNCHECK_BIN (required), ATTNCHECK_ROOT (default: the checkout holding this script),
# AITER_TREE / VLLM_TREE (default: $ATTNCHECK_ROOT/upstream/aiter, .../upstream/vllm: slim trees of
# the files the adapters import, at their repository paths), PYTHON (default python3, the one with
# torch), FINDINGS_TIMEOUT (seconds per attncheck call, default 1800).
set -u

here="$(cd "$(dirname "$0")" && pwd)"
ROOT="${ATTNCHECK_ROOT:-$(cd "$here/../.." && pwd)}"
BIN="${ATTNCHECK_BIN:-}"
AITER_TREE="${AITER_TREE:-$ROOT/upstream/aiter}"
VLLM_TREE="${VLLM_TREE:-$ROOT/upstream/vllm}"
PY="${PYTHON:-python3}"
LIMIT="${FINDINGS_TIMEOUT:-1800}"
OUT="$(mkdir -p "${1:-upstream_findings_out}" && cd "${1:-upstream_findings_out}" && pwd)"

if [[ -z "$BIN" || ! -x "$BIN" ]]; then
  echo "run_upstream_findings: set ATTNCHECK_BIN to the attncheck binary (got '${BIN}')" >&2
  exit 2
fi
for tree in "$AITER_TREE/aiter" "$VLLM_TREE/vllm"; do
  [[ -d "$tree" ]] || echo "run_upstream_findings: warning: $tree is missing" >&2
done

SUMMARY=()
note() { SUMMARY+=("$1"); echo "== $1"; }

# Only the variables each step names reach attncheck (no stray ATTNCHECK_* of the caller's shell).
clean_env() {
  env -u ATTNCHECK_VLLM_SRC -u ATTNCHECK_VLLM_FILE -u ATTNCHECK_AITER_SRC -u ATTNCHECK_AITER_LSE \
      -u ATTNCHECK_AITER_IMPL -u ATTNCHECK_AITER_MLA -u ATTNCHECK_AITER_BACKEND \
      -u ATTNCHECK_VLLM_DECODE_PROPERTIES -u ATTNCHECK_KERNELS "$@"
}

# Counts per entry and verdict of a results.jsonl, with the commonest messages of the verdicts that
# are not "passed" (so "unsupported: ..." says why).
counts() {
  "$PY" - "$1" <<'EOF'
import collections, json, sys
by, why = collections.Counter(), collections.defaultdict(collections.Counter)
try:
    lines = open(sys.argv[1]).read().splitlines()
except OSError as e:
    print(f"   (no results: {e})"); sys.exit(0)
for line in lines:
    try:
        r = json.loads(line)
    except ValueError:
        continue
    entry = r.get("kernel_entry") or r.get("op", "?")
    by[(entry, r.get("verdict", "?"))] += 1
    if r.get("verdict") not in ("passed",):
        why[(entry, r.get("verdict"))][(r.get("message") or "")[:110]] += 1
for (entry, verdict), n in sorted(by.items()):
    print(f"   {entry:28s} {verdict:14s} {n:5d}")
    for msg, m in why[(entry, verdict)].most_common(3):
        print(f"        {m:4d} x {msg}")
EOF
}

run_tier() {  # name, env assignments..., -- attncheck run arguments...
  local name="$1"; shift
  local envs=()
  while [[ "$1" != "--" ]]; do envs+=("$1"); shift; done
  shift
  local dir="$OUT/$name"
  rm -rf "$dir"
  echo "== ($name) ${envs[*]} attncheck run $*"
  clean_env "${envs[@]}" timeout "$LIMIT" "$BIN" run "$@" --out "$dir" >"$OUT/$name.log" 2>&1
  local rc=$?
  grep -E "not provided|cases:|passed|failed" "$OUT/$name.log" | tail -n 8
  counts "$dir/results.jsonl" >"$OUT/$name.counts"
  cat "$OUT/$name.counts"
  note "($name) attncheck exit $rc (log $OUT/$name.log)
$(grep -v '^        ' "$OUT/$name.counts")
$(grep -E 'not provided' "$OUT/$name.log" | head -n 3)"
}

cd "$OUT" || exit 2

# (a) AITER's Triton sparse MLA and paged logits, judged by default (partial contracts).
run_tier a_aiter "ATTNCHECK_AITER_SRC=$AITER_TREE" -- \
  --tier quick --op sparse_mla --op indexer_logits_decode --kernels py:rocm_aiter

# (b) vLLM main over the whole quick tier: exit 1 only for real failures, not-provided ops once.
run_tier b_vllm_quick "ATTNCHECK_VLLM_SRC=$VLLM_TREE" -- --tier quick --kernels py:vllm_triton

# (c) vLLM main's cache writer, loaded from the slim tree (its pure-Python imports executed).
run_tier c_vllm_kv_cache_write "ATTNCHECK_VLLM_SRC=$VLLM_TREE" -- \
  --tier quick --op kv_cache_write --kernels py:vllm_triton

# (d) every finding: export, then run the exported test against the upstream file (expected: FAIL).
# name | adapter | source variable | tree | case id (docs/upstream_findings.md) | run whose results
# confirm the id | pattern of the same class (used, and said, when that run shows the id not failing)
FINDINGS=(
  "vllm_group24_head_mapping|vllm_triton|ATTNCHECK_VLLM_SRC|$VLLM_TREE|decode_attention/d128x128-mla0-h48-hkv2-p16-sp4-cap0-bf16-kvsame-b4-ctx70-contiguous-s4|b_vllm_quick|^decode_attention/.*-h48-hkv2-"
  "vllm_o_store_32bit|vllm_triton|ATTNCHECK_VLLM_SRC|$VLLM_TREE|decode_attention/d128x128-mla0-h16-hkv2-p16-sp4-cap0-bf16-kvsame-b4-ctx70-contiguous-s13-ooff31|b_vllm_quick|^decode_attention/.*-ooff31"
  "vllm_partials_32bit|vllm_triton|ATTNCHECK_VLLM_SRC|$VLLM_TREE|decode_attention/d576x512-mla1-h16-hkv1-p16-sp512-cap0-bf16-kvsame-b600-ctx1024-contiguous-s14-plog31|b_vllm_quick|^decode_attention/.*-plog31"
  "vllm_q_rows_32bit|vllm_triton|ATTNCHECK_VLLM_SRC|$VLLM_TREE|decode_attention/d128x128-mla0-h16-hkv2-p16-sp4-cap0-bf16-kvsame-b4-ctx70-contiguous-s16-qoff31|b_vllm_quick|^decode_attention/.*-qoff31"
  "vllm_shuffle_hybrid_gather|vllm_triton|ATTNCHECK_VLLM_SRC|$VLLM_TREE|kv_gather/shuffle-hybrid-kvmodel-bf16-h1-d64-bs16-full-sp20-b4-ctx50-contiguous-s2|b_vllm_quick|^kv_gather/shuffle-hybrid-"
  "aiter_sparse_mla_below_16_heads|rocm_aiter|ATTNCHECK_AITER_SRC|$AITER_TREE|sparse_mla/h4-bs64-q1-bf16-kvauto-b2-ctx65-k64-random-contiguous-d96x64-scyarn-s1|a_aiter|^sparse_mla/h(1|2|4|8)-bs(16|64)-"
  "aiter_sparse_mla_block_size_1|rocm_aiter|ATTNCHECK_AITER_SRC|$AITER_TREE|sparse_mla/h16-bs1-q3-bf16-kvauto-b2-ctx17-k16-causal-contiguous-d96x64-sclk-s0|a_aiter|^sparse_mla/h(16|32|48|64|128)-bs1-"
  "aiter_sparse_mla_empty_topk_nan|rocm_aiter|ATTNCHECK_AITER_SRC|$AITER_TREE|sparse_mla/h64-bs64-q1-bf16-kvauto-b1-ctx65-k64-holes-contiguous-d96x64-scyarn-s0|a_aiter|^sparse_mla/h(16|32|48|64|128)-bs(16|64)-.*-holes-"
  "aiter_mla_decode_32bit_rows|rocm_aiter|ATTNCHECK_AITER_SRC|$AITER_TREE|mla_decode/h4-bs16-q3-bf16-kvauto-b2-ctx65-contiguous-d96x64-sclk-s11-offlog32|-|-"
)

# The id itself when run $2 shows it failing (or was not run); else the first failing id of the
# class ($3), with a line saying so; the id itself when none fails.
confirmed_id() {
  local id="$1" run="$2" pattern="$3"
  if [[ "$run" == "-" || ! -f "$OUT/$run/results.jsonl" ]]; then
    echo "$id"
    return
  fi
  "$PY" - "$OUT/$run/results.jsonl" "$id" "$pattern" <<'EOF'
import json, re, sys
path, want, pattern = sys.argv[1:4]
verdicts, first = {}, None
for line in open(path):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    verdicts[r.get("id")] = r.get("verdict")
    if first is None and r.get("verdict") in ("failed", "error") and re.search(pattern, r.get("id", "")):
        first = r["id"]
if verdicts.get(want) in ("failed", "error") or first is None:
    print(want)
else:
    print(f"   {want}: {verdicts.get(want, 'not run')} in this run; exporting {first} (same class)", file=sys.stderr)
    print(first)
EOF
}
mkdir -p "$OUT/findings"
TABLE=()
for row in "${FINDINGS[@]}"; do
  IFS='|' read -r name adapter var tree id run pattern <<<"$row"
  id="$(confirmed_id "$id" "$run" "$pattern")"
  test_file="$OUT/findings/test_$name.py"
  rm -f "$test_file" "${test_file%.py}.npz" "$OUT/findings/$name.h5"
  echo "== (d) $name: $id"
  clean_env "$var=$tree" timeout "$LIMIT" "$BIN" repro "$id" --kernels "py:$adapter" --export pytest \
    --out "$test_file" --bundle "$OUT/findings/$name.h5" >"$OUT/findings/$name.repro.log" 2>&1
  repro_rc=$?
  grep -E "^(verdict|failed|passed|error|pytest|bundle)|attncheck:" "$OUT/findings/$name.repro.log" | head -n 6
  if [[ ! -f "$test_file" ]]; then
    TABLE+=("$name|$id|export failed (repro exit $repro_rc; $OUT/findings/$name.repro.log)|-")
    continue
  fi
  clean_env "$var=$tree" PYTHONPATH="$ROOT/bridge/python" timeout "$LIMIT" \
    "$PY" -m pytest -q -p no:cacheprovider "$test_file" >"$OUT/findings/$name.pytest.log" 2>&1
  rc=$?
  tail -n 3 "$OUT/findings/$name.pytest.log"
  log="$OUT/findings/$name.pytest.log"
  why="$(grep -m1 -E '^E +' "$log" | sed -E 's/^E +//' | cut -c1-100)"
  if [[ $rc -eq 1 ]] && grep -qE "cannot load|cannot import|attncheck_bridge is not importable" "$log"; then
    outcome="NOT RUN: the upstream function did not load ($why)"
  elif [[ $rc -eq 1 ]]; then
    outcome="FAILS on the upstream file, as expected: $why"
  elif [[ $rc -eq 0 ]] && grep -q "skipped" "$log"; then
    outcome="SKIPPED (no GPU seen by torch?): see $log"
  elif [[ $rc -eq 0 ]]; then
    outcome="PASSES: unexpected, the finding does not reproduce"
  else
    outcome="pytest exit $rc (not a verdict): see $log"
  fi
  TABLE+=("$name|$id|repro exit $repro_rc|$outcome")
done

echo
echo "================ summary ================"
for line in "${SUMMARY[@]}"; do echo "$line"; echo; done
echo
printf '%-34s %-16s %s\n' "finding" "export" "exported test"
for line in "${TABLE[@]}"; do
  IFS='|' read -r name id exported outcome <<<"$line"
  printf '%-34s %-16s %s\n' "$name" "$exported" "$outcome"
  printf '    %s\n' "$id"
done
echo "(logs and exported tests under $OUT)"
