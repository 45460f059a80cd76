"""DeMo: Decoupled Momentum Optimization.

Each rank keeps its own momentum and only ever sends its fastest-moving components.
Per parameter p, with local gradient g, every step:

    m ← β·m + g                      local momentum (never all-reduced whole)
    C = DCT(chunks(m))               m cut into b1×b2 chunks, a 2-D DCT-II per chunk
    q = top-k(C)                     per chunk, the k coefficients of largest magnitude
    m ← m − IDCT(q)                  what is sent leaves the local momentum
    Q = all_gather(q)                every rank's (index, value) pairs
    Q̄[i] = mean of the values sent for coefficient i, over the ranks that sent it
    p ← p·(1 − lr·wd) − lr·sign(IDCT(Q̄))

Every rank decodes the same gathered coefficients, so replicas stay identical.

Chunks: a 1-D parameter (n,) is viewed as a (1, n) matrix, a 2-D one as is, a conv weight
(out, in, kh, kw) as (out, in·kh·kw). A (rows, cols) matrix is cut into chunks of
b1 = min(chunk, rows) by b2 = min(chunk, cols), zero-padded to whole chunks.

Bytes: a chunk sends k' = min(k, b1·b2) values (float32, 4 bytes) and k' indices into the
chunk (b1·b2 ≤ chunk² ≤ 65536, so 16-bit: 2 bytes). A rank's payload per step is

    P = Σ_p ceil(rows_p / b1_p) · ceil(cols_p / b2_p) · k'_p · 6 bytes

and one all_gather exchanges every rank's payload, so each of n nodes sends (n − 1)·P bytes
per step (ring or direct all_gather). Indices travel as float32 in the simulation (exact
below 2^24); the Communicator is told the encoded size through `wire_bytes`.

Source: B. Peng, J. Quesnelle, D. P. Kingma, "DeMo: Decoupled Momentum Optimization"
(2024), arXiv:2411.19870; reference implementation github.com/bloc97/DeMo. Differences from
the reference: chunks are padded (the reference picks divisors of each dimension, which
degenerates for prime sizes), conv weights are flattened to matrices, and the momentum
accumulates g rather than lr·g (the sign update does not see the scale).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import exoframe
from exoframe.errors import ExoframeError

VALUE_BYTES, INDEX_BYTES = 4, 2


def dct_matrix(n: int) -> torch.Tensor:
    """Orthonormal DCT-II: row f is frequency f, so coefficients = D @ x and x = D.T @ coefficients."""
    freq = torch.arange(n, dtype=torch.float64).unsqueeze(1)
    position = torch.arange(n, dtype=torch.float64).unsqueeze(0)
    d = torch.cos(math.pi * (position + 0.5) * freq / n) * math.sqrt(2 / n)
    d[0] /= math.sqrt(2)
    return d.float()


class DCTChunks:
    """The chunked DCT of one parameter shape: encode to (chunks, b1·b2) coefficients, decode
    back, pick the top k per chunk, and average gathered picks."""

    def __init__(self, shape, chunk: int, k: int):
        self.shape = tuple(shape)
        self.rows = self.shape[0] if len(self.shape) > 1 else 1
        self.cols = math.prod(self.shape) // self.rows
        self.b1, self.b2 = min(chunk, self.rows), min(chunk, self.cols)
        self.row_blocks = math.ceil(self.rows / self.b1)
        self.col_blocks = math.ceil(self.cols / self.b2)
        self.chunks = self.row_blocks * self.col_blocks
        self.k = min(k, self.b1 * self.b2)
        self.d1, self.d2 = dct_matrix(self.b1), dct_matrix(self.b2)

    @property
    def payload_bytes(self) -> int:
        return self.chunks * self.k * (VALUE_BYTES + INDEX_BYTES)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        m = x.reshape(self.rows, self.cols).float()
        m = F.pad(m, (0, self.col_blocks * self.b2 - self.cols,
                      0, self.row_blocks * self.b1 - self.rows))
        blocks = m.reshape(self.row_blocks, self.b1, self.col_blocks, self.b2).transpose(1, 2)
        return (self.d1 @ blocks @ self.d2.T).reshape(self.chunks, self.b1 * self.b2)

    def decode(self, coefficients: torch.Tensor) -> torch.Tensor:
        blocks = coefficients.reshape(self.row_blocks, self.col_blocks, self.b1, self.b2)
        m = (self.d1.T @ blocks @ self.d2).transpose(1, 2)
        m = m.reshape(self.row_blocks * self.b1, self.col_blocks * self.b2)
        return m[:self.rows, :self.cols].reshape(self.shape)

    def top_k(self, coefficients: torch.Tensor):
        """(indices, values), each (chunks, k): the largest-magnitude coefficients per chunk."""
        indices = coefficients.abs().topk(self.k, dim=1).indices
        return indices, coefficients.gather(1, indices)

    def dense(self, indices: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return torch.zeros(self.chunks, self.b1 * self.b2).scatter(1, indices, values)

    def mean(self, indices: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """Gathered (ranks, chunks, k) picks → per coefficient, the mean over the ranks that
        sent it (zero where none did)."""
        indices = indices.transpose(0, 1).reshape(self.chunks, -1)
        values = values.transpose(0, 1).reshape(self.chunks, -1)
        sums = torch.zeros(self.chunks, self.b1 * self.b2).scatter_add(1, indices, values)
        counts = torch.zeros_like(sums).scatter_add(1, indices, torch.ones_like(values))
        return sums / counts.clamp(min=1)


def payload_bytes(shapes, chunk: int, k: int) -> int:
    """P, the bytes one rank contributes per step, for parameters of these shapes."""
    return sum(DCTChunks(shape, chunk, k).payload_bytes for shape in shapes)


class DeMo(exoframe.Strategy):
    """Decoupled momentum: exchange each chunk's top-k DCT components of the local momentum; step by the sign of their average."""

    @dataclass
    class Params:
        chunk: int = 64  # chunk side: chunks are up to chunk × chunk (1-D: chunk)
        k: int = 32  # components sent per chunk
        beta: float = 0.999  # momentum decay

        def __post_init__(self):
            if not 1 <= self.chunk <= 256:
                raise ExoframeError(
                    f"demo: parameter 'chunk' must be in [1, 256] (16-bit indices), got {self.chunk}.")
            if self.k < 1:
                raise ExoframeError(f"demo: parameter 'k' must be at least 1, got {self.k}.")
            if not 0 <= self.beta < 1:
                raise ExoframeError(f"demo: parameter 'beta' must be in [0, 1), got {self.beta}.")

    def setup(self):
        params = self.trainable_parameters()
        self.codecs = [DCTChunks(p.shape, self.params.chunk, self.params.k) for p in params]
        self.momentum = [torch.zeros_like(p, dtype=torch.float32) for p in params]
        self.picks = sum(c.chunks * c.k for c in self.codecs)
        self.payload_bytes = sum(c.payload_bytes for c in self.codecs)

    @torch.no_grad()
    def step(self):
        params = self.trainable_parameters()
        values, indices = [], []
        for p, m, codec in zip(params, self.momentum, self.codecs):
            m.mul_(self.params.beta)
            if p.grad is not None:
                m.add_(p.grad)
            index, value = codec.top_k(codec.encode(m))
            m.sub_(codec.decode(codec.dense(index, value)))
            values.append(value.flatten())
            indices.append(index.flatten())
        sent = torch.cat([*values, *indices]).float()
        gathered = sent.new_empty(self.world_size * sent.numel())
        self.comm.all_gather(gathered, sent, wire_bytes=self.world_size * self.payload_bytes)
        gathered = gathered.view(self.world_size, 2, self.picks)
        all_values, all_indices = gathered[:, 0], gathered[:, 1].long()

        lr, weight_decay = self.lr, self.optimizer_spec.weight_decay  # lr: the schedule's
        offset = 0
        for p, codec in zip(params, self.codecs):
            n = codec.chunks * codec.k
            picked = (all_indices[:, offset:offset + n].reshape(-1, codec.chunks, codec.k),
                      all_values[:, offset:offset + n].reshape(-1, codec.chunks, codec.k))
            direction = codec.decode(codec.mean(*picked)).sign().to(p.dtype)
            if weight_decay:
                p.mul_(1 - lr * weight_decay)
            p.sub_(direction, alpha=lr)
            offset += n
        self.optimizer.zero_grad()

    def extra_state(self):
        return {"momentum": [m.clone() for m in self.momentum]}

    def load_extra_state(self, state):
        for m, saved in zip(self.momentum, state["momentum"]):
            m.copy_(saved)
