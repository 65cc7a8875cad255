"""attncheck_report: turns attncheck results directories into an HTML report and a Markdown summary.

Loading, analysis and merging use the standard library only; rendering needs numpy, matplotlib and
jinja2 (Debian: python3-numpy, python3-matplotlib, python3-jinja2). `python3 -m attncheck_report`
re-runs itself under /usr/bin/python3 when the interpreter it was started with lacks them.
"""

__version__ = "1.0"

# Verdicts written by attncheck (harness/core/result.h), in the order reports list them. Which of
# them fail a job is attncheck's rule, not ours: every record carries it as "failing".
VERDICTS = (
    "passed",
    "failed",
    "refused_as_expected",
    "known_bug",
    "unexpected_pass",
    "unsupported",
    "skipped",
    "error",
)

VERDICT_LABELS = {
    "passed": "passed",
    "failed": "failed",
    "refused_as_expected": "refused as expected",
    "known_bug": "known bug",
    "unexpected_pass": "unexpected pass",
    "unsupported": "unsupported",
    "skipped": "skipped",
    "error": "error",
}

# What a record compared: a kernel's output, the CPU reference against a golden, or nothing.
MODES = ("kernel", "reference", "none")
