"""Tables and plots comparing strategies across networks, built from run folders.

Each run folder gives one row for the network it trained on (summary.json, metrics.jsonl)
and one per replay through another network (replays/*.json). Rows carry each step's
simulated time next to the run's losses, so loss can be drawn against simulated time.
"""
from __future__ import annotations

import csv
import math
from pathlib import Path

from ..errors import ExoframeError
from . import strict_json
from .summary import format_bytes, format_seconds

COLUMNS = ["strategy", "seed", "net", "bottleneck_bandwidth", "projection", "simulated_seconds",
           "time_to_target", "compute_utilization", "bytes_sent_per_node", "final_loss",
           "final_val_loss", "source", "run_dir"]


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
            "run_dir": str(run_dir), "losses": [m["loss"] for m in metrics],
            "val_losses": [m.get("val_loss") for m in metrics]}
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
    """Simulated time of the first step whose validation loss of the averaged model is at
    most `target`, on the row's network: a replay keeps the step and reads its own time for
    it. A sweep with a target validates every step (engine/target.py); for runs made
    without one, the time is only resolved to their evaluation steps."""
    if target is None:
        return None
    for loss, t in zip(row["val_losses"], row["sim_times"]):
        if loss is not None and loss <= target:
            return t
    return None


def table(rows: list[dict]) -> str:
    headers = ["strategy", "network", "simulated time",
               "to target (val loss, averaged model)", "compute util.", "sent / node",
               "final loss"]
    lines = [[r["strategy"] + (f" s{r['seed']}" if r.get("seed") else ""),
              r["net"] + (f" [{r['projection']}]" if r["projection"] else ""),
              format_seconds(r["simulated_seconds"]),
              "-" if r["time_to_target"] is None else format_seconds(r["time_to_target"]),
              "-" if r["compute_utilization"] is None else f"{100 * r['compute_utilization']:.1f}%",
              format_bytes(r["bytes_sent_per_node"]),
              # a projection's times are for another model: the trained model's loss is not
              "-" if r["final_val_loss"] is None or r["projection"] else f"{r['final_val_loss']:.4f}"]
             for r in sorted(rows, key=_order)]
    widths = [max(len(str(x)) for x in column) for column in zip(headers, *lines)]
    return "\n".join("  " + "  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip()
                     for line in [headers, *lines])


def write_outputs(rows: list[dict], folder, plots: bool = True) -> list[Path]:
    """sweep.csv, sweep.json and (with matplotlib) the PNG plots in `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rows = sorted(rows, key=_order)
    with open(folder / "sweep.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    (folder / "sweep.json").write_text(strict_json.dumps(rows, indent=1) + "\n")
    written = [folder / "sweep.csv", folder / "sweep.json"]
    if plots:
        from .plots import plot_sweep

        written += plot_sweep(rows, folder)
    return written


def _order(row):
    bandwidth = row["bottleneck_bandwidth"]
    return (row["strategy"], row.get("seed") or 0,
            -(bandwidth if bandwidth is not None else math.inf), row["net"])
