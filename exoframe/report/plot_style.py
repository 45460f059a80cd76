"""How the sweep's plots look and say what they show: line styles, readable log axes,
smoothing that states its window, titles with the runs' context, file names, and the files
a figure is written to (formats, resolution, a paper's style, fonts a venue takes).

Colours are Tableau's Color Blind 10 (matplotlib's named style `tableau-colorblind10`),
each line also with a line style of its own, so that lines differ for colour-blind readers
and in greyscale; a sweep gives each strategy (and each network) one style in all its
figures (Styles). Text is embedded as TrueType in PDF (pdf.fonttype 42: no Type 3 fonts,
which many venues refuse) and kept as text in SVG."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..errors import ExoframeError

COLOURS = ["#006BA4", "#FF800E", "#ABABAB", "#595959", "#5F9ED1", "#C85200", "#898989",
           "#A2C8EC", "#FFBC79", "#CFCFCF"]  # tableau-colorblind10
DASHES = ["-", "--", ":", "-."]
MARKERS = ["o", "s", "^", "v", "D", "x", "+"]
MAX_WINDOW = 21  # steps in the widest smoothing window
# Seeds of a setup are drawn as a band from their minimum to their maximum from this many;
# fewer are each drawn as a thin line of the setup's colour (two curves are their own band).
MIN_BAND_SEEDS = 3
FORMATS = ("png", "pdf", "svg")
# matplotlib settings every figure is saved with: TrueType in PDF and PostScript, SVG text
# as text
SAVE_RC = {"pdf.fonttype": 42, "ps.fonttype": 42, "svg.fonttype": "none"}
MAX_LOG_LABELS = 12  # labelled ticks on a log axis at most, where its span allows


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


class Styles:
    """One style per key (a strategy's label, a network's) for all of a sweep's figures, in
    the order the keys are given: the same strategy has the same colour and line style in
    every figure."""

    def __init__(self, keys):
        keys = list(dict.fromkeys(keys))
        self.of = dict(zip(keys, line_styles(len(keys))))

    def for_lines(self, keys: list) -> list[dict]:
        """The styles of a figure's lines; where the figure draws a key twice (a strategy on
        two networks), styles of its own."""
        if len(set(keys)) < len(keys) or any(k not in self.of for k in keys):
            return line_styles(len(keys))
        return [self.of[k] for k in keys]


class Look:
    """What every figure of a report shares: the time unit (name, seconds per unit), the
    strategies' and networks' styles, the smoothing window and the target loss."""

    def __init__(self, unit, strategies: Styles, networks: Styles, window: int, target):
        self.unit, self.strategies, self.networks = unit, strategies, networks
        self.window, self.target = window, target

    def styles(self, key: str, labels: list) -> list[dict]:
        """The styles of lines labelled by `key`: a strategy's ("label") or a network's."""
        return (self.strategies if key == "label" else self.networks).for_lines(labels)


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
    """Label a log axis with plain numbers (6, 20, 0.5), enough of them to read a value off
    anywhere over the data's range [low, high]: evenly spaced round values within a decade;
    over more, the densest of 1, 1.5, 2, 3, 5 and 7 times each power of ten, 1, 2 and 5
    times, or the powers alone whose labels fit the axis side by side (MAX_LOG_LABELS at
    most, two at least)."""
    from matplotlib import ticker

    span = math.log10(high / low) if low > 0 and high > low else 0
    if span < 1:
        axis.set_major_locator(ticker.MaxNLocator(nbins=10, steps=[1, 2, 2.5, 5, 10]))
    else:
        choices = ((1.0, 1.5, 2.0, 3.0, 5.0, 7.0), (1.0, 2.0, 5.0), (1.0,))
        subs = next((s for s in choices if _fits(axis, s, low, high)), choices[-1])
        axis.set_major_locator(ticker.LogLocator(base=10, subs=subs,
                                                 numticks=MAX_LOG_LABELS + 2))
    axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: _plain(v)))
    axis.set_minor_locator(ticker.LogLocator(base=10, subs=tuple(range(1, 10))))
    axis.set_minor_formatter(ticker.NullFormatter())


def _fits(axis, subs, low: float, high: float) -> bool:
    """Whether labels at `subs` times the powers of ten in [low, high] are two or more, at
    most MAX_LOG_LABELS, and fit side by side on the axis (a y axis: a line of text each)."""
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    ticks = sorted(s * 10 ** e for e in range(first, last + 1) for s in subs
                   if low <= s * 10 ** e <= high)
    if len(ticks) < 2 or len(ticks) > MAX_LOG_LABELS:
        return len(ticks) >= 2 and subs == (1.0,)
    box = axis.axes.get_position()
    width, height = axis.axes.figure.get_size_inches()
    vertical = axis is axis.axes.yaxis
    length = box.height * height if vertical else box.width * width  # inches
    gap = min(math.log10(b / a) for a, b in zip(ticks, ticks[1:]))  # decades
    need = 0.2 if vertical else 0.1 + 0.085 * max(len(_plain(t)) for t in ticks)  # inches
    return gap / (1.1 * math.log10(high / low)) * length >= need


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


def time_unit(seconds: list[float]) -> tuple[str, float]:
    """One unit for a report's times, from the longest (its figures and tables all use it):
    h from two hours, min from two minutes, else s; and the divisor that shows a time in it."""
    longest = max(seconds, default=0.0)
    if longest >= 2 * 3600:
        return "h", 3600.0
    if longest >= 2 * 60:
        return "min", 60.0
    return "s", 1.0


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

