"""NoLoCo-style training: DiLoCo-like rounds whose outer step averages with one random
partner instead of all-reducing over every rank.

Each rank keeps outer weights φ_i and an outer velocity δ_i. Every H steps the ranks are
paired by a random permutation drawn from (run seed, round), identical on every rank (with
an odd count, the last rank of the permutation sits the round out). Partners swap their
outer gradient Δ = φ − θ and outer weights φ, then each rank updates
    δ_i ← μ·δ_i − lr·mean(Δ_i, Δ_j) − γ·(φ_i − mean(φ_i, φ_j)),   φ_i ← φ_i + δ_i,   θ_i ← φ_i.
The γ term pulls partners' outer weights together: with no global average, it is what keeps
the replicas from drifting apart. With lr = 1, μ = 0, γ = 0 a round averages the partners'
parameters.
Floating-point buffers (BatchNorm statistics) ride along and take the pair's mean.
Bytes per rank per round: one send of Δ and φ to the partner, 8N (none when sitting out).
Source: Kolehmainen et al., "NoLoCo: No-all-reduce Low Communication Training Method for
Large Models" (2025).
"""
from dataclasses import dataclass

import torch

from ..comm import flatten, unflatten_into
from .base import Strategy, check_fraction, check_positive
from .gossip import exchange_with
from .seeds import derive
from .traits import Traits


class NoLoCo(Strategy):
    """H local steps, then an outer step averaged with one random partner (no all-reduce)."""

    traits = Traits(held_model="replicas' average (a model no node holds)")

    @dataclass
    class Params:
        H: int = 50
        outer_lr: float = 0.7
        outer_momentum: float = 0.5
        gamma: float = 0.5

        def __post_init__(self):
            check_positive("noloco", H=self.H, outer_lr=self.outer_lr)
            check_fraction("noloco", outer_momentum=self.outer_momentum, gamma=self.gamma)

    def setup(self):
        self.outer_params = flatten(self.trainable_parameters())
        self.velocity = torch.zeros_like(self.outer_params)
        self.generator = torch.Generator()

    def partner(self, round_num: int):
        self.generator.manual_seed(derive(self.seed, round_num))
        order = torch.randperm(self.world_size, generator=self.generator).tolist()
        position = order.index(self.rank)
        if position == len(order) - 1 and len(order) % 2 == 1:
            return None
        return order[position ^ 1]

    def step(self):
        self.optimizer.step()
        self.optimizer.zero_grad()
        if self.step_num % self.params.H == 0:
            self.outer_step()

    def outer_step(self):
        p = self.params
        params = self.trainable_parameters()
        outer_grad = self.outer_params - flatten(params)
        partner = self.partner(self.step_num // p.H)
        mean_grad, mean_outer = outer_grad, self.outer_params
        if partner is not None:
            mine = self.with_buffers(torch.cat([outer_grad, self.outer_params]))
            theirs = exchange_with(self.comm, mine, [partner])[partner]
            numel = outer_grad.numel()
            mean_grad = (outer_grad + theirs[:numel]) / 2
            mean_outer = (self.outer_params + theirs[numel:2 * numel]) / 2
            self.take_buffers((mine + theirs) / 2, 2 * numel)  # buffers: the pair's mean
        self.velocity = (p.outer_momentum * self.velocity - p.outer_lr * mean_grad
                         - p.gamma * (self.outer_params - mean_outer))
        self.outer_params = self.outer_params + self.velocity
        unflatten_into(self.outer_params, params)

    def extra_state(self):
        return {"outer_params": self.outer_params.clone(), "velocity": self.velocity.clone()}

    def load_extra_state(self, state):
        self.outer_params = state["outer_params"].clone()
        self.velocity = state["velocity"].clone()
