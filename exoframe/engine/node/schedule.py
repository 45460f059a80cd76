"""Learning-rate schedules: the lr of step k (1-based) of a run of `total` steps.

Warm-up rises linearly over `warmup` steps (lr·k/warmup: lr/warmup at step 1, lr at step
warmup). After it:
  constant  lr
  linear    from lr down to min_ratio·lr at the last step
  cosine    from lr down to min_ratio·lr at the last step along half a cosine
  wsd       warm-up, stable at lr, then a linear decay that reaches min_ratio·lr at the
            last step, over the last WSD_DECAY of the steps after warm-up
            ("warmup-stable-decay")
These are the values torch's LinearLR, then CosineAnnealingLR / LinearLR (eta_min =
min_ratio·lr), chained by SequentialLR at the end of warm-up, give step by step; a run
too short for a decay to span two steps ends at min_ratio·lr on its last step.
"""
from __future__ import annotations

import math

WSD_DECAY = 0.2


def lr_at(step: int, lr: float, schedule: str, total: int, warmup: int = 0,
          min_ratio: float = 0.0) -> float:
    if step <= warmup:
        return lr * step / warmup
    if schedule == "constant":
        return lr
    if schedule == "wsd":
        decay = max(1, math.ceil(WSD_DECAY * (total - warmup)))
        into = step - (total - decay)  # 1 .. decay inside the decay window
        return lr if into <= 0 else lr * (1 - (1 - min_ratio) * into / decay)
    span = total - warmup - 1  # steps after the first one after warm-up
    progress = 1.0 if span <= 0 else min(1.0, (step - warmup - 1) / span)
    if schedule == "cosine":
        return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))
    return lr * (1 - (1 - min_ratio) * progress)  # linear
