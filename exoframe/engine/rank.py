"""What one rank process does: join the group, build its strategy and data, train."""
from __future__ import annotations

import copy
import datetime
import resource

import torch
import torch.distributed as dist

from ..comm import Communicator, flatten, unflatten_into
from ..errors import ExoframeError
from .data import Batches, eval_batches
from .job import Job

STORE_TIMEOUT = datetime.timedelta(seconds=60)


def join_group(rank: int, world_size: int, port: int):
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=STORE_TIMEOUT)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                            timeout=STORE_TIMEOUT)


def averaged_parameters(model) -> torch.Tensor:
    """Mean of every rank's parameters, as a flat buffer. Bookkeeping, not strategy traffic:
    it bypasses the Communicator, so it is neither counted nor timed."""
    flat = flatten(model.parameters())
    if dist.get_world_size() > 1:
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
    return flat


def check_loss(loss, step):
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        shape = list(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ExoframeError(
            f"the model's forward(batch) must return a scalar loss tensor; it returned {shape}"
            f"{f' at step {step}' if step else ''}. Reduce it, e.g. with .mean().")


@torch.no_grad()
def validate(job: Job, eval_model, averaged: torch.Tensor, val_shard) -> float | None:
    """Validation loss of the averaged weights `averaged` (flat), over every rank's shard."""
    unflatten_into(averaged, list(eval_model.parameters()))
    eval_model.eval()
    total = torch.zeros(2, dtype=torch.float64)  # [sum of losses × examples, examples]
    for batch in eval_batches(val_shard, job.batch_size, job.eval_batches):
        n = len(batch[0]) if isinstance(batch, (tuple, list)) else len(batch)
        total += torch.tensor([eval_model(batch).item() * n, n], dtype=torch.float64)
    if dist.get_world_size() > 1:
        dist.all_reduce(total)
    return (total[0] / total[1]).item() if total[1] > 0 else None


def train(rank: int, job: Job, batches: Batches, val_shard, conn):
    """batches and val_shard are this rank's data, made by the launcher before the fork.
    Every rank inherits the launcher's model through the fork, so all start identical."""
    torch.set_num_threads(job.threads)
    join_group(rank, job.nodes, conn.recv())
    torch.manual_seed(job.seed * 1_000_003 + rank)  # per-rank randomness (dropout, ...)
    model = job.model
    comm = Communicator(rank, job.nodes)
    strategy = job.strategy_cls(model, comm, job.optimizer, job.strategy_params, seed=job.seed)
    eval_model = copy.deepcopy(model)

    model.train()
    for step in range(1, job.steps + 1):
        loss = model(next(batches))
        check_loss(loss, step)
        loss.backward()
        strategy.step_num = step
        strategy.step()
        record = {"loss": loss.item(), "bytes_sent": comm.traffic.bytes_sent,
                  **strategy.metrics()}
        if step % job.eval_every == 0 or step == job.steps:  # always at the last step
            averaged = averaged_parameters(model)
            record["val_loss"] = validate(job, eval_model, averaged, val_shard)
        conn.send(("step", rank, step, record))

    conn.send(("done", rank, {
        "traffic": comm.traffic.as_dict(),
        "bytes_sent": comm.traffic.bytes_sent,
        "bytes_received": comm.traffic.bytes_received,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "final_parameters": averaged.numpy() if rank == 0 else None,
    }))
