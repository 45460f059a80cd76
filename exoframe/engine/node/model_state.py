"""The ranks' models as the evaluator validates them, folded where they live.

At an evaluation step each rank adds the model it would deploy (its strategy's
`held_weights`: parameters and floating-point buffers) and, where asked, its current weights
into a Fold, on its own device. A worker of packed nodes folds its nodes' before anything
leaves it; the evaluator folds what the ranks and workers send (FoldedModels) and validates
once every rank is in. The launcher never holds a model.

A Fold's mean is summed in float64: float32 values of up to 1024 ranks whose magnitudes lie
within 2^19 of each other's (replicas of one model) sum exactly there, so the mean does not
depend on how the nodes are grouped into processes (packed and unpacked runs validate the
same bits). A down rank (a simulated
failure) counts only while no rank is up. "rank0" folds keep the lowest live rank's weights
instead. The other buffers (counters such as num_batches_tracked) are rank 0's, as torch's
DistributedDataParallel broadcasts them. Arrays, not tensors, cross the pipes: torch would
pass tensors through shared memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ...comm import unflatten_into
from ...strategies.base import current_weights


def exact_buffers(model: torch.nn.Module) -> list[torch.Tensor]:
    return [b for b in model.buffers() if not b.is_floating_point()]


def _flat64(tensors, device) -> torch.Tensor:
    """The tensors' values, one after another, as one float64 tensor on `device`."""
    tensors = list(tensors)
    flat = torch.empty(sum(t.numel() for t in tensors), dtype=torch.float64, device=device)
    offset = 0
    for t in tensors:
        n = t.numel()
        flat[offset:offset + n].copy_(t.detach().reshape(-1))
        offset += n
    return flat


def _add_into(total: torch.Tensor, tensors):
    offset = 0
    for t in tensors:
        n = t.numel()
        total[offset:offset + n].add_(t.detach().reshape(-1))
        offset += n


class Fold:
    """One kind of weights (the held model, or the current weights) over some ranks: their
    mean (float64 sums of the live and of the down ranks apart), or with how="rank0" the
    lowest live rank's (else the lowest rank's)."""

    def __init__(self, how: str = "average"):
        self.how = how
        self.sums: dict[bool, torch.Tensor] = {}  # live? -> the sum (average)
        self.counts: dict[bool, int] = {}
        self.lowest: dict[bool, tuple] = {}  # live? -> (rank, its weights) (rank0)
        self.float32 = True  # every weight added was float32
        self.final: Optional[torch.Tensor] = None  # the result alone, once every rank is in

    def add(self, rank: int, tensors, live: bool, device=None):
        """A rank's weights (tensors in model order), on their device."""
        tensors = list(tensors)
        device = device if device is not None else tensors[0].device
        self.float32 = self.float32 and all(t.dtype == torch.float32 for t in tensors)
        if self.how == "rank0":
            if live not in self.lowest or rank < self.lowest[live][0]:
                self.lowest[live] = (rank, _flat64(tensors, device))
            return
        if live in self.sums:
            _add_into(self.sums[live], tensors)
        else:
            self.sums[live] = _flat64(tensors, device)
        self.counts[live] = self.counts.get(live, 0) + 1

    def merge(self, other: "Fold"):
        """Fold in another Fold's ranks (another worker's)."""
        if self.final is not None or other.final is not None:
            raise ValueError("a fold with every rank in takes no more")
        self.float32 = self.float32 and other.float32
        for live, total in other.sums.items():
            total = total.to(self._device(total))
            if live in self.sums:
                self.sums[live].add_(total)
            else:
                self.sums[live] = total
            self.counts[live] = self.counts.get(live, 0) + other.counts[live]
        for live, (rank, weights) in other.lowest.items():
            if live not in self.lowest or rank < self.lowest[live][0]:
                self.lowest[live] = (rank, weights)

    def _device(self, tensor):
        for mine in self.sums.values():
            return mine.device
        return tensor.device

    def result(self) -> torch.Tensor:
        """The folded weights, flat, float64 (float32 once collapsed): the live ranks' if any
        is live."""
        if self.final is not None:
            return self.final
        live = True if (True in self.sums or True in self.lowest) else False
        if self.how == "rank0":
            return self.lowest[live][1]
        return self.sums[live] / self.counts[live]

    def collapse(self):
        """Every rank is in: keep the result alone, in float32 where the weights are (the
        bits loading the float64 mean into them would give), in half the bytes."""
        final = self.result()
        self.final = final.float() if self.float32 else final
        self.sums, self.counts, self.lowest = {}, {}, {}

    def __getstate__(self):
        single = self.float32 and sum(self.counts.values()) <= 1
        return {"how": self.how, "counts": self.counts, "float32": self.float32,
                "sums": {k: _portable(v, single) for k, v in self.sums.items()},
                "lowest": {k: (r, _portable(v, self.float32))
                           for k, (r, v) in self.lowest.items()},
                "final": None if self.final is None else self.final.cpu().numpy()}

    def __setstate__(self, state):
        self.how, self.counts, self.float32 = state["how"], state["counts"], state["float32"]
        self.sums = {k: torch.from_numpy(v).double() for k, v in state["sums"].items()}
        self.lowest = {k: (r, torch.from_numpy(v).double())
                       for k, (r, v) in state["lowest"].items()}
        final = state["final"]
        self.final = None if final is None else torch.from_numpy(final)


def _portable(tensor: torch.Tensor, float32: bool) -> np.ndarray:
    """A float64 tensor as a numpy array for a pipe; float32: it holds one float32 rank's
    weights, which float32 holds exactly, in half the bytes."""
    return (tensor.float() if float32 else tensor).cpu().numpy()


@dataclass
class FoldedModels:
    """Some ranks' models at an evaluation step, folded (a rank's own, or a worker's nodes'),
    on their way to the evaluator. `replicas` is the current weights' Fold where the held model
    is not the replicas' average and the run validates that average at this step; a
    replicas-only contribution (held None) comes when a run stops after an evaluation step
    that did not include it."""
    step: int
    ranks: int  # how many ranks are folded in
    held: Optional[Fold]
    replicas: Optional[Fold] = None
    exact: Optional[list] = None  # rank 0's other buffers (numpy), where rank 0 is folded in
    # Every rank's held model is the one their worker sent last (DiLoCo between outer steps):
    # not sent again (held is None).
    held_same: bool = False

    @property
    def holds_held(self) -> bool:
        return self.held is not None or self.held_same

    def merge(self, other: "FoldedModels"):
        self.ranks += other.ranks
        for name in ("held", "replicas"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if theirs is not None:
                if mine is None:
                    setattr(self, name, theirs)
                else:
                    mine.merge(theirs)
        if other.exact is not None:
            self.exact = other.exact


def same_buffers(a: Optional[list], b: Optional[list]) -> bool:
    """Whether two lists of exact buffers (numpy) hold the same values."""
    return len(a or []) == len(b or []) and all(
        np.array_equal(x, y) for x, y in zip(a or [], b or []))


def fold_into(pending: dict, models: FoldedModels, ranks: int) -> FoldedModels | None:
    """Fold `models` into `pending` (step, holds the held model? -> fold); the fold, taken out
    of `pending`, once `ranks` ranks are in it, else None."""
    key = (models.step, models.holds_held)
    folded = pending.setdefault(key, models)
    if folded is not models:
        folded.merge(models)
    if folded.ranks < ranks:
        return None
    return pending.pop(key)


def add_models(into: FoldedModels | None, strategy, rank: int, step: int, live: bool,
               held: bool = True, replicas: bool = False, device=None) -> FoldedModels:
    """This rank's models at `step` added into the fold `into` (None: a fold of its own): its
    held model (unless `held` is False) and, with `replicas`, its current weights. live: the
    rank was up (not a simulated failure)."""
    model, cls = strategy.model, type(strategy)
    if device is not None and torch.device(device).type == "mps":
        device = torch.device("cpu")  # (MPS has no float64)
    if into is None:
        into = FoldedModels(step, 0, Fold(cls.traits.held_model_from) if held else None,
                            Fold() if replicas else None)
    if held:
        into.held.add(rank, strategy.held_weights(), live, device)
    if replicas:
        into.replicas.add(rank, current_weights(model), live, device)
    if rank == 0:
        into.exact = [b.detach().cpu().numpy().copy() for b in exact_buffers(model)]
    into.ranks += 1
    return into


@dataclass(frozen=True)
class ModelState:
    """A model as the evaluator validated it: the weights flat (float64, model order) and the
    other buffers."""
    weights: np.ndarray
    exact: Optional[list]


def load(model: torch.nn.Module, state: ModelState):
    """Write a state into `model`, in place."""
    weights = state.weights
    weights = torch.from_numpy(weights) if isinstance(weights, np.ndarray) else weights
    unflatten_into(weights, current_weights(model))
    with torch.no_grad():
        for buffer, value in zip(exact_buffers(model), state.exact or [], strict=True):
            buffer.copy_(torch.from_numpy(value).view_as(buffer))
