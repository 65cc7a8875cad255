"""attncheck cases as pytest tests, for kernel repositories that live in pytest.

    PYTHONPATH=<attncheck>/bridge/python pytest -p attncheck_pytest \\
        --attncheck-tier quick --attncheck-kernels py:my_adapter [--attncheck-op mla_decode]

One test per case id (node id ``attncheck::<case id>``, so ``-k`` selects cases). The selected cases
run in ONE ``attncheck run`` (its worker processes, every check of docs/verification.md), and each
test takes its case's verdict as its outcome: passed and refused_as_expected pass; failing cases
fail with attncheck's message and the repro line; skipped and unsupported skip; known_bug is an
expected failure; unexpected_pass passes with a warning (attncheck does not fail it either).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import pytest


def pytest_addoption(parser):
    g = parser.getgroup("attncheck", "attncheck cases as tests (docs/bridge.md)")
    g.addoption("--attncheck-tier", default=None,
                help="collect the cases of this tier (smoke, quick, full): turns the plugin on")
    g.addoption("--attncheck-kernels", default=None,
                help="kernel library: LIB.so or py:<adapter module> (required)")
    g.addoption("--attncheck-op", action="append", default=[],
                help="only these ops (repeatable)")
    g.addoption("--attncheck-filter", default="", help="regex searched in case ids")
    g.addoption("--attncheck-bin", default=os.environ.get("ATTNCHECK_BIN", "attncheck"),
                help="the attncheck executable (default: $ATTNCHECK_BIN, else attncheck on PATH)")
    g.addoption("--attncheck-jobs", type=int, default=1, help="attncheck worker processes")
    g.addoption("--attncheck-timeout", type=float, default=120.0, help="seconds per case")


class AttncheckError(Exception):
    """A case attncheck judged failing, or a run that produced no verdict for it."""


def _attncheck(config) -> str:
    exe = config.getoption("--attncheck-bin")
    found = shutil.which(exe) if os.sep not in exe else (exe if os.access(exe, os.X_OK) else None)
    if not found:
        raise pytest.UsageError(f"attncheck executable '{exe}' not found "
                                "(--attncheck-bin or $ATTNCHECK_BIN)")
    return found


def _selection_args(config) -> list[str]:
    args = ["--tier", config.getoption("--attncheck-tier")]
    for op in config.getoption("--attncheck-op"):
        args += ["--op", op]
    return args


def _case_ids(config) -> list[str]:
    cmd = [_attncheck(config), "list", "--json"] + _selection_args(config)
    if config.getoption("--attncheck-filter"):
        cmd += ["--filter", config.getoption("--attncheck-filter")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise pytest.UsageError(f"{' '.join(cmd)} failed: {proc.stderr.strip()}")
    return [json.loads(line)["id"] for line in proc.stdout.splitlines() if line.strip()]


class AttncheckRun:
    """The one `attncheck run` over the cases pytest selected, started by the first test."""

    def __init__(self, config):
        self.config = config
        self.results: dict[str, dict] | None = None
        self.failure = ""  # why the run gave no verdicts (bad arguments, no GPU, ...)

    def result(self, case_id: str, selected: list[str]) -> dict | None:
        if self.results is None:
            self._run(selected)
        return self.results.get(case_id)

    def _run(self, ids: list[str]) -> None:
        out = Path(tempfile.mkdtemp(prefix="attncheck_pytest_"))
        # Exactly the selected ids: an anchored alternation (ids hold no regex specials but '.').
        pattern = "^(" + "|".join(re.escape(i) for i in ids) + ")$"
        cmd = [_attncheck(self.config), "run", *_selection_args(self.config), "--filter", pattern,
               "--kernels", self.config.getoption("--attncheck-kernels"),
               "--jobs", str(self.config.getoption("--attncheck-jobs")),
               "--timeout", str(self.config.getoption("--attncheck-timeout")),
               "--out", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        self.results = {}
        results = out / "results.jsonl"
        if results.exists():
            for line in results.read_text().splitlines():
                if line.strip():
                    r = json.loads(line)
                    self.results[r["id"]] = r
        if proc.returncode == 2 or not self.results:
            self.failure = (f"attncheck run exited {proc.returncode} with no verdicts:\n"
                            + (proc.stderr or proc.stdout)[-2000:])


class AttncheckItem(pytest.Item):
    def __init__(self, *, case_id: str, run: AttncheckRun, **kw):
        super().__init__(**kw)
        self.case_id = case_id
        self.run = run

    def runtest(self):
        selected = [i.case_id for i in self.session.items if isinstance(i, AttncheckItem)]
        r = self.run.result(self.case_id, selected)
        if r is None:
            raise AttncheckError(self.run.failure or f"attncheck gave no result for {self.case_id}")
        verdict, message = r["verdict"], r.get("message", "")
        if r["failing"]:
            raise AttncheckError(f"{verdict}: {message}\nrepro: {r.get('repro', '')}")
        if verdict in ("skipped", "unsupported"):
            pytest.skip(f"{verdict}: {message}")
        if verdict == "known_bug":
            pytest.xfail(message)
        if verdict == "unexpected_pass":
            warnings.warn(f"{self.case_id}: {message}")

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, AttncheckError):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, f"attncheck case {self.case_id}"


# tryfirst: the items exist before pytest's own -k / -m deselection runs over them.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    if not config.getoption("--attncheck-tier"):
        return
    if not config.getoption("--attncheck-kernels"):
        raise pytest.UsageError("--attncheck-tier needs --attncheck-kernels (LIB.so or py:MODULE)")
    run = AttncheckRun(config)
    for case_id in _case_ids(config):
        items.append(AttncheckItem.from_parent(session, name=f"attncheck::{case_id}",
                                               case_id=case_id, run=run))
