"""Results as Python shows them: a run's and a sweep's in a few lines (repr), the table the
command line prints (.table()), and rows as a pandas DataFrame where pandas is installed
(.dataframe()), as Lightning's and Hugging Face's result objects do."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ExoframeError
from ..schema import RunSummary
from .bounds import bound_text
from .compare import choose_baseline
from .labels import label_keys, network_label, network_names, strategy_label
from .setups import by_setup
from .summary import as_run_summary, format_seconds, summary_table
from .sweep_table import collect_rows, summarize, table, utilization_text

# what a sweep row holds beside its numbers: each step's values, the run's configuration
_LISTS = ("losses", "val_losses", "sim_times", "bytes_sent", "failed_at", "config",
          "strategy_params")


def run_table(summary: dict, run_dir) -> str:
    """The table `exoframe run` prints for a run."""
    return summary_table(summary, (("run folder", str(run_dir) if run_dir is not None
                                    else "none (out not given: nothing written)"),))


def run_repr(summary: dict | RunSummary, run_dir) -> str:
    """A run in five lines: strategy, nodes, steps, network; simulated time; final losses;
    folder; where the rest is."""
    def loss(value):
        return "-" if value is None else f"{value:.4f}"

    s = as_run_summary(summary)
    utilization = s.compute_utilization
    return "\n".join([
        f"RunResult: {s.strategy} on {s.num_nodes} nodes, {s.steps} steps, network {s.net}",
        f"  simulated wall-clock {format_seconds(s.simulated_seconds)}, "
        f"compute utilization {'-' if utilization is None else f'{100 * utilization:.1f}%'}",
        f"  final train loss {loss(s.final_loss)}, final val loss {loss(s.final_val_loss)}",
        f"  run folder {run_dir if run_dir is not None else 'none (nothing written)'}",
        "  .table(): the summary exoframe run prints; .summary, .metrics (.dataframe()), "
        ".model, .trace"])


def dataframe(records: list[dict]):
    """`records` as a pandas DataFrame, one row each."""
    try:
        import pandas
    except ImportError:
        raise ExoframeError("dataframe() needs pandas: pip install pandas (the same rows are "
                            "there as a list of dicts without it).") from None
    return pandas.DataFrame.from_records(records)


def report_text(rows: list[dict], baseline: str | None = None) -> str:
    """What `exoframe sweep` and `exoframe report` print of rows: the table, the bandwidth
    for each compute utilization, and what bounds each setup."""
    utilization = utilization_text(rows)
    return "\n".join([table(rows, baseline), *([utilization] if utilization else []),
                      *bound_lines(rows)])


def bound_lines(rows: list[dict]) -> list[str]:
    """A report's lines: for each setup (the mean over its seeds), what bounds it; none
    where no setup recorded the split."""
    keys, names = label_keys(rows), network_names(rows)
    lines = []
    for s, group in zip(summarize(rows), by_setup(rows).values()):
        text = bound_text(s)
        if text:
            lines.append(f"  {strategy_label(group[0], keys)} on "
                         f"{network_label(group[0], names)}: {text}")
    if not lines:
        return []
    return ["  what bounds each setup (the nodes' mean; round trips and bytes on the paths "
            "that ended each wait):", *lines]


@dataclass
class SweepResult:
    """A sweep's rows (one per run and network, exoframe/report/sweep_table.py) and its folder.
    `folder, rows = result` unpacks it."""
    folder: Path | None
    rows: list = field(repr=False)
    baseline: str | None = None

    @classmethod
    def load(cls, *folders, target_loss: float | None = None,
             baseline: str | None = None) -> "SweepResult":
        """The rows of run folders (a sweep folder stands for the runs in it), as
        `exoframe report` reads them."""
        runs = []
        for d in map(Path, folders):
            runs += sorted(p for p in (d / "runs").iterdir() if p.is_dir()) \
                if (d / "runs").is_dir() else [d]
        return cls(Path(folders[0]) if len(folders) == 1 else None,
                   collect_rows(runs, target_loss), baseline)

    def __iter__(self):
        return iter((self.folder, self.rows))

    def table(self) -> str:
        """The tables the command line prints (exoframe sweep, exoframe report)."""
        return report_text(self.rows, self.baseline)

    def summary(self) -> list[dict]:
        """One dict per setup: mean and standard deviation over its seeds (sweep_summary.csv)."""
        return summarize(self.rows, self.baseline)

    def dataframe(self, per: str = "setup"):
        """per="setup": sweep_summary's rows; per="run": one row per run and network, its
        numbers without the per-step lists (sweep.csv's, with every field)."""
        if per == "setup":
            return dataframe(self.summary())
        if per == "run":
            return dataframe([{k: v for k, v in r.items() if k not in _LISTS}
                              for r in self.rows])
        raise ExoframeError(f"dataframe: per must be 'setup' or 'run', got {per!r}.")

    def __repr__(self) -> str:
        rows = self.rows
        if not rows:
            return f"SweepResult: no runs, folder {self.folder}"
        strategies = list(dict.fromkeys(r["strategy"] for r in rows))
        nets = list(dict.fromkeys(r["net"] for r in rows))
        seeds = sorted({r.get("seed") for r in rows}, key=str)
        keys, names = label_keys(rows), network_names(rows)
        fastest = min(rows, key=lambda r: r["simulated_seconds"])
        shown = ", ".join(strategies[:4]) + (f", … ({len(strategies)})"
                                            if len(strategies) > 4 else "")
        return "\n".join([
            f"SweepResult: {shown} × {len(nets)} network{'s' * (len(nets) > 1)}, "
            f"{len(seeds)} seed{'s' * (len(seeds) > 1)}: {len(rows)} rows, "
            f"baseline {choose_baseline(rows, self.baseline)}",
            f"  fastest: {strategy_label(fastest, keys)[:60]} on "
            f"{network_label(fastest, names)[:60]}, "
            f"{format_seconds(fastest['simulated_seconds'])} simulated",
            f"  folder {self.folder}",
            "  .table(): the tables exoframe sweep prints; .rows, .summary(), .dataframe()"])
