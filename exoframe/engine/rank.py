"""What one rank process does: join the group, build its clock and strategy, train."""
from __future__ import annotations

import copy
import datetime
import math
import random
import resource
import time
from dataclasses import dataclass
from typing import Callable

import numpy
import torch
import torch.distributed as dist

from .. import distributed
from ..comm import Communicator
from ..comm.exchange import Exchange, TorchExchange
from ..comm.faults import RankFaults
from ..errors import ExoframeError
from ..sim.clock import RankClock, StepClock
from ..sim.measured import RealClock
from ..sim.compute import ComputeClock
from . import devices, rank_state
from .data import Batches
from .job import Job
from .loop import Precision, forward_backward, set_lr
from .messages import (AskStop, CheckpointLate, Checkpointed, PipeSimPort, RankDone, Rendezvous,
                       StepDone, StepState)
from .model_state import snapshot
from .replicas import checksum
from .schedule import lr_at


def join_group(rank: int, world_size: int, rendezvous: Rendezvous,
               device: torch.device | None = None):
    """Meet the other ranks through a file in the launcher's private folder (no port), or
    under torchrun through its rendezvous store. Returns the group for point-to-point
    transfers when it is not the default group.

    NCCL makes its communicators eagerly here (device_id), but would make one per pair of
    ranks at their first send/recv, blocking until both are there, while the simulator may
    hold the peer back: under NCCL, point-to-point goes through a gloo group."""
    backend = rendezvous.backend
    timeout = datetime.timedelta(seconds=rendezvous.timeout_seconds)
    if rendezvous.tcp_store is not None:
        host, port, prefix = rendezvous.tcp_store
        store = dist.PrefixStore(prefix + "group/", dist.TCPStore(
            host, port, is_master=False, timeout=timeout))
    else:
        store = dist.FileStore(rendezvous.store_path, world_size)
    eager = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=timeout, **eager)
    return dist.new_group(backend="gloo") if backend == "nccl" else None


def check_finite(value: float, step: int, rank: int, on_nonfinite: str):
    if not math.isfinite(value) and on_nonfinite == "stop":
        shown = "NaN" if math.isnan(value) else value
        raise ExoframeError(
            f"loss became {shown} at step {step} on rank {rank}. Lower the learning rate or "
            "fix the model, or train on anyway with --on-nonfinite continue.")


@dataclass
class PackedNode:
    """A node that shares its worker process with others (engine/packing.py): how it
    exchanges tensors, and its own CPU time."""
    exchange: Exchange  # comm.memory.MemoryExchange
    timer: Callable[[], float]


def make_clock(rank: int, job: Job, port: PipeSimPort, device: torch.device,
               timer=None) -> StepClock:
    """timer: the compute timer (default: the thread's CPU time, or a GPU timer)."""
    sim = job.sim
    if timer is None:
        timer = devices.gpu_timer(device) if device.type == "cuda" else time.thread_time
    if sim.real:
        return RealClock(rank, timer, sim.topology.algorithms, sim.algorithms, sim.topology)
    compute = ComputeClock(sim.compute, sim.stragglers.for_rank(rank, job.seed), timer)
    return RankClock(rank, port, compute, sim.topology.algorithms,
                     sim.algorithms, topology=sim.topology)


def stop_after(port: PipeSimPort, rank: int, step: int) -> bool:
    """Whether to stop after `step`, as the launcher answers once it has validated step
    `step` − LAG: the same answer for every rank (see engine/target.py)."""
    port.conn.send(AskStop(rank, step))
    return port.recv().stop


def train(rank: int, job: Job, batches: Batches, conn, packed: PackedNode | None = None):
    """batches: this rank's data, made by the launcher before the fork. Every rank inherits
    the launcher's model through the fork (a packed node copies it), so all start identical.

    At evaluation steps the rank sends its model state (weights and buffers) with its step
    record; the launcher averages them and an evaluator process validates the average, so
    no rank waits for another outside the simulated network. With a target loss, every step
    is evaluated and the rank asks the launcher whether to stop (see engine/target.py)."""
    if packed is None:
        torch.set_num_threads(job.threads)
        rendezvous = conn.recv()
        device = job.placement.device_of(rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)  # NCCL's communicator and the default CUDA stream
        exchange = TorchExchange(p2p_group=join_group(rank, job.nodes, rendezvous, device))
        model = job.model.to(device)
    else:
        device, exchange, model = torch.device("cpu"), packed.exchange, copy.deepcopy(job.model)
    # Per-rank randomness (dropout, a user's draws), the same in every run of this seed
    # (a forked process's Python generator is reseeded from the OS at the fork).
    seed = job.seed * 1_000_003 + rank
    torch.manual_seed(seed)
    random.seed(seed)
    numpy.random.seed(seed % 2**32)
    port = PipeSimPort(conn, rank)
    clock = make_clock(rank, job, port, device, packed.timer if packed else None)
    faults = RankFaults(rank, job.faults.plan(job.nodes, job.seed), job.strategy_name,
                        job.strategy_cls.survives_failures) if job.faults.active else None
    comm = Communicator(rank, job.nodes, clock, faults=faults, exchange=exchange)
    comm.remote.declared = job.strategy_cls.remote_calls
    distributed.bind(comm)
    strategy = job.strategy_cls(model, comm, job.optimizer, job.strategy_params, seed=job.seed,
                                total_steps=job.steps)
    precision = Precision(job.precision, device)
    pieces = (model, strategy, batches, clock, comm, precision)
    first = 1
    if job.resume_from is not None:
        first = rank_state.restore(rank_state.load(job.resume_from.rank_file(rank), device),
                                   *pieces) + 1
    checkpoints = rank_state.RankCheckpoints(job.checkpoint_every, job.run_dir, rank)

    # Under simulated failures a rank that is down misses synchronizations: no check.
    check_replicas = (job.strategy_cls.replicas_equal_after_sync and job.nodes > 1
                      and not job.faults.active)
    model.train()
    clock.skip()
    for step in range(first, job.steps + 1):
        # A failed node computes nothing; it still steps, so its collectives stay matched.
        down = faults is not None and faults.at_step_start(step, clock)
        clock.start_step()
        lr = set_lr(strategy, lr_at(step, job.optimizer.lr, job.schedule, job.steps,
                                    job.warmup_steps, job.min_lr_ratio))
        loss = grad_norm = None
        if not down:
            loss = forward_backward(model, batches, job.accumulate, precision, device,
                                    step).item()
            check_finite(loss, step, rank, job.on_nonfinite)
            grad_norm = precision.unscale_and_clip(strategy.optimizer, model.parameters(),
                                                   job.clip_grad_norm)
        strategy.step_num = step
        strategy.step()
        if job.strategy_cls.remote_calls and not down:
            comm.remote.serve()
        if not down:  # a down rank unscaled nothing
            precision.update()
        clock.charge()
        clock.end_step(step)
        # (bookkeeping, as what follows: the clock.skip() below leaves its time out)
        synced = checksum(model) if check_replicas and strategy.synced_at == step else None
        record = {"loss": loss, "lr": lr, "bytes_sent": comm.traffic.bytes_sent,
                  "sim_time": clock.now, **precision.metrics(), **strategy.metrics()}
        if job.clip_grad_norm is not None:
            record["grad_norm"] = grad_norm  # before clipping
        if faults is not None:
            record["nodes_down"] = int(down)
        evaluate = step % job.eval_every == 0 or step == job.steps  # always at the last step
        state = snapshot(strategy, rank) if evaluate else None
        conn.send(StepDone(rank, step, record, state, synced))
        stop = job.asks_to_stop(step) and stop_after(port, rank, step)
        if stop and state is None:  # the final model and its validation need this step's
            conn.send(StepState(rank, step, snapshot(strategy, rank)))
        for wanted in port.checkpoint_requests():  # the run was asked to stop
            if not checkpoints.request(wanted, step):
                conn.send(CheckpointLate(rank, step))
        if checkpoints.save_now(step, comm):
            rank_state.save(checkpoints.folder.rank_file(step, rank),
                            rank_state.capture(step, *pieces))
            conn.send(Checkpointed(rank, step))
        clock.skip()
        if stop:
            break

    strategy.finish()
    comm.wait_all()
    stats = clock.stats()  # training ends here; what follows only serves the others
    if job.strategy_cls.remote_calls:
        comm.remote.barrier()  # serve what peers still ask until every rank is here
    conn.send(RankDone(rank, {
        "traffic": comm.traffic.as_dict(),
        "bytes_sent": comm.traffic.bytes_sent,
        "bytes_received": comm.traffic.bytes_received,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "samples": batches.samples,
        **stats,
        "failures": faults.records if faults is not None else [],
        "trace": clock.trace,
    }))
