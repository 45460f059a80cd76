"""exoframe.load_run: a run folder's records, typed (exoframe/schema/run_records.py)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..errors import ExoframeError
from ..inputs import load_json, load_json_lines
from .run_records import Row, RunSummary, StoppedSummary, Trace, summary_from_json


@dataclass
class RunRecords:
    """What load_run read: the summary (RunSummary, or StoppedSummary for a run that failed
    or was interrupted), metrics.jsonl's rows ([] where the run wrote none), trace.json's
    record (None where there is none) and the rows as a pandas DataFrame (None without
    pandas)."""
    folder: Path
    summary: RunSummary | StoppedSummary
    rows: list[Row]
    trace: Optional[Trace]
    dataframe: Any = None


def load_run(path) -> RunRecords:
    """The records of the run folder at `path`, of any schema version this exoframe has
    written (files without a schema_version are version 1); one line naming the file when
    one is missing, corrupt or of a newer version."""
    folder = Path(path)
    summary_path = folder / "summary.json"
    if not summary_path.is_file():
        raise ExoframeError(f"{folder}: not a run folder (no summary.json).")
    summary = summary_from_json(load_json(summary_path, "summary"), str(summary_path))
    metrics_path = folder / "metrics.jsonl"
    rows = []
    if metrics_path.is_file():
        # The lines carry no version: they are of the summary's.
        rows = [Row.from_json(line, f"{metrics_path}: line {number}")
                for number, line in enumerate(load_json_lines(metrics_path, "metrics file"), 1)]
    trace_path = folder / "trace.json"
    trace = (Trace.from_json(load_json(trace_path, "trace"), str(trace_path))
             if trace_path.is_file() else None)
    return RunRecords(folder=folder, summary=summary, rows=rows, trace=trace,
                      dataframe=_dataframe(rows))


def _dataframe(rows: list[Row]):
    try:
        import pandas
    except ImportError:
        return None
    return pandas.DataFrame.from_records([row.to_json() for row in rows])
