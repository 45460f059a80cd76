"""SPARTA: after each local step, average a random fraction p of the parameters.

Every step, each parameter element is selected with probability p by a mask drawn from a
generator seeded with (run seed, step), identical on every rank, so no mask is sent; the
selected values are all-reduced (mean) and written back. The model's floating-point buffers
(BatchNorm statistics) are part of the vector the mask is drawn over.
Bytes per step: one all-reduce of about p × (number of parameters) values.
Source: Exo Labs, "SPARTA: Sparse Parameter Averaging" (2025).
"""
from dataclasses import dataclass

import torch

from ..comm import flatten, unflatten_into
from .base import Strategy, check_fraction
from .seeds import derive
from .traits import Traits


class Sparta(Strategy):
    """Each step, average a random fraction p of parameters (shared-seed mask, none sent)."""

    traits = Traits(held_model="replicas' average (a model no node holds)")

    @dataclass
    class Params:
        p: float = 0.005

        def __post_init__(self):
            check_fraction("sparta", p=self.p)

    def setup(self):
        self.generator = torch.Generator()

    def step(self):
        self.optimizer.step()
        self.optimizer.zero_grad()
        params = self.trainable_parameters()
        numel = sum(p.numel() for p in params)
        flat = self.with_buffers(flatten(params))  # buffers are sampled like parameters
        self.generator.manual_seed(derive(self.seed, self.step_num))
        index = (torch.rand(flat.numel(), generator=self.generator) < self.params.p).nonzero()
        if index.numel() == 0:
            return
        index = index.squeeze(1)
        values = flat[index]
        self.comm.all_reduce(values, op="mean")
        flat[index] = values
        unflatten_into(self.take_buffers(flat, numel), params)
