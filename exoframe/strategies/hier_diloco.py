"""Hierarchical DiLoCo: data-parallel training inside each site, DiLoCo across sites.

The sites are the network's (its YAML's `sites:`, e.g. geo-2dc's us and eu). Every step,
the ranks of a site average their gradients (an all-reduce among that site's ranks only,
over its fast fabric) and step their inner optimizer alike: a site is one DiLoCo worker
made of many data-parallel ranks. Every H steps, DiLoCo's outer step: the outer gradient
θ_global − θ (the same on every rank of a site) is averaged over all ranks, which weighs
each site by its number of ranks (the data it trained on), then the outer optimizer steps
and every rank takes θ_global. Only that outer reduction crosses the links between sites.
On a network without sites, every rank is one site: this is DDP with an outer step every H
steps (with outer_lr = 1 and no momentum, DDP). One site per rank gives DiLoCo. The outer
gradient may travel quantized (`quantizer`, `error_feedback`, as in diloco).
Bytes per rank: each step 2(m−1)/m · 4N among its site's m ranks (ring), plus DiLoCo's
2(n−1)/n · W(N) among all n ranks every H steps.
Sources: Douillard et al., "DiLoCo" (2023); torchft's HSDP + DiLoCo (one DiLoCo worker per
datacenter, made of data-parallel ranks).
"""
import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from .diloco import DiLoCo, OuterParams


class HierDiLoCo(DiLoCo):
    """Gradient all-reduce inside each site every step; DiLoCo's outer step across sites."""

    # The exchange right after each step's compute is the site's gradient all-reduce, not
    # an outer sync to stream through the backward pass.
    traits = dataclasses.replace(
        DiLoCo.traits,
        outer_sync_overlaps_backward=False,
        survives_failures=False)  # the site all-reduce needs every rank of the site

    @dataclass
    class Params(OuterParams):
        owner: ClassVar[str] = "hier-diloco"

    def setup(self):
        super().setup()
        self.site = next(group for group in self.comm.sites() if self.rank in group)

    def step(self):
        if len(self.site) > 1:
            self.average_gradients(self.site)
        self.optimizer.step()
        self.optimizer.zero_grad()
        if self.step_num % self.params.H == 0:
            with self.sync():
                self.outer_step()

