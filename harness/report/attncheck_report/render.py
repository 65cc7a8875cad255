"""report.html (one self-contained file: inline CSS, PNGs as base64) and summary.md."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import hashlib
import json
import math
import os
from collections import defaultdict
from pathlib import Path

from . import VERDICT_LABELS, VERDICTS, __version__
from .analysis import (
    counts_by,
    describe_runs,
    runs_warnings,
    status_line,
    verdict_counts,
    worst_cases,
)
from . import safe_write
from .bundles import BundleReader
from .coverage import summary_line
from .heatmap import STATE_MARK, plan_heatmap, ratio_label, render_heatmap
from .results import fmt_num

TEMPLATE_DIR = Path(__file__).parent / "templates"
MAX_CASE_ROWS = 3000  # per op in the HTML case table
HEADER_KEYS = (
    ("git revision", "git_revision"),
    ("arch", "arch"),
    ("device", "device"),
    ("backend", "backend"),
    ("kernels", "kernels_library"),
    ("toolchain", "toolchain"),
    ("tier", "tier"),
    ("filter", "filter"),
    ("mode", "mode"),
    ("kernels not checked", "kernel_skipped_reason"),
    ("golden manifest sha256", "golden_manifest_sha256"),
    ("attncheck", "attncheck_version"),
)


def ratio_text(r) -> str:
    return "—" if r is None else ratio_label(r)


def one_line(text: str, limit: int = 220) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Report:
    """Everything both outputs show, computed once."""

    def __init__(self, runs, cases, title, out_dir, regression=None, mutation=None, worst_n=25):
        self.runs = runs
        self.cases = cases
        self.title = title
        self.out_dir = Path(out_dir)
        self.regression = regression
        self.mutation = mutation
        self.coverage = None  # the coverage audit's context (coverage.py), when the run has one
        self.warnings = runs_warnings(runs)
        self.counts = verdict_counts(cases)
        self.status = status_line(cases, self.warnings)
        # Verdict columns whose counts hold a failing case: attncheck marks those, not we.
        self.failing_verdicts = {c.verdict for c in cases if c.failing}
        self.by_arch = counts_by(cases, lambda c: c.arch)
        self.by_op = counts_by(cases, lambda c: (c.op, c.arch))
        self.worst = worst_cases(cases, worst_n)
        self.ops = sorted({c.op for c in cases})
        self.generated = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")

    def header(self) -> list:
        rows = [(label, describe_runs(self.runs, key)) for label, key in HEADER_KEYS]
        rows = [(k, v) for k, v in rows if not (k == "kernels not checked" and v == "—")]
        rows.insert(7, ("cases", str(len(self.cases))))
        started = sorted(r.get("started", "") for r in self.runs if r.get("started", ""))
        finished = sorted(r.get("finished", "") for r in self.runs if r.get("finished", ""))
        when = (started[0] if started else "?") + " → " + (finished[-1] if finished else "?")
        rows.append(("run", when))
        return rows

    def link(self, path: Path) -> str:
        return os.path.relpath(path, self.out_dir)


def _png_data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _case_row(report: Report, c) -> dict:
    w = c.worst_check
    return {
        "id": c.id,
        "arch": c.arch,
        "verdict": c.verdict,
        "ratio": ratio_text(c.ratio),
        "ratio_bad": c.ratio is not None and c.ratio > 1,
        "check": w.name if w else "",
        "measured": w.measured_text() if w else "",
        "budget": c.budget_text(),
        "worst": w.worst_text() if w else "",
        "why": (w.budget.get("why", "") if w else ""),
        "contract": c.contract,
        "message": one_line(c.message, 400),
        "full_message": c.message,
        "repro": c.repro,
        "bundle": report.link(c.bundle) if c.bundle else "",
        "bundle_name": c.bundle.name if c.bundle else "",
        "source": c.source,
        "kernel_ms": fmt_num(c.timings.get("kernel")) if c.timings.get("kernel") else "",
        "shrunk": _shrunk_row(c.shrunk) if c.shrunk else None,
    }


def _partial_context(report) -> list:
    """Cases judged under a declared partial contract (docs/verification.md "Partial
    contracts"): [{op, arch, contract (in words), cases, failing}], by op and contract."""
    groups: dict = {}
    for c in report.cases:
        if c.partial and c.mode == "kernel":
            g = groups.setdefault((c.op, c.arch, c.partial_text), {"cases": 0, "failing": 0})
            g["cases"] += 1
            g["failing"] += int(c.failing)
    return [{"op": op, "arch": arch, "contract": text, **g}
            for (op, arch, text), g in sorted(groups.items())]


def _not_provided_context(report) -> list:
    """Ops a Python adapter does not provide (not run, not failures): [{adapter, ops: [(op,
    cases)], cases}], once per adapter."""
    by_adapter: dict = {}
    for c in report.cases:
        if c.not_provided_by:
            ops = by_adapter.setdefault(c.not_provided_by, {})
            ops[c.op] = ops.get(c.op, 0) + 1
    return [{"adapter": a, "ops": sorted(ops.items()), "cases": sum(ops.values())}
            for a, ops in sorted(by_adapter.items())]


def _invariance_context(report) -> dict:
    """The relations the cases ran (docs/verification.md "Invariance"): how many, bitwise or within
    budget, and each violation with its case."""
    ran = [(c, o) for c in report.cases for o in c.invariance]
    return {
        "cases": len({c.key for c, _ in ran}),
        "relations": len(ran),
        "bitwise": sum(o["mode"] == "bitwise" for _, o in ran),
        "budget": sum(o["mode"] == "budget" for _, o in ran),
        "violated": [{"id": c.id, "arch": c.arch, "relation": o["relation"], "mode": o["mode"],
                      "message": one_line(str(o.get("message", "")), 300)}
                     for c, o in ran if not o["passed"]],
    }


def _shrunk_row(s: dict) -> dict:
    """The minimal failing case of `run --shrink`, shown beside its original."""
    return {"id": s["id"], "check": s["check"], "entry": s["case_file_entry"],
            "repro": s["repro"], "same": s["id"] == s.get("original_id"),
            "search": f"{s.get('evaluations', '?')} evaluations; {s.get('stopped', '')}"}


def _bundle_contents(reader: BundleReader, path: Path) -> str:
    """Dataset names and shapes of a repro bundle, read in a child process (bundles.py): a damaged
    bundle is shown as unreadable, it never ends or hangs the report."""
    got = reader.describe(path)
    if "unreadable" in got:
        return f"(unreadable bundle: {got['unreadable']})"
    return got.get("contents", "")


def heatmap_key(plan, cases) -> str:
    """What an op's heatmap shows, as a digest: its plan and, per case, what render_heatmap reads
    (the axes in params, the arch, the worst ratio) and the verdict. Equal keys, equal PNGs."""
    shown = [(c.id, c.arch, c.params, c.verdict, c.ratio) for c in cases]
    blob = json.dumps([dataclasses.asdict(plan), shown], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _render_all(jobs: list) -> list:
    """render_heatmap over (plan, cases) pairs, in processes of their own when there are several
    and cores to run them: matplotlib draws one figure at a time per process, and the heatmaps
    were most of the report's time (19 of them: 4 s of a 5 s report on the GPU host's cores)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    if len(jobs) < 2 or cores < 2:
        return [render_heatmap(plan, cases) for plan, cases in jobs]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    try:
        context = multiprocessing.get_context("fork")
    except ValueError:  # no fork on this platform
        return [render_heatmap(plan, cases) for plan, cases in jobs]
    with ProcessPoolExecutor(max_workers=min(cores, len(jobs)), mp_context=context) as pool:
        return list(pool.map(render_heatmap, *zip(*jobs)))


def _render_heatmaps(jobs: list, cache: Path | None = None) -> list:
    """The PNG of each (plan, cases) pair. With a cache directory (--heatmap-cache), a heatmap
    whose key (heatmap_key) is there is read, not drawn, and each one drawn is kept there:
    ci/gpu-job draws them from the tier's results while the mutants run."""
    pngs: list = [None] * len(jobs)
    keys = [heatmap_key(plan, cases) for plan, cases in jobs] if cache else []
    if cache:
        for i, key in enumerate(keys):
            try:
                pngs[i] = safe_write.read_regular(cache / f"{key}.png")
            except OSError:  # not drawn yet, or not a plain file: drawn again
                pass
    todo = [i for i, png in enumerate(pngs) if png is None]
    for i, png in zip(todo, _render_all([jobs[i] for i in todo])):
        pngs[i] = png
        if cache:
            try:  # a cache that cannot be written costs the next report a redraw, nothing else
                cache.mkdir(parents=True, exist_ok=True)
                safe_write.write_bytes(cache / f"{keys[i]}.png", png)
            except OSError:
                pass
    return pngs


def heatmap_jobs(report: Report) -> list:
    """(plan, cases) of each op's heatmap, in report.ops order."""
    jobs = []
    for op in report.ops:
        op_cases = [c for c in report.cases if c.op == op]
        jobs.append((plan_heatmap(op, op_cases), op_cases))
    return jobs


def draw_heatmaps(report: Report, cache: Path) -> int:
    """Every heatmap of the report drawn into `cache` (python3 -m attncheck_report
    --heatmaps-only); how many were drawn, not found there."""
    jobs = heatmap_jobs(report)
    missing = [j for j in jobs if not (cache / f"{heatmap_key(*j)}.png").is_file()]
    _render_heatmaps(missing, cache)
    return len(missing)


def html_context(report: Report, heatmap_cache: Path | None = None) -> dict:
    ops = []
    jobs = heatmap_jobs(report)
    pngs = _render_heatmaps(jobs, heatmap_cache)
    for op, (plan, op_cases), png in zip(report.ops, jobs, pngs):
        shown = " × ".join(a for a in (plan.rows, plan.cols) if a and a != "op")
        rows = sorted(op_cases, key=lambda c: (not c.failing, c.verdict != "known_bug",
                                              -(c.ratio if c.ratio is not None else -1), c.id))
        timing = defaultdict(float)
        for c in op_cases:
            for k, v in c.timings.items():
                if not math.isnan(v):
                    timing[k] += v
        ops.append({
            "name": op,
            "counts": verdict_counts(op_cases),
            "total": len(op_cases),
            "image": _png_data_uri(png),
            "axes": shown,
            "panels": plan.panels,
            "arches": plan.arches,
            "folded": plan.folded,
            "generic": plan.generic,
            "rows": [_case_row(report, c) for c in rows[:MAX_CASE_ROWS]],
            "rows_cut": max(0, len(rows) - MAX_CASE_ROWS),
            "timing": {k: fmt_num(v / 1000.0) for k, v in sorted(timing.items())},
        })
    failures = [c for c in report.cases if c.failing]
    failures.sort(key=lambda c: (c.op, c.arch, c.id))
    failure_rows = []
    with BundleReader() as reader:
        for i, c in enumerate(failures):
            row = _case_row(report, c)
            row["bundle_contents"] = _bundle_contents(reader, c.bundle) if c.bundle and i < 50 else ""
            failure_rows.append(row)
    return {
        "report": report,
        "title": report.title,
        "version": __version__,
        "header": report.header(),
        "verdicts": VERDICTS,
        "labels": VERDICT_LABELS,
        "marks": STATE_MARK,
        "alarm": report.failing_verdicts | {"unexpected_pass"},
        "ops": ops,
        "worst": [_case_row(report, c) for c in report.worst],
        "failures": failure_rows[:1000],
        "failures_cut": max(0, len(failure_rows) - 1000),
        "failures_shrunk": any(r["shrunk"] for r in failure_rows),
        "known_bugs": [_case_row(report, c) for c in report.cases if c.verdict == "known_bug"],
        "contracted": [_case_row(report, c) for c in report.cases if c.under_declared_contract],
        "partial": _partial_context(report),
        "not_provided": _not_provided_context(report),
        "invariance": _invariance_context(report),
        "unexpected": [_case_row(report, c) for c in report.cases
                       if c.verdict == "unexpected_pass"],
        "regression": _regression_context(report),
        "mutation": _mutation_context(report),
        "coverage": report.coverage,
        "multi_run": len(report.runs) > 1,
        "fmt": fmt_num,
    }


def _change_row(report: Report, ch) -> dict:
    c, b = ch.case, ch.base
    any_case = ch.any
    return {
        "id": any_case.id,
        "arch": any_case.arch,
        "was": b.verdict if b else "—",
        "now": c.verdict if c else "—",
        "ratio_was": ratio_text(b.ratio) if b else "—",
        "ratio_now": ratio_text(c.ratio) if c else "—",
        "ratio_bad": bool(c and c.ratio is not None and c.ratio > 1),
        "growth": ("∞" if math.isinf(ch.growth) else f"{ch.growth:.1f}x")
        if not math.isnan(ch.growth) else "",
        "message": one_line(c.message if c else "", 300),
        "repro": c.repro if c else "",
    }


def _regression_context(report: Report):
    reg = report.regression
    if reg is None:
        return None

    def group_counts(changes):
        counts = defaultdict(int)
        for ch in changes:
            counts[(ch.any.arch, ch.any.op)] += 1
        return [{"arch": a, "op": o, "n": n} for (a, o), n in sorted(counts.items())]

    return {
        "base": {label: describe_runs(reg.baseline_runs, key) for label, key in HEADER_KEYS[:7]},
        "base_dirs": [str(r.path) for r in reg.baseline_runs],
        "new_failures": [_change_row(report, ch) for ch in reg.new_failures],
        "fixed": [_change_row(report, ch) for ch in reg.fixed],
        "grown": [_change_row(report, ch) for ch in reg.grown[:200]],
        "grown_total": len(reg.grown),
        "other": [_change_row(report, ch) for ch in reg.other_changes[:200]],
        "other_total": len(reg.other_changes),
        "appeared": group_counts(reg.appeared),
        "appeared_ids": [ch.any.id + " (" + ch.any.arch + ", " + ch.any.verdict + ")"
                         for ch in reg.appeared[:60]],
        "appeared_total": len(reg.appeared),
        "disappeared": group_counts(reg.disappeared),
        "disappeared_ids": [ch.any.id + " (" + ch.any.arch + ")" for ch in reg.disappeared[:60]],
        "disappeared_total": len(reg.disappeared),
        "unmatched_arches": reg.unmatched_arches,
        "filter_applied": reg.filter_applied,
        "factor": reg.growth_factor,
        "floor": reg.growth_floor,
    }


def _mutation_context(report: Report):
    mut = report.mutation
    if mut is None:
        return None
    killed, total = mut.score
    rows = []
    for o in mut.outcomes:
        rows.append({
            "name": o.name,
            "op": o.spec.op if o.spec else "?",
            "bug": o.spec.bug if o.spec else "(not listed in any kernels_under_test/*.mutants)",
            "expect": o.spec.expect if o.spec else "",
            "killed": o.killed,
            "considered": o.considered,
            "killers": [c.id + ("" if len({r.arch for r in o.runs}) < 2 else f" ({c.arch})")
                        for c in o.killers],
            "excused": [c.id for c in o.excused],
            "expected_hit": o.expected_hit,
            "cross_checked": o.cross_checked,
            "tiers": ", ".join(sorted({r.get("tier") for r in o.runs})),
            "arches": ", ".join(sorted({r.arch for r in o.runs})),
        })
    return {
        "killed": killed,
        "total": total,
        "percent": (100.0 * killed / total) if total else 0.0,
        "rows": rows,
        "not_run": [{"name": s.name, "op": s.op, "bug": s.bug} for s in mut.not_run],
    }


def write_html(report: Report, path: Path, heatmap_cache: Path | None = None) -> None:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    html = env.get_template("report.html.j2").render(**html_context(report, heatmap_cache))
    safe_write.write_text(path, html)


# --- Markdown -----------------------------------------------------------------------------------


def md_cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def md_table(head, rows) -> list:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(md_cell(x) for x in r) + " |" for r in rows]
    return lines


def write_markdown(report: Report, path: Path, top: int = 10) -> None:
    icons = {"PASSED": "✅", "FAILED": "❌", "INCOMPLETE": "⚠️", "NOT CHECKED": "⚠️",
             "REFERENCE ONLY": "⚠️"}
    st = report.status
    r0 = report.runs
    lines = [
        f"## {report.title}",
        "",
        f"{icons[st.word]} **{st.badge}**" + (f" ({st.scope})" if st.scope else "")
        + f": {st.text} · tier {describe_runs(r0, 'tier')}"
        f" · {describe_runs(r0, 'arch')} · {describe_runs(r0, 'backend')}"
        f" · rev `{describe_runs(r0, 'git_revision')}` · mode {describe_runs(r0, 'mode')}",
        "",
    ]
    for w in report.warnings:
        lines.append(f"> ⚠️ {w}")
    if report.warnings:
        lines.append("")
    head = ["arch", "cases"] + [VERDICT_LABELS[v] for v in VERDICTS]
    rows = [[arch, sum(c.values())] + [c[v] for v in VERDICTS]
            for arch, c in report.by_arch.items()]
    if len(rows) > 1:
        rows.append(["**all**", sum(report.counts.values())] + [report.counts[v] for v in VERDICTS])
    lines += md_table(head, rows) + [""]

    reg = report.regression
    if reg is not None:
        lines.append(
            f"**vs baseline** (rev `{describe_runs(reg.baseline_runs, 'git_revision')}`):"
            f" {len(reg.new_failures)} new failures, {len(reg.fixed)} fixed,"
            f" {len(reg.grown)} error/budget ratios grown > {reg.growth_factor:g}x,"
            f" {len(reg.appeared)} cases appeared, {len(reg.disappeared)} disappeared"
            + (f"; no baseline for {', '.join(reg.unmatched_arches)}"
               if reg.unmatched_arches else "")
        )
        lines.append("")
        changes = [("new failure", ch) for ch in reg.new_failures] + [
            ("ratio grown", ch) for ch in reg.grown] + [("fixed", ch) for ch in reg.fixed]
        if changes:
            rows = []
            for what, ch in changes[:top]:
                row = _change_row(report, ch)
                rows.append([what, f"`{row['id']}`", row["arch"], f"{row['was']} → {row['now']}",
                             f"{row['ratio_was']} → {row['ratio_now']}"])
            lines += md_table(["change", "case", "arch", "verdict", "error/budget"], rows)
            if len(changes) > top:
                lines.append(f"\n… {len(changes) - top} more in report.html")
            lines.append("")

    contracted = [c for c in report.cases if c.under_declared_contract]
    if contracted:
        lines.append(f"**{len(contracted)} passed only under the kernel's declared arithmetic"
                     " contract** (the default budgets fail): "
                     + ", ".join(f"`{c.id}` ({c.contract})" for c in contracted[:top])
                     + (" …" if len(contracted) > top else ""))
        lines.append("")

    for g in _partial_context(report):
        lines.append(f"**Partial contract** `{g['op']}` ({g['arch']}): {g['cases']} case(s) judged"
                     f" with {g['contract']}, {g['failing']} failing")
    for g in _not_provided_context(report):
        lines.append(f"**Not provided by {g['adapter']}**: {len(g['ops'])} op(s), {g['cases']}"
                     " case(s), not run: " + ", ".join(f"{op} {n}" for op, n in g["ops"]))
    if _partial_context(report) or _not_provided_context(report):
        lines.append("")

    inv = _invariance_context(report)
    if inv["relations"]:
        lines.append(f"**Invariance**: {inv['relations']} relations on {inv['cases']} cases"
                     f" ({inv['bitwise']} bitwise, {inv['budget']} within budget),"
                     f" {len(inv['violated'])} violated"
                     + (": " + "; ".join(f"`{v['id']}` {v['relation']} ({v['mode']})"
                                         for v in inv["violated"][:top]) if inv["violated"] else "")
                     + (" …" if len(inv["violated"]) > top else ""))
        lines.append("")

    unexpected = [c for c in report.cases if c.verdict == "unexpected_pass"]
    if unexpected:
        lines.append(f"**{len(unexpected)} unexpected passes** (known-bug marks to remove): "
                     + ", ".join(f"`{c.id}` ({c.arch})" for c in unexpected[:top])
                     + (" …" if len(unexpected) > top else ""))
        lines.append("")

    worst = [c for c in report.worst if c.failing or c.verdict == "known_bug"
             or (c.ratio is not None and c.ratio > 0)][:top]
    if worst:
        lines.append("**Worst cases** (error / budget; > 1 fails)")
        lines.append("")
        rows = []
        for c in worst:
            w = c.worst_check
            metric = f"{w.name}: {w.measured_text()}" if w else one_line(c.message, 80)
            rows.append([f"`{c.id}`", c.arch, VERDICT_LABELS[c.verdict], one_line(metric, 90),
                         c.budget_text(), ratio_text(c.ratio),
                         f"`{c.repro}`" if c.repro else ""])
        lines += md_table(["case", "arch", "verdict", "metric", "budget", "ratio", "repro"], rows)
        lines.append("")

    shrunk = [c for c in report.cases if c.failing and c.shrunk]
    if shrunk:
        lines.append("**Shrunk failures** (the simplest case that fails the same check)")
        lines.append("")
        rows = [[f"`{c.id}`", c.arch, c.shrunk["check"], f"`{c.shrunk['id']}`",
                 f"`{c.shrunk['case_file_entry']}`", f"`{c.shrunk['repro']}`"]
                for c in sorted(shrunk, key=lambda c: (c.op, c.arch, c.id))[:top]]
        lines += md_table(["case", "arch", "check", "minimal case", "case-file entry", "repro"],
                          rows)
        lines.append("")

    mut = report.mutation
    if mut is not None:
        killed, total = mut.score
        survivors = [o.name for o in mut.outcomes if not o.killed]
        lines.append(f"**Mutation score** {killed}/{total}"
                     + (f"; survived: {', '.join(survivors)}" if survivors else "")
                     + (f"; not run: {', '.join(s.name for s in mut.not_run)}"
                        if mut.not_run else ""))
        lines.append("")
    if report.coverage is not None:
        lines += [summary_line(report.coverage), ""]
    lines.append(f"<sub>attncheck_report {__version__} · {report.generated} · full report:"
                 " report.html (artifact)</sub>")
    safe_write.write_text(path, "\n".join(lines) + "\n")
