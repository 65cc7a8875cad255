"""Verdict counts, worst-case order, baseline regressions and the mutation score."""

from types import SimpleNamespace

import pytest

import synthetic
from attncheck_report.analysis import (compare_to_baseline, load_mutant_specs, mutation_analysis,
                                       status_line, verdict_counts, worst_cases)
from attncheck_report.results import ResultsError, all_cases, load_runs


@pytest.fixture(scope="module")
def loaded(synth):
    runs = load_runs(synth["current"])
    return {"runs": runs, "cases": all_cases(runs), "base": load_runs(synth["baseline"]),
            "mutants": load_runs(synth["mutants"]), "specs": load_mutant_specs(synth["specs"])}


def by_id(changes):
    return {(ch.any.arch, ch.any.id) for ch in changes}


def test_verdict_counts_per_arch(loaded):
    g942 = verdict_counts(c for c in loaded["cases"] if c.arch == "gfx942")
    assert dict(g942) == {"passed": 63, "failed": 4, "refused_as_expected": 3, "known_bug": 3,
                          "unexpected_pass": 0, "unsupported": 0, "skipped": 1, "error": 1}


def cases_of(mode="kernel", **verdicts):
    """Stand-in cases: {verdict: how many}, failing as attncheck writes it today."""
    return [SimpleNamespace(verdict=v, failing=v in synthetic.ATTNCHECK_FAILING, mode=mode)
            for v, n in verdicts.items() for _ in range(n)]


def test_status_line():
    st = status_line(cases_of(skipped=52, refused_as_expected=12), [])
    assert (st.word, st.text) == (
        "NOT CHECKED", "none of 64 cases compared an output (12 refused as expected, 52 skipped)")
    cases = cases_of(passed=3, known_bug=1, unexpected_pass=1)
    st = status_line(cases, [])
    assert (st.word, st.text, st.scope) == (
        "PASSED", "5 cases, 3 passed, none failed (1 known bug, 1 unexpected pass)", "")
    assert st.headline == "PASSED: 5 cases, 3 passed, none failed (1 known bug, 1 unexpected pass)"
    assert status_line(cases, ["cut short"]).word == "INCOMPLETE"
    st = status_line(cases + cases_of(error=1), [])
    assert (st.word, st.text) == ("FAILED", "1 error of 6 cases")


def test_failing_is_the_records_word_not_the_verdicts():
    """attncheck owns the rule: were it to make an unexpected pass failing, the report follows."""
    cases = cases_of(passed=2) + [SimpleNamespace(verdict="unexpected_pass", failing=True,
                                                  mode="kernel")]
    assert status_line(cases, []).headline == "FAILED: 1 unexpected pass of 3 cases"
    cases[-1].failing = False
    assert status_line(cases, []).word == "PASSED"


def test_reference_only_results_never_read_as_passed():
    st = status_line(cases_of("reference", passed=52, refused_as_expected=12), [])
    assert st.word == "REFERENCE ONLY" and st.badge == "REFERENCE ONLY: kernels not checked"
    assert st.headline == ("REFERENCE ONLY: kernels not checked: 64 cases, 52 passed, none failed"
                           " (12 refused as expected)")
    # Failing, incomplete or not checked: the word stays, the scope still says it.
    st = status_line(cases_of("reference", passed=5, failed=1), [])
    assert st.headline == "FAILED (REFERENCE ONLY: kernels not checked): 1 failed of 6 cases"
    st = status_line(cases_of("reference", passed=5), ["cut short"])
    assert st.word == "INCOMPLETE" and st.scope == "REFERENCE ONLY: kernels not checked"


def test_mixed_modes_say_how_many_cases_ran_their_kernel():
    cases = (cases_of("kernel", passed=400, skipped=12) + cases_of("reference", passed=150)
             + cases_of("none", skipped=15))
    st = status_line(cases, [])
    assert st.word == "PASSED"
    assert st.headline == ("PASSED (kernel: 412 of 577 cases; 150 reference only, 15 compared"
                           " nothing): 577 cases, 550 passed, none failed (27 skipped)")


def test_a_pass_that_compared_nothing_is_not_counted_as_passed():
    cases = cases_of("kernel", passed=3) + cases_of("none", passed=2, unexpected_pass=1)
    assert status_line(cases, []).text == "6 cases, 3 passed, none failed (3 not compared)"
    st = status_line(cases_of("none", passed=4, skipped=1), [])
    assert st.headline == ("NOT CHECKED (REFERENCE ONLY: kernels not checked): none of 5 cases"
                           " compared an output (1 skipped, 4 not compared)")


def test_worst_cases_put_failures_first_then_ratio(loaded):
    worst = worst_cases(loaded["cases"], 12)
    verdicts = [c.verdict for c in worst]
    n_fail = sum(v in ("failed", "error") for v in verdicts)
    assert n_fail == 8 and all(v in ("failed", "error") for v in verdicts[:n_fail])
    assert verdicts[n_fail:n_fail + 3] == ["known_bug"] * 3
    # failures with a finite ratio come after the infinite ones, largest first
    finite = [c.ratio for c in worst[:n_fail] if c.ratio is not None and c.ratio < float("inf")]
    assert finite == sorted(finite, reverse=True) and finite[0] == pytest.approx(37.0)


def test_regression_against_baseline(loaded):
    reg = compare_to_baseline(loaded["cases"], loaded["base"])
    h8q8 = {("gfx942", f"mla_decode/h8-bs{bs}-q8-bf16-ctx1023-s0") for bs in (1, 16, 64)}
    assert by_id(reg.new_failures) == h8q8
    assert by_id(reg.fixed) == {("gfx942", "mla_decode/h4-bs64-q1-bf16-ctx1023-s0")}
    assert by_id(reg.grown) == {("gfx942", "mla_decode/h32-bs16-q3-bf16-ctx1023-s0")}
    assert reg.grown[0].growth == pytest.approx(10.0)
    assert {ch.any.op for ch in reg.appeared} == {"page_indices"} and len(reg.appeared) == 6
    assert by_id(reg.disappeared) == {("gfx942", "mla_decode/h2-bs16-q1-bf16-ctx1023-s0")}
    # gfx950 has no baseline at all: reported as such, not as 75 appeared cases
    assert reg.unmatched_arches == ["gfx950"]
    assert not reg.is_clean


def test_growth_below_the_floor_is_noise(loaded):
    reg = compare_to_baseline(loaded["cases"], loaded["base"], growth_factor=2.0, growth_floor=0.6)
    assert reg.grown == []  # 0.05 -> 0.5 is 10x, but 0.5 is under the 0.6 floor


def test_identical_baseline_is_clean(loaded):
    reg = compare_to_baseline(loaded["cases"], loaded["runs"])
    assert reg.is_clean and not reg.fixed and not reg.appeared and not reg.disappeared


def test_mutation_score(loaded):
    mut = mutation_analysis(loaded["mutants"], loaded["cases"], loaded["specs"])
    assert mut.score == (1, 2)
    outcome = {o.name: o for o in mut.outcomes}
    causal = outcome["mla_no_causal"]
    assert causal.killed and causal.expected_hit
    # h8 q8 fails with the normal library too: it does not count as a kill
    assert {c.id for c in causal.excused} == {f"mla_decode/h8-bs{bs}-q8-bf16-ctx1023-s0"
                                              for bs in (1, 16, 64)}
    assert all("h8-" not in c.id or "-q3-" in c.id for c in causal.killers)
    assert not outcome["kv_ignore_stride"].killed
    assert [s.name for s in mut.not_run] == ["mla_pad_heads"]


def test_mutant_without_a_mutant_library_is_refused(loaded):
    with pytest.raises(ResultsError, match="is not a mutant library"):
        mutation_analysis(loaded["runs"], loaded["cases"], loaded["specs"])


def test_mutants_file_format_errors(tmp_path):
    (tmp_path / "rope.mutants").write_text("just_a_name\n")
    with pytest.raises(ResultsError,
                       match=r"rope\.mutants:1: expected 'name \| seed bug \| case id regex'"):
        load_mutant_specs(tmp_path)
    (tmp_path / "rope.mutants").write_text("m | bug | rope/(unclosed\n")
    with pytest.raises(ResultsError, match=r"rope\.mutants:1: bad case id regex"):
        load_mutant_specs(tmp_path)


def test_mutants_file_regex_may_contain_bars(synth):
    spec = load_mutant_specs(synth["specs"])["mla_pad_heads"]
    assert spec.op == "mla_decode" and spec.expect == "mla_decode/h(4|8)-"


def test_synthetic_arches_differ_only_where_intended(tmp_path):
    a = {r["id"]: r["verdict"] for r in synthetic.mla_cases("gfx942")}
    b = {r["id"]: r["verdict"] for r in synthetic.mla_cases("gfx950")}
    assert a.keys() == b.keys()
    q8_h8_or_h16 = {k for k in a if "-q8-" in k and ("h8-" in k or "h16-" in k)}
    assert {k for k in a if a[k] != b[k]} == q8_h8_or_h16


def test_current_filter_applies_to_an_unfiltered_baseline(loaded):
    mla = [c for c in loaded["cases"] if c.op == "mla_decode"]
    reg = compare_to_baseline(mla, loaded["base"], id_filter="^mla_decode/")
    assert reg.filter_applied == "^mla_decode/"
    assert {ch.any.op for ch in reg.disappeared} == {"mla_decode"}  # not every other op
    assert len(reg.new_failures) == 3



def test_mutant_runs_over_the_same_cases_and_other_ops(tmp_path, synth, loaded):
    """ci/gpu-job runs every mutant over the whole quick tier: the mutant runs share case ids
    (they must load side by side), and a mutant kills through any op, not only its file's."""
    from attncheck_report.cli import main as report_main
    from attncheck_report.results import load_run
    records = synthetic.mla_cases("gfx942") + synthetic.other_cases("gfx942")
    for r in records:
        if r["op"] == "kv_gather" and r["verdict"] == "passed":
            synthetic.set_verdict(r, "failed", [synthetic.numeric_check("key", 50.0)])
    a = synthetic.write_results(tmp_path / "m" / "a", records, "gfx942",
                                kernels_library="x/libattncheck_kernels_mutant_kv_ignore_stride.so")
    b = synthetic.write_results(
        tmp_path / "m" / "b", synthetic.mla_cases("gfx942") + synthetic.other_cases("gfx942"),
        "gfx942", kernels_library="x/libattncheck_kernels_mutant_mla_pad_heads.so")
    mut = mutation_analysis([load_run(a), load_run(b)], loaded["cases"], loaded["specs"])
    outcome = {o.name: o for o in mut.outcomes}
    assert outcome["kv_ignore_stride"].killed and outcome["kv_ignore_stride"].expected_hit
    assert not outcome["mla_pad_heads"].killed
    # One --mutants list with both directories loads (no "overlapping shards" error).
    rc = report_main([str(p) for p in synth["current"]] +
                     ["--mutants", str(a), str(b), "--mutant-specs", str(synth["specs"]),
                      "--out", str(tmp_path / "r")])
    assert rc == 0 and (tmp_path / "r" / "report.html").exists()


def test_mutant_kills_follow_the_failing_field(tmp_path, loaded):
    """A kill is a case attncheck marks failing with the mutant (and not with the normal library),
    whatever its verdict is called; a failing 'error' (the harness could not run the case) and a
    known bug do not kill."""
    from attncheck_report.results import load_run
    records = [r for r in synthetic.other_cases("gfx942") if r["op"] == "page_indices"]
    killer, harness_error, known = records[:3]
    killer["failing"] = True  # a verdict today's rule does not fail: the field decides
    killer["verdict"] = "unexpected_pass"
    synthetic.set_verdict(harness_error, "error")
    synthetic.set_verdict(known, "known_bug")
    d = synthetic.write_results(tmp_path / "m", records, "gfx942",
                                kernels_library="x/libattncheck_kernels_mutant_mla_pad_heads.so")
    outcome, = mutation_analysis([load_run(d)], loaded["cases"], loaded["specs"]).outcomes
    assert outcome.killed and [c.id for c in outcome.killers] == [killer["id"]]


def test_a_mutant_killed_only_by_unexpected_cases_is_flagged(tmp_path, synth, loaded):
    """Killed, but not by the cases its spec expects (the regex in kernels_under_test/<op>.mutants):
    the analysis says so (expected_hit False) and report.html flags the regex "not among the
    killers"; a kill by an expected case, or no kill, is not flagged."""
    from attncheck_report.cli import main as report_main
    from attncheck_report.results import load_run
    normal = {c.id: c for c in loaded["cases"] if c.arch == "gfx942"}
    records = synthetic.mla_cases("gfx942")
    # mla_no_causal's spec expects the -q3-/-q8- cases; here only a q1 case fails with it.
    killer = next(r for r in records if "-q1-" in r["id"] and not normal[r["id"]].failing)
    synthetic.set_verdict(killer, "failed", [synthetic.numeric_check("out", 80.0)])
    assert not any(r["failing"] for r in records if r is not killer and not normal[r["id"]].failing)
    d = synthetic.write_results(tmp_path / "m", records, "gfx942",
                                kernels_library="x/libattncheck_kernels_mutant_mla_no_causal.so")
    outcome = mutation_analysis([load_run(d)], loaded["cases"], loaded["specs"]).outcomes[0]
    assert outcome.killed and [c.id for c in outcome.killers] == [killer["id"]]
    assert outcome.expected_hit is False

    def mutation_rows(*mutant_dirs):
        out = tmp_path / f"r{len(list(tmp_path.iterdir()))}"
        rc = report_main([str(p) for p in synth["current"]] +
                         ["--mutants", *map(str, mutant_dirs),
                          "--mutant-specs", str(synth["specs"]), "--out", str(out)])
        assert rc == 0
        html = (out / "report.html").read_text(encoding="utf-8")
        section = html[html.index('<section id="mutation">'):]
        section = section[:section.index("</section>")]
        return {row.split("</td>")[0].split(">")[-1]: row for row in section.split("<tr>")[2:]}

    flagged = mutation_rows(d, synth["mutants"][1])  # mla_no_causal off target, kv_stride survives
    assert "not among the killers" in flagged["mla_no_causal"]
    assert "not among the killers" not in flagged["kv_ignore_stride"]
    on_target = mutation_rows(*synth["mutants"])  # mla_no_causal killed by its -q3-/-q8- cases
    assert "killed" in on_target["mla_no_causal"]
    assert "not among the killers" not in on_target["mla_no_causal"]
