"""PNG plots of a sweep (matplotlib, the `plot` extra: pip install 'exoframe[plot]').

Seeds of one setup (strategy, network, projection) are drawn as one line, their mean, in a
shaded band from their minimum to their maximum. Legends sit to the right of the axes;
titles give the runs' nodes, model size, compute model or projection (plot_style.py).
Validation losses are of the model each strategy holds (summary.json's validated_model).
"""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from ..errors import ExoframeError
from ..files import replacing
from .plot_style import (common, file_name, line_styles, readable_log_axis, seeds_note,
                         smoothed, smoothing_label, smoothing_window, time_label, title)
from .setups import by_setup, setup_label


def require_matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise ExoframeError("plots need matplotlib: pip install 'exoframe[plot]' (or run with "
                            "--no-plots).") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_sweep(rows: list[dict], folder, target_loss: float | None = None) -> list:
    """loss_vs_time_<strategy>.png (training loss, one line per network),
    compare_<network>.png (training loss, one line per strategy), val_loss_<network>.png
    (validation loss of the held model, one line per strategy), loss_vs_bytes.png, and for a
    sweep over several bandwidths time_vs_bandwidth.png, utilization_vs_bandwidth.png and
    (with a target) time_to_target_vs_bandwidth.png, one line per strategy. `target_loss`
    defaults to the one the rows were collected with."""
    plt = require_matplotlib()
    if target_loss is None:
        target_loss = common(rows, "target_loss")
    written, names = [], set()

    def save_as(prefix, name=None):
        path = folder / (file_name(prefix, name, names) if name is not None
                         else _claim(f"{prefix}.png", names))
        written.append(path)
        return path

    for strategy, group in _by(rows, "strategy").items():
        _loss_vs_time(plt, group, save_as("loss_vs_time", strategy),
                      f"{strategy}: training loss versus simulated time", _net_label,
                      "network", target_loss)
    for group in _by(rows, lambda r: (r["net"], r.get("faults"), r["projection"])).values():
        label = _net_label(group[0])
        _loss_vs_time(plt, group, save_as("compare", label),
                      f"{label}: training loss of each strategy", lambda r: r["strategy"],
                      "strategy", target_loss)
        if any(v is not None for r in group for v in r["val_losses"]) and not label_projected(
                group):
            _loss_vs_time(plt, group, save_as("val_loss", label),
                          f"{label}: validation loss of each strategy's held model",
                          lambda r: r["strategy"], "strategy", target_loss, validation=True)
    trained = [r for r in rows if r["source"] == "run" and r.get("bytes_sent")]
    if any(v is not None for r in trained for v in r["val_losses"]):
        _loss_vs_bytes(plt, trained, save_as("loss_vs_bytes"), target_loss)
    swept = [r for r in rows if r["bottleneck_bandwidth"] is not None]
    if len({r["bottleneck_bandwidth"] for r in swept}) > 1:
        plots = [("simulated_seconds", "simulated time to finish (s)", "time_vs_bandwidth"),
                 ("compute_utilization", "compute utilization (%)", "utilization_vs_bandwidth")]
        if target_loss is not None:
            plots.append(("time_to_target", f"simulated time to val loss {target_loss:g} (s)",
                          "time_to_target_vs_bandwidth"))
        for key, label, name in plots:
            _versus_bandwidth(plt, swept, key, label, save_as(name))
    return written


def label_projected(rows) -> bool:
    """A projection's times are for another model: the trained model's losses are not."""
    return any(r["projection"] for r in rows)


def _loss_vs_time(plt, rows, path, what, label_of, legend_title, target_loss,
                  validation=False):
    """One line per setup in `rows`, labelled by label_of(its first row); fastest network
    first. Training loss smoothed (the window stated), or the validation loss as validated."""
    setups = sorted(by_setup(rows).values(),
                    key=lambda g: (-(g[0]["bottleneck_bandwidth"] or math.inf), label_of(g[0])))
    steps = max(len(r["losses"]) for r in rows)
    window = 1 if validation else smoothing_window(steps)
    label, unit = time_label([r["sim_times"][-1] for r in rows if r["sim_times"]])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    shown = []
    for group, style in zip(setups, line_styles(len(setups))):
        times, mean, low, high = _mean_curve(group, window, validation)
        times = [t / unit for t in times]
        shown += times
        ax.plot(times, mean, label=label_of(group[0]), linewidth=1.4,
                # a validated model's loss holds until the next validation (DiLoCo's
                # between its outer steps)
                **({"marker": ".", "markersize": 3, "drawstyle": "steps-post"}
                   if validation else {}), **style)
        if len(group) > 1:
            ax.fill_between(times, low, high, color=style["color"], alpha=0.15, linewidth=0,
                            step="post" if validation else None)
        if not validation:
            _failure_marks(ax, group, style["color"], window, unit)
    _reference_lines(ax, rows, target_loss)
    ax.set_xscale("log")
    positive = [t for t in shown if t > 0]
    if positive:
        readable_log_axis(ax.xaxis, min(positive), max(positive))
    ax.set_xlabel(label)
    ax.set_ylabel("validation loss (held model)" if validation
                  else f"training loss ({smoothing_label(window)})")
    ax.set_title(title(what, rows, seeds_note([len(g) for g in setups])), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    _save(plt, fig, ax, path, legend_title)


def _failure_marks(ax, group, colour, window, unit):
    """An x on each run's curve where a node failed (simulated failures); a failure before
    the first step's end or after the last is marked at that end."""
    for row in group:
        times = row["sim_times"]
        if not times or not row.get("failed_at"):
            continue
        losses = smoothed([math.nan if x is None else x for x in row["losses"]], window)
        at = [min(max(t, times[0]), times[-1]) for t in row["failed_at"]]
        ax.plot([t / unit for t in at], [_at(times, losses, t) for t in at], "x",
                color=colour, markersize=7, markeredgewidth=1.5)


def _at(times, values, t):
    """values at the first time at or after t."""
    return next((v for s, v in zip(times, values) if s >= t), values[-1])


def _reference_lines(ax, rows, target_loss):
    best = common(rows, "best_achievable_loss")
    if target_loss is not None:
        ax.axhline(target_loss, color="black", linestyle="--", linewidth=1,
                   label=f"target {target_loss:g} (val loss)")
    if best is not None:
        ax.axhline(best, color="black", linestyle=":", linewidth=1,
                   label=f"best achievable {best:.4g}")


def _loss_vs_bytes(plt, rows, path, target_loss):
    """Validation loss of the held model against the bytes each node has sent, one line per
    strategy (and network, where a strategy trained on several)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    groups = _by(rows, lambda r: (r["strategy"], r["net"], r.get("faults")))
    nets_of = defaultdict(set)
    for strategy, net, _ in groups:
        nets_of[strategy].add(net)
    for ((strategy, net, _), group), style in zip(groups.items(), line_styles(len(groups))):
        points = defaultdict(list)  # step -> (bytes, loss) of each seed
        for r in group:
            for i, (sent, loss) in enumerate(zip(r["bytes_sent"], r["val_losses"])):
                if loss is not None and sent is not None:
                    points[i].append((sent, loss))
        steps = [i for i in sorted(points) if len(points[i]) == len(group)]
        xs = [sum(b for b, _ in points[i]) / len(group) / 1e6 for i in steps]
        ys = [sum(v for _, v in points[i]) / len(group) for i in steps]
        label = strategy + (f" on {_net_label(group[0])}" if len(nets_of[strategy]) > 1 else "")
        ax.plot(xs, ys, label=label, marker=".", markersize=3, linewidth=1.4,
                drawstyle="steps-post", **style)
    _reference_lines(ax, rows, target_loss)
    ax.set_xlabel("bytes sent per node (MB)")
    ax.set_ylabel("validation loss (held model)")
    ax.set_title(title("Validation loss versus bytes sent per node", rows,
                       seeds_note([len(g) for g in groups.values()])), fontsize=10)
    ax.grid(True, alpha=0.3)
    _save(plt, fig, ax, path, "strategy")


def _versus_bandwidth(plt, rows, key, label, path):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    scale = 100 if key == "compute_utilization" else 1
    strategies = _by(rows, "strategy")
    counts, values = [], []
    for (strategy, group), style in zip(strategies.items(), line_styles(len(strategies))):
        points = defaultdict(list)  # bandwidth -> the seeds' values
        for r in group:
            if r[key] is not None:
                points[r["bottleneck_bandwidth"]].append(r[key] * scale)
        xs = sorted(points)
        mbits = [x * 8 / 1e6 for x in xs]
        ax.plot(mbits, [sum(points[x]) / len(points[x]) for x in xs], label=strategy,
                **{"marker": "o", **style})
        if any(len(points[x]) > 1 for x in xs):
            ax.fill_between(mbits, [min(points[x]) for x in xs], [max(points[x]) for x in xs],
                            color=style["color"], alpha=0.15, linewidth=0)
        counts += [len(v) for v in points.values()]
        values += [v for vs in points.values() for v in vs]
    bandwidths = [r["bottleneck_bandwidth"] * 8 / 1e6 for r in rows]
    ax.set_xscale("log")
    readable_log_axis(ax.xaxis, min(bandwidths), max(bandwidths))
    positive = [v for v in values if v > 0]
    if key != "compute_utilization" and positive:
        ax.set_yscale("log")
        readable_log_axis(ax.yaxis, min(positive), max(positive))
    elif key == "compute_utilization":
        ax.set_ylim(0, 105)  # room for the markers at 100%
    ax.set_xlabel("bottleneck bandwidth (Mbit/s, log scale)")
    ax.set_ylabel(label)
    # several networks of one bandwidth (presets, not a --bandwidth grid) share a point
    shared = any(len({r["net"] for r in group}) > 1
                 for group in _by(rows, "bottleneck_bandwidth").values())
    what = f"{label[0].upper()}{label[1:].split(' (')[0]} versus bandwidth"
    ax.set_title(title(what, rows, seeds_note(
        counts, "runs (seeds, networks of equal bandwidth)" if shared else "seeds")),
        fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    _save(plt, fig, ax, path, "strategy")


def _save(plt, fig, ax, path, legend_title):
    entries = len(ax.get_legend_handles_labels()[0])
    ax.legend(title=legend_title, fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1),
              borderaxespad=0, ncol=1 + (entries - 1) // 25)
    # "tight" grows the saved image to take in the legend beside the axes
    with replacing(path, "wb") as f:
        fig.savefig(f, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)


def _mean_curve(rows, window: int, validation: bool = False):
    """Step by step over the rows (seeds): their mean time, and the mean, minimum and
    maximum of their (smoothed) training losses, up to the shortest run (a run stopped at
    the target loss ends early). A diverged (None) loss is NaN, a gap in the line. With
    `validation`, the validation losses at the steps every seed validated."""
    n = min(len(r["sim_times"]) for r in rows)
    if validation:
        steps = [i for i in range(n) if all(r["val_losses"][i] is not None for r in rows)]
        curves = [[r["val_losses"][i] for i in steps] for r in rows]
    else:
        steps = list(range(n))
        curves = [smoothed([math.nan if x is None else x for x in r["losses"]], window)
                  for r in rows]
    times = [sum(r["sim_times"][i] for r in rows) / len(rows) for i in steps]
    at = [[c[j] for c in curves] for j in range(len(steps))]
    return (times, [sum(s) / len(s) for s in at], [min(s) for s in at], [max(s) for s in at])


def _net_label(row) -> str:
    """The network's name (a YAML file's stem), its simulated failures and the projection,
    where there are any."""
    net = row["net"]
    if net.endswith((".yaml", ".yml")):
        net = Path(net).stem
    return setup_label({**row, "net": net})


def _claim(name: str, taken: set) -> str:
    taken.add(name)
    return name


def _by(rows, key) -> dict:
    """Rows grouped by the value of `key`, or of key(row) if it is callable."""
    groups = defaultdict(list)
    for r in rows:
        groups[key(r) if callable(key) else r[key]].append(r)
    return dict(groups)
