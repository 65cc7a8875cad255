"""The coverage audit beside a run's results (`attncheck coverage --out DIR/coverage.json`,
docs/coverage.md): which arguments the tier never varies, passes derived from others, or never
takes to their extremes, and which of those flags the case files accept, with their reasons."""

from __future__ import annotations

import json
from pathlib import Path

from . import jsonread
from .results import ResultsError

FILE_NAME = "coverage.json"


def load_coverage(dirs) -> dict | None:
    """The first results directory's coverage.json as a render context, or None without one."""
    for d in dirs:
        path = Path(d) / FILE_NAME
        if path.is_file():
            return _context(path)
    return None


def _context(path: Path) -> dict:
    try:
        doc = jsonread.loads(path.read_text(encoding="utf-8"))
        ops = []
        for op in doc["ops"]:
            flags = [{"argument": a["name"], "flag": f["flag"], "detail": f["detail"],
                      "accepted": bool(f["accepted"]), "reason": f["reason"],
                      "blind_spot": f["reason"].startswith("BLIND SPOT")}
                     for a in op["arguments"] for f in a["flags"]]
            ops.append({"op": op["op"], "cases": op["cases"], "arguments": len(op["arguments"]),
                        "flags": flags, "stale": list(op["stale"]), "errors": list(op["errors"])})
        return {"tier": str(doc["tier"]), "flags": int(doc["flags"]),
                "unaccepted": int(doc["unaccepted"]), "stale": int(doc["stale"]),
                "errors": int(doc["errors"]), "ops": ops,
                "blind_spots": sum(f["blind_spot"] for o in ops for f in o["flags"])}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError,
            ValueError, AttributeError) as e:
        raise ResultsError(f"{path}: not a coverage audit of `attncheck coverage` ({e})") from None


def summary_line(cov: dict) -> str:
    clean = not (cov["unaccepted"] or cov["stale"] or cov["errors"])
    return (f"**Coverage audit** (tier {cov['tier']}): {cov['flags']} flags,"
            f" {cov['unaccepted']} not accepted, {cov['blind_spots']} accepted as blind spots,"
            f" {cov['stale']} stale acceptances, {cov['errors']} errors"
            + ("" if clean else " — `attncheck coverage` fails"))
