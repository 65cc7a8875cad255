"""Input no report can be made from, and output directories it cannot write: a one-line error and
exit status 2, never a traceback. JSON nested deeper than the report reads (jsonread.MAX_DEPTH)
is bad JSON, whichever file holds it; --out (of the report and of the shard merge) must be a
directory that can be created and written."""

import errno
import json
import os
import subprocess
import sys

import pytest

import synthetic
from attncheck_report import cli, jsonread
from conftest import PACKAGE_PARENT, run_report
from test_report import passing_records

DEEP = 100_000


def one_line_error(proc, *needles, prog="attncheck_report"):
    """Exit 2 with exactly one line on stderr, `PROG: error: ...` holding `needles`."""
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def nested(depth, leaf='1'):
    return '{"a":' * depth + leaf + "}" * depth


@pytest.fixture
def results(tmp_path):
    return synthetic.write_results(tmp_path / "run", passing_records())


def test_deep_results_line_names_file_and_line(results, tmp_path):
    with (results / "results.jsonl").open("a") as fh:
        fh.write("[" * DEEP + "]" * DEEP + "\n")
    proc = run_report(results, "--out", tmp_path / "o")
    one_line_error(proc, "results.jsonl:28: not valid JSON",
                   f"nested deeper than {jsonread.MAX_DEPTH} levels at column 65")
    assert not (tmp_path / "o").exists()


def test_deep_run_json(results, tmp_path):
    (results / "run.json").write_text(nested(DEEP))
    one_line_error(run_report(results, "--out", tmp_path / "o"), "run.json: not valid JSON",
                   "nested deeper than")


def test_deep_coverage_json(results, tmp_path):
    (results / "coverage.json").write_text(json.dumps({"tier": "quick", "ops": "X"}).replace(
        '"X"', "[" * DEEP + "]" * DEEP))
    one_line_error(run_report(results, "--out", tmp_path / "o"),
                   "coverage.json: not a coverage audit", "nested deeper than")


def test_nesting_limit_is_exact_and_checked_below_the_interpreters_limit(results, tmp_path):
    """MAX_DEPTH levels parse; one more is refused even where Python's parser would manage it
    (a depth the interpreter parses but that would break whatever walks it later)."""
    assert jsonread.loads(nested(jsonread.MAX_DEPTH - 1, "[]")) is not None
    assert jsonread.loads('["' + "[" * 500 + '"]') == ["[" * 500]  # brackets in a string
    with pytest.raises(json.JSONDecodeError, match="nested deeper than 64 levels") as e:
        jsonread.loads(nested(jsonread.MAX_DEPTH, "[]"))
    assert e.value.pos == 5 * jsonread.MAX_DEPTH
    meta = json.loads((results / "run.json").read_text())
    meta["extra"] = json.loads(nested(200))
    (results / "run.json").write_text(json.dumps(meta))
    one_line_error(run_report(results, "--out", tmp_path / "o"), "run.json: not valid JSON",
                   "nested deeper than 64 levels")


def run_merge(*args):
    """`python3 -m attncheck_report.merge ARGS` (the shard merge, the same --out rules)."""
    env = dict(os.environ, PYTHONPATH=str(PACKAGE_PARENT))
    return subprocess.run([sys.executable, "-m", "attncheck_report.merge", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("tool", ["report", "merge"])
@pytest.mark.parametrize("where", ["file", "/dev/null", "under_file"])
def test_out_that_cannot_be_a_directory(results, tmp_path, where, tool):
    a_file = tmp_path / "a_file"
    a_file.write_text("keep me")
    out = {"file": a_file, "/dev/null": "/dev/null", "under_file": a_file / "sub"}[where]
    proc = (run_report if tool == "report" else run_merge)(results, "--out", out)
    reason = "cannot be used (Not a directory)" if where == "under_file" else \
        "exists and is not a directory"
    one_line_error(proc, f"--out '{out}': {reason}",
                   prog="attncheck_report" + (".merge" if tool == "merge" else ""))
    assert a_file.read_text() == "keep me"


def refuse(exc_errno):
    def fail(*args, **kwargs):
        raise OSError(exc_errno, os.strerror(exc_errno), str(args[0]) if args else "")
    return fail


def test_out_on_a_read_only_file_system(results, tmp_path, monkeypatch, capsys):
    """EROFS from creating --out, and from writing into an --out that exists, are one line."""
    monkeypatch.setattr(os, "mkdir", refuse(errno.EROFS))
    assert cli.main([str(results), "--out", str(tmp_path / "new" / "o")]) == 2
    err = capsys.readouterr().err
    assert err == f"attncheck_report: error: --out '{tmp_path / 'new' / 'o'}': cannot be created" \
                  " (Read-only file system)\n"
    monkeypatch.undo()
    monkeypatch.setattr("tempfile.mkstemp", refuse(errno.EROFS))
    assert cli.main([str(results), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attncheck_report: error: ") and err.count("\n") == 1
    assert "Read-only file system" in err and not (tmp_path / "report.html").exists()
