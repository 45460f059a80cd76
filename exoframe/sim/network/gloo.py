"""gloo's ring all-reduce (torch's ProcessGroupGloo on CPU tensors) as a plan of flows."""
from __future__ import annotations

import math

from .plan import AT_JOIN, Plan

GLOO_SEGMENT = 2 ** 20  # bytes: gloo's largest ring segment (kMaxSegmentSize, allreduce.h)


def gloo_segments_per_rank(n: int, nbytes: float) -> int:
    """How many segments of an all-reduce of `nbytes` among n each rank owns in gloo's ring:
    segments of at most GLOO_SEGMENT, at least 2 per rank, a multiple of n in all."""
    segments = max(math.ceil(nbytes / GLOO_SEGMENT), 2 * n)
    return -(-segments // n)


def gloo(kind: str, n: int, root: int = 0, nbytes: float = 0.0) -> Plan:
    """all_reduce as gloo's ring runs it over TCP (gloo/allreduce.cc, transport/tcp/pair.cc),
    which torch's ProcessGroupGloo calls: the payload in P = gloo_segments_per_rank segments
    per rank, each rank sending to the rank before it and receiving from the one after, a
    reduce-scatter of (n-1)P steps, then an all-gather of as many. At step j a rank waits for
    its receive of step j-2 (two segments in flight), then posts its receive of step j (a
    notice that it is ready goes to the sender: no payload moves before it arrives) and
    sends its step-j segment (its own for the first P steps of a phase, else the one it
    received P steps before). Latency-bound, each step pays the notice and the payload's
    latency; bandwidth-bound, the other segment in flight hides the notice (where it does not
    wait behind it: between two ranks, a notice shares the connection with its sender's
    payload). all_reduce only (gloo's other collectives are ring-like: use ring.)"""
    plan = Plan(n)
    if n == 1:
        return plan
    if kind != "all_reduce":
        raise ValueError(f"gloo does not implement {kind}")
    per_rank = gloo_segments_per_rank(n, nbytes)
    steps = (n - 1) * per_rank  # of each phase
    fraction = 1 / (n * per_rank)
    into = [[] for _ in range(n)]  # into[r][j]: the flow rank r receives at step j
    for j in range(2 * steps):
        step = j % steps  # within its phase
        for r in range(n):
            left = (r - 1) % n
            deps = [into[r][j - 2]] if j >= 2 else []
            if step >= per_rank:
                deps.append(into[r][j - per_rank])
            elif j >= steps:  # the all-gather starts from r's segment, reduced
                deps.extend(into[r][steps - 2:steps])
            notice = into[left][j - 2] if j >= 2 else AT_JOIN  # left's window moves on
            into[left].append(plan.add(r, left, fraction, dict.fromkeys(deps), notice))
    return plan


def plan_bytes(n: int, nbytes: float) -> float:
    """The payload whose plan gloo's is for `nbytes` among n: one per segment count, so
    that plans of many sizes are built once (Plans reads this)."""
    return float(gloo_segments_per_rank(n, nbytes) * n * GLOO_SEGMENT)


gloo.plan_bytes = plan_bytes
