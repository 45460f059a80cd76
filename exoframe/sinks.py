"""Built-in metrics sinks: where each step's metrics row goes, in the run folder.

A sink is made per run by `factory(run_dir)` and gets `write(row)` for every step as it
finishes, then `close()`. `jsonl` (the default) writes metrics.jsonl, one JSON object per
line; `csv` writes metrics.csv. Plugins add sinks through `exoframe_register_sinks`.
"""
from __future__ import annotations

import csv
import numbers
import os
from pathlib import Path

from .errors import ExoframeError, shorten
from .hookspecs import hookimpl
from .report.strict_json import dumps, finite


def check_row(row: dict) -> dict:
    """The row with non-finite values as None (strict JSON: no bare NaN); a value that is not
    a number (a strategy's metrics() returning a tensor or a string) is refused by name."""
    out = {}
    for key, value in row.items():
        if value is not None and (isinstance(value, bool)
                                  or not isinstance(value, numbers.Real)):
            raise ExoframeError(
                f"metric '{shorten(str(key))}' is {shorten(value)} ({type(value).__name__}), "
                "not a number: a strategy's metrics() must return numbers, e.g. float(x).")
        out[key] = value if value is None or isinstance(value, int) else float(value)
    return finite(out)


class JsonlSink:
    """metrics.jsonl: one JSON object per step, written as the step finishes.

    A write that fails (a full disk) is undone, so every line in the file is a whole row."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / "metrics.jsonl"
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
        self._size = os.fstat(self._fd).st_size

    def write(self, row: dict):
        data = (dumps(check_row(row)) + "\n").encode()
        try:
            written = 0
            while written < len(data):
                written += os.write(self._fd, data[written:])
        except OSError as e:
            os.ftruncate(self._fd, self._size)
            raise OSError(e.errno, e.strerror, str(self.path)) from None
        self._size += len(data)

    def close(self):
        os.close(self._fd)


class CsvSink:
    """metrics.csv: one line per step; a column for every metric seen so far."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / "metrics.csv"
        self.columns: list[str] = []
        self.rows: list[dict] = []
        self._file = open(self.path, "w", newline="")

    def write(self, row: dict):
        row = check_row(row)
        self.rows.append(row)
        new = [key for key in row if key not in self.columns]
        if new:
            # Some metrics first appear mid-run (val_loss, a strategy's outer-step metrics):
            # rewrite the file under the wider header, which happens a few times per run.
            self.columns += new
            self._file.seek(0)
            self._file.truncate()
            self._writer().writeheader()
            self._writer().writerows(self.rows)
        else:
            self._writer().writerow(row)
        self._file.flush()

    def _writer(self):
        return csv.DictWriter(self._file, fieldnames=self.columns, restval="")

    def close(self):
        self._file.close()


@hookimpl
def exoframe_register_sinks(register):
    register("jsonl", JsonlSink)
    register("csv", CsvSink)
