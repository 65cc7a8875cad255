"""The coverage audit in the report: a results directory holding coverage.json gets a section in
report.html and a line in summary.md; a damaged one is an input error naming the file."""

import json

import synthetic
from conftest import run_report


def audit(unaccepted=False):
    flags = [{"flag": "derived", "detail": "a function of q.shape[2]", "accepted": True,
              "reason": "BLIND SPOT: scale is always 1/sqrt(Lk)", "accepted_at": "cases/x.toml:3"},
             {"flag": "never-varied", "detail": "always f32", "accepted": not unaccepted,
              "reason": "" if unaccepted else "the ABI fixes lse to f32",
              "accepted_at": "cases/x.toml:9"}]
    return {"tier": "quick", "flags": 2, "unaccepted": int(unaccepted), "stale": 0, "errors": 0,
            "seconds": 1.0,
            "ops": [{"op": "mla_decode", "case_file": "cases/mla_decode.toml", "cases": 3,
                     "refused": 0, "stale": [], "errors": [],
                     "arguments": [{"name": "params.scale", "kind": "scalar", "flags": flags[:1]},
                                   {"name": "lse.dtype", "kind": "tensor",
                                    "flags": flags[1:]}]}]}


def results_with(tmp_path, doc):
    d = synthetic.write_results(tmp_path / "run", synthetic.mla_cases("gfx942"), "gfx942")
    (d / "coverage.json").write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return d


def test_report_shows_the_audit(tmp_path):
    d = results_with(tmp_path, audit(unaccepted=True))
    proc = run_report(d)
    assert proc.returncode == 0, proc.stderr
    html = (d / "report.html").read_text(encoding="utf-8")
    md = (d / "summary.md").read_text(encoding="utf-8")
    assert 'id="coverage"' in html
    assert "BLIND SPOT: scale is always 1/sqrt(Lk)" in html
    assert "lse.dtype" in html and "not accepted" in html
    assert "**Coverage audit** (tier quick): 2 flags, 1 not accepted, 1 accepted as blind spots" \
        in md
    assert "`attncheck coverage` fails" in md


def test_no_audit_no_section(tmp_path):
    d = synthetic.write_results(tmp_path / "run", synthetic.mla_cases("gfx942"), "gfx942")
    assert run_report(d).returncode == 0
    assert 'id="coverage"' not in (d / "report.html").read_text(encoding="utf-8")
    assert "Coverage audit" not in (d / "summary.md").read_text(encoding="utf-8")


def test_damaged_audit_is_an_input_error(tmp_path):
    d = results_with(tmp_path, '{"tier": "quick"}')
    proc = run_report(d)
    assert proc.returncode == 2
    assert "coverage.json: not a coverage audit" in proc.stderr
