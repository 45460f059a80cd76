"""FLOPs of one training step, counted once with torch's FLOP counter."""
from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from ...errors import ExoframeError


def count_step_flops(model: torch.nn.Module, batch) -> float:
    """FLOPs of forward + backward on one batch (the optimizer's few FLOPs per parameter
    are left out). The model's gradients are left as they were."""
    saved = [p.grad for p in model.parameters()]
    counter = FlopCounterMode(display=False)
    try:
        with counter:
            model(batch).backward()
    finally:
        for p, grad in zip(model.parameters(), saved):
            p.grad = grad
    flops = counter.get_total_flops()
    if flops <= 0:
        raise ExoframeError("compute: torch's FLOP counter found no FLOPs in this model's "
                            "training step; use --compute fixed:<time per step> instead.")
    return float(flops)
