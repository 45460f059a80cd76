"""Strict JSON for every file exoframe writes: NaN and infinities become null.

Python's json writes bare NaN / Infinity, which other JSON readers (jq, JavaScript,
pandas' strict modes) refuse; a diverged loss must not make a run's files unreadable.
"""
from __future__ import annotations

import json
import math

from ..errors import ExoframeError
from ..inputs import read_text


def finite(value):
    """`value` with every non-finite float (nested in dicts, lists, tuples) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dumps(value, **kwargs) -> str:
    return json.dumps(finite(value), allow_nan=False, **kwargs)


def load(path, what: str = "file"):
    """A JSON file's contents, or one line naming the file when it is unreadable or corrupt."""
    try:
        return json.loads(read_text(path, what))
    except json.JSONDecodeError as e:
        raise ExoframeError(f"{what} {path}: line {e.lineno}: malformed JSON ({e.msg}); the "
                            "file is truncated or corrupt: run again to remake it.") from None


def load_lines(path, what: str = "file") -> list:
    """A JSON-lines file: one object per line, each checked."""
    rows = []
    for number, line in enumerate(read_text(path, what).splitlines(), 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ExoframeError(f"{what} {path}: line {number}: malformed JSON ({e.msg}); the "
                                "line is truncated or corrupt: remove it or run again.") from None
        if not isinstance(row, dict):
            raise ExoframeError(f"{what} {path}: line {number}: expected a JSON object.")
        rows.append(row)
    return rows
