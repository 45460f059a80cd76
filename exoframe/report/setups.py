"""A report's setups: its rows grouped by their whole setting but the seed (groups.py: the
strategy and its parameters, the network, failures, projection and every other field of the
runs' configuration), in table order, and each setup's label; read by the tables and the
plots."""
from __future__ import annotations

import math

from .groups import setting_key


def by_setup(rows: list[dict]) -> dict:
    """Rows grouped by their setting, in table order: the seeds of one setup."""
    groups = {}
    for row in sorted(rows, key=row_order):
        groups.setdefault(setting_key(row), []).append(row)
    return dict(sorted(groups.items(), key=lambda item: row_order({**item[1][0], "seed": 0})))


def setup_label(row: dict) -> str:
    """The network, then its simulated failures and the projection, where there are any."""
    faults = row.get("faults", "none")
    return (row["net"] + (f" (faults {faults})" if faults != "none" else "")
            + (f" [{row['projection']}]" if row["projection"] else ""))


def row_order(row):
    bandwidth = row["bottleneck_bandwidth"]
    return (row["strategy"], row.get("seed") or 0,
            -(bandwidth if bandwidth is not None else math.inf), row["net"],
            _failure_rate(row.get("faults", "none")), setting_key(row))


def _failure_rate(faults: str) -> tuple:
    """Fault settings in order: none, then by their random rate (a term rate:F:D), then by
    name."""
    rate = next((float(t.split(":")[1]) for t in faults.split(",") if t.startswith("rate:")), 0.0)
    return (faults != "none", rate, faults)
