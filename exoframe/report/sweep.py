"""Tables and plots comparing strategies across networks, built from run folders.

Each run folder gives one row for the network it trained on (summary.json, metrics.jsonl)
and one per replay through another network (replays/*.json). Rows carry each step's
simulated time next to the run's losses, so loss can be drawn against simulated time.
Rows of the same strategy, network, simulated failures and projection (the seeds) are
summarized as a mean and a standard deviation per metric.
"""
from __future__ import annotations

import csv
import statistics
from pathlib import Path

from ..errors import ExoframeError
from ..files import replacing, write_atomic
from . import strict_json
from .setups import by_setup, row_order, setup_label
from .summary import LOW_UTILIZATION, format_bytes, format_seconds

COLUMNS = ["strategy", "seed", "net", "bottleneck_bandwidth", "faults", "projection",
           "simulated_seconds", "time_to_target", "compute_utilization", "bytes_sent_per_node",
           "final_loss", "final_val_loss", "failures", "lost_steps", "source", "run_dir"]
# Summarized over the seeds of each (strategy, net, faults, projection): <metric>_mean,
# <metric>_std.
METRICS = ["simulated_seconds", "time_to_target", "compute_utilization", "bytes_sent_per_node",
           "final_loss", "final_val_loss", "failures", "lost_steps"]
SUMMARY_COLUMNS = ["strategy", "net", "bottleneck_bandwidth", "faults", "projection", "seeds",
                   "seeds_at_target", *(f"{m}_{s}" for m in METRICS for s in ("mean", "std"))]


def collect_rows(run_dirs, target_loss: float | None = None) -> list[dict]:
    rows = []
    for run_dir in map(Path, run_dirs):
        try:
            rows += _rows_of(run_dir)
        except (KeyError, TypeError, IndexError) as e:
            raise ExoframeError(f"{run_dir}: a file of this run folder lacks or mangles "
                                f"{e.args[0] if isinstance(e, KeyError) else 'a field'!r}; "
                                "it is corrupt or from another tool: run it again.") from None
    for row in rows:
        row["target_loss"] = target_loss
        row["time_to_target"] = time_to_target(row, target_loss)
    return rows


def _rows_of(run_dir: Path) -> list[dict]:
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        raise ExoframeError(f"{run_dir}: not a run folder (no summary.json).")
    summary = _mapping(strict_json.load(summary_path, "summary"), summary_path)
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
            "faults": summary.get("faults", "none"),
            "failures": len(summary.get("failures", [])),
            "failed_at": [f["failed_at"] for f in summary.get("failures", [])],
            "lost_steps": summary.get("lost_steps", 0)}
    rows = [{**base, "net": summary["net"],
             "bottleneck_bandwidth": summary.get("bottleneck_bandwidth"),
             "projection": None, "simulated_seconds": summary["simulated_seconds"],
             "compute_utilization": summary["compute_utilization"],
             "bytes_sent_per_node": summary["bytes_sent_per_node"], "source": "run",
             "sim_times": [m["sim_time"] for m in metrics]}]
    for path in sorted((run_dir / "replays").glob("*.json")):
        replay = _mapping(strict_json.load(path, "replay"), path)
        rows.append({**base, **{k: replay[k] for k in (
            "net", "bottleneck_bandwidth", "projection", "simulated_seconds",
            "compute_utilization", "bytes_sent_per_node", "sim_times")}, "source": "replay"})
    return rows


def _mapping(value, path) -> dict:
    if not isinstance(value, dict):
        raise ExoframeError(f"{path}: expected a JSON object; the file is corrupt: run again.")
    return value


def time_to_target(row: dict, target: float | None) -> float | None:
    """Simulated time of the first step whose validation loss of the held model is at most
    `target`, on the row's network: a replay keeps the step and reads its own time for
    it. A sweep with a target validates every step (engine/target.py); for runs made
    without one, the time is only resolved to their evaluation steps."""
    if target is None:
        return None
    for loss, t in zip(row["val_losses"], row["sim_times"]):
        if loss is not None and loss <= target:
            return t
    return None


def summarize(rows: list[dict]) -> list[dict]:
    """One row per (strategy, net, faults, projection): `seeds` (how many rows it has), and each
    metric's mean and sample standard deviation over the rows where it is known (the std
    is None below two values). `seeds_at_target` counts the rows that reached the target
    loss (None without a target); the time-to-target statistics are over those rows."""
    summaries = []
    for (strategy, net, faults, projection), group in by_setup(rows).items():
        targeted = any(r.get("target_loss") is not None for r in group)
        summary = {"strategy": strategy, "net": net,
                   "bottleneck_bandwidth": group[0]["bottleneck_bandwidth"], "faults": faults,
                   "projection": projection, "seeds": len(group),
                   "seeds_at_target": sum(r["time_to_target"] is not None for r in group)
                   if targeted else None}
        for key in METRICS:
            values = [r.get(key) for r in group if r.get(key) is not None]
            summary[f"{key}_mean"] = statistics.mean(values) if values else None
            summary[f"{key}_std"] = statistics.stdev(values) if len(values) > 1 else None
        summaries.append(summary)
    return summaries


HEADERS = ["strategy", "network", "simulated time", "to target", "compute util.",
           "sent / node", "final val loss"]
TO_TARGET = HEADERS.index("to target")


def table(rows: list[dict]) -> str:
    """One line per row; with several seeds of a setup, one line per setup instead, each
    metric as mean ± standard deviation over its seeds. The "to target" column only with a
    target; below the table, what each strategy's validation loss is of."""
    summaries = summarize(rows)
    failures = any(r.get("faults", "none") != "none" for r in rows)
    extra = ["failures (node-steps lost)"] if failures else []
    targeted = any(r.get("target_loss") is not None for r in rows)
    if any(s["seeds"] > 1 for s in summaries):
        headers = [*HEADERS[:2], "seeds", *HEADERS[2:], *extra]
        lines = [_summary_line(s) + (_failure_cell(s, "_mean") if failures else [])
                 for s in summaries]
        column = TO_TARGET + 1
    else:
        headers = [*HEADERS, *extra]
        lines = [[
            r["strategy"] + (f" s{r['seed']}" if r.get("seed") else ""),
            setup_label(r),
            format_seconds(r["simulated_seconds"]),
            "-" if r["time_to_target"] is None else format_seconds(r["time_to_target"]),
            "-" if r["compute_utilization"] is None
            else f"{100 * r['compute_utilization']:.1f}%",
            format_bytes(r["bytes_sent_per_node"]),
            # a projection's times are for another model: the trained model's loss is not
            "-" if r["final_val_loss"] is None or r["projection"]
            else f"{r['final_val_loss']:.4f}",
            *(_failure_cell(r) if failures else [])]
            for r in sorted(rows, key=row_order)]
        column = TO_TARGET
    if targeted:
        target = _one(rows, "target_loss")
        headers[column] = f"to val loss {target:g}" if target is not None else "to target"
    else:
        headers.pop(column)
        for line in lines:
            line.pop(column)
    return "\n".join([_aligned(headers, lines), *validated_notes(rows)])


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


def _summary_line(s: dict) -> list[str]:
    def cell(key, fmt, fmt_std=None):
        mean, std = s[f"{key}_mean"], s[f"{key}_std"]
        if mean is None:
            return "-"
        if std is None or std <= 1e-9 * abs(mean):  # one seed, or float noise
            return fmt(mean)
        return f"{fmt(mean)} ± {(fmt_std or fmt)(std)}"

    to_target = cell("time_to_target", format_seconds, _duration)
    if to_target != "-" and s["seeds_at_target"] < s["seeds"]:
        to_target += f" ({s['seeds_at_target']}/{s['seeds']} seeds)"
    return [s["strategy"], setup_label(s),
            str(s["seeds"]), cell("simulated_seconds", format_seconds, _duration), to_target,
            cell("compute_utilization", lambda u: f"{100 * u:.1f}%"),
            cell("bytes_sent_per_node", format_bytes),
            "-" if s["projection"] else cell("final_val_loss", lambda x: f"{x:.4f}")]


def _duration(s: float) -> str:
    """format_seconds, and below a second in ms or µs (a spread is often that small)."""
    if s >= 1:
        return format_seconds(s)
    return f"{s * 1e3:.3g} ms" if s >= 1e-3 else f"{s * 1e6:.3g} µs"


def _aligned(headers: list[str], lines: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in column) for column in zip(headers, *lines)]
    return "\n".join("  " + "  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip()
                     for line in [headers, *lines])


def write_outputs(rows: list[dict], folder, plots: bool = True,
                  target_loss: float | None = None) -> list[Path]:
    """sweep.csv and sweep.json (one row per run and network), sweep_summary.csv and
    sweep_summary.json (one row per strategy, network and projection: mean and std over
    seeds) and (with matplotlib) the PNG plots in `folder`. `target_loss` draws a line on
    the loss plots; by default the one the rows were collected with."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rows = sorted(rows, key=row_order)
    with replacing(folder / "sweep.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    write_atomic(folder / "sweep.json", strict_json.dumps(rows, indent=1) + "\n")
    summaries = summarize(rows)
    with replacing(folder / "sweep_summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, SUMMARY_COLUMNS)
        writer.writeheader()
        writer.writerows(summaries)
    write_atomic(folder / "sweep_summary.json", strict_json.dumps(summaries, indent=1) + "\n")
    written = [folder / name for name in
               ("sweep.csv", "sweep.json", "sweep_summary.csv", "sweep_summary.json")]
    if plots:
        from .plots import plot_sweep

        written += plot_sweep(rows, folder, target_loss)
    return written
