"""Start one process per rank and an evaluator, run the network simulator for them, relay
their progress, and stop them all if one fails.

Ranks are forked from this process, which has already imported torch, so start-up does not
pay a fresh interpreter and torch import per rank. The ranks meet through a FileStore in a
private temporary folder (no port: no other process can reach or disturb it), and gloo
binds to loopback. While the run goes, monitor.py runs the simulator, which answers the
ranks over their pipes, and watches every pipe and process; on a failure, a stall (see
watchdog.py), Ctrl-C, SIGTERM or SIGHUP every child is killed (processes.py), so that no
process is left behind. In a run that checkpoints, a stop signal first has every rank save
(monitor.py). Under torchrun, rank 0's process launches only rank 0 and the evaluator, and
serves the other ranks, which join it over TCP (cluster.py, run_cluster_rank).
"""
from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass

import torch

from ...errors import ExoframeError, RunInterrupted, RunStopped
from ...sim.clocks.compute import device_from_name
from ..ipc.messages import EvaluatorDone, EvaluatorStop, Rendezvous
from ..ipc.processes import RankFailed, child_entry, interrupted, stop_all
from ..ipc.sender import Sender
from ..ipc.stop_signals import (catch_stop_signals, ranks_forked, ranks_up, restore_signals,
                                 signals_held, stopping_for_a_failure)
from ..node.data import Batches
from ..node.loop import check_loss
from ..node.model_state import ModelState
from ..node.rank import run_rank
from ..plan import devices
from ..plan.cluster_env import ClusterEnv
from ..plan.flops import count_step_flops
from ..plan.job import Job
from .cluster import Service, join
from .hosting import Hosting, hosting_for
from .monitor import EVALUATOR, Channel, Monitor
from .validation_set import ValidationSet, validation_set


@dataclass
class LaunchResult:
    rank_results: list
    startup_seconds: float
    elapsed_seconds: float
    final_state: ModelState | None = None  # the last step's held model
    steps: int = 0  # steps run: fewer than job.steps when a stopping rule stopped the run
    stopped_by: str = "steps"  # "steps", "target_loss" or "time_budget"
    bytes_between_sites: dict | None = None  # "a->b": bytes (the simulator's inter-site links)
    validation: dict | None = None  # the validation set and what validating cost


def check_model(job: Job, batches: Batches):
    """Fail fast, before any fork: one forward pass (eval mode, no grad, on the CPU) over
    rank 0's first batch must give a scalar. Returns the batch."""
    was_training = job.model.training
    job.model.eval()
    try:
        with torch.no_grad():
            batch = batches.first()
            check_loss(job.model(batch), step=0)
    finally:
        job.model.train(was_training)
    return batch


def checked_validation_set(job: Job) -> ValidationSet:
    """The run's validation set: val_examples no more than the data holds, and some data
    where a target loss is read from it."""
    val_set = validation_set(job.dataset, job.nodes, job.val_examples)
    if job.target_loss is not None and val_set.dataset is None:
        raise ExoframeError("target_loss needs validation data: the time to target is read "
                            "from the validation loss. Give validation data or drop target_loss.")
    return val_set


def check_startable(job: Job):
    """What a run checks of its job before its ranks start (prepare), kept no further: a
    sweep checks each point with it before any point trains. The validation set, and one
    forward pass over rank 0's first batch giving a scalar loss."""
    checked_validation_set(job)
    check_model(job, rank_batches(job, 0))


def rank_batches(job: Job, rank: int) -> Batches:
    """Rank `rank`'s training batches, as its node draws them."""
    return Batches(job.dataset(rank, job.nodes, "train"), job.batch_size, job.seed, rank,
                   job.shuffle, job.drop_last)


def warn_about_measured_compute(job: Job):
    """`measured` times each rank's own work only where nothing else runs on its device."""
    if job.sim.compute.kind != "measured" or job.device == "cpu" or job.placement.packed:
        return  # (packed nodes are timed per turn: one node's kernels at a time)
    if job.device == "mps":
        why = "it reads CPU time, which misses the Apple GPU's work"
    elif job.device == "cuda" and job.placement.gpus >= job.nodes:
        return
    else:
        why = ("ranks share a GPU, and a rank's GPU time then includes the other ranks' "
               "kernels")
    print(f"warning: --compute measured on {job.device}: {why}; --compute flops:auto or "
          "fixed:<time per step> gives compute that does not depend on it.", file=sys.stderr)


def preload():
    """Import once, before forking, what every rank would otherwise import on its own.

    torch's optimizers import torch._dynamo when they are made and at each step (about
    0.7 s and 800 modules on a fast machine); done in each of N ranks on 2 cores it would
    dominate start-up. (The launcher has usually imported it already: building the job
    makes an optimizer.)
    """
    import torch._dynamo  # noqa: F401


def prepare(job: Job, rank: int | None = None) -> tuple[Job, dict, ValidationSet | None]:
    """Everything a run checks and counts before its ranks start: the job with its compute
    model complete (a FLOP count, the GPU), each rank's batches (rank -> Batches) and the
    validation set (engine/launch/validation_set.py). Under torchrun the process of `rank` does it
    for its own rank: its batches (and rank 0's, which the checks read), no validation set
    (the evaluator runs beside rank 0)."""
    if job.device.startswith("cuda") and torch.cuda.is_initialized() and \
            not job.placement.in_process:
        raise ExoframeError(
            "device: CUDA is already initialized in this process (a model or tensor was put on "
            "a GPU before the run), and the ranks, forked from it, could not use it. Keep the "
            "model and data on the CPU: exoframe moves them to --device.")
    ranks = range(job.nodes) if rank is None else sorted({0, rank})
    batches = {r: rank_batches(job, r) for r in ranks}
    val_set = checked_validation_set(job) if rank is None else None
    warn_about_measured_compute(job)
    first_batch = check_model(job, batches[0])
    job = with_step_flops(job, first_batch)
    preload()
    return job, batches, val_set


def with_step_flops(job: Job, first_batch) -> Job:
    """The job with its compute model's device (flops:auto) and FLOP count per step, where
    the model is `flops`."""
    compute = job.sim.compute
    if not compute.needs_flops:
        return job
    if compute.peak is None:  # flops:auto
        gpu = devices.gpu_model() if job.device.startswith("cuda") else None
        compute = compute.with_device(device_from_name(gpu))
    compute = compute.with_flops(count_step_flops(job.model, first_batch) * job.accumulate)
    return dataclasses.replace(job, sim=dataclasses.replace(job.sim, compute=compute))


def evaluator_done(conn, relay: Sender | None, timeout: float) -> EvaluatorDone:
    """Tell the evaluator the run is over (after what `relay` still writes to it, the
    monitor's relay of remote ranks' models); its answer holds the final model."""
    if relay is not None:
        relay.close()
    try:
        conn.send(EvaluatorStop())
        while conn.poll(timeout):
            if isinstance(message := conn.recv(), EvaluatorDone):
                return message  # (nothing else is due: every row was validated)
    except (EOFError, OSError):
        pass
    raise RankFailed(EVALUATOR, "gave no final model at the end of the run: it stopped or "
                     f"took over {timeout:g} s (--hang-timeout)", user_error=False)


def validation_record(val_set: ValidationSet, done: EvaluatorDone, rank_results: list,
                      job: Job) -> dict:
    """summary.json's `validation`: what was validated, and what it cost."""
    moving = done.moving_seconds + sum(r.get("moving_models_seconds", 0.0)
                                       for r in rank_results if r)
    return {**val_set.describe(), "replicas_average": job.val_replicas
            if not job.strategy_cls.held_model_is_replicas_average() else None,
            "validating_seconds": round(done.validating_seconds, 3),
            "moving_models_seconds": round(moving, 3)}


def bind_to_loopback():
    """gloo and NCCL bind their listening sockets to this interface: loopback only, unless
    the user names an interface (these variables)."""
    loopback = "lo0" if sys.platform == "darwin" else "lo"
    os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback)
    os.environ.setdefault("NCCL_SOCKET_IFNAME", loopback)  # NCCL's bootstrap sockets


def launch(job: Job, on_row=None, config: dict | None = None,
           cluster: ClusterEnv | None = None, prepared: tuple | None = None) -> LaunchResult:
    """Run `job` on job.nodes forked ranks. `on_row(row)` is called for each finished step.
    With `cluster` (rank 0's process under torchrun, engine/launch/cluster.py), launch rank 0 and
    serve the ranks of the other processes, which must have been started with the same
    `config`. prepared: the batches and validation shards prepare() returned with `job`, if
    the caller prepared it already."""
    start = time.perf_counter()
    if prepared is None:
        job, *prepared = prepare(job)
    batches, val_set = prepared
    if cluster is None or cluster.is_loopback():
        bind_to_loopback()
    rendezvous = tempfile.mkdtemp(prefix="exoframe-rendezvous-")  # mode 0700: ours alone
    try:
        return _launch(job, on_row, start, batches, val_set, rendezvous, cluster, config)
    finally:
        shutil.rmtree(rendezvous, ignore_errors=True)


def run_cluster_rank(job: Job, cluster: ClusterEnv, config: dict):
    """A rank that torchrun started on a process other than rank 0's: prepare as rank 0
    does, join rank 0's launcher, train, exit (the process ends here)."""
    job, batches, _ = prepare(job, cluster.rank)
    if cluster.is_loopback():
        bind_to_loopback()
    conn = join(cluster, job.connect_timeout, config, job.device)
    child_entry(cluster.rank, run_rank, (cluster.rank, job, batches[cluster.rank], None), conn,
                stack_path=None, forked=False)


def rank_children(hosting: Hosting, job: Job, batches: dict, context, folder: str):
    """The children that run the ranks (hosting.py: processes, or threads InProcess): (who,
    target, arguments) each, and the two ends of each one's pipe to the evaluator."""
    to_evaluator = [context.Pipe(duplex=False) for _ in range(hosting.forks(job))]
    readers, writers = [r for r, _ in to_evaluator], [w for _, w in to_evaluator]
    children = hosting.children(job, batches, context, folder, writers)
    # Each child keeps its own end to the evaluator only.
    children = [(who, hosting.closing([*readers, *writers[:i], *writers[i + 1:]], target),
                 args) for i, (who, target, args) in enumerate(children)]
    return children, readers, writers


def _launch(job, on_row, start, batches, val_set, folder, cluster, config) -> LaunchResult:
    """folder: the run's private temporary folder (the rendezvous store, stack dumps);
    cluster: under torchrun, what it told rank 0's process, else None (all ranks forked)."""
    watchdog = job.hang_timeout
    store_path = os.path.join(folder, "store")
    context = mp.get_context("fork")
    hosting = hosting_for(job, remote=cluster is not None)
    children, readers, writers = rank_children(hosting, job, batches, context, folder)
    children.append(hosting.evaluator(job, val_set, readers, writers))
    conns, processes, remote = [], [], {}
    monitor = service = None
    previous = catch_stop_signals()
    try:
        with signals_held(strict=True):  # (none may raise in a fork handler: it is lost)
            conns, processes = hosting.start(children, context, folder, [*readers, *writers])
        ranks_forked()
        if cluster is not None:  # (after the forks: no child holds the listening socket)
            service = Service(cluster, job.connect_timeout, config or {}, job.device,
                              folder)
            remote = service.accept_ranks()  # every rank's connection, in rank order
        rank_conns, rank_processes, channels = hosting.rank_ends(job, conns[:-1],
                                                                 processes[:-1], remote)
        monitor = Monitor(job, [*rank_conns, conns[-1]], [*rank_processes, processes[-1]],
                          on_row, watchdog, folder,
                          hosts=service.hosts if service is not None else None,
                          channels=[*channels, Channel(conns[-1], (job.nodes,))],
                          config=config)
        # gloo's own timeout outlasts the watchdog, which sees every rank and names the
        # right one; a rank timing out sees only that its peer is late.
        meet = Rendezvous(None if service else store_path, watchdog + 60,
                          job.placement.backend, cluster.store_address if cluster else None)
        hosting.meet(rank_conns, meet)
        ranks_up()  # (a stop signal held since the run started stops it here)
        try:
            monitor.run()
        except (ExoframeError, KeyboardInterrupt) as e:
            # The error that stops the run carries what the run did, for the summary (see
            # run.py).
            error = e if isinstance(e, ExoframeError) else interrupted(e)
            status = "interrupted" if isinstance(error, RunInterrupted) else "failed"
            if status == "failed" and cluster is not None:
                # torchrun's agents stop the ranks it stops, and the one that started this
                # process then signals it: the CLI's handler (under this launch's, restored
                # below) lets that first signal pass
                stopping_for_a_failure()
            raise RunStopped.of(error, status, monitor.flush()) from error
        done = evaluator_done(conns[-1], monitor.relay, watchdog)
        end = time.perf_counter()
        return LaunchResult(rank_results=monitor.results,
                            startup_seconds=(monitor.first_step_at or end) - start,
                            elapsed_seconds=end - start, final_state=done.final_state,
                            steps=monitor.last_step(), stopped_by=monitor.stopped_by(),
                            bytes_between_sites=monitor.sim.bytes_between_sites(),
                            validation=validation_record(val_set, done, monitor.results,
                                                         job))
    except KeyboardInterrupt as e:  # while starting or stopping, outside monitor.run()
        error = interrupted(e)
        raise RunStopped.of(error, "interrupted", monitor.emitted if monitor else []) \
            from error
    finally:
        restore_signals(previous)
        stop_all(processes)
        hosting.close()
        if service is not None:
            service.close()
        for conn in remote.values():  # a rank still waiting learns that the run ended
            conn.close()
