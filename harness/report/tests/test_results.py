"""Reading results directories: what is accepted, what is refused and how the refusal reads."""

import json
import math

import pytest

import synthetic
from attncheck_report.results import ResultsError, check_ratio, load_run, load_runs, mutant_name


def write(tmp_path, records, **meta):
    return synthetic.write_results(tmp_path / "r", records, **meta)


def good_record(**over):
    r = synthetic.record("page_indices", "bs16-b4-ctx300-contiguous-s0",
                         {"block_size": 16, "batch": 4}, "passed",
                         [synthetic.exact_check("page_indices", 0)])
    r.update(over)
    return r


def test_loads_cases_with_their_arch_and_source(tmp_path):
    d = write(tmp_path, [good_record(), good_record(id="page_indices/x", arch="")], arch="gfx950")
    run = load_run(d)
    assert [c.id for c in run.cases] == ["page_indices/bs16-b4-ctx300-contiguous-s0",
                                         "page_indices/x"]
    assert run.cases[1].arch == "gfx950"  # empty arch in the record: the run's
    assert run.cases[0].source == f"{d / 'results.jsonl'}:1"
    assert run.warnings == []


def test_non_finite_strings_become_floats(tmp_path):
    rec = good_record(checks=[synthetic.numeric_check("out", math.inf, nan=3)], verdict="failed",
                      failing=True)
    case = load_run(write(tmp_path, [rec])).cases[0]
    assert math.isinf(case.ratio)
    assert case.checks[0].metrics["worst"]["actual"] == "nan"


def test_bad_json_line_names_file_and_line(tmp_path):
    d = write(tmp_path, [good_record()])
    with (d / "results.jsonl").open("a") as fh:
        fh.write('{"id": "page_indices/y", "op": \n')
    with pytest.raises(ResultsError, match=r"results\.jsonl:2: not valid JSON"):
        load_run(d)


def test_unknown_verdict_is_refused_with_the_known_ones(tmp_path):
    d = write(tmp_path, [good_record(verdict="flaky")])
    with pytest.raises(ResultsError,
                       match=r"results\.jsonl:1: unknown verdict 'flaky' \(known: passed,"):
        load_run(d)


def test_record_without_failing_is_refused_with_file_and_line(tmp_path):
    old = good_record(id="page_indices/old")
    del old["failing"]
    d = write(tmp_path, [good_record(), old])
    with pytest.raises(ResultsError, match=r"results\.jsonl:2: no 'failing' field: written by an"
                                           r" older attncheck; rerun it"):
        load_run(d)


def test_failing_must_be_true_or_false(tmp_path):
    with pytest.raises(ResultsError, match=r":1: 'failing' must be true or false, got 'yes'"):
        load_run(write(tmp_path, [good_record(failing="yes")]))


def test_failing_is_read_from_the_record_not_the_verdict(tmp_path):
    # attncheck owns the rule; the report takes its word even where today's rule would differ.
    records = [good_record(id="page_indices/a", verdict="unexpected_pass", failing=True),
               good_record(id="page_indices/b", verdict="failed", failing=False)]
    assert [c.failing for c in load_run(write(tmp_path, records)).cases] == [True, False]


def test_unsupported_is_a_verdict_and_not_failing(tmp_path):
    rec = good_record(verdict="unsupported", checks=[],
                      message="unsupported by aiter: block_size 1")
    case = load_run(write(tmp_path, [rec])).cases[0]
    assert case.verdict == "unsupported" and not case.failing and case.ratio is None


def test_unknown_or_missing_mode_is_refused(tmp_path):
    with pytest.raises(ResultsError, match=r":1: missing or unknown mode 'gpu' \(known: kernel,"
                                           r" reference, none\)"):
        load_run(write(tmp_path, [good_record(mode="gpu")]))
    rec = good_record()
    del rec["mode"]
    with pytest.raises(ResultsError, match=r":1: missing or unknown mode None"):
        load_run(write(tmp_path, [rec]))


def test_missing_run_json(tmp_path):
    d = write(tmp_path, [good_record()])
    (d / "run.json").unlink()
    with pytest.raises(ResultsError, match=r"run\.json: missing"):
        load_run(d)


def test_missing_results_jsonl(tmp_path):
    d = write(tmp_path, [good_record()])
    (d / "results.jsonl").unlink()
    with pytest.raises(ResultsError, match=r"results\.jsonl: missing"):
        load_run(d)


def test_run_json_must_be_an_object(tmp_path):
    d = write(tmp_path, [good_record()])
    (d / "run.json").write_text("[1, 2]")
    with pytest.raises(ResultsError, match=r"run\.json: expected a JSON object, got list"):
        load_run(d)


def test_not_a_directory(tmp_path):
    with pytest.raises(ResultsError, match="not a directory"):
        load_run(tmp_path / "nope")


def test_empty_results_are_an_error(tmp_path):
    d = write(tmp_path, [], case_count=0)
    with pytest.raises(ResultsError, match="no case results in .*results.jsonl"):
        load_runs([d])


def test_required_fields(tmp_path):
    rec = good_record()
    del rec["op"]
    with pytest.raises(ResultsError, match=r":1: missing or empty string field 'op'"):
        load_run(write(tmp_path, [rec]))


def test_id_must_start_with_op(tmp_path):
    with pytest.raises(ResultsError,
                       match=r"case id 'rope/x' does not start with its op 'page_indices/'"):
        load_run(write(tmp_path, [good_record(id="rope/x")]))


def test_bad_metric_value_names_the_field(tmp_path):
    rec = good_record(checks=[synthetic.numeric_check("out", 0.5)])
    rec["checks"][0]["metrics"]["mismatch_frac"] = "lots"
    rec["checks"][0]["budget"]["max_mismatch_frac"] = 0.01
    with pytest.raises(ResultsError, match=r":1: checks\[0\]: check 'out': mismatch_frac: "
                                           r"expected a number, got 'lots'"):
        load_run(write(tmp_path, [rec]))


def test_duplicate_case_in_one_file(tmp_path):
    with pytest.raises(ResultsError, match=r":2: case .* already at .*results\.jsonl:1"):
        load_run(write(tmp_path, [good_record(), good_record()]))


def test_same_directory_twice_is_refused(tmp_path):
    d = write(tmp_path, [good_record()])
    with pytest.raises(ResultsError, match="also in .*given twice"):
        load_runs([d, d])


def test_same_case_on_two_arches_is_fine(tmp_path):
    a = synthetic.write_results(tmp_path / "a", [good_record(arch="gfx942")], "gfx942")
    b = synthetic.write_results(tmp_path / "b", [good_record(arch="gfx950")], "gfx950")
    assert sum(len(r.cases) for r in load_runs([a, b])) == 2


def test_truncated_run_warns(tmp_path):
    run = load_run(write(tmp_path, [good_record()], case_count=40))
    assert "run.json says 40 cases but results.jsonl holds 1" in run.warnings[0]


def test_unfinished_run_warns(tmp_path):
    run = load_run(write(tmp_path, [good_record()], finished=""))
    assert "did not complete" in run.warnings[0]


def test_bundle_is_found_by_id(tmp_path):
    d = write(tmp_path, [good_record()])
    (d / "repro").mkdir()
    (d / "repro" / "page_indices__bs16-b4-ctx300-contiguous-s0.h5").write_bytes(b"x")
    assert load_run(d).cases[0].bundle.name == "page_indices__bs16-b4-ctx300-contiguous-s0.h5"


# --- ratio rules --------------------------------------------------------------------------------

NUMERIC = {"kind": "numeric", "atol": 1e-2, "rtol": 1e-2, "max_mismatch_frac": 0,
           "max_calc_diff": -1}


def test_numeric_ratio_is_the_worst_element():
    m = {"mismatches": 0, "worst": {"ratio": 0.25}}
    assert check_ratio("numeric", NUMERIC, m, True, "w") == 0.25


def test_numeric_ratio_with_a_mismatch_allowance_is_the_used_fraction():
    b = dict(NUMERIC, max_mismatch_frac=0.01)
    m = {"mismatches": 5, "mismatch_frac": 0.005, "worst": {"ratio": 40}}
    assert check_ratio("numeric", b, m, True, "w") == pytest.approx(0.5)


def test_calc_diff_budget_counts():
    b = dict(NUMERIC, max_calc_diff=1e-4)
    m = {"worst": {"ratio": 0.1}, "calc_diff": 3e-4}
    assert check_ratio("numeric", b, m, False, "w") == pytest.approx(3.0)


def test_nan_is_infinite_even_if_the_worst_ratio_looks_fine():
    m = {"nan_actual": 1, "worst": {"ratio": 0.0}}
    assert math.isinf(check_ratio("numeric", NUMERIC, m, False, "w"))


def test_exact_is_zero_or_infinite():
    assert check_ratio("exact", {}, {"bit_mismatches": 0}, True, "w") == 0
    assert math.isinf(check_ratio("exact", {}, {"bit_mismatches": 1}, False, "w"))


def test_topk_against_its_allowance():
    assert math.isinf(check_ratio("topk_set", {}, {"topk_missing": 1, "count": 10}, False, "w"))
    b = {"max_mismatch_frac": 0.1}
    assert check_ratio("topk_set", b, {"topk_missing": 1, "count": 20}, True, "w") == 0.5


def test_a_failed_check_never_reads_as_within_budget():
    # e.g. an output missing from the kernel's results: metrics all zero, check failed
    assert math.isinf(check_ratio("numeric", NUMERIC, {}, False, "w"))


def test_mutant_name():
    assert mutant_name("/b/libattncheck_kernels_mutant_mla_pad.so") == "mla_pad"
    assert mutant_name("/b/libattncheck_kernels_hip_mutant_kv_gather_contiguous_strides.so") == \
        "kv_gather_contiguous_strides"
    assert mutant_name("/b/libattncheck_kernels_hip.so") is None
    # as the runner writes it: path, then the library's own name
    assert mutant_name("/b/k/libattncheck_kernels_mutant_rope_x.so (attncheck kernels, cuda)") == \
        "rope_x"
    assert mutant_name("/b/libattncheck_kernels_mutant_.so") is None
    assert mutant_name("") is None


def test_synthetic_records_round_trip_as_json():
    # The fixture generator itself must write what the runner writes: strict JSON per line.
    for r in synthetic.mla_cases("gfx942") + synthetic.other_cases("gfx950"):
        json.loads(json.dumps(r, allow_nan=False))


def test_contract_is_read_and_must_be_a_string(tmp_path):
    rec = good_record(contract="qk-products-in-input-type")
    run = load_run(synthetic.write_results(tmp_path / "ok", [rec]))
    case = run.cases[0]
    assert case.contract == "qk-products-in-input-type" and case.under_declared_contract
    rec["contract"] = 3
    with pytest.raises(ResultsError, match=r"results.jsonl:1: 'contract' must be a string"):
        load_run(synthetic.write_results(tmp_path / "bad", [rec]))
    del rec["contract"]
    plain = load_run(synthetic.write_results(tmp_path / "plain", [rec])).cases[0]
    assert plain.contract == "" and not plain.under_declared_contract


def test_margin_and_bundle_are_read_from_the_record(tmp_path):
    # The runner writes each check's margin and the bundle's path: the report takes them as
    # written (a metrics-derived margin of 0.5 would say otherwise).
    check = dict(synthetic.numeric_check("out", 0.5), margin=0.75)
    rec = good_record(checks=[check], bundle="/elsewhere/repro/named.h5")
    d = write(tmp_path, [rec])
    (d / "repro").mkdir()
    (d / "repro" / "named.h5").write_bytes(b"x")
    case = load_run(d).cases[0]
    assert case.checks[0].ratio == 0.75
    assert case.bundle == d / "repro" / "named.h5"  # the run moved: the same name in its repro/


def test_records_without_margin_or_bundle_are_measured_and_named_as_before(tmp_path):
    rec = good_record(checks=[synthetic.numeric_check("out", 0.5)])
    d = write(tmp_path, [rec])
    (d / "repro").mkdir()
    (d / "repro" / "page_indices__bs16-b4-ctx300-contiguous-s0.h5").write_bytes(b"x")
    case = load_run(d).cases[0]
    assert case.checks[0].ratio == pytest.approx(0.5)
    assert case.bundle.name == "page_indices__bs16-b4-ctx300-contiguous-s0.h5"
