"""`exoframe timeline RUN`: a run's timeline as Trace Event Format JSON (Perfetto,
chrome://tracing) and a picture."""
from __future__ import annotations

import json
from pathlib import Path

import click

from ..errors import ExoframeError
from .group import cli
from .options import figure_formats_option


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True))
@figure_formats_option("The picture's formats, comma-separated: png, svg, pdf (none: the "
                       "JSON alone).")
def timeline(run_dir, formats):
    """Write RUN_DIR/timeline.json (Trace Event Format: open it in Perfetto or
    chrome://tracing) and RUN_DIR/timeline.png: per rank its compute and exchanges, per TCP
    connection its messages on the wire, on the run's simulated clock (a run on a real
    network: as its ranks measured them)."""
    from ..experiments.trace_events import timeline as build
    from ..files import write_atomic

    chosen = [f.strip() for f in formats.split(",") if f.strip() and f.strip() != "none"]
    bad = [f for f in chosen if f not in ("png", "svg", "pdf")]
    if bad:
        raise ExoframeError(f"--format: '{bad[0]}' is not one of png, svg, pdf, none.")
    if chosen:
        from ..report.plots import require_matplotlib

        require_matplotlib()
    data = build(run_dir)
    out = Path(run_dir) / "timeline.json"
    write_atomic(out, json.dumps(data, allow_nan=False))
    click.echo(f"  wrote {out}")
    if chosen:
        from ..report.timeline_plot import draw

        for fmt in chosen:
            click.echo(f"  wrote {draw(data, Path(run_dir) / f'timeline.{fmt}')}")
