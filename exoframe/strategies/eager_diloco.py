"""Eager DiLoCo: the outer all-reduce overlaps the next round's inner steps; the local outer
gradient stands in for the average until the average arrives.

Worker m keeps its own θ_m and outer optimizer. At the end of round t it computes its outer
gradient Δ_m^t = θ_m − θ_m,local, starts the all-reduce of Δ_m^t without waiting, and steps
its outer optimizer on the eager outer gradient

    Δ̃_m^t = Ā^{t−1} − Δ_m^{t−1}/M + Δ_m^t/M = Δ_m^t/M + (1/M) Σ_{k≠m} Δ_k^{t−1}

(its own current outer gradient mixed with the others' from the previous round, whose
average Ā^{t−1} has arrived meanwhile; Ā^0 = Δ^0 = 0), then sets its weights to θ_m and
starts the next round. The average of round t is collected at the end of step (t+1)H − 1:
the all-reduce overlaps H − 1 inner steps, and a round costs max((H−1)·c, T_allreduce) + c
for c the compute per step (the first round H·c); the run ends once the last round's
all-reduce is done (a run resumed from a checkpoint goes on with it). The outer gradient may travel quantized (`quantizer`,
`error_feedback`, as in diloco). The floating-point buffers ride with the all-reduce and
take their mean when it arrives. Replicas differ between rounds (each applied its own
Δ_m^t); the run's model is their average.
Bytes per rank per round (ring): 2(M−1)/M · W(N), W as in strategies/quantizers.py.
Source: Kale, Douillard, Donchev, "Eager Updates For Overlapped Communication and
Computation in DiLoCo" (arXiv 2502.12996, 2025).
"""
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..comm import flatten, unflatten_into
from .base import Strategy
from .traits import Traits
from .diloco import OuterParams, outer_quantizer


class EagerDiLoCo(Strategy):
    """DiLoCo whose outer all-reduce overlaps the next round, with eager outer steps."""

    # Each node's copy differs until the round's average arrives (its own outer gradient
    # stands in for it): their mean is validated.
    traits = Traits(
        held_model="global model as of the last outer step (each node's eager copy, averaged)")

    @dataclass
    class Params(OuterParams):
        owner: ClassVar[str] = "eager-diloco"

    def setup(self):
        self.global_params = torch.nn.Parameter(flatten(self.trainable_parameters()))
        self.outer_optimizer = self.params.outer_spec().build([self.global_params])
        self.quantizer = outer_quantizer(self)
        self.previous_mean = torch.zeros_like(self.global_params.detach())  # Ā^{t−1}
        self.previous_local = torch.zeros_like(self.previous_mean)  # Δ_m^{t−1}, as sent
        self.pending = None  # (handle, joined tensor) of the all-reduce in flight

    def held_weights(self):
        return self.weights_with(self.global_params.detach(), self.float_buffers_flat())

    def step(self):
        self.optimizer.step()
        self.optimizer.zero_grad()
        H = self.params.H
        if self.pending is not None and self.step_num % H == (H - 1) % H:
            self.collect()
        if self.step_num % H == 0:
            if self.pending is not None:  # a stopping rule moved the end
                self.collect()
            self.outer_step()

    def outer_step(self):
        params = self.trainable_parameters()
        sent, wire_bytes = self.quantizer.compress(self.global_params.detach() - flatten(params))
        joined = self.with_buffers(sent).clone()
        wire_bytes += 4 * (joined.numel() - sent.numel())
        handle = self.comm.all_reduce(joined, op="mean", async_op=True, wire_bytes=wire_bytes)
        self.pending = (handle, joined)
        n = self.world_size
        eager = self.previous_mean - self.previous_local / n + sent / n
        self.previous_local = sent.clone()
        self.global_params.grad = eager
        self.outer_optimizer.step()
        self.outer_optimizer.zero_grad()
        unflatten_into(self.global_params.detach(), params)
        self.note(outer_grad_norm=eager.norm().item())

    def collect(self):
        handle, joined = self.pending
        handle.wait()
        self.pending = None
        joined = self.quantizer.sent_back(joined)
        self.previous_mean = self.take_buffers(joined, self.previous_mean.numel()).clone()

    @classmethod
    def checkpoint_problem(cls, params):
        if params.H == 1:
            return "with H=1 an outer all-reduce is in flight at every step end; take H >= 2"
        return None

    def extra_state(self):
        return {"global_params": self.global_params.detach().clone(),
                "outer_optimizer": self.outer_optimizer.state_dict(),
                "previous_mean": self.previous_mean.clone(),
                "previous_local": self.previous_local.clone(), **self.quantizer.state()}

    def load_extra_state(self, state):
        with torch.no_grad():
            self.global_params.copy_(state["global_params"])
        self.outer_optimizer.load_state_dict(state["outer_optimizer"])
        self.previous_mean = state["previous_mean"].clone()
        self.previous_local = state["previous_local"].clone()
        self.quantizer.load(state)
