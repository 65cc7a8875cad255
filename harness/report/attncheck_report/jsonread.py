"""JSON of results directories (results.jsonl, run.json, coverage.json), parsed with a depth limit.

Python's json module parses by recursion: a line nested some thousands deep raises RecursionError,
not a JSONDecodeError, and a document just under the interpreter's limit parses but breaks
whatever walks it later. attncheck's own files nest a few levels (docs/report.md); anything nested
deeper than MAX_DEPTH is refused as bad JSON, with the position where the limit is crossed."""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 64


def loads(text: str) -> Any:
    """json.loads, or json.JSONDecodeError for bad JSON and for nesting deeper than MAX_DEPTH."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise _too_deep(text) from None
    # Fewer brackets than the limit, inside strings or not, cannot nest deeper than it.
    if text.count("[") + text.count("{") > MAX_DEPTH and _depth(value) > MAX_DEPTH:
        raise _too_deep(text)
    return value


def _depth(value: Any) -> int:
    """Nesting depth of a parsed value (a scalar 0, [] 1), walked without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = item.values()
        elif not isinstance(item, list):
            continue
        deepest = max(deepest, depth + 1)
        stack.extend((child, depth + 1) for child in item)
    return deepest


def _too_deep(text: str) -> json.JSONDecodeError:
    return json.JSONDecodeError(f"nested deeper than {MAX_DEPTH} levels", text,
                                _first_too_deep(text))


def _first_too_deep(text: str) -> int:
    """Offset of the first '[' or '{' (outside strings) that opens level MAX_DEPTH + 1."""
    depth, in_string, escaped = 0, False, False
    for offset, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return offset
        elif char in "]}":
            depth -= 1
    return 0
