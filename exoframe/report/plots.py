"""PNG plots of a sweep (matplotlib, the `plot` extra: pip install 'exoframe[plot]')."""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from ..errors import ExoframeError


def require_matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise ExoframeError("plots need matplotlib: pip install 'exoframe[plot]' (or run with "
                            "--no-plots).") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_sweep(rows: list[dict], folder: Path) -> list[Path]:
    plt = require_matplotlib()
    written = []
    for strategy, group in _by(rows, "strategy").items():
        path = folder / f"loss_vs_time_{strategy}.png"
        _loss_vs_time(plt, strategy, group, path)
        written.append(path)
    swept = [r for r in rows if r["bottleneck_bandwidth"] is not None]
    if len({r["bottleneck_bandwidth"] for r in swept}) > 1:
        for key, label, name in (
                ("simulated_seconds", "simulated time to finish (s)", "time_vs_bandwidth.png"),
                ("compute_utilization", "compute utilization (%)", "utilization_vs_bandwidth.png")):
            path = folder / name
            _versus_bandwidth(plt, swept, key, label, path)
            written.append(path)
    return written


def _loss_vs_time(plt, strategy, rows, path):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for row in sorted(rows, key=lambda r: -(r["bottleneck_bandwidth"] or math.inf)):  # fastest first
        times, losses = _smoothed(row["sim_times"], row["losses"])
        label = row["net"] + (f" (seed {row['seed']})" if row.get("seed") else "")
        ax.plot(times, losses, label=label, linewidth=1.4)
    ax.set_xscale("log")
    ax.set_xlabel("simulated wall-clock (s, log scale)")
    ax.set_ylabel("training loss (moving average)")
    ax.set_title(f"{strategy}: training loss versus simulated time")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(title="network", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _versus_bandwidth(plt, rows, key, label, path):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for strategy, group in _by(rows, "strategy").items():
        points = defaultdict(list)  # several seeds: plot their mean
        for r in group:
            if r[key] is not None:
                points[r["bottleneck_bandwidth"]].append(r[key])
        xs = sorted(points)
        ys = [sum(points[x]) / len(points[x]) * (100 if key == "compute_utilization" else 1)
              for x in xs]
        ax.plot([x * 8 / 1e6 for x in xs], ys, marker="o", label=strategy)
    ax.set_xscale("log")
    if key == "simulated_seconds":
        ax.set_yscale("log")
        plain = plt.FuncFormatter(lambda v, _: f"{v:g}")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
    else:
        ax.set_ylim(0, 100)
    ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("bottleneck bandwidth (Mbit/s, log scale)")
    ax.set_ylabel(label)
    ax.set_title(f"{label[0].upper()}{label[1:].split(' (')[0]} versus bandwidth")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(title="strategy")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _smoothed(times, losses, window: int = 10):
    out, acc = [], []
    for loss in losses:
        acc.append(loss)
        if len(acc) > window:
            acc.pop(0)
        out.append(sum(acc) / len(acc))
    return times, out


def _by(rows, key) -> dict:
    groups = defaultdict(list)
    for r in rows:
        groups[r[key]].append(r)
    return dict(groups)
