"""What a comparison of strategies reports: each setup's speed-up over a baseline strategy,
and the bandwidth each strategy needs for a share of its time computing.

Speed-up: the baseline's time over the setup's, on the same setting but the strategy and
its parameters (the same network, workload, partition, nodes, ...). The time is the
simulated time to the target loss where the report has a target, else the simulated time
to finish. Seeds run by both are paired (the baseline's seed s over the setup's seed s) and
give the speed-up's mean and spread; a setup that shares no seed with the baseline has
none.

Utilization: over the bandwidths a strategy was run or replayed at (its other settings
fixed), the lowest bandwidth at which its compute utilization reaches each level,
interpolated linearly in utilization against log bandwidth between the two points that
bracket the level; at or below the lowest bandwidth run, or above the highest, a bound.
"""
from __future__ import annotations

import math
import statistics

from ..errors import ExoframeError
from ..sim.network.units import format_bandwidth
from .groups import STRATEGY_PARAM, setting, setting_key, varying
from .setups import by_setup

UTILIZATION_LEVELS = (0.5, 0.8, 0.9, 0.95, 0.99)


def choose_baseline(rows: list[dict], baseline: str | None) -> str | None:
    """`baseline`, checked to be among the rows' strategies; by default the first row's
    (a sweep's first --strategy)."""
    strategies = list(dict.fromkeys(r["strategy"] for r in rows))
    if baseline is None:
        return strategies[0] if strategies else None
    if baseline not in strategies:
        raise ExoframeError(f"--baseline: no run of '{baseline}' among the runs (their "
                            f"strategies: {', '.join(strategies)}); give one of those.")
    return baseline


def compared_time(row: dict) -> float | None:
    """What a speed-up divides: the time to the target with a target, else to finish."""
    return row["time_to_target"] if row.get("target_loss") is not None \
        else row["simulated_seconds"]


def with_speedups(rows: list[dict], baseline: str | None) -> list[dict]:
    """The rows, each with its `speedup` over the run of `baseline` of the same setting
    but the strategy and of the same seed (None where there is no such run, or several)."""
    groups = by_setup(rows)
    baselines = {}
    for group in groups.values():
        if group[0]["strategy"] == baseline:
            baselines.setdefault(_without_strategy(group[0]), []).append(group)
    out = []
    for group in groups.values():
        matches = baselines.get(_without_strategy(group[0]), [])
        times = {r.get("seed"): compared_time(r) for r in matches[0]} if len(matches) == 1 \
            else {}
        for row in group:
            base, own = times.get(row.get("seed")), compared_time(row)
            out.append({**row, "speedup": base / own if base and own else None})
    return out


def speedups(rows: list[dict], baseline: str | None) -> dict:
    """Setting key -> (mean, std, seeds paired) of the setup's speed-up over `baseline`;
    setups without a paired seed are left out."""
    out = {}
    for key, group in by_setup(with_speedups(rows, baseline)).items():
        ratios = [r["speedup"] for r in group if r["speedup"] is not None]
        if ratios:
            out[key] = (statistics.mean(ratios),
                        statistics.stdev(ratios) if len(ratios) > 1 else None, len(ratios))
    return out


def _without_strategy(row: dict) -> str:
    return setting_key(row, lambda k: k == "strategy" or k.startswith(STRATEGY_PARAM))


def utilization_table(rows: list[dict]) -> list[dict]:
    """One row per setup but the network (strategy, its parameters, projection, ...) that
    ran at two bandwidths or more: for each level, the bandwidth (bytes/s) and whether it is
    a bound ("at most": reached at the lowest bandwidth run; "above": not reached at the
    highest), and the latencies of the networks."""
    families = {}
    for row in rows:
        if row["bottleneck_bandwidth"] is not None and row["compute_utilization"] is not None:
            key = setting_key(row, lambda k: k in ("net", "latency"))
            families.setdefault(key, []).append(row)
    keys = varying([r for family in families.values() for r in family])
    keys = [k for k in keys if k != "latency"]
    table = []
    for family in families.values():
        points = {}
        for r in family:
            points.setdefault(r["bottleneck_bandwidth"], []).append(r["compute_utilization"])
        if len(points) < 2:
            continue
        curve = sorted((b, statistics.mean(u)) for b, u in points.items())
        first = family[0]
        latencies = sorted({r.get("latency") for r in family if r.get("latency") is not None})
        table.append({"strategy": first["strategy"], "projection": first["projection"],
                      "faults": first.get("faults", "none"),
                      **{k: setting(first).get(k) for k in keys},
                      "bandwidths": len(curve), "latencies": latencies,
                      "levels": [needed(curve, level) for level in UTILIZATION_LEVELS]})
    return sorted(table, key=lambda t: (t["strategy"], repr(t)))


def needed(curve: list[tuple], level: float) -> dict:
    """The bandwidth at which (bandwidth, utilization) points, sorted by bandwidth, first
    reach `level`."""
    for i, (bandwidth, utilization) in enumerate(curve):
        if utilization >= level:
            if i == 0:
                return {"level": level, "bandwidth": bandwidth, "bound": "at most"}
            (b0, u0) = curve[i - 1]
            share = (level - u0) / (utilization - u0)
            at = math.exp(math.log(b0) + share * (math.log(bandwidth) - math.log(b0)))
            return {"level": level, "bandwidth": at, "bound": None}
    return {"level": level, "bandwidth": curve[-1][0], "bound": "above"}


def level_text(point: dict) -> str:
    prefix = {"at most": "<= ", "above": "> ", None: ""}[point["bound"]]
    return prefix + format_bandwidth(point["bandwidth"])


def level_csv(point: dict) -> str:
    """The bandwidth in Mbit/s, with <= or > for a bound."""
    prefix = {"at most": "<=", "above": ">", None: ""}[point["bound"]]
    return f"{prefix}{point['bandwidth'] * 8 / 1e6:.10g}"
