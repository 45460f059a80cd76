"""The local optimizer's numbers, checked where a config is read and where a strategy's
optimizer is specified (torch-free: the config imports it)."""
from __future__ import annotations

import math

from .errors import ExoframeError


def check_optimizer_values(lr=None, weight_decay=0.0, momentum=0.0):
    """The local optimizer's numbers, checked before any rank builds it (torch would only
    complain inside the ranks, after the fork)."""
    if lr is not None and not (math.isfinite(lr) and lr > 0):
        raise ExoframeError(f"lr must be a positive finite number, got {lr}.")
    if not (math.isfinite(weight_decay) and weight_decay >= 0):
        raise ExoframeError(f"weight_decay must be a finite number >= 0, got {weight_decay}.")
    if not (math.isfinite(momentum) and 0 <= momentum < 1):
        raise ExoframeError(f"momentum must be in [0, 1), got {momentum}.")
