"""`exoframe run`: one training run."""
from __future__ import annotations

import click

from ..config import config_to_dict, parse_assignments, resolve_config
from .group import cli
from .options import progress_mode, progress_options, sink_items, check_out_folder


@cli.command()
@click.option("--config", "config_file", type=click.Path(dir_okay=False),
              help="YAML file of RunConfig fields; flags override it.")
@click.option("--strategy", help="Strategy name (see `exoframe strategies`). [ddp]")
@click.option("--nodes", type=int, help="Number of simulated nodes. [2]")
@click.option("--nodes-per-process", type=int, help="Nodes sharing a worker process, "
              "stepping in turn and exchanging in memory (CPU only). [a process per node up "
              "to 4 per core and 32 in all, else a worker per core]")
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
@click.option("--partition", help="How the training set is split over the nodes, seeded: "
              "iid, dirichlet:ALPHA (label skew), shards:K (K label shards per node) or "
              "quantity:ALPHA (power-law sizes). [iid]")
@click.option("--time-budget", help="Stop at the first step whose simulated end reaches this "
              "time (2h, 90min, 600s).")
@click.option("--eval-every", type=int, help="Validate the held model every N steps. [steps/10]")
@click.option("--eval-batches", type=int, help="Validation batches per rank. [8]")
@click.option("--target-loss", type=float, help="Validate every step, report the simulated "
              "time to reach this validation loss of the held model, and stop there.")
@click.option("--threads", type=int, help="CPU threads per rank. [1]")
@click.option("--hang-timeout", type=float, help="Real seconds without progress from any rank "
              "before the watchdog stops the run and names the stuck process. [300]")
@click.option("--connect-timeout", type=float, help="Under torchrun: real seconds to reach "
              "the rendezvous and for every rank to join. [60]")
@click.option("--on-nonfinite", type=click.Choice(["stop", "continue"]),
              help="A NaN or infinite training loss stops the run (naming step and rank), or "
              "training continues. [stop]")
@click.option("--checkpoint-every", type=int, help="Save every rank's state every N steps "
              "into the run folder; `exoframe resume RUN_DIR` goes on from the latest. [off]")
@click.option("--out", help="Parent folder of run folders. [runs]")
@click.option("--net", help="Network: a preset (see `exoframe nets`), a YAML file, or real "
              "(no simulator: measured wall-clock and compute time). [ideal]")
@click.option("--compute", help="Compute model: measured, fixed:<time per step> (fixed:250ms) "
              "or flops:<device>[:<efficiency>] (flops:h100). [measured]")
@click.option("--stragglers", help="Slow ranks, comma-separated: RANK:FACTOR (3:4), "
              "lognormal:SIGMA, exponential:MEAN, bernoulli:P:FACTOR. [none]")
@click.option("--faults", help="Simulated node failures, comma-separated: NODE@TIME:DOWN "
              "(1@90s:60s: node 1 fails at 90 s simulated, back 60 s later) or "
              "rate:PER_HOUR:DOWN (rate:4:5min: 4 failures an hour over the cluster). [none]")
@click.option("-p", "--param", "params", multiple=True, metavar="KEY=VALUE",
              help="Strategy parameter, repeatable (e.g. -p H=50).")
@click.option("-w", "--workload-param", "workload_params", multiple=True, metavar="KEY=VALUE",
              help="Workload parameter, repeatable (e.g. -w n_layer=4).")
@click.option("--sink", "sinks", multiple=True, metavar="NAME[:KEY=VALUE,...]",
              help="Metrics sink, repeatable: jsonl, csv or a plugin's (see `exoframe sinks`), "
              "with its options after a colon (tensorboard:logdir=tb). [jsonl]")
@progress_options
@click.option("--debug", is_flag=True, help="Show full tracebacks.")
def run(config_file, params, workload_params, optimizer_params, sinks, progress, progress_every,
        debug, **flags):
    """Train a workload on N simulated nodes under a strategy."""
    from ..engine import execute, job_from_config
    from ..engine.cluster import ClusterEnv

    overrides = {k: v for k, v in flags.items() if v is not None}
    cluster = ClusterEnv.from_environ()  # started by torchrun
    if cluster is not None:
        cluster.check_nodes(overrides.setdefault("nodes", cluster.world_size))
    if params:
        overrides["strategy_params"] = parse_assignments(params, "--param")
    if workload_params:
        overrides["workload_params"] = parse_assignments(workload_params, "--workload-param")
    if optimizer_params:
        overrides["optimizer_params"] = parse_assignments(optimizer_params, "--optimizer-param")
    if sinks:
        overrides["sinks"] = [item for text in sinks for item in sink_items(text)]
    config = resolve_config(config_file, overrides)
    if cluster is not None:
        cluster.check_config(config)
    check_out_folder(config.out, "--out")
    job = job_from_config(config)
    record = config_to_dict(config)
    record.update(strategy=job.strategy_name, batch_size=job.batch_size, lr=job.optimizer.lr,
                  eval_every=job.eval_every, strategy_params=vars(job.strategy_params).copy())
    if cluster is not None and cluster.rank != 0:  # rank 0's process writes the run folder
        from ..engine.launcher import run_cluster_rank

        run_cluster_rank(job, cluster, record)  # does not return
    result = execute(job, out=config.out, config_record=record,
                     progress=progress_mode(progress, progress_every),
                     progress_every=progress_every, cluster=cluster)
    show_result(result)


def show_result(result):
    from ..report import summary_table
    from ..report.summary import compute_warning

    click.echo(summary_table(result.summary, (("run folder", str(result.run_dir)),)))
    warning = compute_warning(result.summary)
    if warning:
        click.echo(warning, err=True)


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--steps", type=int, help="Train to this many steps in all. [the run's]")
@progress_options
@click.option("--debug", is_flag=True, help="Show full tracebacks.")
def resume(run_dir, steps, progress, progress_every, debug):
    """Go on with a run from its latest checkpoint (--checkpoint-every), in its folder."""
    from ..engine.resume import resume as resume_run

    show_result(resume_run(run_dir, steps, progress=progress_mode(progress, progress_every),
                           progress_every=progress_every))
