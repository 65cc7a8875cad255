"""The report end to end, as CI runs it: python3 -m attncheck_report DIRS... on hand-made results
with failures, a baseline and mutants. The HTML must parse, be self-contained, and every image must
be a whole PNG; the Markdown must carry the rows a CI summary needs."""

import base64
import re
from html.parser import HTMLParser

import synthetic
from conftest import run_report
from png_check import check_png

VOID = {"meta", "img", "br", "hr", "input", "link", "col", "area", "base", "wbr", "source"}


class Collector(HTMLParser):
    """Tags balanced, ids unique, every resource reference recorded."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.errors, self.images, self.refs, self.ids = [], [], [], [], []
        self.text = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.append(a["id"])
        if tag == "img":
            self.images.append(a)
        for key in ("src", "href"):
            if key in a:
                self.refs.append((tag, a[key]))
        if tag in ("script", "link", "iframe", "object", "embed"):
            self.errors.append(f"<{tag}> in a self-contained report")
        if tag not in VOID:
            self.stack.append((tag, self.getpos()))

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1][0] != tag:
            self.errors.append(f"</{tag}> at {self.getpos()} closes {self.stack[-1:]}")
            return
        self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def parse(html):
    p = Collector()
    p.feed(html)
    p.close()
    assert not p.errors, p.errors[:5]
    assert not p.stack, f"unclosed: {p.stack[:5]}"
    return p


def test_html_parses_and_is_self_contained(full_report):
    html = full_report["html"]
    p = parse(html)
    assert len(p.ids) == len(set(p.ids)), "duplicate ids"
    for tag, ref in p.refs:
        assert not re.match(r"(?i)(https?:|//|ftp:)", ref), f"network reference {tag} {ref}"
        if ref.startswith("#"):
            assert ref[1:] in p.ids, f"dangling anchor {ref}"
    assert "url(" not in html and "@import" not in html
    # The title is escaped, not injected.
    assert "synthetic &lt;report&gt; &amp; co" in html and "<report>" not in html


def test_every_image_is_a_whole_png(full_report):
    p = parse(full_report["html"])
    ops = {"indexer_topk", "kv_gather", "mla_decode", "page_indices", "rope", "sparse_mla"}
    assert len(p.images) == len(ops)
    for img in p.images:
        prefix = "data:image/png;base64,"
        assert img["src"].startswith(prefix)
        width, height = check_png(base64.b64decode(img["src"][len(prefix):], validate=True))
        assert width >= 300 and height >= 150
        assert img.get("alt", "").split(" heatmap")[0] in ops


def test_html_content(full_report):
    text = " ".join(" ".join(parse(full_report["html"]).text).split())
    assert "FAILED 7 failed, 1 error of 150 cases" in text
    for expected in (
        "9f2c0b7e9f2c0b7e",  # golden manifest hash
        "abc1234def",  # revision
        "New failures (3)",
        "Fixed (1)",
        "Error/budget ratio grown more than 2x (1)",
        "Cases appeared (6) and disappeared (1)",
        "The baseline has no results for gfx950",
        "Mutation score 1/2 (50%)",
        "mla_pad_heads",  # listed but not run
        "3 case(s) passed although marked as a known bug",
        "attncheck repro 'mla_decode/h8-bs16-q8-bf16-ctx1023-s0'",
        "golden/rope.h5: dataset 'gptj-inplace' missing",  # an error's message
        "mla_decode__h8-bs16-q8-bf16-ctx1023-s0.h5",  # its repro bundle
    ):
        assert expected in text, expected


def md_rows(md):
    return [[c.strip() for c in line.strip("|").split(" | ")] for line in md.splitlines()
            if line.startswith("| ")]


def test_markdown_summary(full_report):
    md = full_report["md"]
    assert md.startswith("## synthetic <report> & co\n")
    assert "❌ **FAILED**: 7 failed, 1 error of 150 cases" in md
    rows = md_rows(md)
    assert rows[0] == ["arch", "cases", "passed", "failed", "refused as expected", "known bug",
                       "unexpected pass", "unsupported", "skipped", "error"]
    assert ["gfx942", "75", "63", "4", "3", "3", "0", "0", "1", "1"] in rows
    assert ["gfx950", "75", "65", "3", "3", "0", "3", "0", "1", "0"] in rows
    assert ["**all**", "150", "128", "7", "6", "3", "3", "0", "2", "1"] in rows
    assert "3 new failures, 1 fixed, 1 error/budget ratios grown > 2x, 6 cases appeared," \
           " 1 disappeared; no baseline for gfx950" in md
    changes = [r for r in rows if r[0] in ("new failure", "ratio grown", "fixed")]
    assert [r[0] for r in changes] == ["new failure"] * 3 + ["ratio grown", "fixed"]
    assert changes[0][1:4] == ["`mla_decode/h8-bs1-q8-bf16-ctx1023-s0`", "gfx942",
                               "passed → failed"]
    worst = [r for r in rows if len(r) == 7 and r[0].startswith("`")]
    assert len(worst) == 10 and all(r[6].startswith("`attncheck repro '") for r in worst)
    assert "**3 unexpected passes**" in md
    assert "**Mutation score** 1/2; survived: kv_ignore_stride" in md
    # Short enough for a step summary and a human.
    assert len(md.splitlines()) < 60 and len(md) < 16_000


def test_single_passing_run_without_extras(synth, tmp_path):
    records = [r for r in __import__("synthetic").other_cases("gfx942")
               if r["verdict"] == "passed"]
    d = __import__("synthetic").write_results(tmp_path / "ok", records)
    proc = run_report(d, "--out", tmp_path / "o", "--exit-code")
    assert proc.returncode == 0, proc.stderr
    md = (tmp_path / "o" / "summary.md").read_text()
    assert "✅ **PASSED**" in md and "vs baseline" not in md and "Mutation" not in md
    html = (tmp_path / "o" / "report.html").read_text()
    assert 'id="regression"' not in html and 'id="mutation"' not in html
    parse(html)


def test_exit_code_annotations_and_bad_input(synth, tmp_path):
    proc = run_report(*synth["current"], "--out", tmp_path / "a", "--exit-code",
                      env={"GITHUB_ACTIONS": "true"})
    assert proc.returncode == 1 and "FAILED: 7 failed, 1 error" in proc.stdout
    # GitHub annotations: every failure an error, every unexpected pass a warning.
    errors = [line for line in proc.stdout.splitlines() if line.startswith("::error ")]
    warnings = [line for line in proc.stdout.splitlines() if line.startswith("::warning ")]
    assert len(errors) == 8 and len(warnings) == 3
    assert any("mla_decode/h8-bs16-q8-bf16-ctx1023-s0 (gfx942)::" in line for line in errors)
    proc = run_report(tmp_path / "missing", "--out", tmp_path / "b")
    assert proc.returncode == 2
    assert "attncheck_report: error:" in proc.stderr and "not a directory" in proc.stderr
    assert not (tmp_path / "b" / "report.html").exists()


def test_malformed_line_exits_with_file_and_line(synth, tmp_path):
    import shutil
    bad = tmp_path / "bad"
    shutil.copytree(synth["current"][0], bad)
    with (bad / "results.jsonl").open("a") as fh:
        fh.write("{oops\n")
    proc = run_report(bad, "--out", tmp_path / "o")
    assert proc.returncode == 2
    n = len((bad / "results.jsonl").read_text().splitlines())
    assert f"results.jsonl:{n}: not valid JSON" in proc.stderr


def test_reexec_under_debian_python_or_clear_message(synth, tmp_path):
    """Started from an interpreter without numpy (python3 -I -S: no site packages) the package
    either re-runs itself under /usr/bin/python3 or names what is missing."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, PYTHONPATH=str(__import__("conftest").PACKAGE_PARENT))
    cmd = [sys.executable, "-S", "-m", "attncheck_report", *map(str, synth["current"]),
           "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    if os.access("/usr/bin/python3", os.X_OK):
        assert proc.returncode == 0, proc.stderr
        assert (tmp_path / "report.html").is_file()
    env["ATTNCHECK_REPORT_REEXEC"] = "1"  # no second chance: the message must say what is missing
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 3
    assert "lacks numpy" in proc.stderr and "apt-get install python3-numpy" in proc.stderr


# --- failing field, modes, unsupported, default output directory --------------------------------


def passing_records(mode="kernel", arch="gfx942"):
    """The 27 passing records of one arch in tests/synthetic.py."""
    records = [r for r in synthetic.other_cases(arch) if r["verdict"] == "passed"]
    assert len(records) == 27 or arch != "gfx942"
    for r in records:
        r["mode"] = mode
    return records


def report_text(out):
    html = (out / "report.html").read_text()
    badge = re.search(r'<span class="status (\w+)">([^<]*)</span>', html)
    body = re.sub(r"(?s)<style>.*</style>", "", html)  # CSS names every status
    return " ".join(" ".join(parse(body).text).split()), badge, (out / "summary.md").read_text()


def test_reference_only_run_never_shows_passed(tmp_path):
    d = synthetic.write_results(tmp_path / "ref", passing_records("reference"),
                                mode="reference", kernels_library="")
    proc = run_report(d, "--out", tmp_path / "o", "--exit-code")
    assert proc.returncode == 0, proc.stderr  # the reference matched its goldens: not a failure
    text, badge, md = report_text(tmp_path / "o")
    assert badge.groups() == ("REFERENCE", "REFERENCE ONLY: kernels not checked")
    assert "⚠️ **REFERENCE ONLY: kernels not checked**: 27 cases, 27 passed, none failed" in md
    assert "PASSED" not in md and "PASSED" not in text and "✅" not in md
    assert "REFERENCE ONLY: kernels not checked: 27 cases" in proc.stdout


def test_failing_reference_only_run_says_both(tmp_path):
    records = passing_records("reference")
    synthetic.set_verdict(records[0], "failed")
    d = synthetic.write_results(tmp_path / "ref", records, mode="reference")
    proc = run_report(d, "--out", tmp_path / "o", "--exit-code")
    assert proc.returncode == 1
    _, badge, md = report_text(tmp_path / "o")
    assert badge.groups() == ("FAILED", "FAILED")
    assert "❌ **FAILED** (REFERENCE ONLY: kernels not checked): 1 failed of 27 cases" in md


def test_mixed_run_says_how_many_cases_ran_their_kernel(tmp_path):
    records = passing_records("kernel")
    for r in records[:4]:
        r["mode"] = "reference"
    records[4]["mode"] = "none"  # a pass that compared nothing: never counted as passed
    d = synthetic.write_results(tmp_path / "mix", records)
    proc = run_report(d, "--out", tmp_path / "o", "--exit-code")
    assert proc.returncode == 0, proc.stderr
    text, badge, md = report_text(tmp_path / "o")
    scope = "(kernel: 22 of 27 cases; 4 reference only, 1 compared nothing)"
    assert badge.groups() == ("PASSED", "PASSED")
    assert f"PASSED {scope} 27 cases, 26 passed, none failed (1 not compared)" in text
    assert f"✅ **PASSED** {scope}: 27 cases, 26 passed, none failed (1 not compared)" in md


def test_exit_code_follows_the_failing_field(tmp_path):
    """attncheck decides what fails: the report's exit status and its FAILED follow the field."""
    records = passing_records()
    records[0]["failing"] = True  # a passed verdict that attncheck's (future) rule fails
    d = synthetic.write_results(tmp_path / "r", records)
    proc = run_report(d, "--out", tmp_path / "o", "--exit-code", env={"GITHUB_ACTIONS": "true"})
    assert proc.returncode == 1 and "FAILED: 1 passed of 27 cases" in proc.stdout
    assert sum(line.startswith("::error ") for line in proc.stdout.splitlines()) == 1
    records[0]["failing"] = False
    synthetic.set_verdict(records[1], "unsupported")
    d = synthetic.write_results(tmp_path / "r2", records)
    assert run_report(d, "--out", tmp_path / "o2", "--exit-code").returncode == 0


def test_unsupported_is_shown_like_skipped_and_counted_apart(tmp_path):
    records = passing_records()
    synthetic.set_verdict(records[0], "unsupported", [])
    synthetic.set_verdict(records[1], "skipped", [])
    d = synthetic.write_results(tmp_path / "r", records)
    proc = run_report(d, "--out", tmp_path / "o")
    assert proc.returncode == 0, proc.stderr
    _, _, md = report_text(tmp_path / "o")
    assert ["gfx942", "27", "25", "0", "0", "0", "0", "1", "1", "0"] in md_rows(md)
    assert "27 cases, 25 passed, none failed (1 unsupported, 1 skipped)" in md
    html = (tmp_path / "o" / "report.html").read_text()
    assert '<span class="v v-unsupported">unsupported</span>' in html
    assert ".v-skipped, .v-unsupported {" in html


def test_without_out_the_report_goes_next_to_the_results(tmp_path):
    first = synthetic.write_results(tmp_path / "runs" / "gfx942", passing_records())
    second = synthetic.write_results(tmp_path / "runs" / "gfx950",
                                     passing_records(arch="gfx950"), arch="gfx950")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    proc = run_report("../runs/gfx942", "../runs/gfx950", cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr
    assert list(elsewhere.iterdir()) == []  # not the current directory
    assert not (second / "report.html").exists()
    html, summary = (first / "report.html").resolve(), (first / "summary.md").resolve()
    assert html.is_file() and summary.is_file()
    lines = proc.stdout.splitlines()
    assert f"report: {html}" in lines and f"summary: {summary}" in lines
    assert html.is_absolute()


def test_contract_is_shown_beside_the_budget_and_contract_passes_are_named(tmp_path):
    """A pass that needed the kernel's declared arithmetic contract is never shown as a plain
    pass: the summary and the HTML name it with its contract, and every budget of a case with a
    contract carries the contract's name (docs/verification.md "Arithmetic contracts")."""
    records = passing_records()
    qk = "qk-products-in-input-type"
    records[0]["contract"] = qk
    records[1]["contract"] = "fp32-accumulate"  # default budgets held: an ordinary pass
    d = synthetic.write_results(tmp_path / "r", records)
    proc = run_report(d, "--out", tmp_path / "o", "--exit-code")
    assert proc.returncode == 0, proc.stderr
    text, badge, md = report_text(tmp_path / "o")
    assert badge.groups() == ("PASSED", "PASSED")
    line = next(x for x in md.splitlines() if "passed only under the kernel's declared" in x)
    assert line.startswith("**1 passed only under")
    assert f"`{records[0]['id']}` ({qk})" in line and records[1]["id"] not in line
    assert f"1 passed only under the kernel's declared arithmetic contract" in text
    html = (tmp_path / "o" / "report.html").read_text()
    assert f"· contract {qk}</td>" in html
    assert "· contract fp32-accumulate</td>" in html
    # Without a contract field nothing is added.
    plain = synthetic.write_results(tmp_path / "p", passing_records())
    assert run_report(plain, "--out", tmp_path / "po").returncode == 0
    _, _, md_plain = report_text(tmp_path / "po")
    assert "declared arithmetic contract" not in md_plain
    assert "· contract" not in (tmp_path / "po" / "report.html").read_text()


def test_partial_contracts_and_not_provided_ops_are_shown(tmp_path):
    """Cases judged under a declared partial contract are counted per op with the contract in
    words; ops a Python adapter does not provide are listed once; a malformed record is an error
    naming the field (docs/verification.md "Partial contracts")."""
    records = passing_records()
    records[0]["partial"] = {"not_produced": ["lse"], "unspecified": {}}
    records[1]["partial"] = {"not_produced": [], "unspecified": {"logits": "past_context"}}
    records[1]["verdict"], records[1]["failing"] = "failed", True
    absent = dict(records[2], verdict="unsupported", failing=False, mode="none",
                  not_provided_by="vllm_triton", checks=[])
    records[2] = absent
    d = synthetic.write_results(tmp_path / "r", records)
    assert run_report(d, "--out", tmp_path / "o").returncode == 0
    _, _, md = report_text(tmp_path / "o")
    assert (f"**Partial contract** `{records[0]['op']}` (gfx942): 1 case(s) judged with 'lse' not"
            " produced, 0 failing") in md
    assert "judged with 'logits' past_context unspecified, 1 failing" in md
    assert f"**Not provided by vllm_triton**: 1 op(s), 1 case(s), not run: {absent['op']} 1" in md
    html = (tmp_path / "o" / "report.html").read_text()
    assert 'id="partial"' in html and "&#39;lse&#39; not produced" in html
    assert "Not provided by vllm_triton" in html
    plain = synthetic.write_results(tmp_path / "p", passing_records())
    assert run_report(plain, "--out", tmp_path / "po").returncode == 0
    _, _, md_plain = report_text(tmp_path / "po")
    assert "Partial contract" not in md_plain and "Not provided" not in md_plain
    records[0]["partial"] = {"not_produced": "lse"}
    bad = synthetic.write_results(tmp_path / "b", records)
    proc = run_report(bad, "--out", tmp_path / "bo")
    assert proc.returncode != 0 and "'partial' must be null or" in proc.stderr


def test_invariance_relations_are_counted_and_violations_named(tmp_path):
    """The relations each case ran (docs/verification.md "Invariance"): the summary counts them,
    bitwise and within budget, and names every violation with its case; a malformed record is an
    error naming the field."""
    records = passing_records()
    records[0]["invariance"] = [
        {"relation": "batch permutation [1,2,0]", "mode": "bitwise", "passed": True, "message": "same bits"},
        {"relation": "split count 4 -> 1", "mode": "budget", "passed": True, "message": "within"},
    ]
    records[1]["verdict"], records[1]["failing"] = "failed", True
    records[1]["invariance"] = [
        {"relation": "request 3 alone vs in the batch of 4", "mode": "bitwise", "passed": False,
         "message": "'o' differs bitwise from the case's launch"},
    ]
    d = synthetic.write_results(tmp_path / "r", records)
    assert run_report(d, "--out", tmp_path / "o").returncode == 0
    _, _, md = report_text(tmp_path / "o")
    line = next(x for x in md.splitlines() if x.startswith("**Invariance**"))
    assert "3 relations on 2 cases (2 bitwise, 1 within budget), 1 violated" in line
    assert f"`{records[1]['id']}` request 3 alone vs in the batch of 4 (bitwise)" in line
    html = (tmp_path / "o" / "report.html").read_text()
    assert "<td>request 3 alone vs in the batch of 4</td>" in html
    # Without relations nothing is added.
    plain = synthetic.write_results(tmp_path / "p", passing_records())
    assert run_report(plain, "--out", tmp_path / "po").returncode == 0
    assert "Invariance" not in report_text(tmp_path / "po")[2]
    bad = passing_records()
    bad[0]["invariance"] = [{"relation": "x", "mode": "sometimes", "passed": True}]
    proc = run_report(synthetic.write_results(tmp_path / "b", bad), "--out", tmp_path / "bo")
    assert proc.returncode != 0 and "'invariance' must be a JSON array" in proc.stderr


def test_heatmaps_drawn_beforehand_are_read_back_not_drawn_again(synth, tmp_path):
    # ci/gpu-job draws the heatmaps from the tier's results while the mutants run: the report
    # then reads them (same cases, same key) and its HTML is the one it draws itself.
    cache = tmp_path / "cache"
    first = run_report(*synth["current"], "--heatmap-cache", cache, "--heatmaps-only")
    assert first.returncode == 0, first.stderr
    drawn = sorted(cache.glob("*.png"))
    assert len(drawn) >= 2 and "heatmap(s) drawn into" in first.stdout
    assert not (tmp_path / "o").exists() and not list(cache.parent.glob("*.html"))
    again = run_report(*synth["current"], "--heatmap-cache", cache, "--heatmaps-only")
    assert again.returncode == 0 and "0 heatmap(s) drawn" in again.stdout
    # Each cached PNG replaced by a marker: the report must show the markers, not redraw.
    for p in drawn:
        p.write_bytes(b"\x89PNG marker " + p.name.encode())
    proc = run_report(*synth["current"], "--out", tmp_path / "o", "--heatmap-cache", cache,
                      "--baseline", *synth["baseline"], "--mutants", *synth["mutants"],
                      "--mutant-specs", synth["specs"])
    assert proc.returncode == 0, proc.stderr
    html = (tmp_path / "o" / "report.html").read_text()
    markers = [base64.b64encode(b"\x89PNG marker " + p.name.encode()).decode() for p in drawn]
    assert all(m in html for m in markers)
    # Other cases, another key: drawn, not taken from the cache.
    records = [r for r in synthetic.other_cases("gfx942") if r["verdict"] == "passed"]
    d = synthetic.write_results(tmp_path / "ok", records)
    proc = run_report(d, "--out", tmp_path / "o2", "--heatmap-cache", cache)
    assert proc.returncode == 0, proc.stderr
    html = (tmp_path / "o2" / "report.html").read_text()
    assert not any(m in html for m in markers)


def test_a_link_in_the_heatmap_cache_is_not_read(synth, tmp_path):
    cache = tmp_path / "cache"
    assert run_report(*synth["current"], "--heatmap-cache", cache, "--heatmaps-only").returncode == 0
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"not for the report")
    for p in cache.glob("*.png"):
        p.unlink()
        p.symlink_to(secret)
    proc = run_report(*synth["current"], "--out", tmp_path / "o", "--heatmap-cache", cache)
    assert proc.returncode == 0, proc.stderr
    html = (tmp_path / "o" / "report.html").read_text()
    assert base64.b64encode(b"not for the report").decode() not in html
    for m in re.finditer(r'data:image/png;base64,([A-Za-z0-9+/=]+)', html):
        check_png(base64.b64decode(m.group(1)))
    proc = run_report(*synth["current"], "--heatmaps-only")
    assert proc.returncode == 2 and "--heatmaps-only needs --heatmap-cache" in proc.stderr
