"""A rank's simulated clock, and its side of the conversation with the simulator.

The clock advances by compute (from the compute model) and by waiting for operations (as
the simulator answers). Its time is split four ways, which always add up to `now`:
compute, exposed communication (`comm`), `idle` (waiting for peers to join) and `down`
(a simulated failure: the node does nothing until it is back, see exoframe/comm/rank_failures.py).
Communication is split again, as the simulator answers (critical_path.py): `comm_latency`
(round trips) and `comm_bandwidth` (bytes), which add up to `comm`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ...errors import ExoframeError
from ..network.collectives import Plans
from ..network.topology import Topology
from .compute import ComputeClock
from .protocol import (Listen, Mail, Op, Paused, Post, Probe, Probed, Quorum, Quorumed, StepEnd,
                       Wait, Waited)

# is_completed() asked this many times at one simulated instant: the rank spins without
# letting simulated time pass, and the answer can never change.
MAX_POLLS_AT_ONE_TIME = 10_000


@dataclass
class Submitted:
    op_id: int
    bytes_sent: int
    bytes_received: int


@runtime_checkable
class Clock(Protocol):
    """What a Communicator asks of its rank's clock: when an operation is submitted, waited
    for and done. RankClock (simulated), measured.RealClock (--net real) and SoloClock (one
    process) are Clocks."""

    now: float  # the rank's time: simulated, or the wall-clock time it trained

    def submit(self, kind: str, nbytes: int, participants: tuple, root: int = 0,
               blocking: bool = True) -> Submitted: ...

    def wait(self, op_id: int) -> None: ...

    def waited(self, op_id: int | None = None) -> None: ...

    def is_done(self, op_id: int, work=None) -> bool: ...

    def add_compute(self, seconds: float) -> None: ...

    def skip(self) -> None: ...


@runtime_checkable
class StepClock(Clock, Protocol):
    """A training rank's clock (RankClock, RealClock): what the rank's loop and the fault
    plan (comm/rank_failures.py) ask of it besides."""

    compute_seconds: float
    down: bool  # a failed node: nothing it computes is charged
    trace: list  # what the rank did, for the run's trace.json

    def start_step(self) -> None: ...

    def charge(self) -> None: ...

    def end_step(self, step: int) -> None: ...

    def stats(self) -> dict: ...


def operation_key(sequence: dict, kind: str, participants: tuple) -> tuple:
    """The key that names one operation alike on every participant: its group (or its
    (src, dst) pair) and how many operations that group has had before. `sequence` counts
    them (updated)."""
    point_to_point = kind in ("send", "recv")
    group = ("p" if point_to_point else "c", participants)
    count = sequence.get(group, 0)
    sequence[group] = count + 1
    return ("p", *participants, count) if point_to_point else ("c", participants, count)


def overlapped_compute(trace: list) -> float:
    """The compute seconds a RankClock's trace charged while one of the rank's non-blocking
    collectives was in flight (started, not yet waited for nor answered done): compute that
    the simulator runs beside an exchange, which meanwhile moves at the network's pace, or
    at the compute model's overlap= rate where it has one. (A receive posted ahead, as a
    server's, waits for a peer rather than moving bytes: not counted.)"""
    in_flight, seconds = set(), 0.0
    for entry in trace:
        tag = entry[0]
        if tag == "o" and not entry[7] and entry[3] not in ("send", "recv"):
            in_flight.add(entry[1])
        elif tag == "w" or (tag == "t" and entry[2]):
            in_flight.discard(entry[1])
        elif tag == "c" and in_flight:
            seconds += entry[1]
    return seconds


class RankClock:
    def __init__(self, rank: int, port, compute: ComputeClock, topology_algorithms: dict,
                 algorithms: dict, topology: Topology | None = None):
        """port: the way to the simulator, with send(message) and recv() of the messages in
        protocol.py (the engine's pipe to the launcher, where the simulator runs).
        topology_algorithms: op kind -> algorithm name; algorithms: name -> plan function;
        topology: the network, for algorithms that plan by site (None: one site), so that
        the bytes counted here are those the simulator moves."""
        self.rank = rank
        self.port = port
        self.compute = compute
        self.plans = Plans(topology_algorithms, algorithms, topology)
        self.now = 0.0
        self.compute_seconds = self.comm_seconds = self.idle_seconds = 0.0
        self.comm_latency_seconds = 0.0  # of comm_seconds: round trips (the rest: bytes)
        self.down_seconds = 0.0
        self.down = False  # a failed node: nothing it computes is charged
        self._quorums = 0
        self._next_id = 0
        self._posts = 0
        self._sequence: dict = {}  # per group / per (src, dst) pair: operations so far
        self._polls = (None, 0)  # (simulated time, questions asked at it)
        # What this rank did, for replaying it through other networks (exoframe.sim.traces.replay):
        # ["c", seconds] compute, ["o", op_id, key, kind, bytes, participants, root,
        # blocking], ["w", op_id] wait, ["t", op_id, answer] question, ["s", step] step end,
        # ["q", seq, down_until, end, live, joining] quorum, ["p", msg_id, dst, bytes] post,
        # ["l", op_id, block, end, messages] listen.
        self.trace: list = []

    # -- compute -----------------------------------------------------------------------------
    def start_step(self):
        self._add_compute(self.compute.start_step())

    def charge(self):
        """Bring the clock up to date with the compute done since the last exchange."""
        self._add_compute(self.compute.elapsed())

    def skip(self):
        """Do not charge what was done since the last charge (bookkeeping)."""
        self.compute.restart()

    def add_compute(self, seconds: float):
        """Charge `seconds` of simulated compute now, beyond what the compute model counts
        (the declared cost of a served remote call)."""
        self.charge()
        self._add_compute(seconds * self.compute.factor)  # a straggler is slower at it too

    def end_step(self, step: int):
        self.trace.append(["s", step])

    def pause(self, step: int):
        """Tell the simulator that this rank waits outside it (for its worker's other nodes,
        to compute `step` with them: engine/node/stacked.py), sending nothing earlier than
        its clock now; resumed(step) says whether the simulator answered that it waits for
        this rank."""
        self._send(Paused(self.now, step))

    def resumed(self, step: int) -> bool:
        return self.port.resumed(step)

    def go_on(self):
        """The paused rank goes on: it waits for nothing outside the simulator any more (a
        StepEnd at its clock, which has not moved)."""
        self._send(StepEnd(self.now))

    def _add_compute(self, seconds: float):
        if seconds and not self.down:
            self.now += seconds
            self.compute_seconds += seconds
            if self.trace and self.trace[-1][0] == "c":
                self.trace[-1][1] += seconds
            else:
                self.trace.append(["c", seconds])

    # -- operations --------------------------------------------------------------------------
    def submit(self, kind: str, nbytes: int, participants: tuple, root: int = 0,
               blocking: bool = True, work=None) -> Submitted:
        """Tell the simulator this rank starts an operation now; if blocking, wait for it.
        participants: the group's ranks (send/recv: (src, dst)); root: index in it. work:
        the real exchange, which only RealClock watches."""
        self.charge()
        key = operation_key(self._sequence, kind, participants)
        sent, received = self.plans.bytes_moved(kind, participants, root, self.rank, nbytes)
        op_id = self._next_id
        self._next_id += 1
        self._send(Op(self.now, op_id, key, kind, nbytes, participants, root, blocking))
        self.trace.append(["o", op_id, key, kind, nbytes, participants, root, blocking])
        if blocking:
            self._receive_wait()
        return Submitted(op_id, sent, received)

    def wait(self, op_id: int):
        self.charge()
        self._send(Wait(self.now, op_id))
        self.trace.append(["w", op_id])
        self._receive_wait()

    def waited(self, op_id: int | None = None):
        """The real exchange behind an operation was waited for (see measured.RealClock)."""

    def is_done(self, op_id: int, work=None) -> bool:
        """Has the operation completed by this rank's simulated now? (work: the real
        exchange, which only RealClock asks)"""
        self.charge()
        self._count_poll()
        self._send(Probe(self.now, op_id))
        reply = self._receive()
        assert isinstance(reply, Probed), reply
        self.trace.append(["t", op_id, reply.done])
        return reply.done

    # -- remote calls ----------------------------------------------------------------------
    def post(self, dst: int, nbytes: int, payload) -> int:
        """Send a one-sided message of `nbytes` to rank dst now; `payload` travels beside
        the simulator (the engine hands it over with the Mail that delivers it)."""
        self.charge()
        msg_id, self._posts = self._posts, self._posts + 1
        self.port.send(Post(self.now, msg_id, dst, nbytes), payload)
        self.trace.append(["p", msg_id, dst, nbytes])
        return msg_id

    def listen(self, op_id: int | None = None, block: bool = True) -> Mail | None:
        """Wait for mail, or with op_id until that operation completes if it does first
        (then None). Not block: the mail delivered by now, maybe none, without waiting."""
        self.charge()
        self._send(Listen(self.now, op_id, block))
        reply = self._receive()
        if isinstance(reply, Waited):
            self._waited(reply)
            self.trace.append(["w", op_id])
            return None
        assert isinstance(reply, Mail) and reply.end >= self.now, (reply, self.now)
        if not block and not reply.messages:
            self._count_poll()
        self.idle_seconds += reply.idle
        self.comm_seconds += reply.comm
        self.comm_latency_seconds += reply.latency
        self.now = reply.end
        self.trace.append(["l", op_id, block, reply.end, [list(m) for m in reply.messages]])
        return reply

    def quorum(self, down_until: float | None) -> Quorumed:
        """Join the membership quorum of a synchronization (simulated failures): down_until
        is None on a live rank, else when this rank is back. The wait counts as idle on a
        live rank and as down time on a failed one."""
        self.charge()
        seq, self._quorums = self._quorums, self._quorums + 1
        self._send(Quorum(self.now, seq, down_until))
        reply = self._receive()
        assert isinstance(reply, Quorumed) and reply.end >= self.now, (reply, self.now)
        if down_until is None:
            self.idle_seconds += reply.end - self.now
        else:
            self.down_seconds += reply.end - self.now
        self.now = reply.end
        self.trace.append(["q", seq, down_until, reply.end, reply.live, reply.joining])
        return reply

    def state_dict(self) -> dict:
        """Everything a checkpoint needs to continue this clock exactly."""
        return {"now": self.now, "compute_seconds": self.compute_seconds,
                "comm_seconds": self.comm_seconds, "idle_seconds": self.idle_seconds,
                "comm_latency_seconds": self.comm_latency_seconds,
                "down_seconds": self.down_seconds, "down": self.down, "quorums": self._quorums,
                "next_id": self._next_id, "posts": self._posts, "sequence": dict(self._sequence),
                "polls": self._polls, "trace": self.trace, "compute": self.compute.state_dict()}

    def load_state_dict(self, state: dict):
        self.now = state["now"]
        self.compute_seconds = state["compute_seconds"]
        self.comm_seconds, self.idle_seconds = state["comm_seconds"], state["idle_seconds"]
        # (absent from checkpoints written before it was counted: all of it bandwidth)
        self.comm_latency_seconds = state.get("comm_latency_seconds", 0.0)
        # (absent from checkpoints written before simulated failures existed)
        self.down_seconds, self.down = state.get("down_seconds", 0.0), state.get("down", False)
        self._quorums = state.get("quorums", 0)
        self._next_id, self._sequence = state["next_id"], dict(state["sequence"])
        self._posts = state.get("posts", 0)
        self._polls, self.trace = tuple(state["polls"]), list(state["trace"])
        self.compute.load_state_dict(state["compute"])

    def stats(self) -> dict:
        return {"simulated_seconds": self.now, "compute_seconds": self.compute_seconds,
                "comm_seconds": self.comm_seconds, "idle_seconds": self.idle_seconds,
                "comm_latency_seconds": self.comm_latency_seconds,
                "comm_bandwidth_seconds": self.comm_seconds - self.comm_latency_seconds,
                "down_seconds": self.down_seconds}

    # -- plumbing ----------------------------------------------------------------------------
    def _count_poll(self):
        at, count = self._polls
        self._polls = (self.now, count + 1 if at == self.now else 1)
        if self._polls[1] > MAX_POLLS_AT_ONE_TIME:
            raise ExoframeError(
                f"rank {self.rank} asked whether something arrived (is_completed(), serve()) "
                f"{MAX_POLLS_AT_ONE_TIME} times at simulated time {self.now:.6g} s: no "
                "simulated time passes between the questions (compute is charged per step), "
                "so the answer cannot change. Call wait(), or ask once per step.")

    def _send(self, message):
        self.port.send(message)

    def _receive(self):
        reply = self.port.recv()
        self.compute.restart()
        return reply

    def _receive_wait(self):
        self._waited(self._receive())

    def _waited(self, reply: Waited):
        assert isinstance(reply, Waited) and reply.end >= self.now, (reply, self.now)
        self.now = reply.end
        self.idle_seconds += reply.idle
        self.comm_seconds += reply.comm
        self.comm_latency_seconds += reply.latency


class SoloClock:
    """The clock of a Communicator used alone, in one process (world size 1, no simulator):
    nothing leaves the rank, so every operation is done at once and moves no bytes."""

    now = 0.0

    def __init__(self):
        self._next_id = 0

    def submit(self, kind, nbytes, participants, root=0, blocking=True, work=None) -> Submitted:
        if len(participants) > 1:
            raise ValueError("a Communicator without a clock is for world size 1; ranks of a "
                             "run get theirs from the engine")
        self._next_id += 1
        return Submitted(self._next_id - 1, 0, 0)

    def wait(self, op_id):
        pass

    def waited(self, op_id=None):
        pass

    def is_done(self, op_id, work=None) -> bool:
        return True

    def add_compute(self, seconds):
        pass

    def skip(self):
        pass
