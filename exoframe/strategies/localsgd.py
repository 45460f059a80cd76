"""Local SGD / FedAvg: H local optimizer steps, then average parameters.

Update: θ_r ← opt(θ_r, g_r) every step; every H steps θ_r ← mean_r(θ_r) (floating-point
buffers such as BatchNorm statistics are averaged in the same all-reduce).
Source: Stich, "Local SGD Converges Fast and Communicates Little" (2019); McMahan et al.,
"Communication-Efficient Learning of Deep Networks from Decentralized Data" (FedAvg, 2017).
"""
from dataclasses import dataclass

from .base import Strategy, check_positive


class LocalSGD(Strategy):
    """H local steps, then average parameters."""

    survives_failures = True
    replicas_equal_after_sync = True

    @dataclass
    class Params:
        H: int = 10

        def __post_init__(self):
            check_positive("localsgd", H=self.H)

    def step(self):
        self.optimizer.step()
        self.optimizer.zero_grad()
        if self.step_num % self.params.H == 0:
            with self.sync():
                self.average_parameters()
