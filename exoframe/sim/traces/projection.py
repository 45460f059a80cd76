"""Projection: a run's trace rescaled to a larger model, for replay (sim/traces/replay.py).

Every operation's bytes are scaled by one ratio (the parameter ratio times the payload's
bits over 32), every step's compute to a given step time. An all-reduce right after a step's
compute that a real implementation streams out during the backward pass is split into
buckets, each made ready by its slice of the backward pass (the forward pass is the first
1/3 of the compute, gradients come evenly through the rest):

- DDP's gradients (`bucketed_gradients`): as torch's DDP, on one communication stream per
  rank: bucket i starts when it is ready and bucket i−1 is done on this rank; the step ends
  when the last bucket is done. Each bucket pays the collective's latency in turn.
- A declared overlappable outer sync (`overlapped_sync`: DiLoCo's outer gradient, each
  Streaming DiLoCo fragment's, whose strided layers get their gradients all through the
  backward pass):
  - waited for in the same step (DiLoCo; Streaming DiLoCo with τ = 0): buckets one after
    another on one stream, as DDP's, but only where that ends the step sooner than the same
    bytes sent in one all-reduce after the compute (`all_reduce_seconds` estimates both on
    the network at hand); a real implementation would not choose an overlap that makes it
    slower, so an overlapped sync is never slower than the same bytes sent blocking;
  - waited for τ ≥ 1 steps later (Streaming DiLoCo): each bucket goes out as soon as its
    slice of the backward pass is done, beside the others (the network shares the links
    between them), and the wait τ steps later waits for every bucket. The next step's
    compute starts once the backward pass is done.

Projected traces use two more events, for the backward pass running beside the
communication stream: ["b", seconds] queues compute on the rank's compute stream without
moving its clock, and ["r"] moves the clock to the end of the oldest queued compute not yet
waited for (the next bucket's gradients are ready).
"""
from __future__ import annotations

import math
from typing import Callable, Optional

from ..clocks.protocol import frozen
from .replay import ReplayError

DDP_BUCKET_BYTES = 25 * 1024 * 1024  # torch DistributedDataParallel's bucket_cap_mb = 25
BACKWARD_SHARE = 2 / 3  # backward ≈ 2 × forward in FLOPs

#: (bytes, participants) -> seconds one all-reduce of that size takes alone on the network
AllReduceSeconds = Callable[[float, tuple], float]


def project(traces: list[list], bytes_ratio: float, step_seconds: float,
            bucketed_gradients: bool = False, overlapped_sync: bool = False,
            bucket_bytes: float = DDP_BUCKET_BYTES,
            all_reduce_seconds: Optional[AllReduceSeconds] = None) -> list[list]:
    """The traces of the same run for a model whose payloads are `bytes_ratio` times larger
    and whose training step computes for `step_seconds` (each rank's compute is scaled by one
    factor, so stragglers stay as slow relative to the others); streamed all-reduces as the
    module's docstring says. Without `all_reduce_seconds` an overlapped sync waited for in
    its step is always bucketed."""
    steps = sum(1 for e in traces[0] if e[0] == "s")
    total_compute = sum(e[1] for events in traces for e in events if e[0] == "c")
    if steps == 0 or total_compute <= 0:
        raise ReplayError("the trace has no compute to scale: record the run with a compute "
                        "model (measured, fixed or flops).")
    scale = step_seconds / (total_compute / (len(traces) * steps))
    streams = _Streams(bucket_bytes, step_seconds, all_reduce_seconds)
    return [_project_rank(events, bytes_ratio, scale, bucketed_gradients, overlapped_sync,
                          streams) for events in traces]


def _project_rank(events, bytes_ratio, scale, bucketed_gradients, overlapped_sync, streams):
    out = []
    waits_for = {}  # recorded op id -> the buckets its wait now waits for
    skip_wait = None  # the recorded wait the buckets already end with
    for index, event in enumerate(events):
        tag = event[0]
        if tag == "c":
            out.append(["c", event[1] * scale])
        elif tag == "o":
            op = list(event)
            op[4] = event[4] * bytes_ratio
            waits = _waits_after_compute(out) if op[3] == "all_reduce" else None
            waited_now = op[7] or _waited_next(events, index, op[1])
            streamed = waits is not None and (
                (bucketed_gradients and op[7] and not waits)
                or (overlapped_sync and (not waited_now or streams.worth_streaming(op))))
            if not streamed:
                out.append(op)
                continue
            # The waits for earlier exchanges (a fragment τ steps old) move into the
            # backward pass, which hides them; the compute before them is split.
            del out[len(out) - len(waits):]
            compute = out.pop()[1]
            if waited_now:
                out.extend(streams.serial(op, compute, waits))
                skip_wait = None if op[7] else frozen(op[1])
            else:
                buckets, waits_for[frozen(op[1])] = streams.beside(op, compute, waits)
                out.extend(buckets)
        elif tag == "w" and skip_wait is not None and frozen(event[1]) == skip_wait:
            skip_wait = None
        elif tag == "w" and frozen(event[1]) in waits_for:
            out.extend(["w", b] for b in waits_for.pop(frozen(event[1])))
        else:
            out.append(list(event))
    return out


def _waits_after_compute(out) -> list | None:
    """The waits that end `out` right after a compute segment (maybe none), or None when
    `out` does not end with a compute segment and waits."""
    waits = []
    for event in reversed(out):
        if event[0] == "c":
            return waits[::-1]
        if event[0] != "w":
            return None
        waits.append(event)
    return None


def _waited_next(events, index, op_id) -> bool:
    """Is the event after `index` the wait for `op_id` (an async op waited for at once)?"""
    following = events[index + 1] if index + 1 < len(events) else None
    return following is not None and following[0] == "w" and frozen(following[1]) == frozen(op_id)


class _Streams:
    """How an all-reduce after a step's compute goes out in buckets during the backward
    pass."""

    def __init__(self, bucket_bytes: float, step_seconds: float,
                 all_reduce_seconds: Optional[AllReduceSeconds]):
        self.bucket_bytes, self.step_seconds = bucket_bytes, step_seconds
        self.all_reduce_seconds = all_reduce_seconds
        self.decided = {}  # (bytes, participants) -> stream it or not

    def count(self, nbytes: float) -> int:
        return max(1, math.ceil(nbytes / self.bucket_bytes))

    def worth_streaming(self, op) -> bool:
        """Whether buckets one after another through the backward pass end a step of
        `step_seconds` sooner than one all-reduce after it (the same answer on every rank)."""
        if self.all_reduce_seconds is None:
            return True
        nbytes, participants = op[4], tuple(op[5])
        key = (nbytes, participants)
        if key not in self.decided:
            k = self.count(nbytes)
            compute = self.step_seconds
            forward, slice_ = compute * (1 - BACKWARD_SHARE), compute * BACKWARD_SHARE / k
            bucket = self.all_reduce_seconds(nbytes / k, participants)
            done = 0.0
            for i in range(k):
                done = max(forward + (i + 1) * slice_, done) + bucket
            self.decided[key] = done < compute + self.all_reduce_seconds(nbytes, participants)
        return self.decided[key]

    def _backward(self, compute: float, count: int, waits: list) -> list:
        backward = compute * BACKWARD_SHARE
        return [["c", compute - backward], *(["b", backward / count] for _ in range(count)),
                *waits]

    def serial(self, op, compute: float, waits: list) -> list:
        """The forward pass; the backward pass queued in one slice per bucket; then, on the
        communication stream, each bucket once its slice is computed and the previous bucket
        is done; then wait for the last bucket."""
        _, op_id, key, kind, nbytes, participants, root, _ = op
        count = self.count(nbytes)
        events = self._backward(compute, count, waits)
        for b in range(count):
            if b > 0:
                events.append(["w", (op_id, b - 1)])
            events.append(["r"])
            events.append(["o", (op_id, b), [*_as_list(key), b], kind, nbytes / count,
                           participants, root, False])
        events.append(["w", (op_id, count - 1)])
        return events

    def beside(self, op, compute: float, waits: list) -> tuple[list, list]:
        """The forward pass; the backward pass queued in one slice per bucket; each bucket
        sent once its slice is computed. Returns the events and the buckets' ids."""
        _, op_id, key, kind, nbytes, participants, root, _ = op
        count = self.count(nbytes)
        events, ids = self._backward(compute, count, waits), []
        for b in range(count):
            events.append(["r"])
            events.append(["o", (op_id, b), [*_as_list(key), b], kind, nbytes / count,
                           participants, root, False])
            ids.append((op_id, b))
        return events, ids


def _as_list(key):
    return list(key) if isinstance(key, (list, tuple)) else [key]
