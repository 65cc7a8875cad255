"""Shared fixtures: synthetic results (tests/synthetic.py), one rendered report, a CLI runner."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
PACKAGE_PARENT = TESTS.parent
REPO = PACKAGE_PARENT.parents[1]
sys.path[:0] = [str(PACKAGE_PARENT), str(TESTS)]

import synthetic  # noqa: E402


def run_report(*args, env=None, python=None, cwd=None):
    """`python3 -m attncheck_report ARGS` as CI runs it; returns the CompletedProcess."""
    full_env = dict(os.environ, PYTHONPATH=str(PACKAGE_PARENT))
    full_env.pop("GITHUB_ACTIONS", None)  # annotations only where a test asks for them
    full_env.update(env or {})
    return subprocess.run([python or sys.executable, "-m", "attncheck_report", *map(str, args)],
                          capture_output=True, text=True, env=full_env, timeout=300, cwd=cwd)


@pytest.fixture(scope="session")
def synth(tmp_path_factory):
    return synthetic.make_all(tmp_path_factory.mktemp("synthetic"))


@pytest.fixture(scope="session")
def full_report(synth, tmp_path_factory):
    """The report over both arches, with a baseline and two mutant runs."""
    out = tmp_path_factory.mktemp("report")
    proc = run_report(*synth["current"], "--baseline", *synth["baseline"], "--mutants",
                      *synth["mutants"], "--mutant-specs", synth["specs"], "--out", out,
                      "--title", "synthetic <report> & co")
    assert proc.returncode == 0, proc.stderr
    return {"out": out, "proc": proc, "html": (out / "report.html").read_text(encoding="utf-8"),
            "md": (out / "summary.md").read_text(encoding="utf-8")}
