"""`attncheck run --shrink` records: the report shows each failure's minimal failing case beside
it (HTML failures table and the Markdown summary), and refuses a malformed "shrunk" field naming
the file and line."""

import synthetic
from conftest import run_report
from test_report import parse, passing_records


def shrunk_records():
    records = passing_records()
    failing = records[0]
    synthetic.set_verdict(failing, "failed")
    failing["message"] = "o: 3 of 40 elements beyond budget"
    minimal = failing["op"] + "/h8-p64-b1-ctx1"
    failing["shrunk"] = {
        "id": minimal, "original_id": failing["id"], "params": {"heads": 8, "page_size": 64},
        "case_file_entry": "{ heads = 8, page_size = 64 }",
        "repro": f"attncheck repro '{minimal}' --kernels lib.so --params '{{\"heads\":8}}'",
        "check": "o (numeric)", "message": "o: 1 of 1 elements beyond budget", "steps": [],
        "evaluations": 41, "passes": 3, "stopped": "no simpler value fails the same way"}
    second = records[1]
    synthetic.set_verdict(second, "failed")  # failed, not shrunk (past --shrink N)
    return records, failing, minimal


def test_minimal_case_is_shown_beside_the_original(tmp_path):
    records, failing, minimal = shrunk_records()
    d = synthetic.write_results(tmp_path / "r", records)
    proc = run_report(d, "--out", tmp_path / "o")
    assert proc.returncode == 0, proc.stderr
    html = (tmp_path / "o" / "report.html").read_text()
    parse(html)
    assert "minimal failing case (<code>run --shrink</code>)" in html
    section = html[html.index('<section id="failures">'):]
    row = section[section.index(f'<td class="id">{failing["id"]}</td>'):]
    row = row[:row.index("</tr>")]
    assert f'<span class="id">{minimal}</span>' in row
    assert "fails o (numeric)" in row
    assert "{ heads = 8, page_size = 64 }" in row
    assert "41 evaluations; no simpler value fails the same way" in row
    md = (tmp_path / "o" / "summary.md").read_text()
    assert "**Shrunk failures**" in md
    line = next(x for x in md.splitlines() if x.startswith(f"| `{failing['id']}`")
                and minimal in x)
    assert "o (numeric)" in line and "`{ heads = 8, page_size = 64 }`" in line
    assert "--params" in line


def test_no_shrunk_column_without_shrunk_records(tmp_path):
    records, failing, _ = shrunk_records()
    del failing["shrunk"]
    d = synthetic.write_results(tmp_path / "r", records)
    assert run_report(d, "--out", tmp_path / "o").returncode == 0
    assert "run --shrink" not in (tmp_path / "o" / "report.html").read_text()
    assert "Shrunk failures" not in (tmp_path / "o" / "summary.md").read_text()


def test_malformed_shrunk_field_names_file_and_line(tmp_path):
    records, failing, _ = shrunk_records()
    failing["shrunk"]["id"] = "other_op/x"
    d = synthetic.write_results(tmp_path / "r", records)
    proc = run_report(d, "--out", tmp_path / "o")
    assert proc.returncode == 2
    assert "results.jsonl:1: shrunk case id 'other_op/x' does not start with" in proc.stderr
    failing["shrunk"] = {"id": failing["id"]}
    d = synthetic.write_results(tmp_path / "r2", records)
    proc = run_report(d, "--out", tmp_path / "o2")
    assert proc.returncode == 2 and "missing or empty string field 'shrunk.repro'" in proc.stderr
