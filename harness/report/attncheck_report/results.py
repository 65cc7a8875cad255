"""Reading results directories (run.json + results.jsonl + repro/), the contract in docs/report.md.

Everything here is standard library only. Malformed input raises ResultsError naming the file and
line, so a CI log says exactly which record broke.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from . import MODES, VERDICTS, jsonread

INF = math.inf
# attncheck's default arithmetic contract (harness/core/policy.h, kDefaultContractName).
DEFAULT_CONTRACT = "fp32-accumulate"


class ResultsError(Exception):
    """Unusable input: missing files, bad JSON, unknown verdicts, duplicate cases."""


def to_float(value: Any, where: str) -> float:
    """A JSON number, or one of the strings the runner writes for non-finite values."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)  # "inf", "-inf", "nan", "-nan"
        except ValueError:
            pass
    raise ResultsError(f"{where}: expected a number, got {value!r}")


@dataclass
class Check:
    name: str
    passed: bool
    message: str
    kind: str  # numeric | exact | topk_set
    budget: dict
    metrics: dict
    ratio: float  # error / budget: <= 1 within budget, inf for NaN or any exact mismatch

    def budget_text(self) -> str:
        b = self.budget
        if self.kind == "exact":
            return "bitwise"
        if self.kind == "topk_set":
            frac = b.get("max_mismatch_frac", 0) or 0
            allowance = f", {frac:g} missing allowed" if frac else ""
            return "same index sets (ties excused)" + allowance
        parts = [f"atol {fmt_num(b.get('atol', 0))}", f"rtol {fmt_num(b.get('rtol', 0))}"]
        if (b.get("max_mismatch_frac") or 0) > 0:
            parts.append(f"frac {fmt_num(b['max_mismatch_frac'])}")
        if b.get("max_calc_diff") is not None and to_float(b["max_calc_diff"], "budget") >= 0:
            parts.append(f"calc_diff {fmt_num(b['max_calc_diff'])}")
        return " ".join(parts)

    def measured_text(self) -> str:
        m = self.metrics
        if self.kind == "exact":
            bad = m.get("bit_mismatches", m.get("mismatches", 0))
            return f"{bad}/{m.get('count', 0)} bits differ"
        if self.kind == "topk_set":
            return (
                f"{m.get('topk_missing', 0)} missing, {m.get('topk_invalid', 0)} invalid"
                f" of {m.get('count', 0)}"
            )
        text = f"max|Δ| {fmt_num(m.get('max_abs', 0))}"
        if m.get("mismatches"):
            text += f", {m['mismatches']}/{m.get('count', 0)} out"
        if m.get("nan_actual"):
            text += f", NaN {m['nan_actual']}"
        if m.get("neginf_mask_mismatch"):
            text += f", -inf mask {m['neginf_mask_mismatch']}"
        return text

    def worst_text(self) -> str:
        w = self.metrics.get("worst")
        if not isinstance(w, dict) or "index" not in w:
            return ""
        idx = ",".join(str(i) for i in w.get("index", []))
        return f"[{idx}] expected {fmt_num(w.get('expected'))} actual {fmt_num(w.get('actual'))}"


@dataclass
class CaseResult:
    id: str
    op: str
    params: dict
    verdict: str
    failing: bool  # attncheck's word (the record's "failing"), never derived from the verdict here
    mode: str  # kernel | reference | none
    message: str
    checks: list
    timings: dict
    arch: str
    repro: str
    source: str  # "DIR/results.jsonl:12"
    run: "Run"
    bundle: Optional[Path] = None
    # The arithmetic contract whose budgets the checks hold ("fp32-accumulate", the default, or
    # the kernel's declared one when the default budgets failed; "" for ops no contract changes).
    contract: str = ""
    # The op's metamorphic relations (docs/verification.md "Invariance"): dicts with "relation",
    # "mode" ("bitwise" | "budget"), "passed" and "message"; empty when none ran.
    invariance: list = field(default_factory=list)
    # The partial contract the kernel entry declared and the case was judged under
    # (docs/verification.md "Partial contracts"): {"not_produced": [...], "unspecified":
    # {output: region}}; None when the entry produces everything.
    partial: Optional[dict] = None
    # The Python adapter that provides no entry for the case (not run); "" otherwise.
    not_provided_by: str = ""
    # `attncheck run --shrink`: the simplest case found that fails the same check (id, params,
    # case_file_entry, repro, check, evaluations, stopped); None when the failure was not shrunk.
    shrunk: Optional[dict] = None

    @property
    def partial_text(self) -> str:
        """The partial contract in words ("'lse' not produced; 'logits' past_context
        unspecified"), "" when none."""
        if not self.partial:
            return ""
        parts = [f"'{o}' not produced" for o in self.partial.get("not_produced", [])]
        parts += [f"'{o}' {r} unspecified" for o, r in self.partial.get("unspecified", {}).items()]
        return "; ".join(parts)

    @property
    def under_declared_contract(self) -> bool:
        """Passed only because the kernel's declared contract was applied (docs/verification.md
        "Arithmetic contracts"): never to be read as a pass under the default budgets."""
        return self.verdict == "passed" and self.contract not in ("", DEFAULT_CONTRACT)

    def budget_text(self) -> str:
        """The worst check's budget with the contract it was derived for."""
        w = self.worst_check
        if not w:
            return ""
        return w.budget_text() + (f" · contract {self.contract}" if self.contract else "")

    @property
    def key(self) -> tuple:
        return (self.arch, self.id)

    @property
    def ratio(self) -> Optional[float]:
        """Worst error/budget ratio over the checks; None when nothing was compared."""
        if not self.checks:
            return None
        return max(c.ratio for c in self.checks)

    @property
    def worst_check(self) -> Optional[Check]:
        if not self.checks:
            return None
        return max(self.checks, key=lambda c: (not c.passed, c.ratio))


@dataclass
class Run:
    path: Path
    meta: dict
    cases: list = field(default_factory=list)
    warnings: list = field(default_factory=list)

    def get(self, key: str, default: str = "?") -> str:
        value = self.meta.get(key)
        return default if value in (None, "") else str(value)

    @property
    def arch(self) -> str:
        return self.get("arch", "unknown")

    @property
    def mutant(self) -> Optional[str]:
        return mutant_name(self.meta.get("kernels_library") or "")


MUTANT_LIBRARY = re.compile(r"libattncheck_kernels(?:_hip)?_mutant_([A-Za-z0-9_]+)\.so\b")


def mutant_name(kernels_library: str) -> Optional[str]:
    """The mutant a run used, from run.json's kernels_library ('<path>/<file> (<library name>)'):
    libattncheck_kernels_mutant_<name>.so (nvcc build) or libattncheck_kernels_hip_mutant_<name>.so
    (hipcc build) -> '<name>'; None for any other library."""
    m = MUTANT_LIBRARY.search(Path(kernels_library.split(" (")[0]).name)
    return m.group(1) if m else None


def check_ratio(kind: str, budget: dict, metrics: dict, passed: bool, where: str) -> float:
    """How far a check is from its budget: 1.0 is the edge, > 1 fails, inf for NaN/bit errors.

    numeric: the worst element's |a-e| / (atol + rtol |e|) when no element may exceed the budget;
    when a fraction of elements may (max_mismatch_frac > 0), the used fraction of that allowance;
    max_calc_diff adds calc_diff / max_calc_diff. exact: 0 or inf. topk_set: missing+invalid
    indices over the allowance (inf when none is allowed). A failed check is never below 1.
    """

    def f(key: str, src: dict = metrics, default: float = 0.0) -> float:
        value = src.get(key)
        return default if value is None else to_float(value, f"{where}: {key}")

    if kind == "exact":
        bad = f("bit_mismatches") or f("mismatches")
        ratio = INF if bad > 0 else 0.0
    elif kind == "topk_set":
        bad = f("topk_missing") + f("topk_invalid")
        allowed = f("max_mismatch_frac", budget) * f("count")
        ratio = bad / allowed if allowed > 0 else (INF if bad > 0 else 0.0)
    else:
        if f("nan_actual") or f("nan_expected") or f("neginf_mask_mismatch"):
            ratio = INF
        else:
            allowed_frac = f("max_mismatch_frac", budget)
            if allowed_frac > 0:
                ratio = f("mismatch_frac") / allowed_frac
            else:
                worst = metrics.get("worst")
                if isinstance(worst, dict) and worst.get("ratio") is not None:
                    ratio = to_float(worst["ratio"], f"{where}: worst.ratio")
                else:
                    ratio = INF if f("mismatches") > 0 else 0.0
            max_calc = f("max_calc_diff", budget, -1.0)
            if max_calc >= 0:
                calc = max(f("calc_diff"), 0.0)
                ratio = max(ratio, calc / max_calc if max_calc > 0 else (INF if calc > 0 else 0.0))
        if math.isnan(ratio):
            ratio = INF
    if not passed and ratio <= 1.0:
        ratio = INF  # failed for a reason the metrics do not scale (missing output, ...)
    return max(ratio, 0.0)


def _parse_check(raw: Any, where: str) -> Check:
    if not isinstance(raw, dict):
        raise ResultsError(f"{where}: a check must be a JSON object, got {type(raw).__name__}")
    budget = raw.get("budget") or {}
    metrics = raw.get("metrics") or {}
    if not isinstance(budget, dict) or not isinstance(metrics, dict):
        raise ResultsError(f"{where}: check budget and metrics must be JSON objects")
    kind = budget.get("kind", "numeric")
    if kind not in ("numeric", "exact", "topk_set"):
        raise ResultsError(f"{where}: unknown budget kind {kind!r}")
    name = str(raw.get("name", "?"))
    passed = bool(raw.get("passed", False))
    # The runner writes each check's margin (core/compare.h check_margin); records written before
    # it had one are measured here the same way.
    if raw.get("margin") is not None:
        ratio = max(to_float(raw["margin"], f"{where}: check '{name}': margin"), 0.0)
        if math.isnan(ratio):
            ratio = INF
    else:
        ratio = check_ratio(kind, budget, metrics, passed, f"{where}: check '{name}'")
    return Check(name, passed, str(raw.get("message", "")), kind, budget, metrics, ratio)


def _parse_shrunk(shrunk, op: str, where: str) -> Optional[dict]:
    """results.jsonl's "shrunk" field (docs/cli.md "run --shrink"), or None when absent."""
    if shrunk is None:
        return None
    if not isinstance(shrunk, dict):
        raise ResultsError(f"{where}: 'shrunk' must be a JSON object")
    for key in ("id", "repro", "check", "case_file_entry"):
        if not isinstance(shrunk.get(key), str) or not shrunk[key]:
            raise ResultsError(f"{where}: missing or empty string field 'shrunk.{key}'")
    if not shrunk["id"].startswith(op + "/"):
        raise ResultsError(f"{where}: shrunk case id {shrunk['id']!r} does not start with '{op}/'")
    if not isinstance(shrunk.get("params", {}), dict):
        raise ResultsError(f"{where}: 'shrunk.params' must be a JSON object")
    return shrunk


def _parse_failing(raw: dict, where: str) -> bool:
    """attncheck decides what fails a job and writes it into every record; a report that guessed
    from verdict names would drift from the gate the moment that rule changes."""
    if "failing" not in raw:
        raise ResultsError(f"{where}: no 'failing' field: written by an older attncheck; rerun it")
    if not isinstance(raw["failing"], bool):
        raise ResultsError(f"{where}: 'failing' must be true or false, got {raw['failing']!r}")
    return raw["failing"]


def _parse_case(raw: Any, run: Run, where: str) -> CaseResult:
    if not isinstance(raw, dict):
        raise ResultsError(f"{where}: a result must be a JSON object, got {type(raw).__name__}")
    for key in ("id", "op", "verdict"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise ResultsError(f"{where}: missing or empty string field '{key}'")
    if raw["verdict"] not in VERDICTS:
        raise ResultsError(
            f"{where}: unknown verdict {raw['verdict']!r} (known: {', '.join(VERDICTS)})"
        )
    failing = _parse_failing(raw, where)
    if raw.get("mode") not in MODES:
        raise ResultsError(
            f"{where}: missing or unknown mode {raw.get('mode')!r} (known: {', '.join(MODES)})")
    if not raw["id"].startswith(raw["op"] + "/"):
        raise ResultsError(
            f"{where}: case id {raw['id']!r} does not start with its op '{raw['op']}/'")
    params = raw.get("params", {})
    if not isinstance(params, dict):
        raise ResultsError(f"{where}: 'params' must be a JSON object")
    checks_raw = raw.get("checks") or []
    if not isinstance(checks_raw, list):
        raise ResultsError(f"{where}: 'checks' must be a JSON array")
    checks = [_parse_check(c, f"{where}: checks[{i}]") for i, c in enumerate(checks_raw)]
    contract = raw.get("contract", "")
    if not isinstance(contract, str):
        raise ResultsError(f"{where}: 'contract' must be a string, got {contract!r}")
    partial = raw.get("partial")
    if partial is not None and not (
            isinstance(partial, dict)
            and isinstance(partial.get("not_produced", []), list)
            and all(isinstance(o, str) for o in partial.get("not_produced", []))
            and isinstance(partial.get("unspecified", {}), dict)
            and all(isinstance(r, str) for r in partial.get("unspecified", {}).values())):
        raise ResultsError(f"{where}: 'partial' must be null or {{not_produced: [names], unspecified: {{output: region}}}}, got {partial!r}")
    not_provided_by = raw.get("not_provided_by", "")
    if not isinstance(not_provided_by, str):
        raise ResultsError(f"{where}: 'not_provided_by' must be a string, got {not_provided_by!r}")
    invariance = raw.get("invariance") or []
    if not isinstance(invariance, list) or not all(
            isinstance(o, dict) and isinstance(o.get("relation"), str) and isinstance(o.get("passed"), bool)
            and o.get("mode") in ("bitwise", "budget") for o in invariance):
        raise ResultsError(f"{where}: 'invariance' must be a JSON array of {{relation, mode: bitwise|budget, passed, message}}")
    shrunk = _parse_shrunk(raw.get("shrunk"), raw["op"], where)
    timings = raw.get("timings_ms") or {}
    if not isinstance(timings, dict):
        raise ResultsError(f"{where}: 'timings_ms' must be a JSON object")
    # Reference-only runs have no device and may leave the arch empty.
    arch = raw.get("arch") or run.meta.get("arch") or (
        "cpu" if run.meta.get("backend") == "cpu" else "unknown")
    case = CaseResult(
        id=raw["id"],
        op=raw["op"],
        params=params,
        verdict=raw["verdict"],
        failing=failing,
        mode=raw["mode"],
        message=str(raw.get("message", "")),
        checks=checks,
        timings={k: to_float(v, f"{where}: timings_ms.{k}") for k, v in timings.items()},
        arch=str(arch),
        repro=str(raw.get("repro", "")),
        source=where,
        run=run,
        contract=contract,
        invariance=invariance,
        partial=partial,
        not_provided_by=not_provided_by,
        shrunk=shrunk,
    )
    # The record names its bundle; when the run directory moved since (a CI artifact, merged
    # shards), the file of that name in this run's repro/. Records without the field follow the
    # runner's naming.
    named = raw.get("bundle")
    if isinstance(named, str) and named:
        given = Path(named)
        candidates = [given if given.is_absolute() else run.path / given, run.path / "repro" / given.name]
    else:
        candidates = [run.path / "repro" / (case.id.replace("/", "__") + ".h5")]
    case.bundle = next((c for c in candidates if c.is_file()), None)
    return case


def load_run(path: str | Path) -> Run:
    """One results directory. Raises ResultsError for anything a report cannot be trusted on."""
    path = Path(path)
    if not path.is_dir():
        raise ResultsError(f"{path}: not a directory (expected an `attncheck run --out` directory)")
    run_json = path / "run.json"
    if not run_json.is_file():
        raise ResultsError(f"{run_json}: missing (every results directory has run.json)")
    try:
        meta = jsonread.loads(run_json.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ResultsError(f"{run_json}: not valid JSON ({e})") from None
    except OSError as e:
        raise ResultsError(f"{run_json}: cannot be read ({e.strerror or e})") from None
    if not isinstance(meta, dict):
        raise ResultsError(f"{run_json}: expected a JSON object, got {type(meta).__name__}")
    run = Run(path=path, meta=meta)

    results = path / "results.jsonl"
    if not results.is_file():
        raise ResultsError(f"{results}: missing (every results directory has results.jsonl)")
    seen: dict = {}
    try:
        with results.open(encoding="utf-8", errors="strict") as fh:
            lines = list(fh)
    except UnicodeDecodeError as e:
        raise ResultsError(f"{results}: not UTF-8 text ({e})") from None
    except OSError as e:
        raise ResultsError(f"{results}: cannot be read ({e.strerror or e})") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{results}:{number}"
        try:
            raw = jsonread.loads(line)
        except json.JSONDecodeError as e:
            raise ResultsError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
        case = _parse_case(raw, run, where)
        if case.key in seen:
            raise ResultsError(
                f"{where}: case {case.id!r} ({case.arch}) already at {seen[case.key]}")
        seen[case.key] = where
        run.cases.append(case)

    expected = meta.get("case_count")
    if isinstance(expected, int) and expected != len(run.cases):
        run.warnings.append(
            f"{path}: run.json says {expected} cases but results.jsonl holds {len(run.cases)}"
            " (was the run cut short?)"
        )
    if "finished" in meta and not meta.get("finished"):
        run.warnings.append(f"{path}: run.json has no 'finished' time (the run did not complete)")
    return run


def load_runs(paths: list) -> list:
    """Several results directories (shards, arches) as one set; a case may appear once per arch."""
    if not paths:
        raise ResultsError("no results directories given")
    runs = [load_run(p) for p in paths]
    owner: dict = {}
    for run in runs:
        for case in run.cases:
            if case.key in owner:
                raise ResultsError(
                    f"{case.source}: case {case.id!r} on {case.arch} also in {owner[case.key]}"
                    " (the same results directory given twice, or overlapping shards)"
                )
            owner[case.key] = case.source
    if not owner:
        raise ResultsError(
            "no case results in " + ", ".join(str(r.path / "results.jsonl") for r in runs)
            + " (an empty run: wrong --filter or tier, or the run failed before its first case)"
        )
    return runs


def all_cases(runs: list) -> list:
    return [c for r in runs for c in r.cases]


def fmt_num(value: Any) -> str:
    """Compact, precise enough for errors and budgets: 3 significant digits."""
    if value is None:
        return "—"
    try:
        x = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "∞" if x > 0 else "-∞"
    if x == 0:
        return "0"
    if 1e-3 <= abs(x) < 1e4:
        return f"{x:.3g}"
    return f"{x:.2e}"
