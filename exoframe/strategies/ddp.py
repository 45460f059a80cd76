"""DDP: average gradients across ranks every step, then take a local optimizer step.

Update: g = mean_r(g_r); θ ← opt(θ, g). Every rank ends each step with identical weights.
Bytes per step: one all-reduce of the full gradient.
"""
from dataclasses import dataclass

from .base import Strategy


class DDP(Strategy):
    """Data parallel: all-reduce (mean) of gradients every step."""

    gradient_all_reduce_after_backward = True

    @dataclass
    class Params:
        pass

    def step(self):
        self.average_gradients()
        self.optimizer.step()
        self.optimizer.zero_grad()
