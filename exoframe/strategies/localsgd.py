"""Local SGD / FedAvg: H local optimizer steps, then average parameters.

Update: θ_r ← opt(θ_r, g_r) every step; every H steps θ_r ← mean_r(θ_r) (floating-point
buffers such as BatchNorm statistics are averaged in the same all-reduce).
Source: Stich, "Local SGD Converges Fast and Communicates Little" (2019); McMahan et al.,
"Communication-Efficient Learning of Deep Networks from Decentralized Data" (FedAvg, 2017).
"""
from dataclasses import dataclass

from ..comm import flatten
from .base import Strategy, check_positive
from .traits import Traits


class LocalSGD(Strategy):
    """H local steps, then average parameters."""

    traits = Traits(
        stacks=True,
        survives_failures=True,
        replicas_equal_after_sync=True,
        held_model="global model as of the last average")

    @dataclass
    class Params:
        H: int = 10

        def __post_init__(self):
            check_positive("localsgd", H=self.H)

    def setup(self):
        self.remember_average()

    def remember_average(self):
        self.averaged = (flatten(self.trainable_parameters()).detach().clone(),
                         self.float_buffers_flat())

    def held_weights(self):
        return self.weights_with(*self.averaged)

    def step(self):
        self.optimizer.step()
        self.optimizer.zero_grad()
        if self.step_num % self.params.H == 0:
            with self.sync():
                self.average_parameters()
            self.remember_average()

    def extra_state(self):
        return {"averaged": self.averaged}

    def load_extra_state(self, state):
        self.averaged = state.get("averaged", self.averaged)
