"""One collective or point-to-point transfer as the simulator tracks it: its plan's flows
still gated, who has joined, and when each participant is done."""
from __future__ import annotations

import math

from .critical_path import Paths
from .protocol import SimulationError


def sort_key(value):
    """An operation's key as an order that does not depend on when the ranks sent it, and
    compares numbers as numbers (call 9 before call 10), whatever the mix of types in it."""
    if isinstance(value, (tuple, list)):
        return (2, tuple(sort_key(item) for item in value))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value)
    return (1, repr(value))


class Operation:
    """One collective or point-to-point transfer, shared by its participants."""

    def __init__(self, key, kind, nbytes, participants, root, plan, opened_by):
        self.key, self.kind, self.nbytes = key, kind, nbytes
        self.order = sort_key(key)  # orders its messages among others at one instant (flows.py)
        self.participants, self.root, self.plan = participants, root, plan
        self.paths = Paths(len(participants))  # where its time goes (critical_path.py)
        self.opened_by = opened_by  # (rank, kind, nbytes) of the first submission, for messages
        compiled = plan.compiled
        self.waiting = list(compiled.waiting)
        self.touching = list(compiled.touching)
        self.joined_at = [None] * len(participants)
        self.joined = 0
        self.latest_join = -math.inf
        self.done_at = [None] * len(participants)
        self.last_join_when_done = [None] * len(participants)

    def describe(self) -> str:
        if self.kind in ("send", "recv"):
            return f"the transfer {self.participants[0]} -> {self.participants[1]}"
        return f"{self.kind} among ranks {list(self.participants)}"

    def check_matches(self, rank, kind, nbytes, root):
        """A later participant must call what the first one did."""
        first_rank, first_kind, first_bytes = self.opened_by
        if {kind, first_kind} == {"send", "recv"}:
            kind = first_kind
        if (kind, nbytes, root) != (first_kind, first_bytes, self.root):
            raise SimulationError(
                f"rank {rank} called {kind} ({nbytes} bytes) where rank {first_rank} called "
                f"{first_kind} ({first_bytes} bytes): every rank must make the same collective "
                "calls in the same order, with the same sizes")
