"""Bytes each rank sends and receives for one operation, and per-kind counters.

Until the network model decomposes operations by algorithm, counts follow the default
algorithms: ring for all_reduce / all_gather / reduce_scatter, a chain (pipelined)
broadcast, and a single flow for send/recv. S is the payload in bytes: the full buffer for
all_reduce and broadcast, the gathered output for all_gather, the input for reduce_scatter.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass


def ring_bytes(kind: str, nbytes: int, world_size: int, rank: int = 0, src: int = 0):
    """(bytes sent, bytes received) by `rank` for one operation of `nbytes` payload."""
    n = world_size
    if n == 1:
        return 0, 0
    if kind == "all_reduce":
        each = 2 * (n - 1) * nbytes // n
        return each, each
    if kind in ("all_gather", "reduce_scatter"):
        each = (n - 1) * nbytes // n
        return each, each
    if kind == "broadcast":
        position = (rank - src) % n  # place in the chain that starts at src
        sent = nbytes if position < n - 1 else 0
        received = nbytes if position > 0 else 0
        return sent, received
    raise ValueError(f"no ring byte count for {kind}")


@dataclass
class KindStats:
    calls: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0


class TrafficStats:
    """Per operation kind: calls, bytes sent, bytes received (this rank)."""

    def __init__(self):
        self.by_kind: dict[str, KindStats] = defaultdict(KindStats)

    def add(self, kind: str, sent: int, received: int):
        stats = self.by_kind[kind]
        stats.calls += 1
        stats.bytes_sent += sent
        stats.bytes_received += received

    @property
    def bytes_sent(self) -> int:
        return sum(s.bytes_sent for s in self.by_kind.values())

    @property
    def bytes_received(self) -> int:
        return sum(s.bytes_received for s in self.by_kind.values())

    def as_dict(self) -> dict:
        return {kind: vars(stats).copy() for kind, stats in sorted(self.by_kind.items())}
