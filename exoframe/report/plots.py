"""Plots of a sweep or a report (matplotlib, the `plot` extra: pip install 'exoframe[plot]'),
as PNG, PDF or SVG (plot_style.Figures).

Seeds of one setup (groups.py: its whole setting but the seed) are drawn as one line, their
mean, in a shaded band from their minimum to their maximum from MIN_BAND_SEEDS seeds, else
with each seed as a thin line. Lines are named as a reader names them (labels.py): the
strategy with the parameters that differ between setups ("diloco (H=20)"), the network by
its bandwidth and latency ("100 Mbit/s, 25 ms"); each strategy and network keeps one style
in every figure of a report, and every time is in the report's one unit. Every training
loss is smoothed by the one window of the report. A curve that stopped at the target loss
ends in a star. Legends sit to the right of the axes and name every marker; titles (in a
paper's style, a caption file beside the figure instead) give the runs' nodes, model
size, compute model or projection. Validation losses are of the model each strategy holds
(summary.json's validated_model).
"""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from ..errors import ExoframeError
from ..files import replacing, write_atomic
from ..sim.network.units import format_duration
from .compare import with_speedups
from .labels import label_keys, network_label, network_names, strategy_label
from .plot_style import (MIN_BAND_SEEDS, SAVE_RC, Figures, Look, Styles, common, file_name,
                         readable_log_axis, seeds_note, smoothed, smoothing_label,
                         smoothing_window, time_unit, title)
from .setups import by_setup, row_order, setup_label

STOPPED = {"marker": "*", "markersize": 10, "linestyle": "none", "markeredgewidth": 0.5}


def require_matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise ExoframeError("plots need matplotlib: pip install 'exoframe[plot]' (or run with "
                            "--no-plots).") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_sweep(rows: list[dict], folder, target_loss: float | None = None,
               baseline: str | None = None, figures: Figures | None = None) -> list:
    """loss_vs_time_<strategy> (training loss, one line per network), compare_<network>
    (training loss, one line per strategy), val_loss_<network> (validation loss of the held
    model, one line per strategy), loss_vs_bytes, speedup_vs_bandwidth (with several
    strategies: each one's speed-up over `baseline`), and for a sweep over several
    bandwidths time_vs_bandwidth, utilization_vs_bandwidth and (with a target)
    time_to_target_vs_bandwidth, one line per strategy; each in every format `figures`
    asks for. `target_loss` defaults to the one the rows were collected with."""
    plt = require_matplotlib()
    figures = figures or Figures()
    if target_loss is None:
        target_loss = common(rows, "target_loss")
    keys, names = label_keys(rows), network_names(rows)
    rows = sorted(rows, key=row_order)
    rows = [{**r, "label": strategy_label(r, keys), "net_label": network_label(r, names)}
            for r in rows]
    unit = time_unit([r["simulated_seconds"] for r in rows])
    look = Look(unit, Styles(r["label"] for r in rows),
                Styles(r["net_label"] for r in sorted(
                    rows, key=lambda r: -(r["bottleneck_bandwidth"] or math.inf))),
                smoothing_window(max(len(r["losses"]) for r in rows)), target_loss)
    written, files = [], set()

    def save(drawn, prefix, name=None):
        path = folder / (file_name(prefix, name, files) if name is not None
                         else _claim(f"{prefix}.png", files))
        written.extend(path.with_suffix(f".{f}") for f in figures.formats)
        if figures.paper:
            written.append(caption_path(path))
        _save(plt, *drawn[:2], path, drawn[2], figures)

    for strategy, group in _by(rows, "strategy").items():
        # a line per network, and per value of the parameters that differ (diloco's H)
        several = len({r["label"] for r in group}) > 1
        group = [{**r, "line": r["net_label"] + (
            r["label"][len(strategy):] if several else "")} for r in group]
        save(_loss_vs_time(plt, group, f"{strategy}: training loss versus simulated time",
                           "line", "network", look), "loss_vs_time", strategy)
    for group in _by(rows, lambda r: (r["net"], r.get("faults"), r["projection"])).values():
        label, name = group[0]["net_label"], _file_label(group[0])
        save(_loss_vs_time(plt, group, f"{label}: training loss of each strategy", "label",
                           "strategy", look), "compare", name)
        if any(v is not None for r in group for v in r["val_losses"]) and not label_projected(
                group):
            save(_loss_vs_time(plt, group,
                               f"{label}: validation loss of each strategy's held model",
                               "label", "strategy", look, validation=True), "val_loss", name)
    trained = [r for r in rows if r["source"] == "run" and r.get("bytes_sent")]
    if any(v is not None for r in trained for v in r["val_losses"]):
        save(_loss_vs_bytes(plt, trained, look), "loss_vs_bytes")
    swept = [r for r in rows if r["bottleneck_bandwidth"] is not None]
    compared = [r for r in with_speedups(swept, baseline)
                if r["speedup"] is not None and r["strategy"] != baseline]
    if compared:
        fig, ax, legend = _versus_bandwidth(plt, compared, "speedup",
                                            f"speed-up over {baseline} (×)", look)
        ax.axhline(1, color="black", linestyle="--", linewidth=1, label=f"{baseline} (1×)")
        save((fig, ax, legend), "speedup_vs_bandwidth")
    if len({r["bottleneck_bandwidth"] for r in swept}) > 1:
        plots = [("simulated_seconds", f"simulated time to finish ({unit[0]})",
                  "time_vs_bandwidth"),
                 ("compute_utilization", "compute utilization (%)", "utilization_vs_bandwidth")]
        if target_loss is not None:
            plots.append(("time_to_target",
                          f"simulated time to val loss {target_loss:g} ({unit[0]})",
                          "time_to_target_vs_bandwidth"))
        for key, label, name in plots:
            save(_versus_bandwidth(plt, swept, key, label, look), name)
    return written


def caption_path(path: Path) -> Path:
    """Where a paper-style figure's caption goes: <figure>.caption.txt beside it."""
    return path.parent / f"{path.stem}.caption.txt"


def label_projected(rows) -> bool:
    """A projection's times are for another model: the trained model's losses are not."""
    return any(r["projection"] for r in rows)


def _loss_vs_time(plt, rows, what, label_key, legend_title, look: Look, validation=False):
    """One line per setup in `rows`, labelled by its `label_key` ("label": its strategy's,
    "line": its network's, with the parameters that differ); fastest network first.
    Training loss smoothed over the report's window (stated), or the validation loss as
    validated."""
    window = 1 if validation else look.window
    setups = sorted(by_setup(rows).values(),
                    key=lambda g: (-(g[0]["bottleneck_bandwidth"] or math.inf), g[0][label_key]))
    unit, per = look.unit
    fig, ax = plt.subplots(figsize=(7, 4.5))
    shown, stopped = [], []
    styles = look.styles(label_key, [g[0][label_key] for g in setups])
    for group, style in zip(setups, styles):
        times, mean, low, high = _mean_curve(group, window, validation)
        times = [t / per for t in times]
        shown += times
        ax.plot(times, mean, label=group[0][label_key], linewidth=1.4,
                # a validated model's loss holds until the next validation (DiLoCo's
                # between its outer steps)
                **({"marker": ".", "markersize": 3, "drawstyle": "steps-post"}
                   if validation else {}), **style)
        if len(group) >= MIN_BAND_SEEDS:
            ax.fill_between(times, low, high, color=style["color"], alpha=0.2, linewidth=0,
                            step="post" if validation else None)
        elif len(group) > 1:
            for row in group:
                seed_times, seed_losses = _mean_curve([row], window, validation)[:2]
                ax.plot([t / per for t in seed_times], seed_losses, color=style["color"],
                        linewidth=0.6, alpha=0.6, label="_seed",
                        drawstyle="steps-post" if validation else "default")
        if _stopped_at_target(group) and times:
            ax.plot(times[-1:], mean[-1:], color=style["color"], label="_stopped", **STOPPED)
            stopped += group
        if not validation:
            _failure_marks(ax, group, style["color"], window, per)
    if not validation and any(r.get("failed_at") for r in rows):
        ax.plot([], [], "x", color="black", markersize=7, markeredgewidth=1.5,
                label="node failure")
    note = _stopped_legend(ax, stopped, look.target)
    _reference_lines(ax, rows, look.target)
    ax.set_xscale("log")
    positive = [t for t in shown if t > 0]
    if positive:
        readable_log_axis(ax.xaxis, min(positive), max(positive))
    ax.set_xlabel(f"simulated wall-clock ({unit}, log scale)")
    ax.set_ylabel("validation loss (held model)" if validation
                  else f"training loss ({smoothing_label(window)})")
    ax.set_title(title(what, rows, _notes(seeds_note([len(g) for g in setups]), note)),
                 fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    return fig, ax, legend_title


def _stopped_at_target(group) -> bool:
    """The setup's curve (up to its shortest seed) ends where that run stopped at the
    target loss."""
    shortest = min(group, key=lambda r: len(r["sim_times"]))
    return shortest.get("stopped_by") == "target_loss"


def _stopped_legend(ax, stopped: list, target) -> str:
    """A legend entry for the star that ends a curve stopped at the target, and what the
    title (caption) says of it; `stopped`: the rows of the runs that stopped (their target
    as they ran, where the report was given none)."""
    if not stopped:
        return ""
    ax.plot([], [], color="black", label="stopped at the target", **STOPPED)
    if target is None:
        target = common([r.get("config", {}) for r in stopped], "target_loss")
    at = f" (val loss {target:g})" if target is not None else ""
    return f"a star ends each curve whose run stopped at the target{at}"


def _notes(*notes: str) -> str:
    return "; ".join(n for n in notes if n)


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


def _loss_vs_bytes(plt, rows, look: Look):
    """Validation loss of the held model against the bytes each node has sent, one line per
    strategy (and network, where a strategy trained on several); on a log axis where the
    bytes span more than a decade (points before the first byte sent left out there)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    groups = _by(rows, lambda r: (r["label"], r["net_label"]))
    nets_of = defaultdict(set)
    for label, net in groups:
        nets_of[label].add(net)
    names = [label + (f" on {net}" if len(nets_of[label]) > 1 else "") for label, net in groups]
    lines, stopped = [], []
    for group, name, style in zip(groups.values(), names,
                                  look.strategies.for_lines([k[0] for k in groups])):
        points = defaultdict(list)  # step -> (bytes, loss) of each seed
        for r in group:
            for i, (sent, loss) in enumerate(zip(r["bytes_sent"], r["val_losses"])):
                if loss is not None and sent is not None:
                    points[i].append((sent, loss))
        steps = [i for i in sorted(points) if len(points[i]) == len(group)]
        xs = [sum(b for b, _ in points[i]) / len(group) / 1e6 for i in steps]
        ys = [sum(v for _, v in points[i]) / len(group) for i in steps]
        lines.append((xs, ys, name, style, group if _stopped_at_target(group) else []))
    positive = [x for xs, *_ in lines for x in xs if x > 0]
    log = bool(positive) and max(positive) > 10 * min(positive)
    for xs, ys, name, style, ends in lines:
        if log:
            ys = [y for x, y in zip(xs, ys) if x > 0]
            xs = [x for x in xs if x > 0]
        ax.plot(xs, ys, label=name, marker=".", markersize=3, linewidth=1.4,
                drawstyle="steps-post", **style)
        if ends and xs:
            ax.plot(xs[-1:], ys[-1:], color=style["color"], label="_stopped", **STOPPED)
            stopped += ends
    note = _stopped_legend(ax, stopped, look.target)
    _reference_lines(ax, rows, look.target)
    if log:
        ax.set_xscale("log")
        readable_log_axis(ax.xaxis, min(positive), max(positive))
    ax.set_xlabel("bytes sent per node (MB" + (", log scale; before any byte sent: not shown)"
                                                if log else ")"))
    ax.set_ylabel("validation loss (held model)")
    ax.set_title(title("Validation loss versus bytes sent per node", rows,
                       _notes(seeds_note([len(g) for g in groups.values()]), note)),
                 fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    return fig, ax, "strategy"


def _versus_bandwidth(plt, rows, key, label, look: Look):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    # utilization in %, times in the report's unit
    scale = 100 if key == "compute_utilization" else 1 / look.unit[1] if key in (
        "simulated_seconds", "time_to_target") else 1
    strategies = _by(rows, "label")
    counts, values = [], []
    for (strategy, group), style in zip(strategies.items(),
                                        look.strategies.for_lines(list(strategies))):
        points = defaultdict(list)  # bandwidth -> the seeds' values
        for r in group:
            if r[key] is not None:
                points[r["bottleneck_bandwidth"]].append(r[key] * scale)
        xs = sorted(points)
        mbits = [x * 8 / 1e6 for x in xs]
        ax.plot(mbits, [sum(points[x]) / len(points[x]) for x in xs], label=strategy,
                **{"marker": "o", **style})
        if all(len(points[x]) >= MIN_BAND_SEEDS for x in xs):
            ax.fill_between(mbits, [min(points[x]) for x in xs], [max(points[x]) for x in xs],
                            color=style["color"], alpha=0.2, linewidth=0)
        elif any(len(points[x]) > 1 for x in xs):  # too few for a band: each seed's point
            ax.plot([m for x, m in zip(xs, mbits) for _ in points[x]],
                    [v for x in xs for v in points[x]], linestyle="none", marker=".",
                    color=style["color"], alpha=0.6, label="_seed")
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
    latencies = sorted({r["latency"] for r in rows if r.get("latency") is not None})
    ax.set_xlabel("bottleneck bandwidth (Mbit/s, log scale" + (
        f"; latency {format_duration(latencies[0])} to {format_duration(latencies[-1])} "
        "with it)" if len(latencies) > 1 else ")"))
    ax.set_ylabel(label)
    # several networks of one bandwidth (presets, not a --bandwidth grid) share a point
    shared = any(len({r["net"] for r in group}) > 1
                 for group in _by(rows, "bottleneck_bandwidth").values())
    what = f"{label[0].upper()}{label[1:].split(' (')[0]} versus bandwidth"
    ax.set_title(title(what, rows, seeds_note(
        counts, "runs (seeds, networks of equal bandwidth)" if shared else "seeds")),
        fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    return fig, ax, "strategy"


def _save(plt, fig, ax, path, legend_title, figures: Figures):
    """The figure in each format (path with that suffix); in a paper's style without its
    title, which goes to the caption file."""
    entries = len(ax.get_legend_handles_labels()[0])
    ax.legend(title=legend_title, fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1),
              borderaxespad=0, ncol=1 + (entries - 1) // 25)
    if figures.paper:
        write_atomic(caption_path(path), ax.get_title().replace("\n", ". ") + ".\n")
        ax.set_title("")
    for form in figures.formats:
        # "tight" grows the saved image to take in the legend beside the axes; TrueType
        # fonts in PDF, text as text in SVG (plot_style.SAVE_RC)
        with replacing(path.with_suffix(f".{form}"), "wb") as f, plt.rc_context(SAVE_RC):
            fig.savefig(f, format=form, dpi=figures.dpi, bbox_inches="tight")
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


def _file_label(row) -> str:
    """A network's part of a file name: its name (a YAML file's stem), its simulated
    failures and the projection, where there are any."""
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
