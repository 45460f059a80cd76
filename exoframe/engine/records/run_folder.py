"""A run's folder: the resolved config and the summary; metrics go to the run's sinks
(exoframe.sinks: metrics.jsonl by default), which write into the same folder.

Files are written to a temporary file in the same folder and renamed over the target, so a
crash or a kill never leaves a truncated file; JSON is strict: NaN and ±inf become null.
"""
from __future__ import annotations

import time
from pathlib import Path

import yaml

from ...files import write_atomic
from ...report.strict_json import dumps
from ...schema import RunSummary, StoppedSummary, Trace, with_version


class RunFolder:
    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def create(cls, parent, label: str) -> "RunFolder":
        """A new folder under `parent`, never an existing one."""
        return cls.claim(parent, f"{time.strftime('%Y%m%d-%H%M%S')}-{label}")

    @classmethod
    def claim(cls, parent, stem: str) -> "RunFolder":
        """A new folder `stem` under `parent` (`stem-1`, ... if taken)."""
        parent = Path(parent)
        parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(10_000):
            path = parent / (stem if attempt == 0 else f"{stem}-{attempt}")
            try:
                path.mkdir()
                return cls(path)
            except FileExistsError:
                continue
        raise FileExistsError(f"could not create a new run folder under {parent}")

    def write_config(self, config: dict):
        write_atomic(self.path / "config.yaml", yaml.safe_dump(config, sort_keys=False))

    def write_trace(self, trace: dict | Trace):
        """trace.json, as its record (exoframe/schema) writes it."""
        if not isinstance(trace, Trace):
            trace = Trace.from_json(trace, "trace.json")
        write_atomic(self.path / "trace.json", dumps(trace.to_json()) + "\n")

    def write_summary(self, summary: dict | RunSummary | StoppedSummary):
        """summary.json, as its record (exoframe/schema) writes it. A completed run's
        mapping is read as its record first (its fields checked); a stopped run's, rewritten
        every few seconds while the run goes with every row so far, only gets its version
        (reading each row as a Row would cost seconds on a long run)."""
        if isinstance(summary, dict) and summary.get("status") == "completed":
            summary = RunSummary.from_json(summary, "summary.json")
        mapping = with_version(summary) if isinstance(summary, dict) else summary.to_json()
        write_atomic(self.path / "summary.json", dumps(mapping, indent=2) + "\n")
