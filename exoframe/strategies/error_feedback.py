"""What topk-ef, randomk-ef and powersgd share: compressed gradient averaging with error
feedback.

Each step a rank adds its residual to its gradient, m = g + e, and exchanges a compressed
form of m. The optimizer steps on the average of the ranks' compressed gradients; what this
rank's message did not carry, e ← m − sent, is kept and added to the next gradient.
Source: Karimireddy et al., "Error Feedback Fixes SignSGD and other Gradient Compression
Schemes" (2019); Stich et al., "Sparsified SGD with Memory" (2018).
"""
import torch

from ..comm import flatten, unflatten_into
from .base import Strategy


class ErrorFeedbackStrategy(Strategy):
    """Subclasses implement `exchange(m)` -> (average over ranks, what this rank sent)."""

    def setup(self):
        params = self.trainable_parameters()
        self.residual = torch.zeros(sum(p.numel() for p in params), device=params[0].device)

    def exchange(self, corrected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def step(self):
        params = self.trainable_parameters()
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        corrected = flatten(p.grad for p in params) + self.residual
        averaged, sent = self.exchange(corrected)
        self.residual = corrected - sent
        unflatten_into(averaged, [p.grad for p in params])
        self.optimizer.step()
        self.optimizer.zero_grad()

    def extra_state(self):
        return {"residual": self.residual.clone()}

    def load_extra_state(self, state):
        self.residual = state["residual"].clone()
