"""The report's CSV tables as a paper prints them: <table>.tex (booktabs) and <table>.md
beside each <table>.csv (tables.py renders them). Setups are named as the figures name them
(labels.py), times are in the report's one time unit, each cell of a setup is its mean ±
its sample standard deviation over the seeds, and each column's best value is in bold.
"""
from __future__ import annotations

from pathlib import Path

from ..files import write_atomic
from .compare import UTILIZATION_LEVELS
from .groups import column_name, setting
from .labels import label_keys, network_label, network_names, value
from .plot_style import time_unit
from .tables import Cell, Column, latex, markdown, number, text


def write_paper_tables(folder: Path, rows: list[dict], summaries: list[dict],
                       setups: list[list[dict]], utilization: list[dict]) -> list[Path]:
    """Beside sweep.csv, sweep_summary.csv, speedup.csv and utilization.csv in `folder`:
    each as .tex and .md. summaries[i] is the summary of the seeds setups[i] (sweep.py)."""
    keys, names = label_keys(rows), network_names(rows)
    unit, divisor = time_unit([r["simulated_seconds"] for r in rows])
    context = Context(keys, names, unit, 1 / divisor, _target(rows))
    tables = {
        "sweep": (*_runs(rows, context), "each run on each network (replays included)"),
        "sweep_summary": (*_setups(summaries, setups, context),
                          "each setup: mean ± standard deviation over its seeds"),
        "speedup": (*_speedups(summaries, setups, context),
                    f"speed-up over {summaries[0]['baseline'] if summaries else '-'}: "
                    "its time over each setup's, seed by seed (mean ± std)"),
        "utilization": (*_utilization(utilization, rows, context),
                        "bottleneck bandwidth needed for each compute utilization (Mbit/s; "
                        "≤: reached at the lowest bandwidth run, >: not at the highest)"),
    }
    written = []
    for name, (columns, cells, note) in tables.items():
        for suffix, render in ((".tex", lambda c, r: latex(c, r, note)), (".md", markdown)):
            path = folder / f"{name}{suffix}"
            write_atomic(path, render(columns, cells))
            written.append(path)
    return written


class Context:
    def __init__(self, keys, names, unit, time_scale, target):
        self.keys, self.names, self.unit = keys, names, unit
        self.time_scale, self.target = time_scale, target

    def setup_columns(self, seeds: bool) -> list[Column]:
        return [Column("strategy", numeric=False), Column("network", numeric=False),
                *(Column(column_name(k), numeric=False) for k in self.keys),
                *([Column("seeds")] if seeds else [])]

    def setup_cells(self, row: dict, seeds: int | None = None) -> list[Cell]:
        return [text(row["strategy"]), text(network_label(row, self.names)),
                *(text(value(row, k)) for k in self.keys),
                *([text(seeds)] if seeds is not None else [])]

    def time(self, what: str) -> Column:
        return Column(f"{what} ({self.unit})", "low", self.time_scale)


def _target(rows):
    targets = {r.get("target_loss") for r in rows}
    return targets.pop() if len(targets) == 1 else None


def _time_columns(c: Context) -> list[Column]:
    return [c.time("simulated time"), *([c.time(f"time to val loss {c.target:g}")]
                                        if c.target is not None else [])]


def _runs(rows, c: Context):
    columns = [*c.setup_columns(False), Column("seed", numeric=False), *_time_columns(c),
               Column("compute util. (%)", "high", 100), Column("sent / node (MB)", "low", 1e-6),
               Column("final val loss", "low"), Column("comm. / node (s)"),
               Column("round trips (% of comm.)", scale=100)]
    cells = [[*c.setup_cells(r), text(r.get("seed")), number(r["simulated_seconds"]),
              *([number(r["time_to_target"])] if c.target is not None else []),
              number(r["compute_utilization"]), number(r["bytes_sent_per_node"]),
              number(None if r["projection"] else r["final_val_loss"]),
              number(r.get("comm_seconds")), number(_share(r.get("comm_latency_seconds"),
                                                          r.get("comm_seconds")))]
             for r in rows]
    return columns, cells


def _setups(summaries, setups, c: Context):
    columns = [*c.setup_columns(True), *_time_columns(c),
               Column("compute util. (%)", "high", 100), Column("sent / node (MB)", "low", 1e-6),
               Column("final val loss", "low"), Column("comm. / node (s)"),
               Column("round trips (% of comm.)", scale=100)]
    cells = []
    for s, group in zip(summaries, setups):
        cell = _maker(s)
        cells.append([*c.setup_cells(group[0], s["seeds"]), cell("simulated_seconds"),
                      *([cell("time_to_target")] if c.target is not None else []),
                      cell("compute_utilization"), cell("bytes_sent_per_node"),
                      number(None) if s["projection"] else cell("final_val_loss"),
                      cell("comm_seconds"),
                      number(_share(s.get("comm_latency_seconds_mean"),
                                    s.get("comm_seconds_mean")))])
    return columns, cells


def _speedups(summaries, setups, c: Context):
    baseline = summaries[0]["baseline"] if summaries else "-"
    columns = [*c.setup_columns(True), Column(f"speed-up over {baseline} (×)", "high"),
               *_time_columns(c), Column("final val loss", "low")]
    cells = []
    for s, group in zip(summaries, setups):
        cell = _maker(s)
        cells.append([*c.setup_cells(group[0], s["seeds"]), cell("speedup"),
                      cell("simulated_seconds"),
                      *([cell("time_to_target")] if c.target is not None else []),
                      number(None) if s["projection"] else cell("final_val_loss")])
    return columns, cells


def _utilization(entries, rows, c: Context):
    columns = [Column("strategy", numeric=False),
               *(Column(column_name(k), numeric=False) for k in c.keys),
               Column("bandwidths"),
               *(Column(f"{100 * level:g}% util. (Mbit/s)", "low", 8e-6)
                 for level in UTILIZATION_LEVELS)]
    cells = []
    for e in entries:
        row = _representative(e, rows)
        cells.append([text(e["strategy"] + (f" [{e['projection']}]" if e["projection"] else "")),
                      *(text(value(row, k)) for k in c.keys), text(e["bandwidths"]),
                      *(_level(point) for point in e["levels"])])
    return columns, cells


def _representative(entry: dict, rows: list[dict]) -> dict:
    """A row of the setups a utilization entry is made of (its strategy, projection,
    failures and the fields it gives), for their labels."""
    for r in rows:
        given = setting(r)
        if (r["strategy"], r["projection"], r.get("faults", "none")) == (
                entry["strategy"], entry["projection"], entry.get("faults", "none")) and all(
                given.get(k) == v for k, v in entry.items() if k in given
                and k not in ("latency",)):
            return r
    return {"strategy": entry["strategy"]}


def _level(point: dict) -> Cell:
    """A bandwidth needed; a bound is ranked past every value it bounds (> 1 Gbit/s: not
    reached, worse than any reached)."""
    prefix = {"at most": "≤ ", "above": "> ", None: ""}[point["bound"]]
    rank = float("inf") if point["bound"] == "above" else point["bandwidth"]
    return number(point["bandwidth"], prefix=prefix, rank=rank)


def _maker(s: dict):
    return lambda key: number(s.get(f"{key}_mean"), s.get(f"{key}_std"))


def _share(part, whole):
    return part / whole if part is not None and whole else None
