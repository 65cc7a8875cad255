#!/usr/bin/env python3
"""Stands in for `attncheck run`, `mutants` and `coverage` in the ci/gpu-job tests: writes a results
directory (for mutants, one per --library under --out) in the contract's format
(tests/synthetic.py records), records the device environment it ran with, and exits 1 when a
case failed (mutants: 0, as attncheck mutants does). FAKE_ARCH sets the arch; FAKE_ALL_PASS=1 drops failing records;
a kernels path naming a mutant makes every case fail; FAKE_STRESS_FAIL=1 makes a --stress run
exit 1 (a nondeterministic stressed case)."""

import json
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synthetic  # noqa: E402


# `attncheck kernels` lines (entry, op) for the mutant scope: the entries of two real sources.
FAKE_ENTRY_OPS = [("rope_inplace", "rope"), ("rope_out_of_place", "rope"),
                  ("indexer_qk_rope", "indexer_qk_rope"), ("decode_attention", "decode_attention")]


def main(argv):
    if argv[0] == "kernels":
        for entry, op in FAKE_ENTRY_OPS:
            print(f"  ok      {entry:<26} op {op}")
        return 0
    if argv[0] == "list":
        for r in synthetic.other_cases(os.environ.get("FAKE_ARCH", "gfx942")):
            print(r["id"])
        return 0
    if argv[0] == "coverage":
        return coverage(argv)
    assert argv[0] in ("run", "mutants"), argv
    if argv[0] == "mutants":
        return mutants(argv)
    return run(argv)


def coverage(argv):
    """A clean audit of one op without flags, in `attncheck coverage --out`'s format."""
    opts = options(argv)
    Path(opts["out"]).write_text(json.dumps({
        "tier": opts.get("tier", "quick"), "flags": 0, "unaccepted": 0, "stale": 0, "errors": 0,
        "ops": [{"op": "rope", "cases": 1, "arguments": [], "stale": [], "errors": []}]}))
    print("fake attncheck coverage: clean")
    return 0


def options(argv):
    opts, i = {}, 1  # (--op and --library repeat: read from argv)
    while i < len(argv):
        if argv[i] in ("--profile", "--allow-missing-goldens"):  # flags
            opts[argv[i].lstrip("-")] = True
            i += 1
            continue
        opts[argv[i].lstrip("-")] = argv[i + 1]
        i += 2
    return opts


def device_setting():
    return ",".join(f"{v}={os.environ[v]}"
                    for v in ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES") if v in os.environ)


def mutants(argv):
    """One results directory per --library LIB[=op,op], named as attncheck names it."""
    opts = options(argv)
    arch = os.environ.get("FAKE_ARCH", "gfx942")
    out = Path(opts["out"])
    out.mkdir(parents=True, exist_ok=True)
    libraries = [argv[k + 1] for k in range(len(argv) - 1) if argv[k] == "--library"]
    for spec in libraries:
        lib, _, ops = spec.partition("=")
        records = [r for r in synthetic.other_cases(arch)
                   if not ops or r["id"].split("/")[0] in ops.split(",")]
        for r in records:
            r["mode"] = "kernel"
            if "mutant" in lib:
                synthetic.set_verdict(r, "failed")
        name = Path(lib).stem.split("_mutant_", 1)[-1]
        synthetic.write_results(out / name, records, arch, tier=opts["tier"], shard="",
                                kernels_library=lib, device=device_setting() or "none",
                                mode="kernel", filter=opts.get("filter", ""))
    (out / "argv.json").write_text(json.dumps(argv))
    print(f"fake attncheck mutants: {len(libraries)} libraries")
    return 0


def run(argv):
    opts = options(argv)
    arch = os.environ.get("FAKE_ARCH", "gfx942")
    kernels = opts.get("kernels", "")
    records = [r for r in synthetic.other_cases(arch)
               if not os.environ.get("FAKE_ALL_PASS") or r["verdict"] == "passed"]
    for r in records:
        r["mode"] = "kernel" if kernels else "reference"  # without a library: reference vs goldens
    if "mutant" in kernels:
        for r in records:
            synthetic.set_verdict(r, "failed")
    if "shard" in opts:
        k, n = map(int, opts["shard"].split("/"))
        records = records[k::n]
    if "filter" in opts:
        records = [r for r in records if re.search(opts["filter"], r["id"])]
    ops = [argv[k + 1] for k in range(len(argv) - 1) if argv[k] == "--op"]
    if ops:
        records = [r for r in records if r["id"].split("/")[0] in ops]
    device = device_setting()
    synthetic.write_results(Path(opts["out"]), records, arch, tier=opts["tier"],
                            shard=opts.get("shard", ""), kernels_library=kernels,
                            device=device or "none", mode="kernel" if kernels else "reference",
                            filter=opts.get("filter", ""))
    (Path(opts["out"]) / "argv.json").write_text(json.dumps(argv))
    (Path(opts["out"]) / "env.json").write_text(json.dumps({"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")}))
    print(f"fake attncheck: {len(records)} cases")
    if "stress" in opts and os.environ.get("FAKE_STRESS_FAIL"):
        return 1
    return 1 if any(r["failing"] for r in records) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
