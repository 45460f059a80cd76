"""`exoframe sweep` and `replay`: strategies across networks, and their tables (`report`:
report_command.py)."""
from __future__ import annotations

from pathlib import Path

import click

from ..config import EXECUTORS, resolve_config
from ..errors import ExoframeError
from ..fields import long_flag
from .group import cli
from .config_flags import FIELDS, field_option, sweep_options, sweep_values
from .options import (check_out_folder, config_file_option, progress_mode, progress_options,
                      projection_from_flags, projection_options)
from .start_up import import_engine

plots_option = click.option("--plots/--no-plots", default=True,
                            help="Write plots (PNG; needs matplotlib).")


@cli.command()
@config_file_option(
    "YAML file of RunConfig fields for every run (`exoframe run --config` takes the same): its "
    "strategy, net, seed, out and every other field are the sweep's defaults; flags override "
    "them.")
@sweep_options
@click.option("--bandwidth", help="A grid LOW..HIGH (e.g. 10mbit..10gbit) of --points "
              "log-spaced bandwidths applied to the base network: its inter-site links if it "
              "has sites, else every node's NIC.")
@click.option("--points", type=int, default=8, show_default=True,
              help="Points in the --bandwidth grid.")
@projection_options
@plots_option
@click.option("--executor", type=click.Choice(EXECUTORS), default=EXECUTORS[0],
              show_default=True,
              help="Where the training runs happen: here, one after another, or as Ray tasks "
                   "(pip install 'exoframe[ray]'; a local Ray unless --ray-address or "
                   "RAY_ADDRESS names a cluster).")
@click.option("--ray-address", help="The Ray cluster for --executor ray, e.g. ray://HOST:10001.")
@progress_options
def sweep(config_file, bandwidth, points, project_params, step_time, payload_bits, bucket_mb,
          plots, executor, ray_address, progress, progress_every, **flags):
    """Strategies × networks: simulated wall-clock, compute utilization and bytes, as a
    table, sweep.csv, sweep.json and plots.

    Any run flag given several values, comma-separated (--partition iid,dirichlet:0.1,
    --lr 0.01,0.1), or one per flag where a value holds commas (--faults, --stragglers), is an
    axis of the sweep, as is a parameter given several (-p diloco.H=5,50, -w n_layer=2,4):
    every combination is a point. A repeated value is refused.

    A strategy whose behaviour does not depend on timing trains once and its trace is
    replayed through every other network (the same clocks a re-run would give); a
    timing-dependent one trains once per network.
    """
    if executor == "local":  # Ray's workers train: its driver makes no optimizer
        import_engine()
    from ..config import load_yaml
    from ..experiments.sweep import config_axes, parse_grid, sweep as run_sweep
    from ..report.sweep_table import compute_warning

    given, axes = sweep_values(flags)
    # -p is scoped by strategy in a sweep ([STRATEGY.]KEY=VALUE): experiments/sweep.py places it.
    assignments = given.pop("strategy_params", {})
    base = resolve_config(config_file, given)
    defaults = config_axes(base, set(given) | (set(load_yaml(config_file)) if config_file
                                               else set()))
    strategy_names = axes.pop("strategy", defaults["strategies"])
    net_list = axes.pop("net", defaults["nets"])
    seed_list = axes.pop("seed", defaults["seeds"])
    faults = axes.pop("faults", None)
    grid = parse_grid(bandwidth, points) if bandwidth else None
    check_out_folder(defaults["out"], long_flag(FIELDS["out"]))
    projection = projection_from_flags(project_params, step_time, payload_bits, bucket_mb)
    if plots:
        from ..report.plots import require_matplotlib

        require_matplotlib()  # fail now, not after the training, when matplotlib is missing
    result = run_sweep(base, strategy_names, net_list, seed_list, defaults["out"],
                       assignments, None, projection, plots,
                       progress_mode(progress, progress_every), grid, progress_every,
                       faults, executor, ray_address, axes=axes)
    click.echo(result.table())  # the table, the bandwidth for each utilization, the bounds
    click.echo(f"  sweep folder: {result.folder}")
    warning = compute_warning(result.rows)
    if warning:
        click.echo(warning, err=True)


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False))
@field_option("net", required=True, help="Network to replay through (preset or YAML file).")
@projection_options
def replay(run_dir, net, project_params, step_time, payload_bits, bucket_mb):
    """Replay a run's trace through another network (no training); saved in RUN_DIR/replays."""
    from ..experiments.run_replays import replay_run
    from ..report.summary import format_bytes, format_seconds

    if not Path(run_dir).is_dir():
        raise ExoframeError(f"{run_dir}: no such run folder.")
    record = replay_run(run_dir, net,
                        projection_from_flags(project_params, step_time, payload_bits, bucket_mb))
    utilization = record["compute_utilization"]
    click.echo(f"  {record['strategy']} on {record['net']}"
               + (f" [{record['projection']}]" if record["projection"] else "")
               + f": simulated {format_seconds(record['simulated_seconds'])}, compute "
               f"utilization {'-' if utilization is None else f'{100 * utilization:.1f}%'}, "
               f"sent per node {format_bytes(record['bytes_sent_per_node'])}")

