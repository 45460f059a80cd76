"""The evaluator process: validation loss of the ranks' averaged model (weights and buffers).

It runs beside the ranks, so validation never makes one rank wait for another outside the
simulated network (which would stall the simulator's conservative synchronization).
"""
from __future__ import annotations

import torch

from .data import eval_batches
from .job import Job
from .model_state import load


@torch.no_grad()
def validation_loss(model, val_shards, batch_size: int, max_batches: int) -> float | None:
    """Mean loss over the first `max_batches` batches of every rank's validation shard."""
    model.eval()
    total, count = 0.0, 0
    for shard in val_shards:
        for batch in eval_batches(shard, batch_size, max_batches):
            n = len(batch[0]) if isinstance(batch, (tuple, list)) else len(batch)
            total += model(batch).item() * n
            count += n
    return total / count if count else None


def evaluate(job: Job, val_shards, conn):
    """Answer each (step, averaged model state) with ("val", step, loss) until None."""
    torch.set_num_threads(job.threads)
    while (message := conn.recv()) is not None:
        step, state = message
        load(job.model, state)
        conn.send(("val", step, validation_loss(job.model, val_shards, job.batch_size,
                                                job.eval_batches)))
