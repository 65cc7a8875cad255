"""ctest driver: a buggy Python adapter fails only its own case (docs/verification.md "Worker
isolation").

    hostile_adapters.py <attncheck executable> <scratch dir> [probe ...]

Runs `attncheck run --kernels py:bridge/tests/adapters/hostile.py` once per misbehaviour on five
page_indices smoke cases (the misbehaviour happens on one launch of the run) and checks: every
selected case has exactly one result, with its own id; only the case that misbehaved fails, with
the words of its message; processes the adapter started do not outlive the run; a hanging import
is reported within the limit, naming the adapter. Prints one line per probe. Exit 77 (skipped)
when this interpreter lacks numpy (hostile.py delegates to numpy_reference).
"""

import json
import os
import shutil
import subprocess
import sys
import time

try:
    import numpy  # noqa: F401
except ImportError:
    print(f"skipped: {sys.executable} has no numpy", file=sys.stderr)
    sys.exit(77)

ATTNCHECK, SCRATCH = sys.argv[1], sys.argv[2]
ONLY = set(sys.argv[3:])
ADAPTER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "adapters", "hostile.py")
FILTER = "^page_indices/bs1-"
CASES = 5

# probe -> (extra arguments, exit status, words of the misbehaving case's message or None when
# every case must pass, check that started processes are gone). The fork probes fork on every
# launch, the others misbehave once.
EVERY_LAUNCH = {"fork", "fork_linger"}
PROBES = {
    "forge": ([], 1, "protocol line was rejected", False),
    "inherited_fds": ([], 0, None, False),
    "fork": ([], 0, None, True),
    "fork_linger": ([], 0, None, True),
    "thread": ([], 1, "thread(s) it started still run|worker process died", False),
    "hang_with_child": (["--timeout", "3"], 1, "timed out after 3 s", True),
    "detach": ([], 0, None, True),
    "detach_and_hang": (["--timeout", "3"], 1, "timed out after 3 s", True),
    "memory": (["--worker-memory", "512M", "--timeout", "60"], 1, "over the limit of 512 MiB (--worker-memory)", False),
}


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def run(probe, extra):
    out = os.path.join(SCRATCH, probe)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    env = dict(os.environ, ATTNCHECK_HOSTILE=probe, ATTNCHECK_HOSTILE_PIDS=os.path.join(out, "pids"))
    env.pop("ATTNCHECK_HOSTILE_ONCE", None)
    if probe not in EVERY_LAUNCH:
        env["ATTNCHECK_HOSTILE_ONCE"] = os.path.join(out, "once")
    cmd = [ATTNCHECK, "run", "--tier", "smoke", "--op", "page_indices", "--filter", FILTER,
           "--kernels", "py:" + ADAPTER, "--out", os.path.join(out, "results"), *extra]
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    return p, time.monotonic() - t0, out


def check(probe, extra, status, words, no_leftovers):
    p, wall, out = run(probe, extra)
    problems = []
    if p.returncode != status:
        problems.append(f"exit {p.returncode}, expected {status}")
    path = os.path.join(out, "results", "results.jsonl")
    results = []
    if os.path.exists(path):
        with open(path) as f:
            results = [json.loads(line) for line in f if line.strip()]
    ids = [r["id"] for r in results]
    if len(ids) != CASES or len(set(ids)) != CASES or not all(i.startswith("page_indices/bs1-") for i in ids):
        problems.append(f"ids {ids}: expected {CASES} distinct selected cases")
    failing = [r for r in results if r["verdict"] != "passed"]
    if words is None and failing:
        problems.append("failing: " + "; ".join(f"{r['id']}: {r['verdict']}: {r.get('message', '')[:200]}" for r in failing))
    if words is not None:
        # The first launch misbehaves; which case that is depends on the pool's order (longest
        # cases first when durations are known), so any one case may be it.
        hit = [r for r in failing if any(w in r.get("message", "") for w in words.split("|"))]
        if len(failing) != 1 or len(hit) != 1:
            problems.append(f"expected exactly one failing case (the first launched) with {words!r}; got " +
                            "; ".join(f"{r['id']}: {r['verdict']}: {r.get('message', '')[:300]}" for r in failing))
    if no_leftovers:
        pids_file = os.path.join(out, "pids")
        pids = [int(x) for x in open(pids_file).read().split()] if os.path.exists(pids_file) else []
        if not pids:
            problems.append("the adapter recorded no started process")
        deadline = time.monotonic() + 3
        while any(alive(q) for q in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [q for q in pids if alive(q)]
        for q in left:
            try:
                os.kill(q, 9)  # the probe's own leftovers, not to disturb later probes
            except OSError:
                pass
        if left:
            problems.append(f"processes the adapter started outlived the run: {left}")
    return problems, p.stdout, wall


def check_import_hang():
    out = os.path.join(SCRATCH, "import_hang")
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, ATTNCHECK_HOSTILE="import_hang")
    cmd = [ATTNCHECK, "run", "--tier", "smoke", "--op", "page_indices", "--filter", FILTER,
           "--kernels", "py:" + ADAPTER, "--out", out, "--import-timeout", "3"]
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return ["no answer within 120 s"], "", time.monotonic() - t0
    wall = time.monotonic() - t0
    problems = []
    want = f"adapter {ADAPTER} did not finish importing within 3 s"
    if p.returncode != 2:
        problems.append(f"exit {p.returncode}, expected 2")
    if want not in p.stdout:
        problems.append(f"the output does not say {want!r}")
    if wall > 30:
        problems.append(f"reported after {wall:.0f} s")
    return problems, p.stdout, wall


failures = []
for probe, (extra, status, words, no_leftovers) in PROBES.items():
    if ONLY and probe not in ONLY:
        continue
    problems, log, wall = check(probe, extra, status, words, no_leftovers)
    print(f"{probe:16s} {'ok' if not problems else 'FAILED'}  ({wall:.1f} s)" + "".join(f"\n    {x}" for x in problems), flush=True)
    if problems:
        failures.append(f"{probe}:\n  " + "\n  ".join(problems) + "\n  output tail:\n" + log[-2500:])
if not ONLY or "import_hang" in ONLY:
    problems, log, wall = check_import_hang()
    print(f"{'import_hang':16s} {'ok' if not problems else 'FAILED'}  ({wall:.1f} s)" + "".join(f"\n    {x}" for x in problems), flush=True)
    if problems:
        failures.append("import_hang:\n  " + "\n  ".join(problems) + "\n  output tail:\n" + log[-2500:])

if failures:
    print("\n\n".join(failures), file=sys.stderr)
    sys.exit(1)
