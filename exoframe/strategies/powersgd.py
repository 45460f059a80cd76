"""PowerSGD: rank-r gradient compression by one step of power iteration, with error feedback
and warm start.

Update, per parameter with two or more dimensions, viewed as a matrix M (rows = first
dimension) after adding its residual: P = M Q; P ← mean_r P; P ← orthonormalize(P);
Q = Mᵀ P; Q ← mean_r Q; the gradient is P Qᵀ and the residual M − P Qᵀ. Q is kept for the
next step (warm start); it starts from a normal draw with a seed shared by every rank.
r' = min(r, rows, cols). Vectors (biases, norms) are averaged uncompressed, as in the paper.
Bytes per rank per step (three ring all-reduces of fp32: P's, Q's, vectors):
    2(n−1)/n · 4 · [Σ_matrices r'(rows + cols) + Σ_vectors numel].
Source: Vogels, Karimireddy, Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for
Distributed Optimization" (2019).
"""
from dataclasses import dataclass

import torch

from ..comm import flatten
from .base import check_positive
from .error_feedback import ErrorFeedbackStrategy
from .seeds import derive


class PowerSGD(ErrorFeedbackStrategy):
    """Rank-r power-iteration gradient compression with error feedback and warm start."""

    @dataclass
    class Params:
        rank: int = 4

        def __post_init__(self):
            check_positive("powersgd", rank=self.rank)

    def setup(self):
        super().setup()
        generator = torch.Generator().manual_seed(derive(self.seed, 17))
        self.matrices = []  # (start, rows, cols) in the flat gradient
        self.vectors = []  # (start, numel)
        self.q = []
        start = 0
        for p in self.trainable_parameters():
            if p.dim() >= 2:
                rows, cols = p.shape[0], p.numel() // p.shape[0]
                self.matrices.append((start, rows, cols))
                self.q.append(torch.randn(cols, min(self.params.rank, rows, cols),
                                          generator=generator).to(p.device))
            else:
                self.vectors.append((start, p.numel()))
            start += p.numel()

    def exchange(self, corrected):
        views = [corrected[s:s + rows * cols].view(rows, cols) for s, rows, cols in self.matrices]
        ps = [m @ q for m, q in zip(views, self.q)]
        self.all_reduce_mean(ps)
        ps = [torch.linalg.qr(p).Q for p in ps]
        self.q = [m.T @ p for m, p in zip(views, ps)]
        self.all_reduce_mean(self.q)
        averaged = torch.empty_like(corrected)
        for (s, rows, cols), p, q in zip(self.matrices, ps, self.q):
            averaged[s:s + rows * cols] = (p @ q.T).reshape(-1)
        vectors = [corrected[s:s + n].clone() for s, n in self.vectors]
        self.all_reduce_mean(vectors)
        for (s, n), v in zip(self.vectors, vectors):
            averaged[s:s + n] = v
        # The vectors' residual is zero: what was sent for them is the rank's own value.
        sent = averaged.clone()
        for s, n in self.vectors:
            sent[s:s + n] = corrected[s:s + n]
        return averaged, sent

    def all_reduce_mean(self, tensors: list):
        """One all-reduce (mean) of every tensor in the list, in place."""
        if not tensors:
            return
        flat = flatten(tensors)
        self.comm.all_reduce(flat, op="mean")
        offset = 0
        for t in tensors:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()

    def extra_state(self):
        return {**super().extra_state(), "q": [q.clone() for q in self.q]}

    def load_extra_state(self, state):
        super().load_extra_state(state)
        self.q = [q.clone() for q in state["q"]]
