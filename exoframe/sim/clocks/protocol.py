"""What a rank's clock and the simulator say to each other: typed, immutable messages.

A rank tells the simulator, at its simulated time `t`, that it starts an operation (Op),
waits for one (Wait) or asks whether one is done (Probe, as MPI_Test). A blocking Op and a
Wait are answered with Waited (when it ended, and how much of the wait was idle, peers not
yet there, versus communication); a Probe with Probed. Under simulated failures every rank
joins a Quorum at each synchronization, answered with Quorumed: who takes part. Remote
calls travel as Posts (one-sided messages); a rank gets its mail when it Listens, answered
with Mail (or Waited, when the operation it also waits for completes first). StepEnd and Done
tell the simulator how far a rank has come; Paused, that a rank waits outside it (answered
with Resume if the simulation waits for that rank). Ranks send these through a transport
(transport.py): live ranks over their pipe or TCP connection (engine/launch/monitor.py), replayed
ranks in process (sim/traces/replay.py). (Without __slots__: a slotted dataclass pickles at
twice the cost, and a rank sends a StepEnd every step.)
"""
from __future__ import annotations

from dataclasses import dataclass


class SimulationError(Exception):
    """The ranks' messages break the protocol: collectives that do not match, a message to a
    rank that does not exist."""


@dataclass(frozen=True)
class Op:
    t: float
    op_id: int  # the rank's own numbering of its operations
    key: tuple  # the same on every participant: which call of which group
    kind: str  # all_reduce, broadcast, all_gather, reduce_scatter, send, recv
    nbytes: float
    participants: tuple  # the group's ranks; (src, dst) for send and recv
    root: int  # index in participants (broadcast's source)
    blocking: bool


@dataclass(frozen=True)
class Wait:
    t: float
    op_id: int


@dataclass(frozen=True)
class Probe:
    t: float
    op_id: int


@dataclass(frozen=True)
class Quorum:
    """At the start of a synchronization, every rank (down or not) says whether it is up."""
    t: float
    seq: int  # the rank's count of quorums: the same on every rank
    down_until: float | None  # None: the rank is up; else when it is back from its failure


@dataclass(frozen=True)
class Post:
    """A one-sided message (a remote call or its result) to `dst`: it leaves at `t` and,
    once delivered, waits in dst's mailbox until dst listens."""
    t: float
    msg_id: int  # the sender's own numbering of its posts
    dst: int
    nbytes: float


@dataclass(frozen=True)
class Listen:
    """Wait for mail; with `op_id`, also for that operation (answered like Wait if it
    completes first). Not `block`: only ask for the mail delivered by `t`."""
    t: float
    op_id: int | None = None
    block: bool = True


@dataclass(frozen=True)
class Paused:
    """The rank waits for something outside the simulator before it goes on (its worker's
    other nodes, to compute a step with them: engine/node/stacked.py), and sends nothing
    earlier than `t`. If the simulator can go no further without it, it answers
    Resume(step): the rank goes on without what it waited for."""
    t: float
    step: int


@dataclass(frozen=True)
class Resume:
    step: int


@dataclass(frozen=True)
class StepEnd:
    """The rank ended a training step at `t`: it sends nothing earlier from now on."""
    t: float
    step: int | None = None  # which one (the simulator needs only `t`)


@dataclass(frozen=True)
class Done:
    """The rank sends nothing more."""


@dataclass(frozen=True)
class Waited:
    end: float
    idle: float
    comm: float
    latency: float = 0.0  # of comm: round trips, not bytes (critical_path.py)


@dataclass(frozen=True)
class Probed:
    done: bool


@dataclass(frozen=True)
class Quorumed:
    end: float  # when the last live member joined (a rank that joined later: its own time)
    live: tuple  # the ranks whose contributions count in this synchronization
    joining: tuple  # ranks back from a failure: they take a live rank's state after it


@dataclass(frozen=True)
class Mail:
    """The messages delivered to a listening rank: it waited from its Listen's t to `end`,
    `comm` of it while the message that ended the wait was in flight, the rest `idle`.
    messages: (src, msg_id, nbytes) each, in delivery order. payloads: their contents, added
    by the engine, which carries them beside the simulator."""
    end: float
    idle: float
    comm: float
    messages: tuple
    payloads: tuple = ()
    latency: float = 0.0  # of comm: the message's latency (critical_path.py)


def frozen(value):
    """A message field read back from JSON, which turns tuples into lists: keys and ids
    must be hashable again."""
    return tuple(frozen(v) for v in value) if isinstance(value, list) else value
