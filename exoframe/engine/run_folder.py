"""A run's folder: the resolved config and the summary; metrics go to the run's sinks
(exoframe.sinks: metrics.jsonl by default), which write into the same folder.

Files are written to a temporary file in the same folder and renamed over the target, so a
crash or a kill never leaves a truncated file; JSON is strict: NaN and ±inf become null.
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import yaml

from ..report.strict_json import dumps


class RunFolder:
    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def create(cls, parent, label: str) -> "RunFolder":
        """A new folder under `parent`, never an existing one."""
        parent = Path(parent)
        parent.mkdir(parents=True, exist_ok=True)
        stem = f"{time.strftime('%Y%m%d-%H%M%S')}-{label}"
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

    def write_trace(self, trace: dict):
        write_atomic(self.path / "trace.json", dumps(trace) + "\n")

    def write_summary(self, summary: dict):
        write_atomic(self.path / "summary.json", dumps(summary, indent=2) + "\n")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


UMASK = _umask()


def write_atomic(path: Path, text: str):
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o666 & ~UMASK)  # as open() would make it, not mkstemp's 0600
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        os.unlink(temp)
        raise
