"""Top-k gradient sparsification with error feedback.

Update: m_r = g_r + e_r; each rank keeps the k entries of m_r largest in magnitude, S_r;
g = (1/n) Σ_r S_r (every rank gathers every rank's values and indices); e_r ← m_r − S_r;
θ ← opt(θ, g). k = ceil(k_fraction · N); with k_fraction = 1 this is DDP.
Bytes per rank per step: each rank's message is k fp32 values and k int32 indices (8k bytes);
a ring all-gather of the n messages sends (n−1) of them: 8k(n−1).
Sources: Stich et al., "Sparsified SGD with Memory" (2018); Lin et al., "Deep Gradient
Compression" (2018).
"""
from dataclasses import dataclass
import math

import torch

from .base import check_fraction, check_positive
from .error_feedback import ErrorFeedbackStrategy

VALUE_BYTES = INDEX_BYTES = 4


class TopKEF(ErrorFeedbackStrategy):
    """Exchange the top-k gradient entries (values + indices), with error feedback."""

    @dataclass
    class Params:
        k_fraction: float = 0.01

        def __post_init__(self):
            check_fraction("topk-ef", k_fraction=self.k_fraction)
            check_positive("topk-ef", k_fraction=self.k_fraction)

    def exchange(self, corrected):
        n, numel = self.world_size, corrected.numel()
        k = math.ceil(self.params.k_fraction * numel)
        index = torch.topk(corrected.abs(), k, sorted=False).indices
        values = corrected[index]
        all_values = corrected.new_empty(n * k)
        all_index = torch.empty(n * k, dtype=torch.int64, device=corrected.device)
        self.comm.all_gather(all_values, values, wire_bytes=n * k * VALUE_BYTES)
        self.comm.all_gather(all_index, index, wire_bytes=n * k * INDEX_BYTES)
        averaged = torch.zeros_like(corrected).index_add_(0, all_index, all_values).div_(n)
        sent = torch.zeros_like(corrected)
        sent[index] = values
        return averaged, sent
