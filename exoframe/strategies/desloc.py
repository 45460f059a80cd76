"""DES-LOC: local Adam whose parameters and two moments are averaged on separate periods.

Each worker runs Adam (or AdamW) on its own data. At the end of step s it replaces by their
mean over workers: the parameters θ when Kx divides s, Adam's first moment u when Ku divides
s, and its second moment v when Kv divides s. The moments decay slowly (their half-life
ln 0.5 / ln β grows with β), so they can be synced less often than the parameters: the
paper recommends Ku = 3·Kx and Kv = 6·Kx. The paper states the averages as taken before step
t's update for t ≡ 0 (mod K); here they are taken after step s's, the same schedule shifted
by one step, so that a run of a multiple of Kx steps ends synced. With Kx = Ku = Kv this is
Local Adam. What one step syncs travels as one all-reduce; the floating-point buffers
(BatchNorm statistics) go with the parameters. Every sync is a `sync()`: under simulated
failures the live workers average among themselves, and a worker back from a failure takes
the parameters and both moments from a live one (the paper's point: its state is never
lost, as every quantity is periodically the workers' mean).
Bytes per rank at a step that syncs k of the three (ring): 2(n−1)/n · 4N·k.
Source: Iacob et al., "DES-LOC: Desynced Low Communication Adaptive Optimizers for Training
Foundation Models" (arXiv 2505.22549, 2025).
"""
from dataclasses import dataclass

import torch

from ..comm import flatten, unflatten_into
from ..errors import ExoframeError
from .base import Strategy, check_positive
from .traits import Traits

MOMENTS = {"Ku": "exp_avg", "Kv": "exp_avg_sq"}  # Adam's names for u and v


class DESLOC(Strategy):
    """Local Adam; parameters averaged every Kx steps, first moment every Ku, second every Kv."""

    traits = Traits(
        survives_failures=True,
        replicas_equal_after_sync=False,
        held_model="replicas' average (a model no node holds)")
    # A step that syncs only a moment leaves the parameters apart: no checksum check.

    @dataclass
    class Params:
        Kx: int = 32
        Ku: int = 96
        Kv: int = 192

        def __post_init__(self):
            check_positive("desloc", Kx=self.Kx, Ku=self.Ku, Kv=self.Kv)

    def step(self):
        self.optimizer.step()
        self.optimizer.zero_grad()
        p, s = self.params, self.step_num
        moments = [MOMENTS[k] for k in ("Ku", "Kv") if s % getattr(p, k) == 0]
        if s % p.Kx == 0 or moments:
            with self.sync():
                self.average(moments, parameters=s % p.Kx == 0)

    def average(self, moments: list[str], parameters: bool):
        """One all-reduce (mean) of the parameters (with the buffers) and the named moments."""
        params = self.trainable_parameters()
        states = [self.moment(q, key) for key in moments for q in params]
        flat = flatten(states) if states else None
        if parameters:
            weights = flatten(params)
            joined = weights if flat is None else torch.cat([weights, flat])
            mean = self.all_reduce_with_buffers(joined)
            unflatten_into(mean[:weights.numel()], params)
            mean = mean[weights.numel():]
        else:
            self.comm.all_reduce(flat, op="mean")
            mean = flat
        if states:
            unflatten_into(mean, states)

    def moment(self, param: torch.Tensor, key: str) -> torch.Tensor:
        state = self.optimizer.state.get(param, {})
        if key not in state:
            raise ExoframeError(f"desloc: the inner optimizer keeps no '{key}' (Adam's moments); "
                                "use --optimizer adamw or adam.")
        return state[key]
