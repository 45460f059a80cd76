"""The `exoframe` command line."""
from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import click

from .commands import PluginGroup, format_plugins
from .config import config_to_dict, parse_assignments, resolve_config
from .errors import ExoframeError, shorten

MAX_MESSAGE = 1000  # characters of an error line; values inside are cut at 200 already


def _progress_options(command):
    command = click.option(
        "--progress-every", type=click.FloatRange(min=0), default=30.0, show_default=True,
        metavar="SECONDS", help="Without a terminal, print a progress line (step, loss, "
        "simulated time) this often; 0: never.")(command)
    return click.option("--progress/--no-progress", default=None,
                        help="Progress bar. [a bar in a terminal, else lines]")(command)


def _progress_mode(flag, every: float) -> str:
    from .engine.progress import default_mode

    return default_mode(every) if flag is None else "bar" if flag else "off"


@click.group(cls=PluginGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--strict-plugins", is_flag=True,
              help="A plugin that fails to load is an error (also: EXOFRAME_STRICT_PLUGINS=1).")
@click.option("--debug", is_flag=True, help="Show full tracebacks of errors.")
def cli(strict_plugins, debug):
    """Simulate distributed training of PyTorch models on one machine."""


@cli.command()
@click.option("--config", "config_file", type=click.Path(dir_okay=False),
              help="YAML file of RunConfig fields; flags override it.")
@click.option("--strategy", help="Strategy name (see `exoframe strategies`). [ddp]")
@click.option("--nodes", type=int, help="Number of simulated nodes (rank processes). [2]")
@click.option("--steps", type=int, help="Training steps per rank. [300]")
@click.option("--workload", help="Built-in workload name or package.module:function. [gpt]")
@click.option("--seed", type=int, help="Seed for model init, data order and strategy masks. [0]")
@click.option("--batch-size", type=int, help="Per-rank batch size. [workload's]")
@click.option("--optimizer", help="Local (inner) optimizer: any torch.optim class by name "
              "(adamw, sgd, rmsprop, ...) or a plugin's (see `exoframe optimizers`). [adamw]")
@click.option("-o", "--optimizer-param", "optimizer_params", multiple=True, metavar="KEY=VALUE",
              help="Optimizer keyword argument, repeatable (e.g. -o betas=[0.9,0.95]).")
@click.option("--lr", type=float, help="Local optimizer learning rate. [workload's]")
@click.option("--weight-decay", type=float, help="Local optimizer weight decay. [0]")
@click.option("--momentum", type=float, help="Momentum, for sgd. [0]")
@click.option("--schedule", type=click.Choice(["constant", "linear", "cosine", "wsd"]),
              help="Learning-rate schedule after --warmup-steps. [constant]")
@click.option("--warmup-steps", type=int, help="Linear warm-up steps. [0]")
@click.option("--min-lr-ratio", type=float,
              help="Where linear, cosine and wsd decay to, as a fraction of lr. [0]")
@click.option("--clip-grad-norm", type=float,
              help="Clip each rank's local gradient norm before the strategy's step. [off]")
@click.option("--accumulate", type=int, help="Micro-batches of --batch-size per step. [1]")
@click.option("--precision", type=click.Choice(["fp32", "bf16", "fp16"]),
              help="Autocast precision (fp16 with a loss scaler). [fp32]")
@click.option("--device", help="auto, cpu, cuda (ranks round-robin over the GPUs), cuda:N or "
              "mps. [cpu]")
@click.option("--epochs", type=int, help="Passes over each rank's shard; replaces --steps.")
@click.option("--shuffle/--no-shuffle", default=None, help="Reshuffle every epoch. [on]")
@click.option("--drop-last/--keep-last", default=None,
              help="Drop each epoch's last short batch. [drop]")
@click.option("--time-budget", help="Stop at the first step whose simulated end reaches this "
              "time (2h, 90min, 600s).")
@click.option("--eval-every", type=int, help="Validate the averaged model every N steps. [steps/10]")
@click.option("--eval-batches", type=int, help="Validation batches per rank. [8]")
@click.option("--target-loss", type=float, help="Validate every step, report the simulated "
              "time to reach this validation loss of the averaged model, and stop there.")
@click.option("--threads", type=int, help="CPU threads per rank. [1]")
@click.option("--hang-timeout", type=float, help="Real seconds without progress from any rank "
              "before the watchdog stops the run and names the stuck process. [300]")
@click.option("--on-nonfinite", type=click.Choice(["stop", "continue"]),
              help="A NaN or infinite training loss stops the run (naming step and rank), or "
              "training continues. [stop]")
@click.option("--out", help="Parent folder of run folders. [runs]")
@click.option("--net", help="Network: a preset (see `exoframe nets`) or a YAML file. [ideal]")
@click.option("--compute", help="Compute model: measured, fixed:<time per step> (fixed:250ms) "
              "or flops:<device>[:<efficiency>] (flops:h100). [measured]")
@click.option("--stragglers", help="Slow ranks, comma-separated: RANK:FACTOR (3:4), "
              "lognormal:SIGMA, exponential:MEAN, bernoulli:P:FACTOR. [none]")
@click.option("-p", "--param", "params", multiple=True, metavar="KEY=VALUE",
              help="Strategy parameter, repeatable (e.g. -p H=50).")
@click.option("-w", "--workload-param", "workload_params", multiple=True, metavar="KEY=VALUE",
              help="Workload parameter, repeatable (e.g. -w n_layer=4).")
@click.option("--sink", "sinks", multiple=True, metavar="NAME[:KEY=VALUE,...]",
              help="Metrics sink, repeatable: jsonl, csv or a plugin's (see `exoframe sinks`), "
              "with its options after a colon (tensorboard:logdir=tb). [jsonl]")
@_progress_options
@click.option("--debug", is_flag=True, help="Show full tracebacks.")
def run(config_file, params, workload_params, optimizer_params, sinks, progress, progress_every,
        debug, **flags):
    """Train a workload on N simulated nodes under a strategy."""
    from .engine import execute, job_from_config
    from .report import summary_table

    overrides = {k: v for k, v in flags.items() if v is not None}
    if params:
        overrides["strategy_params"] = parse_assignments(params, "--param")
    if workload_params:
        overrides["workload_params"] = parse_assignments(workload_params, "--workload-param")
    if optimizer_params:
        overrides["optimizer_params"] = parse_assignments(optimizer_params, "--optimizer-param")
    if sinks:
        overrides["sinks"] = [item for text in sinks for item in _sink_items(text)]
    config = resolve_config(config_file, overrides)
    check_out_folder(config.out, "--out")
    job = job_from_config(config)
    record = config_to_dict(config)
    record.update(strategy=job.strategy_name, batch_size=job.batch_size, lr=job.optimizer.lr,
                  eval_every=job.eval_every, strategy_params=vars(job.strategy_params).copy())
    result = execute(job, out=config.out, config_record=record,
                     progress=_progress_mode(progress, progress_every),
                     progress_every=progress_every)
    click.echo(summary_table(result.summary))
    click.echo(f"  run folder            {result.run_dir}")


# Listings of what is installed: `exoframe KIND` prints a registry, one line per item.
LISTINGS = {
    "strategies": "List installed strategies: name, description, source package.",
    "workloads": "List installed workloads: name, description, source package.",
    "algorithms": "List collective algorithms (network YAML `algorithm:`): name, aliases, "
                  "source package.",
    "sinks": "List metrics sinks (--sink): name, aliases, source package.",
    "optimizers": "List local optimizers (every torch.optim class, and plugins'): name, "
                  "source package.",
}


def _listing(kind: str, help_text: str):
    def command():
        from .plugins import PluginManager

        # Only this kind: built-ins register by name (exoframe/builtins.py), so listing them
        # imports no torch (but torch's optimizers are found by importing it).
        _print_registry(PluginManager(kinds={kind}).registries[kind])
    cli.command(name=kind, help=help_text)(command)


for _kind, _help in LISTINGS.items():
    _listing(_kind, _help)


@cli.command()
def nets():
    """List network presets: name, what it models, source package."""
    from .plugins import PluginManager
    from .sim.netconfig import load_network

    pm = PluginManager(kinds={"networks"})
    entries = list(pm.networks)
    width = max((len(e.name) for e in entries), default=4)
    for e in entries:
        try:
            line = e.description or load_network(e.name, pm.networks).summary()
        except ExoframeError as error:
            line = f"broken: {error}"
        click.echo(f"{e.name:<{width}}  {line}  [{e.source}]")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def plugins(as_json):
    """List plugins: package, version, status (active, failed with its error, disabled) and
    what each registered."""
    import json

    from .plugins import get_plugin_manager

    infos = get_plugin_manager().plugins.values()
    if as_json:
        click.echo(json.dumps([info.as_dict() for info in infos], indent=2))
    else:
        click.echo(format_plugins(infos))


@cli.command("new-plugin")
@click.argument("name")
@click.option("--dir", "parent", default=".", type=click.Path(file_okay=False),
              help="Where to create the package folder. [.]")
def new_plugin(name, parent):
    """Write a plugin package skeleton exoframe-NAME: a strategy, its entry point and a test."""
    from .scaffold import write_skeleton

    folder = write_skeleton(name, parent)
    click.echo(f"wrote {folder}\n  pip install -e {folder}\n  python -m pytest {folder}\n"
               f"  exoframe run --strategy {name} --workload mlp")


def _print_registry(registry):
    entries = list(registry)
    width = max((len(e.name) for e in entries), default=4)
    for e in entries:
        aliases = f" (alias: {', '.join(e.aliases)})" if e.aliases else ""
        click.echo(f"{e.name:<{width}}  {e.description}{aliases}  [{e.source}]")


def check_out_folder(folder, flag: str):
    """Refuse an output folder that cannot be made or written, before anything runs."""
    path = Path(folder)
    existing = path
    while not existing.exists():
        if existing.is_symlink():
            raise ExoframeError(f"{flag} {folder}: {existing} is a broken link; give another "
                                "folder.")
        existing = existing.parent
    if not existing.is_dir():
        where = "is a file" if existing == path else f"is under {existing}, a file"
        raise ExoframeError(f"{flag} {folder}: {where}; give a folder.")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ExoframeError(f"{flag} {folder}: {existing} is not writable; give a folder you "
                            "can write to.")


def _sink_items(text: str) -> list[str]:
    """One --sink: "csv,jsonl" names two sinks; in "csv,tensorboard:logdir=tb,flush_secs=5"
    the options after the colon are the last sink's."""
    names, colon, options = text.partition(":")
    items = _names(names, "--sink")
    if colon:
        items[-1] += colon + options
    return items


def _names(text, flag):
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    if not names:
        raise ExoframeError(f"{flag}: give at least one name (comma-separated).")
    return names


def _projection(project_params, step_time, payload_bits, bucket_mb):
    from .engine.replay import Projection
    from .sim.units import parse_seconds

    if project_params is None and step_time is None:
        for flag, value in (("--payload-bits", payload_bits), ("--bucket-mb", bucket_mb)):
            if value is not None:
                raise ExoframeError(f"{flag} is a projection parameter: give --project-params "
                                    "(e.g. 1e9) and --step-time (e.g. 0.5s) with it.")
        return None
    if project_params is None or step_time is None:
        raise ExoframeError("a projection needs both --project-params (e.g. 1e9) and "
                            "--step-time (e.g. 0.1s or 100ms).")
    seconds = parse_seconds(step_time, "--step-time", "projection")
    extras = {"payload_bits": payload_bits, "bucket_mb": bucket_mb}
    return Projection(project_params, seconds, **{k: v for k, v in extras.items() if v is not None})


def _projection_options(command):
    """The projection flags, shared by `sweep` and `replay`."""
    options = [
        click.option("--project-params", type=float, metavar="P", help=(
            "Answer for a model of P parameters instead of the one trained: every exchange's "
            "bytes are scaled by P / (the trained model's parameters) × --payload-bits / 32, "
            "and every rank's compute by one factor so that a step computes for --step-time "
            "on average. DDP's gradient all-reduce, and an outer sync the strategy declares "
            "overlappable (diloco's), are split into --bucket-mb buckets that go one after "
            "another on one communication stream per rank during the backward pass (taken as "
            "2/3 of the step): bucket i+1 starts once bucket i is done and its gradients are "
            "ready, so each bucket pays the collective's latency. Assumes payloads scale "
            "linearly with parameters, the optimizer's time is inside --step-time, and the "
            "network and algorithms are the ones named. Needs --step-time.")),
        click.option("--step-time", metavar="TIME",
                     help="Compute time of one training step of the projected model (e.g. 0.5s)."),
        click.option("--payload-bits", type=float, metavar="BITS", help=(
            "Bits per value on the wire in the projection: 16 for bf16, 8 or 4 for quantized "
            "exchanges; scales the bytes of every operation of the trace (taken as fp32), "
            "indices and a strategy's own encoding included. [32]")),
        click.option("--bucket-mb", type=float, metavar="MiB", help=(
            "Bucket size of a projected streamed all-reduce, in MiB of payload (torch's "
            "bucket_cap_mb). [25]")),
    ]
    for option in reversed(options):
        command = option(command)
    return command


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
@click.option("--steps", type=int, help="Training steps per run. [300]")
@click.option("--workload", help="Workload. [gpt]")
@click.option("--compute", help="Compute model (see `exoframe run --help`). [measured]")
@click.option("--stragglers", help="Slow ranks (see `exoframe run --help`).")
@click.option("-p", "--param", "params", multiple=True, metavar="[STRATEGY.]KEY=VALUE",
              help="Strategy parameter, repeatable; unscoped keys go to every swept strategy "
                   "that has them (e.g. -p diloco.H=50), as do the config's strategy_params, "
                   "which these override.")
@click.option("-w", "--workload-param", "workload_params", multiple=True, metavar="KEY=VALUE")
@click.option("--target-loss", type=float, help="Also report the simulated time to reach this "
              "validation loss of the averaged model: each run validates every step and stops "
              "there.")
@_projection_options
@click.option("--out", help="Parent folder of sweep folders. [the config's out, else sweeps]")
@click.option("--plots/--no-plots", default=True, help="Write PNG plots (needs matplotlib).")
@_progress_options
def sweep(config_file, strategies, nets, bandwidth, points, seeds, params, workload_params,
          target_loss, project_params, step_time, payload_bits, bucket_mb, out, plots, progress,
          progress_every, **flags):
    """Strategies × networks: simulated wall-clock, compute utilization and bytes, as a
    table, sweep.csv, sweep.json and plots.

    A strategy whose behaviour does not depend on timing trains once and its trace is
    replayed through every other network (the same clocks a re-run would give); a
    timing-dependent one trains once per network.
    """
    from .config import load_yaml
    from .engine.sweep import config_axes, parse_grid, sweep as run_sweep
    from .report.sweep import table

    overrides = {k: v for k, v in flags.items() if v is not None}
    if workload_params:
        overrides["workload_params"] = parse_assignments(workload_params, "--workload-param")
    base = resolve_config(config_file, overrides)
    defaults = config_axes(base, set(load_yaml(config_file)) if config_file else set())
    strategy_names = _names(strategies, "--strategy") if strategies is not None \
        else defaults["strategies"]
    net_list = _names(nets, "--net") if nets is not None else defaults["nets"]
    try:
        seed_list = [int(s) for s in _names(seeds, "--seeds")] if seeds is not None \
            else defaults["seeds"]
    except ValueError:
        raise ExoframeError(f"--seeds: expected integers like 0,1,2; got '{seeds}'.") from None
    grid = parse_grid(bandwidth, points) if bandwidth else None
    check_out_folder(out or defaults["out"], "--out")
    projection = _projection(project_params, step_time, payload_bits, bucket_mb)
    if plots:
        from .report.plots import require_matplotlib

        require_matplotlib()  # fail now, not after the training, when matplotlib is missing
    folder, rows = run_sweep(base, strategy_names, net_list, seed_list, out or defaults["out"],
                             parse_assignments(params, "--param"), target_loss, projection,
                             plots, _progress_mode(progress, progress_every), grid,
                             progress_every)
    click.echo(table(rows))
    click.echo(f"  sweep folder: {folder}")


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--net", required=True, help="Network to replay through (preset or YAML file).")
@_projection_options
def replay(run_dir, net, project_params, step_time, payload_bits, bucket_mb):
    """Replay a run's trace through another network (no training); saved in RUN_DIR/replays."""
    from .engine.replay import replay_run
    from .report.summary import format_bytes, format_seconds

    if not Path(run_dir).is_dir():
        raise ExoframeError(f"{run_dir}: no such run folder.")
    record = replay_run(run_dir, net,
                        _projection(project_params, step_time, payload_bits, bucket_mb))
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
              "validation loss of the averaged model.")
@click.option("--plots/--no-plots", default=True, help="Write PNG plots (needs matplotlib).")
def report(run_dirs, out, target_loss, plots):
    """Rebuild the table (and with --out the CSV, JSON and plots) from run folders (a
    sweep folder stands for the runs in it)."""
    from .report.sweep import collect_rows, table, write_outputs

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


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    try:
        cli.main(args=argv, prog_name="exoframe", standalone_mode=False)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except (click.Abort, KeyboardInterrupt):
        click.echo("interrupted", err=True)
        sys.exit(130)
    except ExoframeError as e:
        details = getattr(e, "details", "")
        user_error = getattr(e, "user_error", True)
        if details and (debug or not user_error):
            click.echo(details.rstrip(), err=True)
        elif debug:
            traceback.print_exc()
        _error_line(str(e))
        sys.exit(130 if type(e).__name__ == "RunInterrupted" else (2 if user_error else 1))
    except Exception as e:  # the one boundary: one line, the traceback only with --debug
        if debug:
            traceback.print_exc()
        _error_line(_describe(e))
        sys.exit(2 if isinstance(e, (OSError, UnicodeDecodeError, json.JSONDecodeError))
                 else 1)


def _error_line(message: str):
    line = " ".join(message.split())
    if len(line) > MAX_MESSAGE:
        line = f"{line[:MAX_MESSAGE]}... (cut)"
    click.echo(f"error: {line}", err=True)


def _describe(e: Exception) -> str:
    import yaml

    if isinstance(e, OSError):
        name = e.filename if e.filename is not None else "a file"
        return (f"{shorten(str(name))}: {e.strerror or e}; check that the path exists and "
                "can be read and written.")
    if isinstance(e, UnicodeDecodeError):
        return "a file is not UTF-8 text (binary?); give a text file (--debug names it)."
    if isinstance(e, json.JSONDecodeError):
        return (f"malformed JSON (line {e.lineno}): {e.msg}; the file is truncated or corrupt "
                "(--debug names it).")
    if isinstance(e, yaml.YAMLError):
        return f"malformed YAML: {shorten(str(e))}"
    return (f"unexpected {type(e).__name__}: {shorten(str(e))}. Run again with --debug for "
            "the traceback, and report it if the input looks right.")
