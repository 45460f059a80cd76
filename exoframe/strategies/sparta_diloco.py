"""SPARTA-DiLoCo: SPARTA's sparse parameter averaging every step, plus a DiLoCo outer step
every H steps.

Update: each step, θ_r ← opt(θ_r, g_r), then the elements picked by a shared-seed mask of
density p are averaged across ranks (SPARTA); every H steps, Δ = mean_r(θ_global − θ_r),
θ_global ← OuterOpt(θ_global, Δ) and θ_r ← θ_global (DiLoCo). With p = 0 this is DiLoCo.
Bytes per rank per step (ring): 2(n−1)/n · 4·|mask_t| (|mask_t| ≈ pN), plus 2(n−1)/n · 4N at
every H-th step.
Sources: Exo Labs, "SPARTA: Sparse Parameter Averaging" (2025); Douillard et al., "DiLoCo"
(2023).
"""
import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from .base import check_fraction
from .diloco import DiLoCo, OuterParams
from .sparta import Sparta


class SpartaDiLoCo(Sparta, DiLoCo):
    """SPARTA each step plus a DiLoCo outer step every H."""

    # The exchange right after each step's compute is SPARTA's sparse average, not the
    # outer sync a projection would stream through the backward pass.
    traits = dataclasses.replace(DiLoCo.traits, outer_sync_overlaps_backward=False,
                                 replicas_equal_after_sync=False, stacks=False)
    # SPARTA's sparse averages leave the ranks apart between outer steps.
    held_weights = DiLoCo.held_weights

    @dataclass
    class Params(OuterParams):
        owner: ClassVar[str] = "sparta-diloco"
        H: int = 100
        p: float = 0.005

        def __post_init__(self):
            super().__post_init__()
            check_fraction(self.owner, p=self.p)

    def setup(self):
        Sparta.setup(self)
        DiLoCo.setup(self)

    def step(self):
        Sparta.step(self)  # local step, then the sparse average
        if self.step_num % self.params.H == 0:
            self.outer_step()
