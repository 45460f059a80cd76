"""Learning-rate schedules: the lr of step k (1-based) of a run of `total` steps.

Warm-up rises linearly over `warmup` steps (lr·k/warmup: lr/warmup at step 1, lr at step
warmup). After it:
  constant  lr
  linear    from lr down to min_ratio·lr at the last step
  cosine    from lr down to min_ratio·lr at the last step along half a cosine
  wsd       warm-up, stable at lr, then a linear decay to min_ratio·lr over the last
            WSD_DECAY of the steps after warm-up ("warmup-stable-decay")
These are the values torch's LinearLR, then CosineAnnealingLR / LinearLR (eta_min =
min_ratio·lr), chained by SequentialLR at the end of warm-up, give step by step.
"""
from __future__ import annotations

import math

WSD_DECAY = 0.2


def lr_at(step: int, lr: float, schedule: str, total: int, warmup: int = 0,
          min_ratio: float = 0.0) -> float:
    if step <= warmup:
        return lr * step / warmup
    after, span = step - warmup - 1, total - warmup - 1  # 0 at the first step after warm-up
    if schedule == "constant" or span <= 0:
        return lr
    if schedule == "wsd":
        decay = max(1, math.ceil(WSD_DECAY * (total - warmup)))
        after, span = after - (total - warmup - decay), decay - 1
        if after <= 0 or span <= 0:
            return lr if after <= 0 else lr * min_ratio
    progress = min(1.0, after / span)
    if schedule == "cosine":
        return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))
    return lr * (1 - (1 - min_ratio) * progress)  # linear, and wsd's decay
