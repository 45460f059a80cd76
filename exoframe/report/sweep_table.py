"""Tables and plots comparing strategies across networks, built from run folders.

Each run folder gives one row for the network it trained on (summary.json, metrics.jsonl)
and one per replay through another network (replays/*.json). Rows carry each step's
simulated time next to the run's losses, so loss can be drawn against simulated time.
Rows of one setting (groups.py: the run's whole recorded configuration but the seed, on one
network) are the seeds of one setup, summarized as a mean and a standard deviation per
metric, with the speed-up over a baseline strategy and the bandwidth each setup needs for
a compute utilization (compare.py).
"""
from __future__ import annotations

import csv
import statistics
from pathlib import Path

from ..errors import ExoframeError
from ..files import replacing, write_atomic
from ..sim.network.units import format_duration
from . import strict_json
from .compare import (UTILIZATION_LEVELS, choose_baseline, level_csv, level_text, speedups,
                      utilization_table)
from .groups import cells, check_distinct_seeds, column_name, read_config, varying
from .paper_tables import write_paper_tables
from .setups import by_setup, row_order, setup_label
from .plot_style import time_unit
from .summary import LOW_UTILIZATION, format_bytes

# Each node's time by what it went to, mean over the nodes (exoframe/report/bounds.py):
# communication not hidden behind compute, of it round trips (latency) and bytes
# (bandwidth), and waiting for peers.
TIMES = ["comm_seconds", "comm_latency_seconds", "comm_bandwidth_seconds", "idle_seconds"]
COLUMNS = ["strategy", "seed", "net", "bottleneck_bandwidth", "latency", "faults", "projection",
           "simulated_seconds", "time_to_target", "compute_utilization", "bytes_sent_per_node",
           *TIMES, "final_loss", "final_val_loss", "failures", "lost_steps", "source",
           "run_dir"]
# Summarized over the seeds of each setup (setups.py): <metric>_mean, <metric>_std.
METRICS = ["simulated_seconds", "time_to_target", "compute_utilization", "bytes_sent_per_node",
           "final_loss", "final_val_loss", "failures", "lost_steps", *TIMES]
# speedup.csv: each setup's speed-up over the baseline, with its times and final loss
# (the fields that differ between setups after the fifth column).
SPEEDUP_COLUMNS = ["strategy", "net", "bottleneck_bandwidth", "faults", "projection", "seeds",
                   "baseline", "speedup_mean", "speedup_std", "speedup_seeds_paired",
                   "seeds_at_target", "time_to_target_mean", "time_to_target_std",
                   "simulated_seconds_mean", "simulated_seconds_std", "final_val_loss_mean",
                   "final_val_loss_std", "final_loss_mean", "final_loss_std"]
# utilization.csv: the bandwidth (Mbit/s; <= and > mark bounds) for each utilization level
LEVEL_COLUMNS = [f"bandwidth_for_{100 * level:g}pct_mbit" for level in UTILIZATION_LEVELS]


def collect_rows(run_dirs, target_loss: float | None = None) -> list[dict]:
    """The rows of the run folders (a folder given twice counts once), in their order; two
    runs of one setting and one seed are refused (groups.py)."""
    rows, given = [], {}
    for run_dir in map(Path, run_dirs):
        given.setdefault(run_dir.resolve(), run_dir)
    for run_dir in given.values():
        try:
            rows += _rows_of(run_dir)
        except (KeyError, TypeError, IndexError) as e:
            raise ExoframeError(f"{run_dir}: a file of this run folder lacks or mangles "
                                f"{e.args[0] if isinstance(e, KeyError) else 'a field'!r}; "
                                "it is corrupt or from another tool: run it again.") from None
    for row in rows:
        row["target_loss"] = target_loss
        row["time_to_target"] = time_to_target(row, target_loss)
    check_distinct_seeds(rows)
    return rows


def _rows_of(run_dir: Path) -> list[dict]:
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        raise ExoframeError(f"{run_dir}: not a run folder (no summary.json).")
    summary = strict_json.load_summary(summary_path)  # (typed: one line naming a field)
    metrics_path = run_dir / "metrics.jsonl"
    if not metrics_path.is_file():
        raise ExoframeError(f"{run_dir}: no metrics.jsonl (the run did not use the jsonl "
                            "metrics sink); reports need it.")
    metrics = strict_json.load_lines(metrics_path, "metrics")
    base = {"strategy": summary["strategy"], "seed": summary.get("seed"),
            "final_loss": summary["final_loss"], "final_val_loss": summary["final_val_loss"],
            "best_achievable_loss": summary.get("best_achievable_loss"),
            "run_dir": str(run_dir), "losses": [m.get("loss") for m in metrics],
            "val_losses": [m.get("val_loss") for m in metrics],
            # what val_loss is of (the model each node would deploy), and the run's context
            "validated_model": summary.get("validated_model"),
            "num_nodes": summary.get("num_nodes"), "workload": summary.get("workload"),
            "model_parameters": summary.get("model_parameters"),
            "compute_model": summary.get("compute_model"),
            "bytes_sent": [m.get("bytes_sent_per_node") for m in metrics],
            # the run's whole setting but the seed (groups.py)
            "config": read_config(run_dir),
            "faults": summary.get("faults", "none"),
            "failures": len(summary.get("failures", [])),
            "failed_at": [f["failed_at"] for f in summary.get("failures", [])],
            "lost_steps": summary.get("lost_steps", 0),
            # why a curve ends early: "target_loss" where the run stopped at the target
            "stopped_by": summary.get("stopped_by"),
            # its strategy's parameters, defaults included (labels.py)
            "strategy_params": summary.get("strategy_params")}
    rows = [{**base, "net": summary["net"],
             "bottleneck_bandwidth": summary.get("bottleneck_bandwidth"),
             "latency": summary.get("latency"), "projection": None,
             "simulated_seconds": summary["simulated_seconds"],
             "compute_utilization": summary["compute_utilization"],
             "bytes_sent_per_node": summary["bytes_sent_per_node"], "source": "run",
             "sim_times": [m["sim_time"] for m in metrics],
             **{key: None if summary.get("real_network") else summary.get(f"{key}_per_node")
                for key in TIMES}}]
    for path in sorted((run_dir / "replays").glob("*.json")):
        replay = _mapping(strict_json.load(path, "replay"), path)
        rows.append({**base, **{k: replay[k] for k in (
            "net", "bottleneck_bandwidth", "projection", "simulated_seconds",
            "compute_utilization", "bytes_sent_per_node", "sim_times")},
            "latency": replay.get("latency"), "source": "replay",
            **{key: _per_node(replay.get("per_rank"), key) for key in TIMES}})
    return rows


def _per_node(ranks, key: str) -> float | None:
    """The mean of each rank's `key` (None where a rank lacks it: an older replay)."""
    values = [r.get(key) for r in ranks or [] if isinstance(r, dict)]
    if not values or any(v is None for v in values):
        return None
    return sum(values) / len(values)


def _mapping(value, path) -> dict:
    if not isinstance(value, dict):
        raise ExoframeError(f"{path}: expected a JSON object; the file is corrupt: run again.")
    return value


def time_to_target(row: dict, target: float | None) -> float | None:
    """Simulated time of the first step whose validation loss of the held model is at most
    `target`, on the row's network: a replay keeps the step and reads its own time for
    it. A sweep with a target validates every step (engine/plan/target.py); for runs made
    without one, the time is only resolved to their evaluation steps."""
    if target is None:
        return None
    for loss, t in zip(row["val_losses"], row["sim_times"]):
        if loss is not None and loss <= target:
            return t
    return None


def summarize(rows: list[dict], baseline: str | None = None) -> list[dict]:
    """One row per setup (groups.py: the rows' setting but the seed): the fields that differ
    between setups (groups.varying), `seeds` (its distinct seeds), each metric's mean and
    sample standard deviation over the rows where it is known (the std is None below two
    values), and the speed-up over `baseline` (compare.py; the first strategy by default).
    `seeds_at_target` counts the rows that reached the target loss (None without a target);
    the time-to-target statistics are over those rows."""
    baseline = choose_baseline(rows, baseline)
    keys, ratios, summaries = varying(rows), speedups(rows, baseline), []
    for key, group in by_setup(rows).items():
        first = group[0]
        targeted = any(r.get("target_loss") is not None for r in group)
        mean, std, pairs = ratios.get(key, (None, None, None))
        summary = {"strategy": first["strategy"], "net": first["net"],
                   "bottleneck_bandwidth": first["bottleneck_bandwidth"],
                   "faults": first.get("faults", "none"), "projection": first["projection"],
                   **dict(zip(map(column_name, keys), cells(first, keys))),
                   "seeds": len({r.get("seed") for r in group}),
                   "seeds_at_target": sum(r["time_to_target"] is not None for r in group)
                   if targeted else None,
                   "baseline": baseline, "speedup_mean": mean, "speedup_std": std,
                   "speedup_seeds_paired": pairs}
        for metric in METRICS:
            values = [r.get(metric) for r in group if r.get(metric) is not None]
            summary[f"{metric}_mean"] = statistics.mean(values) if values else None
            summary[f"{metric}_std"] = statistics.stdev(values) if len(values) > 1 else None
        summaries.append(summary)
    return summaries


def table(rows: list[dict], baseline: str | None = None) -> str:
    """One line per setup: with several seeds of a setup, each metric as mean ± standard
    deviation over its seeds; with one, the run's seed beside its strategy. The fields
    that differ between setups as columns; the "to target" column only with a target, the
    speed-up over the baseline only with several strategies; below the table, what each
    strategy's validation loss is of."""
    summaries = summarize(rows, baseline)
    keys = varying(rows)
    several = any(s["seeds"] > 1 for s in summaries)
    failures = any(r.get("faults", "none") != "none" for r in rows)
    targeted = any(r.get("target_loss") is not None for r in rows)
    compared = len({r["strategy"] for r in rows}) > 1 and any(
        s["speedup_mean"] is not None for s in summaries)
    target = _one(rows, "target_loss")
    name, per = time_unit([t for r in rows for t in (r["simulated_seconds"],
                                                     r.get("time_to_target")) if t])

    def in_unit(seconds: float) -> str:  # (a spread, too: in the column's unit)
        return f"{seconds / per:.3g}"
    headers = ["strategy", "network", *map(column_name, keys), *(["seeds"] * several),
               f"simulated time ({name})",
               *([f"to val loss {target:g} ({name})" if target is not None
                  else f"to target ({name})"] * targeted),
               *([f"speed-up vs {summaries[0]['baseline']}"] * compared),
               "compute util.", "sent / node", "final val loss",
               *(["failures (node-steps lost)"] * failures)]
    lines = []
    for s, group in zip(summaries, by_setup(rows).values()):
        seed = group[0].get("seed")
        cell = _cells(s)
        lines.append([s["strategy"] + (f" s{seed}" if seed and not several else ""),
                      setup_label(s), *cells(group[0], keys), *([str(s["seeds"])] * several),
                      cell("simulated_seconds", in_unit),
                      *([_to_target(s, cell, in_unit)] * targeted),
                      *([cell("speedup", lambda x: f"{x:.2f}×", lambda x: f"{x:.2f}")]
                        * compared),
                      cell("compute_utilization", lambda u: f"{100 * u:.1f}%"),
                      cell("bytes_sent_per_node", format_bytes),
                      # a projection's times are for another model: its loss is not
                      "-" if s["projection"] else cell("final_val_loss", lambda x: f"{x:.4f}"),
                      *(_failure_cell(s, "_mean") if failures else [])])
    return "\n".join([_aligned(headers, lines), *validated_notes(rows)])


def utilization_text(rows: list[dict]) -> str | None:
    """The bandwidth each setup needs for each compute-utilization level, as a table; None
    where no setup ran at two bandwidths or more."""
    entries = utilization_table(rows)
    if not entries:
        return None
    keys = [k for k in varying(rows) if k != "latency"]
    headers = ["strategy", *map(column_name, keys), "bandwidths",
               *(f"{100 * level:g}% util." for level in UTILIZATION_LEVELS)]
    lines = [[e["strategy"] + (f" [{e['projection']}]" if e["projection"] else ""),
              *("-" if e.get(k) is None else str(e[k]) for k in keys), str(e["bandwidths"]),
              *map(level_text, e["levels"])] for e in entries]
    notes = ["  bandwidth needed for each compute utilization (the bottleneck link; "
             "interpolated in log bandwidth between the runs that bracket it)"]
    if any(len(e["latencies"]) > 1 for e in entries):
        notes.append("  note: the networks' latencies differ too (" + ", ".join(
            sorted({format_duration(x) for e in entries for x in e["latencies"]})) + "): the "
            "bandwidth is not the only change between these points.")
    return "\n".join([_aligned(headers, lines), *notes])


def validated_notes(rows: list[dict]) -> list[str]:
    """What each strategy's validation loss (and time to target) is of."""
    models = {}
    for r in sorted(rows, key=row_order):
        if r.get("validated_model"):
            models.setdefault(r["strategy"], r["validated_model"])
    if not models:
        return []
    return ["  val loss of: " + "; ".join(f"{s}: {m}" for s, m in models.items())]


def compute_warning(rows: list[dict]) -> str | None:
    """One line when some rows' compute model leaves utilization under 1 %."""
    low = [r for r in rows if r["compute_utilization"] is not None
           and r["compute_utilization"] < LOW_UTILIZATION]
    if not low:
        return None
    models = sorted({r.get("compute_model") or "unknown" for r in low})
    return (f"warning: compute model {' and '.join(models)} leaves compute utilization under "
            f"1% in {len(low)} of {len(rows)} rows: the times compare the network alone and "
            "stragglers change little; give the step time you mean (--compute fixed:<time per "
            "step>, or --step-time with a projection) or a larger model.")


def _one(rows: list[dict], key: str):
    values = {r.get(key) for r in rows}
    return values.pop() if len(values) == 1 else None


def _failure_cell(row: dict, suffix: str = "") -> list[str]:
    count, lost = row.get(f"failures{suffix}"), row.get(f"lost_steps{suffix}")
    return ["-" if count is None else f"{count:g} ({lost:g})"]


def _cells(s: dict):
    """A cell maker for summary `s`: a metric's mean, ± its std over the seeds."""
    def cell(key, fmt, fmt_std=None):
        mean, std = s[f"{key}_mean"], s[f"{key}_std"]
        if mean is None:
            return "-"
        if std is None or std <= 1e-9 * abs(mean):  # one seed, or float noise
            return fmt(mean)
        return f"{fmt(mean)} ± {(fmt_std or fmt)(std)}"
    return cell


def _to_target(s: dict, cell, in_unit) -> str:
    text = cell("time_to_target", in_unit)
    if text != "-" and s["seeds_at_target"] < s["seeds"]:
        text += f" ({s['seeds_at_target']}/{s['seeds']} seeds)"
    return text


def _aligned(headers: list[str], lines: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in column) for column in zip(headers, *lines)]
    return "\n".join("  " + "  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip()
                     for line in [headers, *lines])


def write_outputs(rows: list[dict], folder, plots: bool = True,
                  target_loss: float | None = None, baseline: str | None = None,
                  figures=None) -> list[Path]:
    """In `folder`: sweep.csv and sweep.json (one row per run and network), sweep_summary.csv
    and sweep_summary.json (one row per setup: mean and std over seeds, and the speed-up over
    `baseline`, by default the first row's strategy), speedup.csv (the comparison: speed-up,
    time to target and final loss with their spread), utilization.csv and utilization.json
    (the bandwidth each setup needs for each compute utilization, where it ran at several),
    each CSV also as .tex (booktabs) and .md (paper_tables.py), and (with matplotlib) the
    plots, as `figures` (plots.Figures) asks. `target_loss` draws
    a line on the loss plots; by default the one the rows were collected with."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    baseline = choose_baseline(rows, baseline)
    rows = sorted(rows, key=row_order)
    keys = varying(rows)
    names = [column_name(k) for k in keys]
    _write_csv(folder / "sweep.csv", [*COLUMNS[:7], *names, *COLUMNS[7:]],
               [{**r, **dict(zip(names, cells(r, keys)))} for r in rows])
    write_atomic(folder / "sweep.json", strict_json.dumps(rows, indent=1) + "\n")
    summaries = summarize(rows, baseline)
    _write_csv(folder / "sweep_summary.csv", list(summaries[0]) if summaries else [], summaries)
    write_atomic(folder / "sweep_summary.json", strict_json.dumps(summaries, indent=1) + "\n")
    _write_csv(folder / "speedup.csv", [*SPEEDUP_COLUMNS[:5], *names, *SPEEDUP_COLUMNS[5:]],
               summaries)
    utilization = utilization_table(rows)
    _write_csv(folder / "utilization.csv",
               ["strategy", "projection", "faults", *(column_name(k) for k in keys
                                                      if k != "latency"),
                "bandwidths", "latencies", *LEVEL_COLUMNS],
               [{**{k: v for k, v in e.items() if k != "levels"},
                 **{column_name(k): e[k] for k in keys if k in e},
                 "latencies": " ".join(map(format_duration, e["latencies"])),
                 **dict(zip(LEVEL_COLUMNS, map(level_csv, e["levels"])))}
                for e in utilization])
    write_atomic(folder / "utilization.json", strict_json.dumps(utilization, indent=1) + "\n")
    written = [folder / name for name in
               ("sweep.csv", "sweep.json", "sweep_summary.csv", "sweep_summary.json",
                "speedup.csv", "utilization.csv", "utilization.json")]
    # each CSV as a paper prints it: LaTeX (booktabs) and Markdown beside it
    written += write_paper_tables(folder, rows, summaries, list(by_setup(rows).values()),
                                  utilization)
    if plots:
        from .plots import plot_sweep

        written += plot_sweep(rows, folder, target_loss, baseline, figures)
    return written


def _write_csv(path: Path, columns: list[str], rows: list[dict]):
    with replacing(path, "w", newline="") as f:
        writer = csv.DictWriter(f, columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
