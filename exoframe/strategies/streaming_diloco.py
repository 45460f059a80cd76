"""Streaming DiLoCo: DiLoCo whose outer sync is split into fragments, staggered and overlapped.

The flat parameter vector is cut into F contiguous fragments of ceil(N/F) values (the last
may be shorter). Fragment f is synced at the steps s with s mod H = ((f+1)·H // F) mod H,
so the fragments' syncs are spread evenly over each H-step round. At a sync, each rank
computes the fragment's outer gradient Δ_f = θ_global,f − θ_f, quantizes and dequantizes
it (`quantizer`, any format of strategies/quantizers.py, with `error_feedback` if asked; or
`bits`: 32 none, 16 bf16, 8 int8, 4 int4: symmetric integers with one fp32 scale per
fragment) and starts an asynchronous all-reduce (mean) of it. τ inner steps later the
result is applied: an outer Nesterov step θ_global,f ← OuterOpt(θ_global,f, mean Δ_f), and
the live fragment becomes θ_f ← α·θ_f + (1 − α)·θ_global,f (α = 0: take the global one).
With F = 1, τ = 0, α = 0, bits = 32 this is DiLoCo. The model's floating-point buffers
(BatchNorm statistics) travel, in full precision, with the last fragment (synced at multiples
of H) and are mixed in the same way: b ← α·b + (1 − α)·mean_r(b).

Bytes per rank for one fragment sync of m values (ring all-reduce over n ranks):
    2(n−1)/n · W(m),  W(m) = 4m (32 bits), 2m (16 bits), ceil(m·bits/8) + 4 (8 or 4 bits).
Peak per step: the largest fragment's, 2(n−1)/n · W(ceil(N/F)); average per step over whole
rounds: 2(n−1)/n · Σ_f W(m_f) / H (32 bits: 2(n−1)/n · 4N / H, the same as DiLoCo).
Source: Douillard et al., "Streaming DiLoCo with overlapping communication: Towards a
Distributed Free Lunch" (2025).
"""
import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..comm import flatten, unflatten_into
from ..errors import ExoframeError
from .base import Strategy, check_fraction, check_positive
from .traits import Traits
from .diloco import OuterParams
from .quantizers import OuterQuantizer, row_lengths, rows_within

# `bits` names the formats of strategies/quantizers.py it stood for before `quantizer`.
BITS = {32: "none", 16: "bf16", 8: "int8", 4: "int4"}


class StreamingDiLoCo(Strategy):
    """DiLoCo with F staggered fragments whose outer all-reduce overlaps τ inner steps."""

    traits = Traits(
        held_model="global model, each fragment as of its last sync",
        outer_sync_overlaps_backward=True)
    # Each fragment's outer gradient, of layers strided through the model, is ready as the
    # backward pass goes (projections stream it through that backward pass).

    @dataclass
    class Params(OuterParams):
        owner: ClassVar[str] = "streaming-diloco"
        fragments: int = 4
        tau: int = 1
        alpha: float = 0.5
        bits: int = 32

        def __post_init__(self):
            super().__post_init__()
            check_positive(self.owner, fragments=self.fragments)
            check_fraction(self.owner, alpha=self.alpha)
            if self.fragments > self.H:
                raise ExoframeError(f"streaming-diloco: parameter 'fragments' ({self.fragments}) "
                                    f"must not exceed H ({self.H}): each fragment needs its "
                                    "own step.")
            if not 0 <= self.tau < self.H:
                raise ExoframeError(f"streaming-diloco: parameter 'tau' must be in [0, H), "
                                    f"got {self.tau}.")
            if self.bits not in BITS:
                raise ExoframeError(f"streaming-diloco: parameter 'bits' must be one of "
                                    f"{', '.join(map(str, sorted(BITS)))}, got {self.bits}.")
            if self.bits != 32 and self.quantizer != "none":
                raise ExoframeError("streaming-diloco: give 'quantizer' or 'bits', not both "
                                    f"(bits={self.bits} is quantizer={BITS[self.bits]}).")

        @property
        def format(self) -> str:
            return self.quantizer if self.quantizer != "none" else BITS[self.bits]

    @classmethod
    def params_problem(cls, params, nodes, model):
        values = sum(q.numel() for q in model.parameters() if q.requires_grad)
        if len(fragment_bounds(values, params.fragments)) < params.fragments:
            return (f"parameter 'fragments' is {params.fragments}, which leaves some empty on "
                    f"a model of {values} values; give fewer")
        return None

    def setup(self):
        p = self.params
        flat = flatten(self.trainable_parameters())
        self.bounds = fragment_bounds(flat.numel(), p.fragments)
        self.sync_offsets = [((f + 1) * p.H // p.fragments) % p.H for f in range(p.fragments)]
        self.global_fragments = [torch.nn.Parameter(flat[a:b].clone()) for a, b in self.bounds]
        self.outer_optimizer = p.outer_spec().build(self.global_fragments)
        # The floating-point buffers (BatchNorm statistics) travel with the last fragment,
        # the one synced at multiples of H, as DiLoCo's do.
        self.buffer_fragment = p.fragments - 1
        self.rows = row_lengths([q.shape for q in self.trainable_parameters()])
        self.quantizer = OuterQuantizer(p.format, p.error_feedback, self.rows)
        self.in_flight = {}  # fragment -> (handle, outer gradient, step at which to apply)
        self.synced_buffers = self.float_buffers_flat()  # their mean at the last buffer sync

    def step(self):
        self.optimizer.step()
        self.optimizer.zero_grad()
        for f, (handle, outer_grad, apply_at) in list(self.in_flight.items()):
            if apply_at == self.step_num:
                self.apply_sync(f, handle, outer_grad)
        for f, offset in enumerate(self.sync_offsets):
            if self.step_num % self.params.H == offset:
                self.start_sync(f)

    def start_sync(self, f: int):
        a, b = self.bounds[f]
        local = flatten(self.trainable_parameters())[a:b]
        outer_grad, wire_bytes = self.quantizer.compress(
            self.global_fragments[f].detach() - local, rows_within(self.rows, a, b), slice(a, b))
        if f == self.buffer_fragment:
            buffer_bytes = sum(t.numel() * t.element_size() for t in self.float_buffers())
            outer_grad, wire_bytes = self.with_buffers(outer_grad), wire_bytes + buffer_bytes
        handle = self.comm.all_reduce(outer_grad, op="mean", async_op=True, wire_bytes=wire_bytes)
        if self.params.tau == 0:
            self.apply_sync(f, handle, outer_grad)
        else:
            self.in_flight[f] = (handle, outer_grad, self.step_num + self.params.tau)

    def apply_sync(self, f: int, handle, outer_grad):
        handle.wait()
        self.in_flight.pop(f, None)
        a, b = self.bounds[f]
        outer_grad = self.quantizer.sent_back(outer_grad, rows_within(self.rows, a, b))
        fragment = self.global_fragments[f]
        if f == self.buffer_fragment:  # full precision; mixed with the local ones like weights
            if self.synced_buffers is not None:
                self.synced_buffers = outer_grad[fragment.numel():].clone()
            outer_grad = self.take_buffers(outer_grad, fragment.numel(), keep=self.params.alpha)
        fragment.grad = outer_grad
        self.outer_optimizer.step()
        self.outer_optimizer.zero_grad()  # grads to None: the other fragments do not move
        params = self.trainable_parameters()
        flat = flatten(params)
        flat[a:b] = torch.lerp(fragment.detach(), flat[a:b], self.params.alpha)
        unflatten_into(flat, params)
        self.note(**{f"outer_grad_norm_{f}": outer_grad.norm().item()})

    def held_weights(self):
        return self.weights_with(torch.cat([g.detach() for g in self.global_fragments]),
                                 self.synced_buffers)

    @classmethod
    def checkpoint_problem(cls, params):
        offsets = sorted({((f + 1) * params.H // params.fragments) % params.H
                          for f in range(params.fragments)})
        gaps = [b - a for a, b in zip(offsets, offsets[1:] + [offsets[0] + params.H])]
        if params.tau >= max(gaps):  # a fragment is in flight at every step end
            return (f"with tau={params.tau} some fragment is always in flight (its syncs are "
                    f"at most {max(gaps)} steps apart); take tau below {max(gaps)}")
        return None

    def extra_state(self):
        return {"global_fragments": [g.detach().clone() for g in self.global_fragments],
                "outer_optimizer": self.outer_optimizer.state_dict(),
                "synced_buffers": self.synced_buffers, **self.quantizer.state()}

    def load_extra_state(self, state):
        with torch.no_grad():
            for g, saved in zip(self.global_fragments, state["global_fragments"]):
                g.copy_(saved)
        self.outer_optimizer.load_state_dict(state["outer_optimizer"])
        self.synced_buffers = state.get("synced_buffers", self.synced_buffers)
        self.quantizer.load(state)


def fragment_bounds(values: int, fragments: int) -> list[tuple[int, int]]:
    """[start, end) of each fragment of ceil(values / fragments) values (the last may be
    shorter; fewer than `fragments` when they do not all get one)."""
    size = max(1, math.ceil(values / fragments))
    return [(start, min(start + size, values)) for start in range(0, values, size)]
