"""How the sweep's plots look and say what they show: line styles, readable log axes,
smoothing that states its window, titles with the runs' context, file names, and the files
a figure is written to (formats, resolution, a paper's style)."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..errors import ExoframeError

COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf"]  # tab10
DASHES = ["-", "--", ":", "-."]
MARKERS = ["o", "s", "^", "v", "D", "x", "+"]
MAX_WINDOW = 21  # steps in the widest smoothing window
# Seeds of a setup are drawn as a band from their minimum to their maximum from this many;
# fewer are each drawn as a thin line of the setup's colour (two curves are their own band).
MIN_BAND_SEEDS = 3
FORMATS = ("png", "pdf", "svg")


@dataclass(frozen=True)
class Figures:
    """How figures are written: each in every one of `formats`, rasters at `dpi`; `paper`:
    no titles, what a title would say in <figure>.caption.txt beside it."""
    formats: tuple = ("png",)
    dpi: int = 120
    paper: bool = False

    @classmethod
    def parse(cls, formats: str, dpi: int, paper: bool) -> "Figures":
        chosen = tuple(dict.fromkeys(f.strip().lower() for f in formats.split(",") if f.strip()))
        unknown = [f for f in chosen if f not in FORMATS]
        if unknown or not chosen:
            raise ExoframeError(f"--format: unknown figure format '{','.join(unknown)}'; give "
                                f"some of {','.join(FORMATS)}, comma-separated.")
        if not 10 <= dpi <= 2400:
            raise ExoframeError(f"--dpi: {dpi} dots per inch; give 10 to 2400 (300 for "
                                "print).")
        return cls(chosen, dpi, paper)


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


def smoothing_window(steps: int) -> int:
    """An odd number of steps: about a twentieth of the run, at most MAX_WINDOW; 1 (none)
    for runs under 20 steps."""
    return min(MAX_WINDOW, max(1, steps // 20)) | 1


def smoothed(values: list[float], window: int) -> list[float]:
    """Centred moving average over `window` (odd) steps; near either end the window
    shrinks to what fits on both sides of the step, so no end is made of a half-filled
    window (the first value is itself)."""
    half, n, out = window // 2, len(values), []
    for i in range(n):
        reach = min(half, i, n - 1 - i)
        span = values[i - reach:i + reach + 1]
        out.append(sum(span) / len(span))
    return out


def smoothing_label(window: int) -> str:
    return "not smoothed" if window <= 1 else f"centred mean over {window} steps"


def readable_log_axis(axis, low: float, high: float):
    """Label a log axis with plain numbers (6, 20, 0.5), enough of them to read a value
    off: at 1, 2 and 5 times each power of ten over more than 1.3 decades, at 1, 1.5, 2, 3, 5
    and 7 times over less, and at evenly spaced round values within one decade."""
    from matplotlib import ticker

    span = math.log10(high / low) if low > 0 and high > low else 0
    if span < 1:
        axis.set_major_locator(ticker.MaxNLocator(nbins=10, steps=[1, 2, 2.5, 5, 10]))
    else:
        subs = (1.0, 2.0, 5.0) if span > 1.3 else (1.0, 1.5, 2.0, 3.0, 5.0, 7.0)
        axis.set_major_locator(ticker.LogLocator(base=10, subs=subs))
    axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: _plain(v)))
    axis.set_minor_locator(ticker.LogLocator(base=10, subs=tuple(range(1, 10))))
    axis.set_minor_formatter(ticker.NullFormatter())


def _plain(v: float) -> str:
    """1000 not 1e+03, 0.05 not 5e-02; 1e6 and beyond, 1e-4 and below, as 1e6, 2e-5."""
    if v == 0 or 1e-4 < abs(v) < 1e6:
        return f"{v:.6g}"
    mantissa, exponent = f"{v:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def context(rows: list[dict]) -> str:
    """A title's second line: the runs' nodes, model, compute model and projection, where
    the rows agree on them."""
    parts = []
    nodes = common(rows, "num_nodes")
    if nodes:
        parts.append(f"{nodes} nodes")
    workload, size = common(rows, "workload"), common(rows, "model_parameters")
    if workload or size:
        parts.append(" ".join(p for p in (workload, f"{_count(size)} params" if size else "")
                              if p))
    projection = common(rows, "projection")
    if projection:
        parts.append(f"projected to {projection}")
    else:
        compute = common(rows, "compute_model")
        if compute:
            parts.append(f"compute {compute.split(' (')[0]}")
    return " · ".join(parts)


def _count(n: float) -> str:
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:g}"


def title(what: str, rows: list[dict], note: str = "") -> str:
    """`what`, then the runs' context, then `note` (how seeds are drawn), each on a line."""
    return "\n".join(line for line in (what, context(rows), note) if line)


def seeds_note(counts: list[int], what: str = "seeds") -> str:
    """How several seeds are drawn; nothing for one seed each."""
    if not counts or max(counts) < 2:
        return ""
    n = str(max(counts)) if min(counts) == max(counts) else f"{min(counts)}–{max(counts)}"
    spread = []
    if min(c for c in counts if c > 1) < MIN_BAND_SEEDS:
        spread.append(f"thin lines: each seed (under {MIN_BAND_SEEDS})")
    if max(counts) >= MIN_BAND_SEEDS:
        spread.append("shaded: their min to max")
    return f"mean of {n} {what}; {'; '.join(spread)}"


def time_label(seconds: list[float]) -> tuple[str, float]:
    """The axis label of a time axis and the divisor to show its values in that unit."""
    longest = max(seconds, default=0.0)
    if longest >= 2 * 3600:
        return "simulated wall-clock (h, log scale)", 3600.0
    if longest >= 2 * 60:
        return "simulated wall-clock (min, log scale)", 60.0
    return "simulated wall-clock (s, log scale)", 1.0


def file_name(prefix: str, name: str, taken: set) -> str:
    """prefix_name.png with only letters, digits, '.', '-' and '_' from the name, unique
    among `taken` (to which it is added)."""
    safe = re.sub(r"[^A-Za-z0-9.-]+", "_", name).strip("._")[:80] or "unnamed"
    stem, i = f"{prefix}_{safe}", 1
    while f"{stem}.png" in taken:
        i += 1
        stem = f"{prefix}_{safe}_{i}"
    taken.add(f"{stem}.png")
    return f"{stem}.png"


def common(rows, key):
    """The rows' one value of `key`, else None (absent, or not the same in every row)."""
    values = {r.get(key) for r in rows}
    return values.pop() if len(values) == 1 else None

