"""What a report says about a set of results: verdict counts, worst cases, regressions against a
baseline, and the mutation score. Standard library only."""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from . import VERDICT_LABELS, VERDICTS
from .results import CaseResult, ResultsError


def verdict_counts(cases) -> Counter:
    counts = Counter({v: 0 for v in VERDICTS})
    counts.update(c.verdict for c in cases)
    return counts


def counts_by(cases, key) -> dict:
    """{key(case): Counter of verdicts}, keys sorted."""
    groups = defaultdict(list)
    for c in cases:
        groups[key(c)].append(c)
    return {k: verdict_counts(groups[k]) for k in sorted(groups)}


REFERENCE_ONLY = "REFERENCE ONLY: kernels not checked"
NOT_COMPARED = "not compared"  # headline label of a pass that compared nothing (mode none)


@dataclass
class Status:
    """The report's verdict on a set of results. word: FAILED, INCOMPLETE, NOT CHECKED,
    REFERENCE ONLY or PASSED; text: the counts behind it; scope: how many cases ran their kernel,
    when not all did ('' when all did)."""

    word: str
    text: str
    scope: str = ""

    @property
    def badge(self) -> str:
        # A reference-only run says what it did not check in the badge itself.
        return REFERENCE_ONLY if self.word == "REFERENCE ONLY" else self.word

    @property
    def headline(self) -> str:
        scope = f" ({self.scope})" if self.scope else ""
        return f"{self.badge}{scope}: {self.text}"


def headline_counts(cases) -> Counter:
    """Verdict counts for the headline. A pass that compared nothing (mode none) is counted as
    'not compared': only a comparison can pass."""
    counts = Counter()
    for c in cases:
        passed = c.verdict in ("passed", "unexpected_pass")
        counts[NOT_COMPARED if passed and c.mode == "none" else c.verdict] += 1
    return counts


def kernel_scope(cases) -> str:
    """'' when every case ran its kernel, REFERENCE_ONLY when none did, else how many did."""
    modes = Counter(c.mode for c in cases)
    if modes["kernel"] == len(cases):
        return ""
    if not modes["kernel"]:
        return REFERENCE_ONLY
    rest = [f"{modes['reference']} reference only"] if modes["reference"] else []
    rest += [f"{modes['none']} compared nothing"] if modes["none"] else []
    return f"kernel: {modes['kernel']} of {len(cases)} cases; {', '.join(rest)}"


def status_line(cases, warnings: list) -> Status:
    """FAILED: a case attncheck marked failing. INCOMPLETE: results cut short. NOT CHECKED: no case
    compared an output (e.g. no kernel library and no goldens). REFERENCE ONLY: nothing failed, but
    no case ran its kernel. None of these may read as a pass."""
    cases = list(cases)
    total = len(cases)
    scope = kernel_scope(cases)
    failing = Counter(c.verdict for c in cases if c.failing)
    if failing:
        parts = [f"{failing[v]} {VERDICT_LABELS[v]}" for v in VERDICTS if failing[v]]
        return Status("FAILED", f"{', '.join(parts)} of {total} cases", scope)
    if warnings:
        return Status("INCOMPLETE",
                      f"no failures in {total} cases, but the results are incomplete", scope)
    counts = headline_counts(cases)
    others = [f"{counts[v]} {VERDICT_LABELS.get(v, v)}" for v in VERDICTS + (NOT_COMPARED,)
              if v != "passed" and counts[v]]
    if counts["passed"] + counts["unexpected_pass"] == 0:
        return Status("NOT CHECKED",
                      f"none of {total} cases compared an output ({', '.join(others)})", scope)
    text = f"{total} cases, {counts['passed']} passed, none failed" + (
        f" ({', '.join(others)})" if others else "")
    if scope == REFERENCE_ONLY:
        return Status("REFERENCE ONLY", text)
    return Status("PASSED", text, scope)


def worst_cases(cases, limit: int) -> list:
    """Failures first (crashes and refusals without a ratio among them), then by ratio."""

    def key(c: CaseResult):
        ratio = c.ratio
        if ratio is None:
            ratio = math.inf if c.failing else -1.0
        rank = 0 if c.failing else (1 if c.verdict == "known_bug" else 2)
        return (rank, -ratio, c.arch, c.id)

    candidates = [c for c in cases if c.failing or c.ratio is not None or c.verdict == "known_bug"]
    return sorted(candidates, key=key)[:limit]


# --- regressions -------------------------------------------------------------------------------


@dataclass
class Change:
    case: Optional[CaseResult]  # current (None when it disappeared)
    base: Optional[CaseResult]  # baseline (None when it appeared)

    @property
    def any(self) -> CaseResult:
        return self.case or self.base

    @property
    def growth(self) -> float:
        if self.case is None or self.base is None or self.case.ratio is None:
            return math.nan
        if not self.base.ratio:
            return math.inf
        return self.case.ratio / self.base.ratio


@dataclass
class Regression:
    baseline_runs: list
    new_failures: list = field(default_factory=list)
    fixed: list = field(default_factory=list)
    grown: list = field(default_factory=list)
    other_changes: list = field(default_factory=list)
    appeared: list = field(default_factory=list)
    disappeared: list = field(default_factory=list)
    growth_factor: float = 2.0
    growth_floor: float = 0.01
    unmatched_arches: list = field(default_factory=list)  # current arches the baseline lacks
    filter_applied: str = ""  # the current filter, applied to the baseline's cases

    @property
    def is_clean(self) -> bool:
        return not (self.new_failures or self.grown)


def compare_to_baseline(cases, baseline_runs, growth_factor=2.0, growth_floor=0.01,
                        id_filter: str = "") -> Regression:
    """Cases matched by (arch, id). Growth counts only where the new ratio is at least
    `growth_floor` of the budget: below that, a 2x change is rounding noise, not a regression.
    `id_filter`: the current run's case filter, applied to a baseline that ran without it (a
    filtered manual run against main's full results must not list everything else as gone)."""
    reg = Regression(baseline_runs, growth_factor=growth_factor, growth_floor=growth_floor)
    pattern = None
    if id_filter:
        try:
            pattern = re.compile(id_filter)
            reg.filter_applied = id_filter
        except re.error:
            pass  # a C++ regex Python cannot read: compare everything

    def keep(c) -> bool:
        if pattern is None or c.run.meta.get("filter") == id_filter:
            return True
        return bool(pattern.search(c.id))

    base = {c.key: c for r in baseline_runs for c in r.cases if keep(c)}
    now = {c.key: c for c in cases}
    base_arches = {c.arch for c in base.values()}
    reg.unmatched_arches = sorted({c.arch for c in cases} - base_arches)
    for key in sorted(now):
        c = now[key]
        b = base.get(key)
        if b is None:
            if c.arch in base_arches:  # an arch the baseline never ran is not "appeared"
                reg.appeared.append(Change(c, None))
            continue
        if c.failing and not b.failing:
            reg.new_failures.append(Change(c, b))
        elif b.failing and not c.failing and c.verdict in ("passed", "refused_as_expected",
                                                             "unexpected_pass"):
            reg.fixed.append(Change(c, b))
        elif c.verdict != b.verdict:
            reg.other_changes.append(Change(c, b))
        if not c.failing and c.ratio is not None and b.ratio is not None:
            ch = Change(c, b)
            if c.ratio >= growth_floor and ch.growth > growth_factor:
                reg.grown.append(ch)
    now_arches = {c.arch for c in cases}
    reg.disappeared = [Change(None, base[k]) for k in sorted(base)
                       if k not in now and k[0] in now_arches]
    reg.grown.sort(key=lambda ch: -ch.growth)
    return reg


# --- mutation ----------------------------------------------------------------------------------


@dataclass
class MutantSpec:
    name: str
    op: str
    bug: str
    expect: str  # case id regex expected to catch it
    source: str


def load_mutant_specs(directory: Path) -> dict:
    """kernels_under_test/<op>.mutants: 'name | seed bug it re-creates | case id regex' per line."""
    specs = {}
    if not directory.is_dir():
        return specs
    for path in sorted(directory.glob("*.mutants")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            parts = [p.strip() for p in text.split("|", 2)]  # the regex may hold "|"
            if len(parts) != 3 or not all(parts):
                raise ResultsError(
                    f"{path}:{number}: expected 'name | seed bug | case id regex', got {text!r}"
                )
            try:
                re.compile(parts[2])
            except re.error as e:
                raise ResultsError(
                    f"{path}:{number}: bad case id regex {parts[2]!r} ({e})") from None
            specs[parts[0]] = MutantSpec(parts[0], path.stem, parts[1], parts[2],
                                         f"{path}:{number}")
    return specs


@dataclass
class MutantOutcome:
    name: str
    spec: Optional[MutantSpec]
    runs: list
    considered: int = 0  # cases of the mutant's op that ran
    killers: list = field(default_factory=list)  # failed with the mutant, not with the normal lib
    excused: list = field(default_factory=list)  # failed with the normal library too
    expected_hit: Optional[bool] = None  # a killer matches the spec's regex
    cross_checked: bool = True  # normal-library results were there for every arch

    @property
    def killed(self) -> bool:
        return bool(self.killers)


@dataclass
class Mutation:
    outcomes: list
    not_run: list  # specs without a results directory

    @property
    def score(self) -> tuple:
        return sum(o.killed for o in self.outcomes), len(self.outcomes)


def mutation_analysis(mutant_runs, normal_cases, specs: dict) -> Mutation:
    """A mutant is killed when a case is failing with the mutant library and not with the normal
    one. Every case of the run counts (ci/gpu-job runs a mutant on every op its define can change);
    a failing 'error' (the harness could not run the case) does not kill, nor does a known bug, nor
    a case skipped after the run's --max-failures."""
    by_name = defaultdict(list)
    for run in mutant_runs:
        name = run.mutant
        if name is None:
            raise ResultsError(
                f"{run.path / 'run.json'}: kernels_library {run.meta.get('kernels_library')!r}"
                " is not a mutant library (libattncheck_kernels[_hip]_mutant_<name>.so)"
            )
        by_name[name].append(run)
    normal = {c.key: c for c in normal_cases}
    normal_arches = {c.arch for c in normal_cases}
    outcomes = []
    for name in sorted(by_name):
        spec = specs.get(name)
        o = MutantOutcome(name, spec, by_name[name])
        for run in o.runs:
            for c in run.cases:
                o.considered += 1
                if not c.failing or c.verdict == "error":  # error: the mutant was not run
                    continue
                if c.arch not in normal_arches:
                    o.cross_checked = False
                ref = normal.get(c.key)
                (o.excused if ref is not None and ref.failing else o.killers).append(c)
        if spec is not None and o.killers:
            o.expected_hit = any(re.search(spec.expect, c.id) for c in o.killers)
        outcomes.append(o)
    not_run = [s for n, s in sorted(specs.items()) if n not in by_name]
    return Mutation(outcomes, not_run)


def runs_warnings(runs) -> list:
    return [w for r in runs for w in r.warnings]


def describe_runs(runs, key: str) -> str:
    """One header value across runs: the common value, or the distinct ones joined."""
    values = []
    for r in runs:
        v = r.get(key, "—")
        if v not in values:
            values.append(v)
    return ", ".join(values)
