"""Random-k gradient sparsification with error feedback.

Update: m_r = g_r + e_r; every rank picks the same k random coordinates I_t (a generator
seeded with (run seed, step), so no indices are sent); g[I_t] = mean_r m_r[I_t], zero
elsewhere; e_r ← m_r with I_t zeroed; θ ← opt(θ, g). k = ceil(k_fraction · N).
Bytes per rank per step (ring all-reduce of k fp32 values): 2(n−1)/n · 4k.
Source: Stich et al., "Sparsified SGD with Memory" (2018).
"""
import math
from dataclasses import dataclass

import torch

from .base import check_fraction, check_positive
from .error_feedback import ErrorFeedbackStrategy
from .seeds import derive


class RandomKEF(ErrorFeedbackStrategy):
    """Average k shared-seed random gradient entries (no indices sent), with error feedback."""

    @dataclass
    class Params:
        k_fraction: float = 0.01

        def __post_init__(self):
            check_fraction("randomk-ef", k_fraction=self.k_fraction)
            check_positive("randomk-ef", k_fraction=self.k_fraction)

    def setup(self):
        super().setup()
        self.generator = torch.Generator()

    def exchange(self, corrected):
        numel = corrected.numel()
        k = math.ceil(self.params.k_fraction * numel)
        self.generator.manual_seed(derive(self.seed, self.step_num))
        index = torch.randperm(numel, generator=self.generator)[:k].to(corrected.device)
        values = corrected[index]
        self.comm.all_reduce(values, op="mean")
        averaged = torch.zeros_like(corrected)
        averaged[index] = values
        sent = torch.zeros_like(corrected)
        sent[index] = corrected[index]
        return averaged, sent
