"""A model's state as the ranks send it to the launcher for evaluation and the final model.

Parameters and floating-point buffers (BatchNorm's running statistics) are averaged over
ranks; the other buffers (counters such as num_batches_tracked) are taken from rank 0, as
torch's DistributedDataParallel broadcasts them. Arrays, not tensors, cross the pipes:
torch would pass tensors through shared memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ..comm import flatten, unflatten_into
from ..strategies.base import float_buffers


def averaged_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    return [*model.parameters(), *float_buffers(model)]


def exact_buffers(model: torch.nn.Module) -> list[torch.Tensor]:
    return [b for b in model.buffers() if not b.is_floating_point()]


@dataclass(frozen=True)
class ModelState:
    averaged: np.ndarray  # parameters and float buffers, flat, in model order
    exact: Optional[list]  # the other buffers: rank 0's (None from the other ranks)


def snapshot(model: torch.nn.Module, rank: int) -> ModelState:
    flat = flatten(averaged_tensors(model)).detach().cpu().numpy()
    exact = ([b.detach().cpu().numpy().copy() for b in exact_buffers(model)] if rank == 0
             else None)
    return ModelState(flat, exact)


def average(snapshots: list[ModelState], exact: Optional[list] = None) -> ModelState:
    """The mean of the ranks' snapshots (summed in rank order: deterministic); the exact
    buffers are rank 0's (`exact`, where rank 0's snapshot is not among them)."""
    flat = np.sum(np.stack([s.averaged for s in snapshots]), axis=0) / len(snapshots)
    return ModelState(flat, snapshots[0].exact if exact is None else exact)


def load(model: torch.nn.Module, state: ModelState):
    """Write an averaged snapshot into `model`, in place."""
    unflatten_into(torch.from_numpy(state.averaged), averaged_tensors(model))
    with torch.no_grad():
        for buffer, value in zip(exact_buffers(model), state.exact, strict=True):
            buffer.copy_(torch.from_numpy(value).view_as(buffer))
