"""What one rank process does: join the group, build its clock and strategy, train."""
from __future__ import annotations

import datetime
import math
import resource

import torch
import torch.distributed as dist

from ..comm import Communicator
from ..errors import ExoframeError
from ..sim.clock import RankClock
from ..sim.compute import ComputeClock
from .data import Batches
from .job import Job
from .model_state import snapshot
from .target import LAG

def join_group(rank: int, world_size: int, store_path: str, timeout_seconds: float):
    """Meet the other ranks through a file in the launcher's private folder: no port."""
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_seconds))


def check_loss(loss, step):
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        shape = list(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ExoframeError(
            f"the model's forward(batch) must return a scalar loss tensor; it returned {shape}"
            f"{f' at step {step}' if step else ''}. Reduce it, e.g. with .mean().")


def check_finite(value: float, step: int, rank: int, on_nonfinite: str):
    if not math.isfinite(value) and on_nonfinite == "stop":
        shown = "NaN" if math.isnan(value) else value
        raise ExoframeError(
            f"loss became {shown} at step {step} on rank {rank}. Lower the learning rate or "
            "fix the model, or train on anyway with --on-nonfinite continue.")


def make_clock(rank: int, job: Job, conn) -> RankClock:
    sim = job.sim
    compute = ComputeClock(sim.compute, sim.stragglers.for_rank(rank, job.seed))
    return RankClock(rank, conn, compute, sim.topology.algorithms, sim.algorithms)


def stop_after(conn, rank: int, step: int) -> bool:
    """Whether to stop after `step`, as the launcher answers once it has validated step
    `step` − LAG: the same answer for every rank (see engine/target.py)."""
    conn.send(("verdict", rank, step))
    _, stop = conn.recv()
    return stop


def train(rank: int, job: Job, batches: Batches, conn):
    """batches: this rank's data, made by the launcher before the fork. Every rank inherits
    the launcher's model through the fork, so all start identical.

    At evaluation steps the rank sends its model state (weights and buffers) with its step
    record; the launcher averages them and an evaluator process validates the average, so
    no rank waits for another outside the simulated network. With a target loss, every step
    is evaluated and the rank asks the launcher whether to stop (see engine/target.py)."""
    torch.set_num_threads(job.threads)
    join_group(rank, job.nodes, *conn.recv())
    torch.manual_seed(job.seed * 1_000_003 + rank)  # per-rank randomness (dropout, ...)
    model = job.model
    clock = make_clock(rank, job, conn)
    comm = Communicator(rank, job.nodes, clock)
    strategy = job.strategy_cls(model, comm, job.optimizer, job.strategy_params, seed=job.seed)

    model.train()
    clock.skip()
    for step in range(1, job.steps + 1):
        clock.start_step()
        loss = model(next(batches))
        check_loss(loss, step)
        loss_value = loss.item()
        check_finite(loss_value, step, rank, job.on_nonfinite)
        loss.backward()
        strategy.step_num = step
        strategy.step()
        clock.charge()
        clock.end_step(step)
        record = {"loss": loss_value, "bytes_sent": comm.traffic.bytes_sent,
                  "sim_time": clock.now, **strategy.metrics()}
        evaluate = step % job.eval_every == 0 or step == job.steps  # always at the last step
        state = snapshot(model, rank) if evaluate else None
        conn.send(("step", rank, step, record, state))
        stop = (job.target_loss is not None and LAG < step < job.steps
                and stop_after(conn, rank, step))
        clock.skip()
        if stop:
            break

    strategy.finish()
    comm.wait_all()
    conn.send(("done", rank, {
        "traffic": comm.traffic.as_dict(),
        "bytes_sent": comm.traffic.bytes_sent,
        "bytes_received": comm.traffic.bytes_received,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        **clock.stats(),
        "trace": clock.trace,
    }))
