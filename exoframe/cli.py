"""The `exoframe` command line."""
from __future__ import annotations

import sys
import traceback

import click

from .config import config_to_dict, parse_assignments, resolve_config
from .errors import ExoframeError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli():
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
@click.option("--optimizer", help="Local (inner) optimizer: adamw, adam, sgd. [adamw]")
@click.option("--lr", type=float, help="Local optimizer learning rate. [workload's]")
@click.option("--weight-decay", type=float, help="Local optimizer weight decay. [0]")
@click.option("--momentum", type=float, help="Momentum, for sgd. [0]")
@click.option("--eval-every", type=int, help="Validate the averaged model every N steps. [steps/10]")
@click.option("--eval-batches", type=int, help="Validation batches per rank. [8]")
@click.option("--threads", type=int, help="CPU threads per rank. [1]")
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
@click.option("--progress/--no-progress", default=None, help="Progress bar. [on in a terminal]")
@click.option("--debug", is_flag=True, help="Show full tracebacks.")
def run(config_file, params, workload_params, progress, debug, **flags):
    """Train a workload on N simulated nodes under a strategy."""
    from .engine import execute, job_from_config
    from .report import summary_table

    overrides = {k: v for k, v in flags.items() if v is not None}
    if params:
        overrides["strategy_params"] = parse_assignments(params, "--param")
    if workload_params:
        overrides["workload_params"] = parse_assignments(workload_params, "--workload-param")
    config = resolve_config(config_file, overrides)
    job = job_from_config(config)
    record = config_to_dict(config)
    record.update(strategy=job.strategy_name, batch_size=job.batch_size, lr=job.optimizer.lr,
                  eval_every=job.eval_every, strategy_params=vars(job.strategy_params).copy())
    if progress is None:
        progress = sys.stderr.isatty()
    result = execute(job, out=config.out, config_record=record, progress=progress)
    click.echo(summary_table(result.summary))
    click.echo(f"  run folder            {result.run_dir}")


@cli.command()
def strategies():
    """List installed strategies: name, description, source package."""
    from .plugins import get_plugin_manager

    _print_registry(get_plugin_manager().strategies)


@cli.command()
def workloads():
    """List installed workloads: name, description, source package."""
    from .plugins import get_plugin_manager

    _print_registry(get_plugin_manager().workloads)


@cli.command()
def nets():
    """List network presets: name, what it models, source package."""
    from .plugins import get_plugin_manager
    from .sim.netconfig import load_network

    pm = get_plugin_manager()
    entries = list(pm.networks)
    width = max((len(e.name) for e in entries), default=4)
    for e in entries:
        try:
            line = e.description or load_network(e.name, pm.networks).summary()
        except ExoframeError as error:
            line = f"broken: {error}"
        click.echo(f"{e.name:<{width}}  {line}  [{e.source}]")


@cli.command()
def plugins():
    """List loaded plugins with their status (a broken plugin shows its error)."""
    from .plugins import get_plugin_manager

    for info in get_plugin_manager().plugins.values():
        line = f"{info.name:<24} {info.source} {info.version:<10} {info.status}"
        click.echo(line + (f": {info.error}" if info.error else ""))


def _print_registry(registry):
    entries = list(registry)
    width = max((len(e.name) for e in entries), default=4)
    for e in entries:
        aliases = f" (alias: {', '.join(e.aliases)})" if e.aliases else ""
        click.echo(f"{e.name:<{width}}  {e.description}{aliases}  [{e.source}]")


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
        click.echo(f"error: {e}", err=True)
        sys.exit(130 if type(e).__name__ == "RunInterrupted" else (2 if user_error else 1))
