"""ctest driver: partial contracts and adapters that implement a subset, through the Python bridge
(docs/verification.md "Partial contracts", docs/bridge.md).

    partial_caught.py <attncheck executable> <scratch dir>

- tests/adapters/partial_numpy.py declares rope_out_of_place's k_out not produced: kept, its cases
  pass and every record names the contract; broken (k_out written), they fail saying so; bad
  declarations are errors naming entry, op and name, and fail `attncheck kernels --check`.
- numpy_reference implements some ops: over the whole smoke tier the others are reported once, as
  not provided, not as failures, and the exit code is that of the cases that ran (0 here; 1 when
  numpy_broken's bug fails them).
Exit 77 (skipped) when this interpreter lacks numpy.
"""

import json
import os
import re
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
PARTIAL = "py:" + os.path.join(os.path.dirname(os.path.abspath(__file__)), "adapters", "partial_numpy.py")
failures = []


def run(name, kernels, args, env=()):
    out = os.path.join(SCRATCH, name)
    shutil.rmtree(out, ignore_errors=True)
    cmd = [ATTNCHECK, "run", "--tier", "smoke", "--kernels", kernels, "--out", out, *args]
    p = subprocess.run(cmd, env=dict(os.environ, **dict(env)), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=900)
    path = os.path.join(out, "results.jsonl")
    results = []
    if os.path.exists(path):
        with open(path) as f:
            results = [json.loads(line) for line in f if line.strip()]
    return p.returncode, p.stdout, results


def expect(cond, what, log=""):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what + ("\n" + log[-3000:] if log else ""))


# A kept declaration: rope_out_of_place judged without k_out; rope_inplace not provided.
rc, log, results = run("keep", PARTIAL, ["--op", "rope"])
oop = [r for r in results if r.get("kernel_entry") == "rope_out_of_place"]
expect(rc == 0, f"kept declaration: exit 0 (got {rc})", log)
expect(oop and all(r["verdict"] in ("passed", "refused_as_expected") for r in oop),
       "kept declaration: every rope_out_of_place case passes or is refused", log)
judged = [r for r in oop if r["verdict"] == "passed"]
expect(judged and all(r.get("partial") == {"not_produced": ["k_out"], "unspecified": {}} for r in judged),
       "kept declaration: every judged record carries the contract", log)
expect(all("k_out" not in [c["name"] for c in r["checks"]] for r in judged), "k_out is never compared")
expect(f"partial contract: rope_out_of_place: {len(judged)} case(s) judged with 'k_out' not produced" in log,
       "the summary counts the cases judged under the contract", log)
absent = [r for r in results if r.get("not_provided_by")]
expect(absent and all(r["verdict"] == "unsupported" and r["not_provided_by"] == "partial_numpy" for r in absent),
       "rope_inplace cases are not provided (unsupported), not failures", log)

# A broken declaration: k_out written.
rc, log, results = run("write", PARTIAL, ["--op", "rope"], {"ATTNCHECK_PARTIAL_MODE": "write"})
bad = [r for r in results if r.get("kernel_entry") == "rope_out_of_place" and r["verdict"] == "failed"]
expect(rc == 1 and bad and all("which entry 'rope_out_of_place' declares not produced" in r["message"] for r in bad),
       "written k_out fails, saying it was declared not produced", log)

# Bad declarations: errors at load naming the entry, the op and the name; kernels --check fails.
for declared, says in [
    ('{"not_produced": ["v_out"]}', "naming output 'v_out', which the op does not have"),
    ('{"unspecified": {"q_out": "past_context"}}', "naming region 'past_context' of output 'q_out', which the op does not define"),
]:
    env = {"ATTNCHECK_PARTIAL_DECLARE": declared}
    rc, log, results = run("bad", PARTIAL, ["--op", "rope", "--filter", "out_of_place"], env)
    errors = [r for r in results if r["verdict"] == "error"]
    expect(rc == 1 and errors and all("entry 'rope_out_of_place' (op rope)" in r["message"] and says in r["message"] for r in errors),
           f"{declared}: every rope_out_of_place case is an error naming it", log)
    p = subprocess.run([ATTNCHECK, "kernels", "--check", "--kernels", PARTIAL], env=dict(os.environ, **env),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    expect(p.returncode == 1 and "BAD partial contract" in p.stdout and says in p.stdout,
           f"{declared}: kernels --check fails naming it", p.stdout)

# A subset adapter over the whole tier: the other ops reported once, the exit code that of the cases run.
rc, log, results = run("subset", "py:numpy_reference", [])
lines = [line for line in log.splitlines() if line.startswith("not provided by numpy_reference: ")]
ran = [r for r in results if not r.get("not_provided_by")]
absent = [r for r in results if r.get("not_provided_by")]
expect(rc == 0 and ran and not any(r["failing"] for r in results), f"numpy_reference over the smoke tier: exit 0 (got {rc})", log)
expect(len(lines) == 1 and re.search(rf"\d+ op\(s\), {len(absent)} case\(s\), not run", lines[0]) is not None,
       "the ops it does not provide are reported once, with their case count", log)
expect(not any(line.startswith("FAIL") for line in log.splitlines()), "no case is reported failing", log)
rc, log, results = run("subset_broken", "py:numpy_broken", ["--op", "page_indices", "--op", "rope", "--op", "mla_decode"],
                       {"ATTNCHECK_BROKEN": "*=wrong_element"})
expect(rc == 1 and "not provided by numpy_broken: 1 op(s)" in log,
       "a real failure still exits 1 beside the not-provided ops", log)

if failures:
    print("\n".join(failures), file=sys.stderr)
    sys.exit(1)
