"""How far a run or a sweep has got: a bar in a terminal; without one (a batch job's log) a
line every `every` seconds and one at the end; or nothing.

    progress_display("lines", total=500, label="diloco ×4", every=30)
    diloco ×4: step 120/500 (24%)  loss 2.3412  val 2.4100  sim 12.3 s  elapsed 41 s
"""
from __future__ import annotations

import sys
import time

from tqdm import tqdm

from ...report.summary import format_seconds

MODES = ("bar", "lines", "off")


def progress_display(mode, total: int, label: str, every: float = 30.0,
                     measured: bool = False):
    """mode: "bar" (or True), "lines" or "off" (or False/None). measured: the rows' times
    are measured (--net real), not simulated."""
    if mode is True or mode == "bar":
        return Bar(total, label, measured)
    if mode == "lines" and every > 0:
        return Lines(total, label, every, measured=measured)
    return Off()


def default_mode(every: float) -> str:
    """A bar in a terminal, else lines (unless every is 0)."""
    return "bar" if sys.stderr.isatty() else "lines" if every > 0 else "off"


def _facts(row: dict, measured: bool = False) -> dict:
    # no loss: every node was down that step (simulated failures)
    facts = {"loss": "-" if row.get("loss") is None else f"{row['loss']:.4f}"}
    if row.get("val_loss") is not None:
        facts["val"] = f"{row['val_loss']:.4f}"
    if row.get("sim_time") is not None:
        facts["measured" if measured else "sim"] = format_seconds(row["sim_time"])
    return facts


class Off:
    def describe(self, label: str):
        pass

    def update(self, steps: int = 1, row: dict | None = None):
        pass

    def close(self):
        pass


class Bar(Off):
    def __init__(self, total: int, label: str, measured: bool = False):
        self.bar = tqdm(total=total, desc=label, unit="step", dynamic_ncols=True)
        self.measured = measured

    def describe(self, label: str):
        """A new run (or replay) from here: its own label, and none of the last one's numbers."""
        self.bar.set_description(label)
        self.bar.set_postfix({}, refresh=False)

    def update(self, steps: int = 1, row: dict | None = None):
        self.bar.update(steps)
        if row is not None:
            self.bar.set_postfix(_facts(row, self.measured), refresh=False)

    def close(self):
        self.bar.close()


class Lines(Off):
    def __init__(self, total: int, label: str, every: float, out=None, clock=time.monotonic,
                 measured: bool = False):
        self.total, self.label, self.every, self.measured = total, label, every, measured
        self.out, self.clock = out or sys.stderr, clock
        self.start = self.last = clock()
        self.done, self.row, self.shown = 0, None, 0

    def describe(self, label: str):
        """A new run (or replay) from here: its own label, and none of the last one's numbers."""
        self.label, self.row = label, None

    def update(self, steps: int = 1, row: dict | None = None):
        self.done += steps
        self.row = row if row is not None else self.row
        if self.clock() - self.last >= self.every:
            self._print()

    def close(self):
        if self.done != self.shown:
            self._print()

    def _print(self):
        self.last = self.clock()
        self.shown = self.done
        shown = _facts(self.row, self.measured) if self.row else {}
        facts = "".join(f"  {key} {value}" for key, value in shown.items())
        percent = 100 * self.done / self.total if self.total else 100
        print(f"{self.label}: step {self.done}/{self.total} ({percent:.0f}%){facts}  elapsed "
              f"{format_seconds(self.last - self.start)}", file=self.out, flush=True)
