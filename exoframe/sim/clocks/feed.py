"""The simulator's inputs, recorded per rank so that a checkpoint can rebuild its state.

The simulator's state is a function of each rank's sequence of inputs (its messages and the
clock it reports at each step end), not of how the ranks interleave (see simulator.py). So
a checkpoint stores each rank's inputs up to the step it was taken at, and a resumed run
feeds them to a fresh simulator before the restored ranks' own: each rank's recorded inputs
go in as that rank sent them, the next one only once the simulator has answered the last
blocking one. Those answers were received by the ranks before the checkpoint; they are
dropped. A rank's new inputs queue behind its recorded ones.

Inputs are stored as JSON-ready lists: ["o", t, op_id, key, kind, nbytes, participants,
root, blocking], ["w", t, op_id], ["t", t, op_id] (a Probe), ["q", t, seq, down_until]
(a Quorum), ["p", t, msg_id, dst, nbytes] (a Post), ["l", t, op_id, block] (a Listen),
["s", t] (a step's end), ["z", t, step] (Paused; a Resume the replay answers is for a step
the rank has passed, and the rank ignores it).
"""
from __future__ import annotations

from collections import deque

from .protocol import Done, Listen, Op, Paused, Post, Probe, Quorum, StepEnd, Wait, frozen
from .simulator import Simulator

STEP_END = "s"


class Feed:
    def __init__(self, sim: Simulator, recorded: list[list] | None = None, record: bool = True):
        """recorded: per rank, the inputs a checkpoint stored (as_records), replayed first.
        record: keep every input in `log` (for checkpoints)."""
        self.sim = sim
        nodes = sim.topology.size
        recorded = recorded or [[] for _ in range(nodes)]
        self.record = record
        self.log = [list(inputs) if record else [] for inputs in recorded]  # every input
        # Inputs not yet given to the simulator, each with whether it is a replayed one.
        self.queue = [deque((from_record(r), True) for r in inputs) for inputs in recorded]
        self.replay_waits = [False] * nodes  # a replayed input waits for its (dropped) answer
        for rank in range(nodes):
            self._pump(rank)

    def message(self, rank: int,
                message: Op | Wait | Probe | Quorum | Post | Listen | Paused | StepEnd):
        if self.record:
            self.log[rank].append(as_record(message))
        self.queue[rank].append((message, False))
        self._pump(rank)

    def rank_done(self, rank: int):
        """The rank sends nothing more (after its inputs still queued)."""
        self.queue[rank].append((Done(), False))
        self._pump(rank)

    def replaying(self) -> bool:
        return any(self.queue) or any(self.replay_waits)

    def advance(self) -> list:
        """Run the simulator; return the replies for the live ranks."""
        replies = []
        while True:
            fed = False
            for rank, reply in self.sim.advance():
                if self.replay_waits[rank]:
                    self.replay_waits[rank] = False
                    self._pump(rank)
                    fed = True
                else:
                    replies.append((rank, reply))
            if not fed:
                return replies

    def _pump(self, rank: int):
        queue = self.queue[rank]
        while queue and not self.replay_waits[rank]:
            message, replayed = queue.popleft()
            if isinstance(message, StepEnd):
                self.sim.note_clock(rank, message.t)
                continue
            if isinstance(message, Done):
                self.sim.rank_done(rank)
                continue
            self.sim.receive(rank, message)
            if replayed and (isinstance(message, (Wait, Probe, Quorum, Listen)) or
                             isinstance(message, Op) and message.blocking):
                self.replay_waits[rank] = True


def as_record(message: Op | Wait | Probe | Quorum | Post | Listen | Paused | StepEnd) -> list:
    if isinstance(message, StepEnd):
        return [STEP_END, message.t]
    if isinstance(message, Quorum):
        return ["q", message.t, message.seq, message.down_until]
    if isinstance(message, Post):
        return ["p", message.t, message.msg_id, message.dst, message.nbytes]
    if isinstance(message, Listen):
        return ["l", message.t, message.op_id, message.block]
    if isinstance(message, Paused):
        return ["z", message.t, message.step]
    if isinstance(message, Op):
        return ["o", message.t, message.op_id, message.key, message.kind, message.nbytes,
                message.participants, message.root, message.blocking]
    return ["w" if isinstance(message, Wait) else "t", message.t, message.op_id]


def from_record(record: list) -> Op | Wait | Probe | Quorum | Post | Listen | Paused | StepEnd:
    tag = record[0]
    if tag == STEP_END:
        return StepEnd(record[1])
    if tag == "q":
        return Quorum(*record[1:])
    if tag == "p":
        return Post(*record[1:])
    if tag == "l":
        return Listen(*record[1:])
    if tag == "z":
        return Paused(*record[1:])
    if tag == "o":
        _, t, op_id, key, kind, nbytes, participants, root, blocking = record
        return Op(t, frozen(op_id), frozen(key), kind, nbytes, tuple(participants), root,
                  blocking)
    if tag == "w":
        return Wait(record[1], frozen(record[2]))
    if tag == "t":
        return Probe(record[1], frozen(record[2]))
    raise ValueError(f"not a simulator input: {record!r}")
