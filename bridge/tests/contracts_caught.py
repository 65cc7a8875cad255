"""ctest driver: arithmetic contracts end to end through the Python bridge (docs/verification.md
"Arithmetic contracts", docs/bridge.md).

    contracts_caught.py <attncheck executable> <scratch dir>

Runs `attncheck run --tier smoke --op decode_attention` three times:
  - py:numpy_reference (q.k products rounded to the input type, declared as
    qk-products-in-input-type): every valid case passes, at least one only under its declared
    contract, which the result, the JUnit properties and the run's summary name; its declared
    invariance properties make every relation bitwise, and each holds;
  - py:numpy_broken, bug undeclared_rounding (the same arithmetic declared as the default): it
    fails the default budgets, with the hint "the error would fit contract
    qk-products-in-input-type", and nothing passes under a contract it did not declare;
  - py:numpy_broken, bug wrong_scale (sm_scale applied twice, the contract declared): every valid
    case fails its declared contract too.
Exit 77 (skipped) when this interpreter lacks numpy.
"""

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

try:
    import numpy  # noqa: F401
except ImportError:
    print(f"skipped: {sys.executable} has no numpy", file=sys.stderr)
    sys.exit(77)

ATTNCHECK, SCRATCH = sys.argv[1], sys.argv[2]
if not os.access(ATTNCHECK, os.X_OK):
    raise SystemExit(f"{ATTNCHECK} is not built (build the attncheck target, then rerun)")

QK = "qk-products-in-input-type"
failures = []


def run(name, kernels, bug=None):
    out = os.path.join(SCRATCH, name)
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ)
    env.pop("ATTNCHECK_BROKEN", None)
    if bug:
        env["ATTNCHECK_BROKEN"] = f"decode_attention={bug}"
    cmd = [ATTNCHECK, "run", "--tier", "smoke", "--op", "decode_attention", "--kernels", kernels, "--out", out]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    path = os.path.join(out, "results.jsonl")
    if not os.path.exists(path):
        raise SystemExit(f"{name}: attncheck wrote no results (exit {p.returncode}):\n{p.stdout[-3000:]}")
    with open(path) as f:
        results = [json.loads(line) for line in f if line.strip()]
    print(f"--- {name}: exit {p.returncode}\n{p.stdout[-2500:]}")
    return results, p, out


def expect(cond, what):
    if not cond:
        failures.append(what)


def show(rs):
    return "; ".join(f"{r['id']}: {r['verdict']} [{r.get('contract', '')}] {r.get('message', '')[:300]}" for r in rs[:3])


# 1. numpy_reference declares the contract it computes under.
results, p, out = run("reference", "py:numpy_reference")
valid = [r for r in results if r["verdict"] != "refused_as_expected"]
expect(len(results) >= 2 and len(valid) >= 1, f"reference: too few cases: {show(results)}")
expect(all(r["verdict"] == "passed" for r in valid), f"reference: not every valid case passed: {show([r for r in valid if r['verdict'] != 'passed'])}")
expect(all(r.get("contract") in ("fp32-accumulate", QK) for r in valid), f"reference: a valid case without its contract: {show(valid)}")
under = [r for r in valid if r.get("contract") == QK]
expect(under, f"reference: no case needed the declared contract (the test shows nothing): {show(valid)}")
expect(all(f"passed under declared contract {QK}" in r["message"] and "the default fp32-accumulate budgets fail" in r["message"] for r in under), f"reference: a contract pass without its note: {show(under)}")
expect(all(f"contract {QK}" in c["budget"]["why"] for r in under for c in r["checks"]), f"reference: a budget derived for the contract does not say so: {show(under)}")
expect(p.returncode == 0, f"reference: attncheck exit {p.returncode}")
expect(f"case(s) under {QK}" in p.stdout, "reference: the run's summary does not count the passes under the declared contract")
junit = ET.parse(os.path.join(out, "junit.xml"))
props = {(tc.get("name"), pr.get("name")): pr.get("value") for tc in junit.iter("testcase") for pr in tc.iter("property")}
expect(all(props.get((r["id"], "contract")) == r["contract"] for r in valid), "reference: junit.xml does not carry each case's contract")

# 1b. Invariance through the bridge: numpy_reference's decode entry declares batch-, split- and
# page-order invariance (attncheck_bridge -> the extension table's `properties`), so the op's
# relations run bitwise, and hold; the same cache at page size 1 has no property that names it,
# so it holds within the case's budgets.
rels = [(r["id"], o) for r in valid for o in r.get("invariance", [])]
expect(rels and all(o["passed"] for _, o in rels), f"reference: a relation failed: {[x for x in rels if not x[1]['passed']][:4]}")
modes_wrong = [(i, o) for i, o in rels if o["mode"] != ("budget" if "page size 1" in o["relation"] else "bitwise")]
expect(not modes_wrong, f"reference: relations not bitwise where declared (budget at page size 1): {modes_wrong[:4]}")
names = {o["relation"].split(" [")[0].split(" (")[0] for _, o in rels}
expect({"batch permutation", "shuffled physical page order", "the same cache at page size 1"} <= names and any("alone vs in the batch" in n for n in names) and any(n.startswith("split count") for n in names), f"reference: relations missing: {sorted(names)}")

# 2. The same arithmetic declared as the default: caught, with the contract it would fit.
results, p, _ = run("undeclared_rounding", "py:numpy_broken", "undeclared_rounding")
valid = [r for r in results if r["verdict"] != "refused_as_expected"]
hinted = [r for r in valid if r["verdict"] == "failed" and f"the error would fit contract {QK}" in r["message"] and "fails its declared contract fp32-accumulate (the default)" in r["message"]]
expect(hinted, f"undeclared_rounding: no case failed with the hint: {show(valid)}")
expect(all(r["verdict"] == "failed" or (r["verdict"] == "passed" and r.get("contract") == "fp32-accumulate") for r in valid), f"undeclared_rounding: a case passed under a contract it did not declare: {show(valid)}")
expect(f"the error would fit contract {QK}" in p.stdout, "undeclared_rounding: the run's output does not print the hint")
expect(p.returncode != 0, "undeclared_rounding: attncheck exited 0")

# 3. A real bug under the declared contract fails it.
results, p, _ = run("wrong_scale", "py:numpy_broken", "wrong_scale")
valid = [r for r in results if r["verdict"] != "refused_as_expected"]
expect(valid and all(r["verdict"] == "failed" and f"fails its declared contract {QK}" in r["message"] for r in valid), f"wrong_scale: not every valid case failed its declared contract: {show(valid)}")
expect(all(r.get("contract") == QK for r in valid), f"wrong_scale: the failures are not judged by the declared contract: {show(valid)}")

for r in (failures or []):
    print("NOT AS EXPECTED:", r, file=sys.stderr)
sys.exit(1 if failures else 0)
