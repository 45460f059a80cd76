"""The evaluator process: validation loss of the model the ranks hold (the strategy's held
model) and, where that is another and the run asks for it, of the replicas' average.

The ranks send it their models folded where they live (engine/node/model_state.py): each rank
process over a pipe of its own, each worker of packed nodes its nodes' fold, a rank on another
machine through the launcher. It folds them, in float64, and validates once every rank is in.
It runs beside the ranks, so validation never makes one rank wait for another outside the
simulated network (which would stall the simulator's conservative synchronization).
"""
from __future__ import annotations

import multiprocessing.connection
import time

import numpy as np
import torch

from ...strategies.base import current_weights
from ..ipc.messages import EvaluatorDone, EvaluatorStop, Validated
from ..node.data import examples_in
from ..node.loop import to_device
from ..node.model_state import FoldedModels, ModelState, fold_into, load, same_buffers
from ..node.node_globals import TURNS, NodeGlobals
from ..plan.job import Job
from .validation_set import ValidationSet, batches


@torch.no_grad()
def validate(model, dataset, batch_size: int, metrics=None,
             device: torch.device = torch.device("cpu")):
    """(mean loss, {name: mean value} of the workload's metrics) over the validation set
    (engine/launch/validation_set.py), averaged over examples; (None, {}) without validation
    data."""
    if dataset is None:
        return None, {}
    model.eval()
    total, count, sums = 0.0, 0, {}
    for batch in batches(dataset, batch_size):
        n = examples_in(batch)
        batch = to_device(batch, device)
        total += model(batch).item() * n
        count += n
        for name, value in (metrics(model, batch) if metrics else {}).items():
            sums[name] = sums.get(name, 0.0) + float(value) * n
    if not count:
        return None, {}
    return total / count, {name: value / count for name, value in sums.items()}


class Evaluations:
    """Folded models in, Validated out: folds each step's until every rank's is in. A held
    model equal to the one validated before (DiLoCo's between outer steps) is not validated
    again."""

    def __init__(self, job: Job, val_set: ValidationSet, send):
        self.job, self.val_set, self.send = job, val_set, send
        self.device = job.placement.device_of(0)
        job.model.to(self.device)
        self.pending: dict[tuple, FoldedModels] = {}  # (step, holds the held model?) -> fold
        self.last = None  # (held weights, exact buffers, (loss, metrics)) validated last
        self.final = None  # (step, ModelState): the latest step's held model
        self.validating_seconds = 0.0
        self.moving_seconds = 0.0  # folding the ranks' models here (the ranks count theirs)

    def add(self, models: FoldedModels):
        start = time.perf_counter()
        folded = fold_into(self.pending, models, self.job.nodes)
        self.moving_seconds += time.perf_counter() - start
        if folded is not None:
            self._validate(folded)

    def _validated(self, weights, exact):
        start = time.perf_counter()
        load(self.job.model, ModelState(weights, exact))
        result = validate(self.job.model, self.val_set.dataset, self.job.batch_size,
                          self.job.metrics, self.device)
        self.validating_seconds += time.perf_counter() - start
        return result

    def _validate(self, folded: FoldedModels):
        loss, metrics, replicas_loss = None, {}, None
        start = time.perf_counter()
        held = folded.held.result() if folded.held is not None else None
        replicas = folded.replicas.result() if folded.replicas is not None else None
        self.moving_seconds += time.perf_counter() - start
        last, exact = self.last, folded.exact
        if folded.held_same:  # its worker's mark: the held model validated last
            held, exact = last[0], last[1]
        if held is not None:
            if last is not None and torch.equal(last[0], held) and same_buffers(last[1], exact):
                loss, metrics = last[2]
            else:
                loss, metrics = self._validated(held, exact)
                self.last = (held, exact, (loss, metrics))
            if self.final is None or folded.step >= self.final[0]:
                self.final = (folded.step, ModelState(held.numpy(), exact))
        if replicas is not None:
            replicas_loss = self._validated(replicas, folded.exact)[0]
        self.send(Validated(folded.step, loss, metrics, replicas_loss, held=held is not None))

    def done(self) -> EvaluatorDone:
        """The last word; the final model in float32 where the model is (the same bits as
        loading the float64 mean into it, in half the bytes)."""
        final = self.final[1] if self.final else None
        if final is not None and all(t.dtype == torch.float32
                                     for t in current_weights(self.job.model)):
            final = ModelState(final.weights.astype(np.float32, copy=False), final.exact)
        return EvaluatorDone(final, self.validating_seconds, self.moving_seconds)


def evaluate(job: Job, val_set: ValidationSet, readers: list, conn):
    """Fold what comes from the launcher (`conn`) and the ranks' own pipes (`readers`), answer
    each complete step with Validated, until told EvaluatorStop; then answer EvaluatorDone
    (the last step's held model, the seconds spent). On a GPU run the evaluator validates on
    rank 0's device."""
    torch.set_num_threads(job.threads)
    evaluations = Evaluations(job, val_set, conn.send)
    with TURNS:  # (under --in-process the nodes' threads read the same generators now)
        own = NodeGlobals(cuda=False)  # (its random generators: a metric may draw)
    reading = [conn, *readers]
    while True:
        for source in multiprocessing.connection.wait(reading):
            start = time.perf_counter()
            try:
                message = source.recv()
            except EOFError:
                if source is conn:
                    return  # the launcher is gone
                reading.remove(source)  # a rank that finished
                continue
            if isinstance(message, EvaluatorStop):
                conn.send(evaluations.done())
                return
            evaluations.moving_seconds += time.perf_counter() - start
            with TURNS:  # (the nodes' generators are the process's during their turns)
                own.swap_in()
                try:
                    evaluations.add(message)
                finally:
                    own.swap_out()
