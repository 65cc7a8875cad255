"""The pytest entry point (bridge/python/attncheck_pytest.py) end to end: attncheck cases collected as
tests, run through the NumPy adapters, verdicts as outcomes. Needs the attncheck binary
($ATTNCHECK_BIN, set by ctest)."""

import os

import pytest

pytest_plugins = ["pytester"]

BIN = os.environ.get("ATTNCHECK_BIN", "")
PLUGIN_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python")
pytestmark = pytest.mark.skipif(not os.access(BIN, os.X_OK),
                                reason="ATTNCHECK_BIN (the built attncheck) not set")


def run(pytester, monkeypatch, *args, broken=""):
    monkeypatch.setenv("ATTNCHECK_BIN", BIN)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [PLUGIN_DIR] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    if broken:
        monkeypatch.setenv("ATTNCHECK_BROKEN", broken)
    return pytester.runpytest_subprocess("-p", "attncheck_pytest", "-p", "no:cacheprovider",
                                         "--attncheck-tier", "smoke", "--attncheck-op",
                                         "page_indices", *args)


def test_each_case_is_a_test_and_passes_with_a_correct_kernel(pytester, monkeypatch):
    result = run(pytester, monkeypatch, "--attncheck-kernels", "py:numpy_reference", "-v")
    result.assert_outcomes(passed=15)
    result.stdout.fnmatch_lines(["*::attncheck::page_indices/bs16-b1-ctx64-contiguous-s0 PASSED*"])


def test_a_broken_kernel_fails_with_the_repro_line(pytester, monkeypatch):
    result = run(pytester, monkeypatch, "--attncheck-kernels", "py:numpy_broken",
                 broken="page_indices=wrong_element")
    result.assert_outcomes(failed=15)
    result.stdout.fnmatch_lines([
        "*failed: page_indices: 1 of * elements differ bitwise*",
        "repro: attncheck repro 'page_indices/*' --kernels py:numpy_broken",
    ])


def test_keyword_selection_runs_only_the_selected_cases(pytester, monkeypatch):
    result = run(pytester, monkeypatch, "--attncheck-kernels", "py:numpy_broken", "-k", "bs64",
                 broken="page_indices=wrong_element")
    outcomes = result.parseoutcomes()
    assert outcomes["failed"] == 5 and outcomes["deselected"] == 10, outcomes


def test_unsupported_cases_skip(pytester, monkeypatch):
    result = run(pytester, monkeypatch, "--attncheck-kernels", "py:numpy_broken", "-rs",
                 broken="page_indices=unsupported")
    result.assert_outcomes(skipped=15)
    result.stdout.fnmatch_lines(["*unsupported: unsupported by numpy_broken*"])


def test_kernels_are_required(pytester, monkeypatch):
    result = run(pytester, monkeypatch)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--attncheck-tier needs --attncheck-kernels*"])
