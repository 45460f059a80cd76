"""SparseLoCo: DiLoCo whose outer gradient travels as top-k, 2-bit quantized values, with
error feedback in place of outer momentum.

Every rank holds θ (the global weights). After H inner steps from θ, rank r forms its
pseudo-gradient Δ_r = θ − θ_r and:
    e_r ← β·e_r + Δ_r                          (error feedback, decayed by β)
    Δ̂_r = Q(TopK(e_r))                         (top-k of |e_r| in each chunk, then Q)
    e_r ← e_r − Δ̂_r                            (what was not sent stays)
    θ ← θ − α · A(Δ̂_1 … Δ̂_R)                  (every rank gathers every rank's Δ̂)
and sets its weights to θ. There is no outer momentum: the accumulator e plays its part.
The floating-point buffers (BatchNorm statistics) are averaged in full precision.

`layout` says what a chunk, Q and A are:
  tiles (default, as the authors' code runs it: tplr-ai/templar, src/tplr/compress.py and
        src/tplr/neurons.py, c2397ac): each parameter on its own. A matrix (R, C) is cut
        into tiles of h×w, h and w the largest divisors of R and C not above `chunk` (64:
        64×64 tiles), and sends the `topk` largest |e| of each tile; a 1-D (or 0-D) tensor
        is sent whole. Q is `quantizer` over each tensor's sent values (default
        2bit-6sigma, the authors' code). A: each rank's values of a tensor are scaled by
        min(1, median/‖·‖) (the median, the lower one for an even count, of the ranks' norms
        of that tensor's values), then each value is averaged over the ranks that sent its
        index (an index no rank sent gets 0).
  flat (exoframe's earlier variant; with chunk=4096 quantizer=2bit, its former defaults):
        the flat vector of all parameters cut into runs of `chunk` values across tensor
        boundaries, the `topk` largest |e| of each run; Q over the whole message;
        A = (1/R) Σ_r Δ̂_r.
Bytes per rank per sync (ring all-gather of R messages): (R−1)·(W + ceil(I/8)): W the values
as Q encodes them (quantizers.py; per tensor with tiles), I the bits of their indices,
ceil(log2(values in the chunk)) each (12 for a 64×64 tile; none for a tensor sent whole).
Where the tiles layout differs from the authors' code: a tile of an odd number of values,
fewer than `topk`, sends them all (the authors round k down to even, for their 12-bit index
pairs, and fail on a 1-value tile); a 1-D tensor goes without indices (theirs: in tiles of
the largest divisor not above `chunk`, every value with its index); a tensor of more than 2 dimensions is tiled as the matrix
(first dimension, the rest) (theirs takes 1-D and 2-D only); Δ enters e unscaled (theirs
adds outer_lr·Δ, the same at the default outer_lr 1); codes are counted at 2 bits and
indices at the bits a tile needs (theirs holds a code in a byte and packs every index in
12 bits).
Source: Sarfi, Thérien, Lidin, Belilovsky, "Communication Efficient LLM Pre-training with
SparseLoCo" (arXiv 2508.15706, 2025).
"""
import math
from dataclasses import dataclass

import torch

from ..comm import flatten, unflatten_into
from ..errors import ExoframeError
from .base import Strategy, check_choice, check_fraction, check_positive
from .traits import Traits
from .quantizers import check_format, quantize

LAYOUTS = ("tiles", "flat")


@dataclass(frozen=True)
class Block:
    """Values [offset, offset + rows·cols) of the flat vector seen as a rows × cols matrix cut
    into tiles of h × w; whole: sent whole, no tiles (a 1-D or 0-D tensor)."""
    offset: int
    rows: int
    cols: int
    h: int = 1
    w: int = 1
    whole: bool = False

    def positions(self) -> torch.Tensor:
        return torch.arange(self.offset, self.offset + self.rows * self.cols)

    def tiles(self, values: torch.Tensor) -> torch.Tensor:
        """The block's values, one tile a row."""
        part = values[self.offset:self.offset + self.rows * self.cols]
        return (part.view(self.rows // self.h, self.h, self.cols // self.w, self.w)
                .permute(0, 2, 1, 3).reshape(-1, self.h * self.w))

    def position_of(self, tile: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
        """The flat positions of the values at `at` within tiles number `tile`."""
        tiles_across = self.cols // self.w
        row = tile // tiles_across * self.h + at // self.w
        col = tile % tiles_across * self.w + at % self.w
        return self.offset + row * self.cols + col

    def index_bits(self, topk: int) -> int:
        """Bits of the indices sent: ceil(log2(tile size)) a value (none when whole)."""
        if self.whole:
            return 0
        size = self.h * self.w
        return self.rows * self.cols // size * min(topk, size) * math.ceil(math.log2(size))


class SparseLoCo(Strategy):
    """H inner steps, then an all-gather of each rank's top-k, 2-bit outer gradient."""

    traits = Traits(
        replicas_equal_after_sync=True,
        held_model="global model as of the last outer step")

    @dataclass
    class Params:
        H: int = 15
        outer_lr: float = 1.0
        ef_decay: float = 0.95
        layout: str = "tiles"
        chunk: int = 64  # tiles: a tile's side at most; flat: a run's length
        topk: int = 64  # per chunk: 64 of a 64×64 tile is 1.6 %
        quantizer: str = "2bit-6sigma"

        def __post_init__(self):
            check_positive("sparseloco", H=self.H, outer_lr=self.outer_lr, chunk=self.chunk,
                           topk=self.topk)
            check_fraction("sparseloco", ef_decay=self.ef_decay)
            check_choice("sparseloco", "layout", self.layout, LAYOUTS)
            check_format("sparseloco", self.quantizer)
            limit, name = ((self.chunk ** 2, "'chunk'²") if self.layout == "tiles"
                           else (self.chunk, "'chunk'"))
            if self.topk > limit:
                raise ExoframeError(f"sparseloco: parameter 'topk' ({self.topk}) must not "
                                    f"exceed {name} ({limit}).")

    def setup(self):
        self.global_params = flatten(self.trainable_parameters()).detach().clone()
        self.residual = torch.zeros_like(self.global_params)
        p = self.params
        self.blocks = (tensor_blocks([q.shape for q in self.trainable_parameters()], p.chunk)
                       if p.layout == "tiles" else flat_blocks(self.global_params.numel(), p.chunk))

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
        picked = [self.top_k(block) for block in self.blocks]
        index = torch.cat(picked)
        if p.layout == "tiles":  # each tensor's values coded on their own
            coded = [quantize(self.residual[i], p.quantizer) for i in picked]
            values = torch.cat([v for v, _ in coded])
            value_bytes = sum(size for _, size in coded)
        else:
            values, value_bytes = quantize(self.residual[index], p.quantizer)
        self.residual[index] -= values
        index_bytes = math.ceil(sum(b.index_bits(p.topk) for b in self.blocks) / 8)
        all_values = values.new_empty(n * values.numel())
        all_index = torch.empty(n * index.numel(), dtype=torch.int64, device=index.device)
        self.comm.all_gather(all_values, values, wire_bytes=n * value_bytes)
        self.comm.all_gather(all_index, index, wire_bytes=n * index_bytes)
        if p.layout == "tiles":
            update = self.per_index_mean(all_values.view(n, -1), all_index,
                                         [i.numel() for i in picked])
        else:
            update = torch.zeros_like(self.global_params).index_add_(0, all_index, all_values) / n
        self.global_params -= p.outer_lr * update
        unflatten_into(self.global_params, params)
        if self.float_buffers():  # their mean, in a second (full-precision) all-reduce
            self.all_reduce_with_buffers(self.global_params.new_zeros(0))
        self.note(outer_grad_norm=update.norm().item())

    def top_k(self, block: Block) -> torch.Tensor:
        """The flat positions of the `topk` largest |residual| in each of the block's tiles
        (all of its values when it is sent whole)."""
        if block.whole:
            return block.positions().to(self.residual.device)
        tiles = block.tiles(self.residual)
        k = min(self.params.topk, tiles.shape[1])
        at = torch.topk(tiles.abs(), k, dim=1, sorted=True).indices
        tile = torch.arange(tiles.shape[0], device=at.device).unsqueeze(1).expand_as(at)
        return block.position_of(tile, at).flatten()

    def per_index_mean(self, values: torch.Tensor, index: torch.Tensor,
                       counts: list[int]) -> torch.Tensor:
        """The authors' aggregation of R messages (`values`: one row a rank, each the same
        tensors' values in the same order): each rank's part of a tensor scaled down to the
        median of the ranks' norms of that part, then each index's mean over the ranks that
        sent it."""
        parts = values.split(counts, dim=1)
        norms = torch.stack([part.norm(dim=1) for part in parts], dim=1)  # (R, tensors)
        clip = torch.clamp(norms.median(dim=0).values / (norms + 1e-8), max=1.0)
        clipped = torch.cat([part * clip[:, [t]] for t, part in enumerate(parts)], dim=1)
        total = torch.zeros_like(self.global_params).index_add_(0, index, clipped.flatten())
        senders = torch.zeros_like(self.global_params).index_add_(
            0, index, torch.ones_like(clipped.flatten()))
        return total / senders.clamp_min(1)

    def extra_state(self):
        return {"global_params": self.global_params.clone(), "residual": self.residual.clone()}

    def load_extra_state(self, state):
        self.global_params = state["global_params"].clone()
        self.residual = state["residual"].clone()


def largest_divisor(n: int, limit: int) -> int:
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


def tensor_blocks(shapes, side: int) -> list[Block]:
    """A block per tensor of these shapes (laid end to end in a flat vector): a matrix cut
    into tiles of h × w, the largest divisors of its dimensions not above `side` (more than
    2 dimensions: the first and the rest); a 1-D or 0-D tensor whole."""
    blocks, offset = [], 0
    for shape in shapes:
        numel = math.prod(shape)
        if len(shape) < 2:
            blocks.append(Block(offset, 1, numel, whole=True))
        else:
            rows, cols = shape[0], numel // shape[0]
            blocks.append(Block(offset, rows, cols, largest_divisor(rows, side),
                                largest_divisor(cols, side)))
        offset += numel
    return blocks


def flat_blocks(numel: int, chunk: int) -> list[Block]:
    """The flat vector in runs of `chunk` values (the last may be shorter)."""
    full = numel // chunk * chunk
    runs = [Block(0, 1, full, 1, chunk)] if full else []
    return runs + ([Block(full, 1, numel - full, 1, numel - full)] if numel > full else [])
