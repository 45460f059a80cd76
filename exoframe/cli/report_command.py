"""`exoframe report`: the tables, comparisons and figures of run folders, grouped by their
recorded configuration (exoframe/report/groups.py), however the runs were made."""
from __future__ import annotations

from pathlib import Path

import click

from ..fields import long_flag
from .config_flags import FIELDS, field_option
from .group import cli
from .options import check_out_folder, figure_formats_option
from .sweep_command import plots_option


@cli.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@field_option("out", help="Folder for sweep.csv, sweep.json, speedup.csv, utilization.csv "
              "(each CSV also as .tex and .md) and plots. [none: tables only]")
@field_option("target_loss", help="Also report the simulated time to reach this validation "
              "loss of the held model (and compare strategies by it).")
@click.option("--baseline", metavar="STRATEGY", help="The strategy speed-ups are over "
              "(its time over each setup's, on the same setting). [the first run's strategy]")
@plots_option
@figure_formats_option()
@click.option("--dpi", type=int, default=120, show_default=True,
              help="Resolution of raster figures (png).")
@click.option("--paper", is_flag=True, help="A paper's style: figures without titles, each "
              "title's text in <figure>.caption.txt beside it.")
def report(run_dirs, out, target_loss, baseline, plots, formats, dpi, paper):
    """Rebuild the tables (and with --out the CSV, JSON and plots) from run folders (a
    sweep folder stands for the runs in it).

    Runs are grouped by their whole configuration but the seed: runs that differ in a
    strategy parameter, the partition, the network or any other field are separate rows, and
    the fields that differ are columns. Two runs of one configuration and seed are refused.
    Under the table: the bandwidth each strategy needs for 50-99 % compute utilization,
    where the runs (or their replays) cover several bandwidths, and what bounds each setup
    (compute, round trips, bytes or waiting for peers).
    """
    from ..report.plot_style import Figures
    from ..report.results import report_text
    from ..report.sweep_table import collect_rows, write_outputs

    figures = Figures.parse(formats, dpi, paper)
    if out:
        check_out_folder(out, long_flag(FIELDS["out"]))
        if plots:
            from ..report.plots import require_matplotlib

            require_matplotlib()  # one line before any file, where matplotlib is missing
    folders = []
    for d in map(Path, run_dirs):
        folders += sorted(p for p in (d / "runs").iterdir() if p.is_dir()) \
            if (d / "runs").is_dir() else [d]
    rows = collect_rows(folders, target_loss)
    click.echo(report_text(rows, baseline))  # the table, utilization, what bounds each setup
    if out:
        for path in write_outputs(rows, out, plots=plots, baseline=baseline, figures=figures):
            click.echo(f"  wrote {path}")
