"""`exoframe sweep`, `replay` and `report`: strategies across networks, and their tables."""
from __future__ import annotations

from pathlib import Path

import click

from ..config import parse_assignments, resolve_config
from ..errors import ExoframeError
from .group import cli
from .options import (split_names, progress_mode, progress_options, projection_from_flags,
                      projection_options, check_out_folder)


@cli.command()
@click.option("--config", "config_file", type=click.Path(dir_okay=False),
              help="YAML file of RunConfig fields for every run (`exoframe run --config` takes "
                   "the same): its strategy, net, seed, out and every other field are the "
                   "sweep's defaults; flags override them.")
@click.option("--strategy", "strategies",
              help="Strategies, comma-separated. [the config's strategy, else ddp,diloco]")
@click.option("--net", "nets",
              help="Networks, comma-separated (presets or YAML files); with --bandwidth, the "
                   "one base network of the grid. [the config's net, else wan-100mbps]")
@click.option("--bandwidth", help="A grid LOW..HIGH (e.g. 10mbit..10gbit) of --points "
              "log-spaced bandwidths applied to the base network: its inter-site links if it "
              "has sites, else every node's NIC.")
@click.option("--points", type=int, default=8, help="Points in the --bandwidth grid. [8]")
@click.option("--seeds", help="Seeds, comma-separated. [the config's seed, else 0]")
@click.option("--nodes", type=int, help="Nodes per run. [2]")
@click.option("--nodes-per-process", type=int, help="Nodes sharing a worker process. [auto]")
@click.option("--steps", type=int, help="Training steps per run. [300]")
@click.option("--workload", help="Workload. [gpt]")
@click.option("--partition", help="How the training set is split over the nodes (see "
              "`exoframe run --help`). [iid]")
@click.option("--compute", help="Compute model (see `exoframe run --help`). [measured]")
@click.option("--stragglers", help="Slow ranks (see `exoframe run --help`).")
@click.option("--faults", "faults", multiple=True, metavar="SPEC",
              help="Simulated failures, repeatable: each is a point of the sweep (see "
              "`exoframe run --help`; 'none' for a run without). [the config's faults]")
@click.option("-p", "--param", "params", multiple=True, metavar="[STRATEGY.]KEY=VALUE",
              help="Strategy parameter, repeatable; unscoped keys go to every swept strategy "
                   "that has them (e.g. -p diloco.H=50), as do the config's strategy_params, "
                   "which these override.")
@click.option("-w", "--workload-param", "workload_params", multiple=True, metavar="KEY=VALUE")
@click.option("--target-loss", type=float, help="Also report the simulated time to reach this "
              "validation loss of the held model: each run validates every step and stops "
              "there.")
@projection_options
@click.option("--out", help="Parent folder of sweep folders. [the config's out, else sweeps]")
@click.option("--plots/--no-plots", default=True, help="Write PNG plots (needs matplotlib).")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local",
              help="Where the training runs happen: here, one after another, or as Ray tasks "
                   "(pip install 'exoframe[ray]'; a local Ray unless --ray-address or "
                   "RAY_ADDRESS names a cluster). [local]")
@click.option("--ray-address", help="The Ray cluster for --executor ray, e.g. ray://HOST:10001.")
@click.option("--connect-timeout", type=float, help="Real seconds for the Ray cluster at "
              "--ray-address to answer. [60]")
@progress_options
def sweep(config_file, strategies, nets, bandwidth, points, seeds, faults, params,
          workload_params, target_loss, project_params, step_time, payload_bits, bucket_mb, out,
          plots, executor, ray_address, progress, progress_every, **flags):
    """Strategies × networks: simulated wall-clock, compute utilization and bytes, as a
    table, sweep.csv, sweep.json and plots.

    A strategy whose behaviour does not depend on timing trains once and its trace is
    replayed through every other network (the same clocks a re-run would give); a
    timing-dependent one trains once per network.
    """
    from ..config import load_yaml
    from ..engine.sweep import config_axes, parse_grid, sweep as run_sweep
    from ..report.sweep import compute_warning, table

    overrides = {k: v for k, v in flags.items() if v is not None}
    if workload_params:
        overrides["workload_params"] = parse_assignments(workload_params, "--workload-param")
    base = resolve_config(config_file, overrides)
    defaults = config_axes(base, set(load_yaml(config_file)) if config_file else set())
    strategy_names = split_names(strategies, "--strategy") if strategies is not None \
        else defaults["strategies"]
    net_list = split_names(nets, "--net") if nets is not None else defaults["nets"]
    try:
        seed_list = [int(s) for s in split_names(seeds, "--seeds")] if seeds is not None \
            else defaults["seeds"]
    except ValueError:
        raise ExoframeError(f"--seeds: expected integers like 0,1,2; got '{seeds}'.") from None
    grid = parse_grid(bandwidth, points) if bandwidth else None
    check_out_folder(out or defaults["out"], "--out")
    projection = projection_from_flags(project_params, step_time, payload_bits, bucket_mb)
    if plots:
        from ..report.plots import require_matplotlib

        require_matplotlib()  # fail now, not after the training, when matplotlib is missing
    folder, rows = run_sweep(base, strategy_names, net_list, seed_list, out or defaults["out"],
                             parse_assignments(params, "--param"), target_loss, projection,
                             plots, progress_mode(progress, progress_every), grid,
                             progress_every, list(faults) or None, executor, ray_address)
    click.echo(table(rows))
    click.echo(f"  sweep folder: {folder}")
    warning = compute_warning(rows)
    if warning:
        click.echo(warning, err=True)


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--net", required=True, help="Network to replay through (preset or YAML file).")
@projection_options
def replay(run_dir, net, project_params, step_time, payload_bits, bucket_mb):
    """Replay a run's trace through another network (no training); saved in RUN_DIR/replays."""
    from ..engine.replay import replay_run
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


@cli.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--out", help="Folder for sweep.csv, sweep.json and plots. [none: table only]")
@click.option("--target-loss", type=float, help="Also report the simulated time to reach this "
              "validation loss of the held model.")
@click.option("--plots/--no-plots", default=True, help="Write PNG plots (needs matplotlib).")
def report(run_dirs, out, target_loss, plots):
    """Rebuild the table (and with --out the CSV, JSON and plots) from run folders (a
    sweep folder stands for the runs in it)."""
    from ..report.sweep import collect_rows, table, write_outputs

    if out:
        check_out_folder(out, "--out")
    folders = []
    for d in map(Path, run_dirs):
        folders += sorted(p for p in (d / "runs").iterdir() if p.is_dir()) \
            if (d / "runs").is_dir() else [d]
    rows = collect_rows(folders, target_loss)
    click.echo(table(rows))
    if out:
        for path in write_outputs(rows, out, plots=plots):
            click.echo(f"  wrote {path}")
