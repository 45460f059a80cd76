"""Strict JSON for every file exoframe writes: NaN and infinities become null.

Python's json writes bare NaN / Infinity, which other JSON readers (jq, JavaScript,
pandas' strict modes) refuse; a diverged loss must not make a run's files unreadable.
"""
from __future__ import annotations

import json
import math

from ..errors import ExoframeError
from ..inputs import load_json, load_json_lines
from ..schema.codec import check_fields


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
    """A JSON file's contents, or one line naming the file when it is unreadable, corrupt,
    too large or too deeply nested (inputs.py reads every file strictly)."""
    return load_json(path, what)


def load_lines(path, what: str = "file") -> list:
    """A JSON-lines file: one object per line, each checked."""
    return load_json_lines(path, what)


def load_summary(path) -> dict:
    """A run's summary.json: a JSON object whose fields are of the types its record
    declares (exoframe/schema/run_records.py); else one line naming the file (and the
    field). Fields it lacks are let be (a summary a script wrote)."""
    from ..schema.run_records import RunSummary, StoppedSummary

    summary = load(path, "summary")
    if not isinstance(summary, dict):
        raise ExoframeError(f"{path}: expected a JSON object; the file is corrupt: run again.")
    record = RunSummary if summary.get("status", "completed") == "completed" else \
        StoppedSummary
    return check_fields(record, summary, f"summary {path}")
