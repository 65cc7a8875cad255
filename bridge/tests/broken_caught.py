"""ctest driver: attncheck itself catches every deliberate bug of numpy_broken through the Python
bridge, and passes numpy_reference (docs/bridge.md).

    broken_caught.py <attncheck executable> <scratch dir>

Runs `attncheck run --kernels py:numpy_broken` once per bug (ATTNCHECK_BROKEN='*=<bug>') on a few
page_indices/kv_gather/rope cases and checks each case's verdict and the words of its message.
Exit 77 (skipped) when this interpreter lacks numpy: the bridge embeds the interpreter CMake found,
and this script runs under that interpreter.
"""

import json
import os
import shutil
import subprocess
import sys

try:
    import numpy  # noqa: F401
except ImportError:
    print(f"skipped: {sys.executable} has no numpy", file=sys.stderr)
    sys.exit(77)

ATTNCHECK, SCRATCH = sys.argv[1], sys.argv[2]
if not os.access(ATTNCHECK, os.X_OK):
    raise SystemExit(f"{ATTNCHECK} is not built (build the attncheck target, then rerun)")

# One regex over case ids: every page_indices smoke case, the kv_gather and rope smoke cases.
FILTER = "^(page_indices|kv_gather|rope)/"
# bug -> (verdict every case must get, words its message must contain)
EXPECT = {
    "none": ("passed", ""),
    "wrong_element": ("failed", "differ|mismatches"),
    "guard_before": ("failed", "guard before buffer"),
    "past_view": ("failed", "the kernel must not write there|guard after buffer"),
    "unwritten": ("failed", "never written|differ|mismatches"),
    "mutate_input": ("failed", "changed (input '"),
    "raise": ("failed", "py adapter 'numpy_broken': entry '"),
    "refuse": ("failed", "refused a valid configuration"),
    "unsupported": ("unsupported", "unsupported by numpy_broken: "),
    "nondeterministic": ("failed", "not deterministic"),
    "crash": ("failed", "SIGSEGV"),
}
# Bugs only some cases can show: contiguous inputs read the same with or without strides.
SOME = {"ignore_stride": ("failed", "differ|mismatches")}


def run(bug, filter_=FILTER, extra=()):
    out = os.path.join(SCRATCH, bug)
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, ATTNCHECK_BROKEN=f"*={bug}")
    cmd = [ATTNCHECK, "run", "--tier", "smoke", "--op", "page_indices", "--op", "kv_gather", "--op", "rope", "--filter", filter_, "--kernels", "py:numpy_broken", "--out", out, *extra]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    path = os.path.join(out, "results.jsonl")
    if not os.path.exists(path):
        raise SystemExit(f"{bug}: attncheck wrote no results (exit {p.returncode}):\n{p.stdout[-3000:]}")
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()], p.stdout


def matches(message, words):
    return not words or any(w in message for w in words.split("|"))


failures = []
for bug, (verdict, words) in {**EXPECT, **SOME}.items():
    results, log = run(bug)
    if not results:
        failures.append(f"{bug}: no cases ran\n{log[-2000:]}")
        continue
    ok = [r for r in results if r["verdict"] == verdict and matches(r.get("message", ""), words)]
    want_all = bug in EXPECT
    good = len(ok) == len(results) if want_all else 0 < len(ok) < len(results)
    print(f"{bug:17s} {len(ok):3d}/{len(results)} cases {verdict}" + ("" if want_all else " (some)"))
    if not good:
        bad = [r for r in results if r not in ok][:3]
        failures.append(f"{bug}: expected {'every' if want_all else 'some but not all'} case {verdict} with {words!r}; e.g. " + "; ".join(f"{r['id']}: {r['verdict']}: {r.get('message', '')[:300]}" for r in bad))

# A hang: one case, a short timeout.
results, log = run("hang", "^page_indices/", ["--timeout", "2", "--shard", "0/15"])
hung = [r for r in results if r["verdict"] == "failed" and "timed out" in r.get("message", "")]
print(f"{'hang':17s} {len(hung):3d}/{len(results)} cases failed (timed out)")
if not results or len(hung) != len(results):
    failures.append(f"hang: {[(r['id'], r['verdict'], r.get('message', '')[:200]) for r in results]}")

if failures:
    print("\n".join(["", "NOT CAUGHT:"] + failures), file=sys.stderr)
    sys.exit(1)
