"""PNG plots of a sweep (matplotlib, the `plot` extra: pip install 'exoframe[plot]').

Seeds of one setup (strategy, network, projection) are drawn as one line, their mean, in a
shaded band from their minimum to their maximum. Legends sit to the right of the axes.
"""
from __future__ import annotations

import math
import re
from collections import defaultdict
from pathlib import Path

from ..errors import ExoframeError
from .sweep import by_setup, setup_label

COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf"]  # tab10
DASHES = ["-", "--", ":", "-."]
MARKERS = ["o", "s", "^", "v", "D", "x", "+"]


def require_matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise ExoframeError("plots need matplotlib: pip install 'exoframe[plot]' (or run with "
                            "--no-plots).") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def line_styles(k: int) -> list[dict]:
    """Keyword arguments for ax.plot giving k lines that look different: unique (colour,
    line style) up to 40 lines, unique with markers up to 320. Neighbours differ in line
    style too, so that lines drawn on top of each other (networks fast enough to give the
    same curve) still show through."""
    styles = []
    for i in range(k):
        # colour i % 10 with line style (i + i // 10) % 4: i, i+10, i+20, i+30 differ in style
        style = {"color": COLOURS[i % len(COLOURS)],
                 "linestyle": DASHES[(i + i // len(COLOURS)) % len(DASHES)]}
        rank = i // (len(COLOURS) * len(DASHES))
        if rank:
            style.update(marker=MARKERS[(rank - 1) % len(MARKERS)], markevery=0.1, markersize=4)
        styles.append(style)
    return styles


def plot_sweep(rows: list[dict], folder: Path, target_loss: float | None = None) -> list[Path]:
    """loss_vs_time_<strategy>.png (one line per network), compare_<network>.png (one line
    per strategy) and, for a sweep over several bandwidths, time_vs_bandwidth.png and
    utilization_vs_bandwidth.png (one line per strategy). `target_loss` defaults to the one
    the rows were collected with."""
    plt = require_matplotlib()
    if target_loss is None:
        target_loss = _common(rows, "target_loss")
    written, names = [], set()
    for strategy, group in _by(rows, "strategy").items():
        path = folder / _file_name("loss_vs_time", strategy, names)
        _loss_vs_time(plt, group, path, f"{strategy}: training loss versus simulated time",
                      _net_label, "network", target_loss)
        written.append(path)
    for group in _by(rows, lambda r: (r["net"], r.get("faults"), r["projection"])).values():
        label = _net_label(group[0])
        path = folder / _file_name("compare", label, names)
        _loss_vs_time(plt, group, path, f"{label}: training loss of each strategy",
                      lambda r: r["strategy"], "strategy", target_loss)
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


def _loss_vs_time(plt, rows, path, title, label_of, legend_title, target_loss):
    """One line per setup in `rows`, labelled by label_of(its first row); fastest network
    first."""
    setups = sorted(by_setup(rows).values(),
                    key=lambda g: (-(g[0]["bottleneck_bandwidth"] or math.inf), label_of(g[0])))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for group, style in zip(setups, line_styles(len(setups))):
        times, mean, low, high = _mean_curve(group)
        ax.plot(times, mean, label=label_of(group[0]), linewidth=1.4, **style)
        if len(group) > 1:
            ax.fill_between(times, low, high, color=style["color"], alpha=0.15, linewidth=0)
        _failure_marks(ax, group, style["color"])
    _reference_lines(ax, rows, target_loss)
    ax.set_xscale("log")
    ax.set_xlabel("simulated wall-clock (s, log scale)")
    ax.set_ylabel("training loss (moving average)")
    ax.set_title(title + _seeds_note([len(g) for g in setups]))
    ax.grid(True, which="both", alpha=0.3)
    _save(plt, fig, ax, path, legend_title)


def _failure_marks(ax, group, colour):
    """An x on each run's curve where a node failed (simulated failures)."""
    for row in group:
        failed = [t for t in row.get("failed_at", []) if row["sim_times"]
                  and row["sim_times"][0] <= t <= row["sim_times"][-1]]
        if failed:
            losses = _smoothed([math.nan if x is None else x for x in row["losses"]])
            ax.plot(failed, [_at(row["sim_times"], losses, t) for t in failed], "x",
                    color=colour, markersize=7, markeredgewidth=1.5)


def _at(times, values, t):
    """values at the first time at or after t."""
    return next((v for s, v in zip(times, values) if s >= t), values[-1])


def _reference_lines(ax, rows, target_loss):
    best = _common(rows, "best_achievable_loss")
    if target_loss is not None:
        ax.axhline(target_loss, color="black", linestyle="--", linewidth=1,
                   label=f"target {target_loss:g} (val loss)")
    if best is not None:
        ax.axhline(best, color="black", linestyle=":", linewidth=1,
                   label=f"best achievable {best:.4g}")


def _versus_bandwidth(plt, rows, key, label, path):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    scale = 100 if key == "compute_utilization" else 1
    strategies = _by(rows, "strategy")
    counts = []
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
    ax.set_xscale("log")
    if key == "simulated_seconds":
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
        # label 2 and 5 between the powers of ten: every minor tick's label would overlap
        ax.yaxis.set_minor_formatter(plt.FuncFormatter(
            lambda v, _: f"{v:g}" if round(v / 10 ** math.floor(math.log10(v))) in (2, 5) else ""))
    else:
        ax.set_ylim(0, 105)  # room for the markers at 100%
    ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("bottleneck bandwidth (Mbit/s, log scale)")
    ax.set_ylabel(label)
    # several networks of one bandwidth (presets, not a --bandwidth grid) share a point
    shared = any(len({r["net"] for r in group}) > 1
                 for group in _by(rows, "bottleneck_bandwidth").values())
    ax.set_title(f"{label[0].upper()}{label[1:].split(' (')[0]} versus bandwidth" + _seeds_note(
        counts, "runs (seeds, networks of equal bandwidth)" if shared else "seeds"))
    ax.grid(True, which="both", alpha=0.3)
    _save(plt, fig, ax, path, "strategy")


def _save(plt, fig, ax, path, legend_title):
    entries = len(ax.get_legend_handles_labels()[0])
    ax.legend(title=legend_title, fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1),
              borderaxespad=0, ncol=1 + (entries - 1) // 25)
    # "tight" grows the saved image to take in the legend beside the axes
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def _seeds_note(counts: list[int], what: str = "seeds") -> str:
    """How several seeds are drawn, for the title; nothing for one seed each."""
    if not counts or max(counts) < 2:
        return ""
    n = str(max(counts)) if min(counts) == max(counts) else f"{min(counts)}–{max(counts)}"
    return f"\nmean of {n} {what}; shaded: their min to max"


def _mean_curve(rows):
    """Step by step over the rows (seeds): their mean time, and the mean, minimum and
    maximum of their smoothed losses, up to the shortest run (a run stopped at the target
    loss ends early). A diverged (None) loss is NaN, a gap in the line."""
    curves = [_smoothed([math.nan if x is None else x for x in r["losses"]]) for r in rows]
    n = min(min(len(c), len(r["sim_times"])) for c, r in zip(curves, rows))
    times = [sum(r["sim_times"][i] for r in rows) / len(rows) for i in range(n)]
    steps = [[c[i] for c in curves] for i in range(n)]
    return (times, [sum(s) / len(s) for s in steps], [min(s) for s in steps],
            [max(s) for s in steps])


def _smoothed(losses, window: int = 10):
    out, acc = [], []
    for loss in losses:
        acc.append(loss)
        if len(acc) > window:
            acc.pop(0)
        out.append(sum(acc) / len(acc))
    return out


def _net_label(row) -> str:
    """The network's name (a YAML file's stem), its simulated failures and the projection,
    where there are any."""
    net = row["net"]
    if net.endswith((".yaml", ".yml")):
        net = Path(net).stem
    return setup_label({**row, "net": net})


def _file_name(prefix: str, name: str, taken: set) -> str:
    """prefix_name.png with only letters, digits, '.', '-' and '_' from the name, unique
    among `taken` (to which it is added)."""
    safe = re.sub(r"[^A-Za-z0-9.-]+", "_", name).strip("._")[:80] or "unnamed"
    stem, i = f"{prefix}_{safe}", 1
    while f"{stem}.png" in taken:
        i += 1
        stem = f"{prefix}_{safe}_{i}"
    taken.add(f"{stem}.png")
    return f"{stem}.png"


def _common(rows, key):
    """The rows' one value of `key`, else None (absent, or not the same in every row)."""
    values = {r.get(key) for r in rows}
    return values.pop() if len(values) == 1 else None


def _by(rows, key) -> dict:
    """Rows grouped by the value of `key`, or of key(row) if it is callable."""
    groups = defaultdict(list)
    for r in rows:
        groups[key(r) if callable(key) else r[key]].append(r)
    return dict(groups)
