"""The report on results made by the real `attncheck run --tier smoke` (reference vs goldens on
this CPU), through `ci/gpu-job smoke --no-gpu` exactly as the README's local line runs it.
Skipped, with the reason, when the attncheck binary has not been built."""

import base64
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from attncheck_report.results import load_runs
from conftest import REPO
from png_check import check_png
from test_report import md_rows, parse


def find_build():
    for candidate in (os.environ.get("ATTNCHECK_BUILD"), REPO / "build" / "cpu"):
        if candidate and (Path(candidate) / "harness" / "cli" / "attncheck").is_file():
            return Path(candidate)
    return None


BUILD = find_build()
pytestmark = pytest.mark.skipif(
    BUILD is None, reason="no attncheck binary (build the cpu preset, or set ATTNCHECK_BUILD)")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke")
    env = dict(os.environ, ATTNCHECK_BUILD=str(BUILD))
    for var in ("GITHUB_STEP_SUMMARY", "GITHUB_ACTIONS"):
        env.pop(var, None)
    proc = subprocess.run([str(REPO / "ci" / "gpu-job"), "smoke", "--no-gpu", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=900)
    return {"out": out, "proc": proc}


def test_smoke_tier_runs_on_the_reference_and_the_exit_status_matches(smoke):
    proc = smoke["proc"]
    out = smoke["out"]
    assert (out / "report.html").is_file(), proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "kernels under test are NOT checked" in proc.stdout
    md = (out / "summary.md").read_text(encoding="utf-8")
    status = re.search(r"\*\*(PASSED|FAILED|INCOMPLETE|NOT CHECKED|REFERENCE ONLY)\b[^*]*\*\*",
                       md).group(1)
    # No kernel ran: the headline says so and never reads PASSED.
    assert status != "PASSED" and "REFERENCE ONLY: kernels not checked" in md
    # The job's verdict is the report's: 0 only when nothing failed and the reference was compared.
    assert proc.returncode == (0 if status == "REFERENCE ONLY" else 1), proc.stdout[-3000:]
    if not any((REPO / "golden").glob("*.h5")):
        # Without committed goldens the reference has nothing to be compared with.
        assert status == "NOT CHECKED"


def test_smoke_results_follow_the_contract(smoke):
    runs = load_runs([smoke["out"] / "results"])  # raises on any malformed record
    cases = [c for r in runs for c in r.cases]
    assert cases and {c.mode for c in cases} <= {"reference", "none"}
    # attncheck writes its own word on failing into every record; the report never guesses it.
    lines = (smoke["out"] / "results" / "results.jsonl").read_text().splitlines()
    assert all(isinstance(json.loads(line).get("failing"), bool) for line in lines if line)
    run = runs[0]
    for key in ("git_revision", "arch", "backend", "tier", "case_count", "golden_manifest_sha256",
                "mode"):
        assert key in run.meta, f"run.json lacks {key}"
    assert run.meta["tier"] == "smoke" and run.warnings == []
    # every op that has a case file is in the smoke tier
    ops_with_cases = {p.stem for p in (REPO / "cases").glob("*.toml")}
    assert ops_with_cases <= {c.op for c in cases}


def test_smoke_report_renders(smoke):
    html = (smoke["out"] / "report.html").read_text(encoding="utf-8")
    p = parse(html)
    ops = {c.op for r in load_runs([smoke["out"] / "results"]) for c in r.cases}
    assert len(p.images) == len(ops)
    for img in p.images:
        check_png(base64.b64decode(img["src"].split(",", 1)[1]))
    md = (smoke["out"] / "summary.md").read_text(encoding="utf-8")
    counts = [r for r in md_rows(md) if len(r) == 10 and re.fullmatch(r"\d+", r[1])]
    assert counts and sum(int(r[1]) for r in counts) == sum(
        len(r.cases) for r in load_runs([smoke["out"] / "results"]))
