"""attncheck_report: turns attncheck results directories into an HTML report and a Markdown summary.

Loading, analysis and merging use the standard library only; rendering needs numpy, matplotlib and
jinja2 (Debian: python3-numpy, python3-matplotlib, python3-jinja2). `python3 -m attncheck_report`
re-runs itself under /usr/bin/python3 when the interpreter it was started with lacks them.
"""

__version__ = "1.0"

# Verdicts written by the runner (harness/run/runner.h), in the order reports list them.
VERDICTS = (
    "passed",
    "failed",
    "refused_as_expected",
    "known_bug",
    "unexpected_pass",
    "skipped",
    "error",
)
# Verdicts that fail a job. known_bug is an expected failure; unexpected_pass is reported loudly
# (the known-bug mark should go) but does not fail the job.
FAILING_VERDICTS = ("failed", "error")

VERDICT_LABELS = {
    "passed": "passed",
    "failed": "failed",
    "refused_as_expected": "refused as expected",
    "known_bug": "known bug",
    "unexpected_pass": "unexpected pass",
    "skipped": "skipped",
    "error": "error",
}
