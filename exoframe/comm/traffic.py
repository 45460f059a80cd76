"""Per-kind counters of a rank's operations and bytes.

The bytes come from the network simulator's plan for each operation (the algorithm the
network config selects: ring, tree, ...), so they are what that algorithm puts on the wire.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass


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

    def load_state_dict(self, counts: dict):
        """Counts as as_dict() gave them (a checkpoint)."""
        self.by_kind.clear()
        for kind, stats in counts.items():
            self.by_kind[kind] = KindStats(**stats)
