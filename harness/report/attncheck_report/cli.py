"""python3 -m attncheck_report RESULTS_DIR... [--baseline DIR...] [--mutants DIR...] [--out DIR]

Without --out the report goes next to its results (the first RESULTS_DIR), not into whatever
directory the command happened to run in."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from . import safe_write
from .analysis import compare_to_baseline, load_mutant_specs, mutation_analysis
from .coverage import load_coverage
from .results import ResultsError, all_cases, load_run, load_runs

REPO_ROOT = Path(__file__).resolve().parents[3]

EXIT_OK, EXIT_CASES_FAILED, EXIT_BAD_INPUT = 0, 1, 2


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python3 -m attncheck_report",
        description="Turn attncheck results directories (attncheck run --out DIR) into report.html"
        " (self-contained) and summary.md. Several directories (shards, arches) merge into one"
        " report; the same case may appear once per arch.",
    )
    p.add_argument("results", nargs="+", metavar="RESULTS_DIR",
                   help="attncheck run --out directory")
    p.add_argument("--baseline", action="append", default=[], metavar="DIR", nargs="+",
                   help="results of the reference run (e.g. the last main run); repeatable")
    p.add_argument("--mutants", action="append", default=[], metavar="DIR", nargs="+",
                   help="results of runs against mutant libraries (run.json kernels_library ="
                        " libattncheck_kernels[_hip]_mutant_<name>.so); repeatable")
    p.add_argument("--mutant-specs", default=str(REPO_ROOT / "kernels_under_test"), metavar="DIR",
                   help="directory of <op>.mutants files (default: %(default)s)")
    p.add_argument("--out", metavar="DIR",
                   help="where report.html and summary.md go (default: the first RESULTS_DIR)")
    p.add_argument("--title", default="attncheck accuracy report")
    p.add_argument("--top", type=int, default=10, help="worst cases in summary.md (default 10)")
    p.add_argument("--growth", type=float, default=2.0,
                   help="flag error/budget ratios grown more than this factor vs baseline")
    p.add_argument("--growth-floor", type=float, default=0.01,
                   help="ignore growth of ratios still below this (rounding noise)")
    p.add_argument("--heatmap-cache", metavar="DIR",
                   help="read each op's heatmap from DIR when drawn there before from the same"
                        " cases, and keep the ones drawn now there")
    p.add_argument("--heatmaps-only", action="store_true",
                   help="only draw the heatmaps into --heatmap-cache (ci/gpu-job: from the tier's"
                        " results while the mutants run) and exit")
    p.add_argument("--exit-code", action="store_true",
                   help="exit 1 when a case is failing (attncheck's 'failing' field), the results"
                        " are incomplete, no case compared an output, or a mutant survived (known"
                        " bugs, unexpected passes and reference-only runs do not fail)")
    return p.parse_args(argv)


def annotate(report, limit: int = 20) -> None:
    """GitHub workflow commands: failures as errors, unexpected passes as warnings."""

    def escape(text: str) -> str:
        return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")

    failing = [c for c in report.cases if c.failing]
    for c in failing[:limit]:
        print(f"::error title=attncheck {c.verdict}: {c.id} ({c.arch})::"
              + escape(f"{c.message[:300]} | repro: {c.repro}"))
    if len(failing) > limit:
        print(f"::error title=attncheck::{len(failing) - limit} more failing cases in report.html")
    for c in [c for c in report.cases if c.verdict == "unexpected_pass"][:limit]:
        print(f"::warning title=attncheck unexpected pass: {c.id} ({c.arch})::"
              + escape("passed although marked as a known bug: remove or narrow the mark"))


def flatten(groups):
    return [d for g in groups for d in g]


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from .render import Report, draw_heatmaps, write_html, write_markdown  # jinja2, matplotlib

    if args.heatmaps_only and not args.heatmap_cache:
        print("attncheck_report: error: --heatmaps-only needs --heatmap-cache DIR", file=sys.stderr)
        return EXIT_BAD_INPUT
    cache = Path(args.heatmap_cache) if args.heatmap_cache else None

    try:
        runs = load_runs(args.results)
        cases = all_cases(runs)
        regression = mutation = None
        if args.baseline:
            base = load_runs(flatten(args.baseline))
            filters = {r.meta.get("filter") or "" for r in runs}
            regression = compare_to_baseline(cases, base, args.growth, args.growth_floor,
                                             filters.pop() if len(filters) == 1 else "")
        if args.mutants:
            # Each mutant run covers the same cases as the others: no cross-run duplicate check.
            mutant_runs = [load_run(p) for p in flatten(args.mutants)]
            specs = load_mutant_specs(Path(args.mutant_specs))
            mutation = mutation_analysis(mutant_runs, cases, specs)
        coverage = load_coverage(args.results)
    except ResultsError as e:
        print(f"attncheck_report: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT

    out = Path(args.out if args.out is not None else args.results[0])
    report = Report(runs, cases, args.title, out, regression, mutation, worst_n=max(25, args.top))
    if args.heatmaps_only:
        try:
            drawn = draw_heatmaps(report, cache)
        except OSError as e:
            print(f"attncheck_report: error: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT
        print(f"attncheck_report: {drawn} heatmap(s) drawn into {cache}")
        return EXIT_OK
    report.coverage = coverage
    html, summary = out / "report.html", out / "summary.md"
    try:
        safe_write.make_directory(out, "--out")
        write_html(report, html, cache)
        write_markdown(report, summary, top=args.top)
    except OSError as e:  # UnsafeTarget (a link, FIFO or directory there), a full disk
        print(f"attncheck_report: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    failing = sum(c.failing for c in cases)
    print(f"attncheck_report: {report.status.headline}")
    print(f"report: {html.resolve()}")
    print(f"summary: {summary.resolve()}")
    for w in report.warnings:
        print(f"attncheck_report: warning: {w}", file=sys.stderr)
    if os.environ.get("GITHUB_ACTIONS") == "true":
        annotate(report)
    survived = [o.name for o in mutation.outcomes if not o.killed] if mutation else []
    if survived:
        print(f"attncheck_report: mutants survived: {', '.join(survived)}", file=sys.stderr)
    if args.exit_code and (failing or report.warnings or survived or
                           report.status.word == "NOT CHECKED"):
        return EXIT_CASES_FAILED
    return EXIT_OK
