"""DiLoCo: inner optimizer for H steps, then an outer Nesterov step on the averaged delta.

Every H steps each rank computes its outer gradient Δ_r = θ_global − θ_r, all-reduces the
mean Δ = mean_r(Δ_r), and takes an outer SGD step θ_global ← OuterOpt(θ_global, Δ) (Nesterov,
lr 0.7, momentum 0.9 by default); the live weights are then set to θ_global. Every rank keeps
the same outer state, so a sync is one all-reduce and no broadcast. θ_global is a separate
buffer that shares no storage with the live weights. The model's floating-point buffers
(BatchNorm statistics) travel in the same all-reduce and are set to their mean.
The outer gradient may travel quantized (`quantizer`, strategies/quantizers.py: bytes are
counted at the encoded size; fp8-row's mean is quantized again on its way back, as torchft
does), with error feedback (`error_feedback`: what a message did not
carry is added to the next outer gradient, as MuLoCo does); the buffers stay fp32.
Source: Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language Models"
(2023).
"""
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from ..comm import flatten, unflatten_into
from .base import Strategy, check_fraction, check_positive
from .traits import Traits
from .optimizers import OptimizerSpec, optimizer_tensors, outer_optimizer_spec
from .quantizers import OuterQuantizer, check_format, row_lengths


@dataclass
class OuterParams:
    """DiLoCo's parameters, shared by the strategies built on its outer step (eager-diloco,
    hier-diloco); a subclass names its strategy in `owner` for the error lines."""

    owner: ClassVar[str] = "diloco"
    H: int = 50
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    nesterov: bool = True
    outer_optimizer: str = "sgd"  # or any torch.optim class by name
    outer_optimizer_params: dict = field(default_factory=dict)
    quantizer: str = "none"  # the outer gradient's format (strategies/quantizers.py)
    error_feedback: bool = False

    def __post_init__(self):
        self.outer_spec()  # checked here (in the launcher), built in each rank's setup()
        check_format(self.owner, self.quantizer)
        check_positive(self.owner, H=self.H, outer_lr=self.outer_lr)
        check_fraction(self.owner, outer_momentum=self.outer_momentum)

    def outer_spec(self) -> OptimizerSpec:
        """The outer optimizer these parameters name (strategies/optimizers.py)."""
        return outer_optimizer_spec(self.owner, self)


class DiLoCo(Strategy):
    """Inner optimizer for H steps, then one all-reduce of the outer gradient and an outer Nesterov step."""

    traits = Traits(
        outer_sync_overlaps_backward=True,
        replicas_equal_after_sync=True,
        stacks=True,
        survives_failures=True,
        held_model="global model as of the last outer step")

    Params = OuterParams

    def setup(self):
        self.global_params = torch.nn.Parameter(flatten(self.trainable_parameters()))
        p = self.params
        self.outer_optimizer = p.outer_spec().build([self.global_params])
        self.quantizer = outer_quantizer(self)
        self.synced_buffers = self.float_buffers_flat()  # the buffers' mean at the last sync

    def held_weights(self):
        return self.weights_with(self.global_params.detach(), self.synced_buffers)

    def step(self):
        self.optimizer.step()
        self.optimizer.zero_grad()
        if self.step_num % self.params.H == 0:
            with self.sync():
                self.outer_step()
            # again once a node back from a failure has the live buffers (heal, in sync())
            self.synced_buffers = self.float_buffers_flat()

    def outer_step(self):
        params = self.trainable_parameters()
        # The buffers ride along and take their plain mean (no outer optimizer for statistics).
        outer_grad = self.all_reduce_outer_gradient(self.global_params.detach() - flatten(params))
        self.note(outer_grad_norm=outer_grad.norm().item())
        self.global_params.grad = outer_grad
        self.outer_optimizer.step()
        self.outer_optimizer.zero_grad()
        unflatten_into(self.global_params.detach(), params)
        self.synced_buffers = self.float_buffers_flat()

    def all_reduce_outer_gradient(self, delta: torch.Tensor) -> torch.Tensor:
        """The mean over ranks of this rank's outer gradient as `quantizer` encodes it (the
        float buffers, in full precision, ride along and take their mean)."""
        sent, wire_bytes = self.quantizer.compress(delta)
        joined = self.with_buffers(sent)
        buffer_bytes = 4 * (joined.numel() - sent.numel())
        self.comm.all_reduce(joined, op="mean", wire_bytes=wire_bytes + buffer_bytes)
        return self.take_buffers(self.quantizer.sent_back(joined), sent.numel())

    def recovery_tensors(self):
        return [*super().recovery_tensors(), self.global_params.detach(),
                *optimizer_tensors(self.outer_optimizer)]

    def extra_state(self):
        return {"global_params": self.global_params.detach().clone(),
                "outer_optimizer": self.outer_optimizer.state_dict(),
                "synced_buffers": self.synced_buffers, **self.quantizer.state()}

    def load_extra_state(self, state):
        with torch.no_grad():
            self.global_params.copy_(state["global_params"])
        self.outer_optimizer.load_state_dict(state["outer_optimizer"])
        self.synced_buffers = state.get("synced_buffers", self.synced_buffers)
        self.quantizer.load(state)


def outer_quantizer(strategy: Strategy) -> OuterQuantizer:
    """The strategy's `quantizer` and `error_feedback` parameters over its trainable
    parameters (fp8-row's rows are their last dimensions)."""
    return OuterQuantizer(strategy.params.quantizer, strategy.params.error_feedback,
                          row_lengths([p.shape for p in strategy.trainable_parameters()]))
