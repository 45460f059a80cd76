"""SparseLoCo: DiLoCo whose outer gradient travels as chunk-wise top-k, 2-bit quantized
values, with error feedback in place of outer momentum.

Every rank holds θ (the global weights). After H inner steps from θ, rank r forms its
pseudo-gradient Δ_r = θ − θ_r and:
    e_r ← β·e_r + Δ_r                          (error feedback, decayed by β)
    Δ̂_r = Q(TopK(e_r))                         (top-k of |e_r| in each chunk of `chunk`
                                                values, then the quantizer Q, default 2bit)
    e_r ← e_r − Δ̂_r                            (what was not sent stays)
    θ ← θ − α · (1/R) Σ_r Δ̂_r                 (every rank gathers every rank's Δ̂)
and sets its weights to θ. There is no outer momentum: the accumulator e plays its part.
The floating-point buffers (BatchNorm statistics) are averaged in full precision.
Bytes per rank per sync (ring all-gather of R messages): (R−1)·(W_Q(K) + ceil(K·b/8)),
K = Σ_chunks min(topk, chunk length) values, W_Q their encoded size (quantizers.py), b =
ceil(log2(chunk)) bits for each value's index within its chunk.
Source: Sarfi, Thérien, Lidin, Belilovsky, "Communication Efficient LLM Pre-training with
SparseLoCo" (arXiv 2508.15706, 2025).
"""
import math
from dataclasses import dataclass

import torch

from ..comm import flatten, unflatten_into
from ..errors import ExoframeError
from .base import Strategy, check_fraction, check_positive
from .quantizers import check_format, quantize


class SparseLoCo(Strategy):
    """H inner steps, then an all-gather of each rank's top-k, 2-bit outer gradient."""

    replicas_equal_after_sync = True
    held_model = "global model as of the last outer step"

    @dataclass
    class Params:
        H: int = 15
        outer_lr: float = 1.0
        ef_decay: float = 0.95
        chunk: int = 4096
        topk: int = 64  # per chunk: 64 of 4096 is 1.6 %
        quantizer: str = "2bit"

        def __post_init__(self):
            check_positive("sparseloco", H=self.H, outer_lr=self.outer_lr, chunk=self.chunk,
                           topk=self.topk)
            check_fraction("sparseloco", ef_decay=self.ef_decay)
            check_format("sparseloco", self.quantizer)
            if self.topk > self.chunk:
                raise ExoframeError(f"sparseloco: parameter 'topk' ({self.topk}) must not "
                                    f"exceed 'chunk' ({self.chunk}).")

    def setup(self):
        self.global_params = flatten(self.trainable_parameters()).detach().clone()
        self.residual = torch.zeros_like(self.global_params)
        self.index_bits = max(1, math.ceil(math.log2(self.params.chunk)))

    def held_weights(self):
        return self.weights_with(self.global_params, self.float_buffers_flat())

    def step(self):
        self.optimizer.step()
        self.optimizer.zero_grad()
        if self.step_num % self.params.H == 0:
            with self.sync():
                self.outer_step()

    def outer_step(self):
        p, n = self.params, self.world_size
        params = self.trainable_parameters()
        self.residual = p.ef_decay * self.residual + (self.global_params - flatten(params))
        index = self.top_k_per_chunk(self.residual)
        values, value_bytes = quantize(self.residual[index], p.quantizer)
        self.residual[index] -= values
        index_bytes = math.ceil(index.numel() * self.index_bits / 8)
        all_values = values.new_empty(n * values.numel())
        all_index = torch.empty(n * index.numel(), dtype=torch.int64, device=index.device)
        self.comm.all_gather(all_values, values, wire_bytes=n * value_bytes)
        self.comm.all_gather(all_index, index, wire_bytes=n * index_bytes)
        mean = torch.zeros_like(self.global_params).index_add_(0, all_index, all_values) / n
        self.global_params -= p.outer_lr * mean
        unflatten_into(self.global_params, params)
        if self.float_buffers():  # their mean, in a second (full-precision) all-reduce
            self.all_reduce_with_buffers(self.global_params.new_zeros(0))
        self.note(outer_grad_norm=mean.norm().item())

    def top_k_per_chunk(self, values: torch.Tensor) -> torch.Tensor:
        """Indices of the `topk` largest |values| in each chunk of `chunk` values."""
        picked = []
        for start in range(0, values.numel(), self.params.chunk):
            part = values[start:start + self.params.chunk].abs()
            k = min(self.params.topk, part.numel())
            picked.append(torch.topk(part, k, sorted=True).indices + start)
        return torch.cat(picked)

    def extra_state(self):
        return {"global_params": self.global_params.clone(), "residual": self.residual.clone()}

    def load_extra_state(self, state):
        self.global_params = state["global_params"].clone()
        self.residual = state["residual"].clone()
