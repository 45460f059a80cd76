"""Strict JSON for every file exoframe writes: NaN and infinities become null.

Python's json writes bare NaN / Infinity, which other JSON readers (jq, JavaScript,
pandas' strict modes) refuse; a diverged loss must not make a run's files unreadable.
"""
from __future__ import annotations

import json
import math

from ..errors import ExoframeError
from ..inputs import check_types, load_json, load_json_lines


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


NUMBER, COUNT, TEXT = float | None, int | None, str | None
# The fields of a run's summary.json that a report reads, by type (null: a non-finite value).
SUMMARY_TYPES = {
    "strategy": str, "net": str, "seed": COUNT, "final_loss": NUMBER, "final_val_loss": NUMBER,
    "best_achievable_loss": NUMBER, "validated_model": TEXT, "num_nodes": COUNT,
    "workload": TEXT, "model_parameters": COUNT, "compute_model": TEXT, "faults": TEXT,
    "failures": list, "lost_steps": COUNT, "bottleneck_bandwidth": NUMBER, "latency": NUMBER,
    "simulated_seconds": NUMBER, "compute_utilization": NUMBER, "bytes_sent_per_node": NUMBER}


def load_summary(path) -> dict:
    """A run's summary.json: a JSON object whose fields a report reads are of their types;
    else one line naming the file (and the field)."""
    summary = load(path, "summary")
    if not isinstance(summary, dict):
        raise ExoframeError(f"{path}: expected a JSON object; the file is corrupt: run again.")
    return check_types(summary, SUMMARY_TYPES, f"summary {path}")
