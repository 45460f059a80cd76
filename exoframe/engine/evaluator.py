"""The evaluator process: validation loss of the model the ranks hold (the strategy's held
model, engine/model_state.py) and, where that is another, of the replicas' average.

It runs beside the ranks, so validation never makes one rank wait for another outside the
simulated network (which would stall the simulator's conservative synchronization).
"""
from __future__ import annotations

import numpy as np
import torch

from .data import eval_batches, examples_in
from .loop import to_device
from .messages import EvaluatorStop, Validated
from .job import Job
from .model_state import load, replicas_average


@torch.no_grad()
def validate(model, val_shards, batch_size: int, max_batches: int, metrics=None,
             device: torch.device = torch.device("cpu")):
    """(mean loss, {name: mean value} of the workload's metrics) over the first
    `max_batches` batches of every rank's validation shard, averaged over examples;
    (None, {}) without validation data."""
    model.eval()
    total, count, sums = 0.0, 0, {}
    for shard in val_shards:
        for batch in eval_batches(shard, batch_size, max_batches):
            n = examples_in(batch)
            batch = to_device(batch, device)
            total += model(batch).item() * n
            count += n
            for name, value in (metrics(model, batch) if metrics else {}).items():
                sums[name] = sums.get(name, 0.0) + float(value) * n
    if not count:
        return None, {}
    return total / count, {name: value / count for name, value in sums.items()}


def evaluate(job: Job, val_shards, conn):
    """Answer each Evaluate (a step's model state) with Validated until told EvaluatorStop.
    A held model equal to the one validated before (DiLoCo's between outer steps) is not
    validated again. On a GPU run the evaluator validates on rank 0's device."""
    torch.set_num_threads(job.threads)
    device = job.placement.device_of(0)
    job.model.to(device)

    def validated(state):
        load(job.model, state)
        return validate(job.model, val_shards, job.batch_size, job.eval_batches, job.metrics,
                        device)

    last = None  # (held state, its loss and metrics)
    while not isinstance(message := conn.recv(), EvaluatorStop):
        state = message.state
        if last is not None and _same(last[0], state):
            loss, metrics = last[1]
        else:
            loss, metrics = validated(state)
            last = (state, (loss, metrics))
        replicas = replicas_average(state)
        replicas_loss = validated(replicas)[0] if replicas is not None else None
        conn.send(Validated(message.step, loss, metrics, replicas_loss))


def _same(a, b) -> bool:
    return (np.array_equal(a.averaged, b.averaged)
            and all(np.array_equal(x, y) for x, y in zip(a.exact, b.exact, strict=True)))
