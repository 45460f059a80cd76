"""What a rank's clock and the simulator say to each other: typed, immutable messages.

A rank tells the simulator, at its simulated time `t`, that it starts an operation (Op),
waits for one (Wait) or asks whether one is done (Probe, as MPI_Test). A blocking Op and a Wait are
answered with Waited (when it ended, and how much of the wait was idle, peers not yet
there, versus communication); a Probe with Probed. Under simulated failures every rank
joins a Quorum at each synchronization, answered with Quorumed: who takes part. Live ranks send these over their pipe
(engine/monitor.py), replays feed them straight to the simulator (sim/replay.py).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Op:
    t: float
    op_id: int  # the rank's own numbering of its operations
    key: tuple  # the same on every participant: which call of which group
    kind: str  # all_reduce, broadcast, all_gather, reduce_scatter, send, recv
    nbytes: float
    participants: tuple  # the group's ranks; (src, dst) for send and recv
    root: int  # index in participants (broadcast's source)
    blocking: bool


@dataclass(frozen=True, slots=True)
class Wait:
    t: float
    op_id: int


@dataclass(frozen=True, slots=True)
class Probe:
    t: float
    op_id: int


@dataclass(frozen=True, slots=True)
class Quorum:
    """At the start of a synchronization, every rank (down or not) says whether it is up."""
    t: float
    seq: int  # the rank's count of quorums: the same on every rank
    down_until: float | None  # None: the rank is up; else when it is back from its failure


@dataclass(frozen=True, slots=True)
class Waited:
    end: float
    idle: float
    comm: float


@dataclass(frozen=True, slots=True)
class Probed:
    done: bool


@dataclass(frozen=True, slots=True)
class Quorumed:
    end: float  # when the last live member joined (a rank that joined later: its own time)
    live: tuple  # the ranks whose contributions count in this synchronization
    joining: tuple  # ranks back from a failure: they take a live rank's state after it


def frozen(value):
    """A message field read back from JSON, which turns tuples into lists: keys and ids
    must be hashable again."""
    return tuple(frozen(v) for v in value) if isinstance(value, list) else value
