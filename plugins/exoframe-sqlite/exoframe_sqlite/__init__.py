"""exoframe-sqlite: the `sqlite` metrics sink.

`exoframe run --sink sqlite` (or `sinks: [jsonl, sqlite]` in a config file) writes every
step's metrics into metrics.sqlite in the run folder, one row per (step, metric), in a
table that runs can be merged into:

    CREATE TABLE metrics (run TEXT, step INTEGER, name TEXT, value REAL)

    sqlite3 runs/*/metrics.sqlite "SELECT step, value FROM metrics WHERE name = 'loss'"

Standard library only.
"""
import sqlite3
from pathlib import Path

import exoframe

EXOFRAME_PLUGIN_API = ">=2,<3"

SCHEMA = "CREATE TABLE IF NOT EXISTS metrics (run TEXT, step INTEGER, name TEXT, value REAL)"


class SQLiteSink:
    """metrics.sqlite: one row per step and metric, committed as each step finishes."""

    def __init__(self, run, path: str = "metrics.sqlite"):
        """path: the database file, relative to the run folder (--sink sqlite:path=all.db);
        runs may share one file: each row names its run."""
        self.run = run.name
        self.db = sqlite3.connect(Path(run.dir) / path)
        # WAL with synchronous=NORMAL: a commit per step without an fsync per step.
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute(SCHEMA)

    def write(self, row: dict):
        step = row["step"]
        self.db.executemany(
            "INSERT INTO metrics VALUES (?, ?, ?, ?)",
            [(self.run, step, name, value) for name, value in row.items() if name != "step"])
        self.db.commit()

    def close(self):
        # Back to a rollback journal so the run folder holds one self-contained file.
        self.db.execute("PRAGMA journal_mode=DELETE")
        self.db.close()


@exoframe.hookimpl
def exoframe_register_sinks(register):
    register("sqlite", SQLiteSink)
