"""Merge the shards of one run (same arch, same tier) into one results directory.

python3 -m attncheck_report.merge --out DIR SHARD_DIR...

results.jsonl lines are copied as written, junit.xml suites are combined under one <testsuites>,
repro bundles are copied, and run.json gets every count and time summed over the shards (case
count, compared, workers, seconds per phase), the earliest start, the latest finish, the longest
wall time, each shard's pools and wall time, the imbalance of the shards and "merged_from".
Standard library only.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from . import safe_write
from .results import ResultsError, load_run


# run.json fields that count or time the shard's share of the run: summed.
SUMMED = ("case_count", "compared", "jobs")
SUMMED_PER_KEY = ("timings_s",)
# Settings of the run: every shard must have run with the same.
SAME = ("arch", "tier", "backend", "git_revision", "kernels_library", "repeat", "stress",
        "sanitizer", "smem_poison", "mode")


def summed_run_fields(metas) -> dict:
    """The SUMMED and SUMMED_PER_KEY fields of the shards' run.json, summed; the pools of every
    shard, each named with its shard; each shard's wall time and the spread of the wall times
    relative to the longest ("imbalance": 0.1 = the shortest ended 10% before the longest)."""
    out = {}
    for key in SUMMED:
        values = [m[key] for m in metas if isinstance(m.get(key), (int, float))]
        if values:
            out[key] = sum(values)
    for key in SUMMED_PER_KEY:
        total = {}
        for m in metas:
            for k, v in (m.get(key) or {}).items():
                if isinstance(v, (int, float)):
                    total[k] = round(total.get(k, 0) + v, 6)
        if total:
            out[key] = total
    pools = []
    for m in metas:
        for p in m.get("pools") or []:
            pools.append(dict(p, shard=m.get("shard", "?")))
    if pools:
        out["pools"] = pools
    walls = [m["wall_s"] for m in metas if isinstance(m.get("wall_s"), (int, float))]
    if walls:
        out["shard_wall_s"] = walls
        out["imbalance"] = round((max(walls) - min(walls)) / max(walls), 4) if max(walls) > 0 else 0
    return out


def merge(shards, out: Path) -> dict:
    runs = [load_run(s) for s in shards]  # validates every line before anything is written
    for key in SAME:
        values = {json.dumps(r.get(key)) if not isinstance(r.get(key), str) else r.get(key)
                  for r in runs}
        if len(values) > 1:
            raise ResultsError(
                f"shards disagree on {key}: {', '.join(sorted(values))} (merge shards of one run"
                " only; give different runs to the report side by side instead)"
            )
    safe_write.make_directory(out, "--out")
    if any(out.resolve() == Path(s).resolve() for s in shards):
        raise ResultsError(f"{out}: the output directory is one of the shards")

    meta = dict(runs[0].meta)
    meta.update(summed_run_fields([r.meta for r in runs]))
    meta["case_count"] = sum(len(r.cases) for r in runs)
    meta["shard"] = "merged"
    meta["merged_from"] = [f"{r.path} ({r.get('shard', '?')})" for r in runs]
    started = [r.meta["started"] for r in runs if r.meta.get("started")]
    finished = [r.meta.get("finished") for r in runs]
    if started:
        meta["started"] = min(started)
    # A shard that did not finish leaves the merged run unfinished (the report warns about it).
    meta["finished"] = max(finished) if all(finished) else ""
    walls = [r.meta["wall_s"] for r in runs if isinstance(r.meta.get("wall_s"), (int, float))]
    if walls:
        meta["wall_s"] = max(walls)  # shards run in parallel

    merged_lines = []
    for r in runs:
        for line in (r.path / "results.jsonl").read_text(encoding="utf-8").splitlines():
            if line.strip():
                merged_lines.append(line + "\n")
    safe_write.write_text(out / "results.jsonl", "".join(merged_lines))

    warnings = []
    suites = ET.Element("testsuites")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for r in runs:
        junit = r.path / "junit.xml"
        if not junit.is_file():
            warnings.append(f"{junit}: missing, not merged")
            continue
        try:
            root = ET.parse(junit).getroot()
        except ET.ParseError as e:
            raise ResultsError(f"{junit}: not valid XML ({e})") from None
        for suite in [root] if root.tag == "testsuite" else root.findall("testsuite"):
            suite.set("name", f"{suite.get('name', 'attncheck')} [{r.get('shard', r.path.name)}]")
            suites.append(suite)
            for k in totals:
                totals[k] += int(suite.get(k, "0") or 0)
    for k, v in totals.items():
        suites.set(k, str(v))
    safe_write.write_text(out / "junit.xml",
                          ET.tostring(suites, encoding="unicode", xml_declaration=True))

    for r in runs:
        repro = r.path / "repro"
        if repro.is_dir():
            (out / "repro").mkdir(exist_ok=True)
            for f in sorted(repro.iterdir()):
                target = out / "repro" / f.name
                if target.exists():
                    raise ResultsError(f"{f}: {target} exists already (a case in two shards?)")
                safe_write.copy_file(f, target)

    safe_write.write_text(out / "run.json", json.dumps(meta, indent=2) + "\n")
    return {"cases": meta["case_count"], "shards": len(runs), "warnings": warnings,
            "imbalance": meta.get("imbalance")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m attncheck_report.merge", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("shards", nargs="+", metavar="SHARD_DIR")
    p.add_argument("--out", required=True, metavar="DIR")
    args = p.parse_args(argv)
    try:
        summary = merge(args.shards, Path(args.out))
    except (ResultsError, OSError) as e:  # OSError: UnsafeTarget, a full disk
        print(f"attncheck_report.merge: error: {e}", file=sys.stderr)
        return 2
    for w in summary["warnings"]:
        print(f"attncheck_report.merge: warning: {w}", file=sys.stderr)
    imbalance = ""
    if summary["shards"] > 1 and summary["imbalance"] is not None:
        imbalance = f"; shard wall times differ by {100 * summary['imbalance']:.0f}% of the longest"
    print(f"attncheck_report.merge: {summary['cases']} cases from {summary['shards']} shards"
          f" -> {args.out}{imbalance}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
