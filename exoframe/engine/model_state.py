"""A model's state as the ranks send it to the launcher for evaluation and the final model.

Each rank sends the model it would deploy (its strategy's `held_weights`: parameters and
floating-point buffers) and, when that is not its current weights, those too. The launcher
takes one model over the ranks as the strategy declares (`held_model_from`: their mean, or
rank 0's), and the mean of the current weights as the replicas' average. The other buffers
(counters such as num_batches_tracked) are taken from rank 0, as torch's
DistributedDataParallel broadcasts them. Arrays, not tensors, cross the pipes: torch would
pass tensors through shared memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ..comm import flatten, unflatten_into
from ..strategies.base import current_weights


def exact_buffers(model: torch.nn.Module) -> list[torch.Tensor]:
    return [b for b in model.buffers() if not b.is_floating_point()]


@dataclass(frozen=True)
class ModelState:
    averaged: np.ndarray  # the held model's parameters and float buffers, flat, in model order
    exact: Optional[list]  # the other buffers: rank 0's (None from the other ranks)
    replicas: Optional[np.ndarray] = None  # the current weights, where they are not the held


def _flat(tensors) -> np.ndarray:
    return flatten([t.detach() for t in tensors]).cpu().numpy()


def snapshot(strategy, rank: int) -> ModelState:
    """This rank's held model (and its current weights where they differ)."""
    model = strategy.model
    exact = ([b.detach().cpu().numpy().copy() for b in exact_buffers(model)] if rank == 0
             else None)
    replicas = (None if type(strategy).held_model_is_replicas_average()
                else _flat(current_weights(model)))
    return ModelState(_flat(strategy.held_weights()), exact, replicas)


def _mean(arrays: list) -> np.ndarray:
    return np.sum(np.stack(arrays), axis=0) / len(arrays)  # summed in rank order


def combine(snapshots: list[ModelState], held_from: str = "average",
            exact: Optional[list] = None) -> ModelState:
    """One model from the ranks' snapshots: the held model as `held_from` says ("average":
    their mean; "rank0": the first snapshot's), the replicas' average, and rank 0's exact
    buffers (`exact`, where rank 0's snapshot is not among them)."""
    held = (snapshots[0].averaged if held_from == "rank0"
            else _mean([s.averaged for s in snapshots]))
    replicas = (None if snapshots[0].replicas is None
                else _mean([s.replicas for s in snapshots]))
    return ModelState(held, snapshots[0].exact if exact is None else exact, replicas)


def replicas_average(state: ModelState) -> ModelState | None:
    """The replicas' average as a state of its own (None where it is the held model)."""
    return None if state.replicas is None else ModelState(state.replicas, state.exact)


def load(model: torch.nn.Module, state: ModelState):
    """Write a state's held model into `model`, in place."""
    unflatten_into(torch.from_numpy(state.averaged), current_weights(model))
    with torch.no_grad():
        for buffer, value in zip(exact_buffers(model), state.exact, strict=True):
            buffer.copy_(torch.from_numpy(value).view_as(buffer))
