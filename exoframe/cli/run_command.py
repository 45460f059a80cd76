"""`exoframe run`: one training run."""
from __future__ import annotations

import click

from ..config import resolve_config
from ..fields import long_flag
from .config_flags import FIELDS, field_option, overrides, run_options
from .group import cli
from .options import (check_out_folder, config_file_option, debug_option, progress_mode,
                      progress_options)
from .start_up import import_engine


@cli.command()
@config_file_option("YAML file of RunConfig fields; flags override it.")
@run_options
@progress_options
@debug_option()
def run(config_file, progress, progress_every, debug, **flags):
    """Train a workload on N simulated nodes under a strategy."""
    import_engine()
    from ..engine import execute, job_from_config
    from ..engine.plan.cluster_env import ClusterEnv

    given = overrides(flags)
    cluster = ClusterEnv.from_environ()  # started by torchrun
    if cluster is not None:
        cluster.check_nodes(given.setdefault("nodes", cluster.world_size))
    config = resolve_config(config_file, given)
    if cluster is not None:
        cluster.check_config(config)
    check_out_folder(config.out, long_flag(FIELDS["out"]))
    job = job_from_config(config)
    record = job.config_record()
    if cluster is not None and cluster.rank != 0:  # rank 0's process writes the run folder
        from ..engine.launch.launcher import run_cluster_rank

        run_cluster_rank(job, cluster, record)  # does not return
    result = execute(job, out=config.out, config_record=record,
                     progress=progress_mode(progress, progress_every),
                     progress_every=progress_every, cluster=cluster)
    show_result(result)


def show_result(result):
    from ..report.summary import compute_warning

    click.echo(result.table())
    warning = compute_warning(result.summary)
    if warning:
        click.echo(warning, err=True)


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False))
@field_option("steps", help="Train to this many steps in all. [the run's]")
@progress_options
@debug_option()
def resume(run_dir, steps, progress, progress_every, debug):
    """Go on with a run from its latest checkpoint (--checkpoint-every), in its folder."""
    import_engine()
    from ..engine.resume import resume as resume_run

    show_result(resume_run(run_dir, steps, progress=progress_mode(progress, progress_every),
                           progress_every=progress_every))
