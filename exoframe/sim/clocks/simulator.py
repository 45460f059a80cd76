"""The simulator: one network model for all ranks, driven by their messages.

Ranks run ahead on their own simulated clocks and tell the simulator when they start an
operation, wait for one, or ask whether one is done. Events are processed in a fixed total
order, (time, class, rank, sequence), where at equal times a rank's message (class 0) comes
before the network's events (class 1), which come before "is it done yet?" questions
(class 2). An event is processed only when no running rank can still send something that
sorts before it (conservative synchronization): a running rank's future messages are no
earlier than its last reported clock; a rank that waits for the simulator sends nothing
until it is answered. Results therefore do not depend on how the OS schedules ranks.

Messages are those of protocol.py, `t` being the rank's clock: Op, Wait -> Waited,
Probe -> Probed; a blocking Op is answered like Wait; Quorum -> Quorumed once every rank has
joined (every rank waits for the answer, so none can send anything earlier); Post and
Listen: see mailbox.py.

Simulated failures: a rank the quorum leaves out (down) is outside until its next Quorum.
It takes no part in any simulated operation, only in the real ones, so it sends nothing
that must be ordered and holds no event back: it counts as neither running nor blocked. A
joining rank is outside too, once its one receive of the state (right after the quorum) is
in, until that receive is answered.
`note_clock(rank, t)` and `rank_done(rank)` come from the engine's step records.

A Paused rank waits outside the simulator (a stacked node for its worker's others): it
counts as running, with its bound. Once every running rank is paused and nothing more can be
processed, the simulation waits for them: the one with the lowest bound is answered Resume
(resume_if_held; the engine's too, where the running ranks that are not paused wait outside
the simulator for what the simulation holds back).
"""
from __future__ import annotations

import heapq
import itertools
import math


from ..network.collectives import Plans
from ..network.events import URGENT, Environment
from ..network.flows import FlowNetwork
from ..network.topology import Topology
from .critical_path import wait_latency
from .diagnosis import why_stuck
from .mailbox import Mailboxes
from .membership import join_quorum
from .operation import Operation
from .protocol import (Listen, Op, Paused, Post, Probe, Probed, Quorum, Resume, SimulationError,
                       Wait, Waited)

MESSAGE, NETWORK, QUESTION = 0, 1, 2


class Simulator:
    def __init__(self, topology: Topology, algorithms: dict, seed: int = 0,
                 overlap_rate: float | None = None, log: list | None = None):
        """algorithms: name -> plan function (see collectives.py); overlap_rate: the compute
        model's `overlap=` (bytes/s a rank's exchanges move while it computes), or None;
        log: a list to append what happened to, for a timeline (report/timeline_plot.py):
        ("join", rank, key, kind, bytes, t), ("done", rank, key, t), and the network's."""
        self.topology = topology
        self.plans = Plans(topology.algorithms, algorithms, topology)
        self.env = Environment()
        self.network = FlowNetwork(self.env, topology, seed, overlap_rate)
        self.log = self.network.log = log
        # Unlimited links, no latency: an operation completes when its last participant
        # joins, with no flows to simulate.
        self.ideal = topology.is_ideal()
        n = topology.size
        self.bound = [0.0] * n  # lower bound of each running rank's next message time
        self.blocked = [False] * n
        self.finished = [False] * n
        self.inbox = []  # heap of (t, class, rank, seq, message)
        self._seq = itertools.count()
        self.operations = {}  # key -> Operation
        self.handles = {}  # (rank, op_id) -> (Operation, participant index)
        self.waiters = {}  # (Operation, index) -> (rank, t, op_id)
        self.early_waits = {}  # (rank, op_id) -> t, for waits that overtook their submission
        self.replies = []  # (rank, reply) to be sent by the caller
        self.quorums = {}  # seq -> {rank: Quorum}, until every rank has joined
        self.outside: set[int] = set()  # down ranks between quorums (see the docstring)
        self.recovering: set[int] = set()  # joining ranks whose receive is still to come
        self.mail = Mailboxes(self)
        self.paused: dict[int, int] = {}  # rank -> the step it waits outside the simulator at
        self._earliest = None

    # -- input -------------------------------------------------------------------------------
    def bytes_between_sites(self) -> dict[str, float]:
        """Bytes sent so far from one site to another, by "a->b" (the sites' names)."""
        names = self.topology.sites
        return {f"{names[a]}->{names[b]}": nbytes
                for (a, b), nbytes in sorted(self.network.bytes_between_sites.items())}

    def receive(self, rank: int, message: Op | Wait | Probe | Quorum | Post | Listen | Paused):
        self._earliest = None
        t = message.t
        self._computed(rank, t)
        self.paused.pop(rank, None)
        if isinstance(message, Paused):
            self.bound[rank] = max(self.bound[rank], t)
            self.paused[rank] = message.step
        elif isinstance(message, Post):
            self.bound[rank] = t
            heapq.heappush(self.inbox, (t, MESSAGE, rank, next(self._seq), message))
        elif isinstance(message, Listen):
            self.blocked[rank] = True
            heapq.heappush(self.inbox, (t, MESSAGE if message.block else QUESTION, rank,
                                        next(self._seq), message))
        elif isinstance(message, Op):
            if rank in self.recovering:  # its receive of the state: outside from now on
                self.recovering.discard(rank)
                self.outside.add(rank)
            if message.blocking:
                self.blocked[rank] = True
            else:
                self.bound[rank] = t
            heapq.heappush(self.inbox, (t, MESSAGE, rank, next(self._seq), message))
        elif isinstance(message, Wait):
            self.blocked[rank] = True
            if (rank, message.op_id) in self.handles:
                self._register_wait(rank, t, message.op_id)
            else:  # its submission is still in the inbox
                self.early_waits[(rank, message.op_id)] = t
        elif isinstance(message, Probe):
            self.blocked[rank] = True
            heapq.heappush(self.inbox, (t, QUESTION, rank, next(self._seq), message))
        elif isinstance(message, Quorum):
            self.blocked[rank] = True
            self.outside.discard(rank)
            join_quorum(self, rank, message)
        else:
            raise SimulationError(f"unknown message {message!r} from rank {rank}")

    def note_clock(self, rank: int, t: float):
        self._computed(rank, t)
        self.bound[rank] = max(self.bound[rank], t)
        self.paused.pop(rank, None)
        self._earliest = None

    def _computed(self, rank: int, t: float):
        """A running rank's clock moves only by computing: it computed from its last
        reported time to t. No network event after that time has been processed yet (it was
        not safe), so the network can still slow its exchanges over that stretch."""
        if self.network.busy_rate is not None and self.running(rank):
            self.network.computing(rank, self.bound[rank], t)

    def running(self, rank: int) -> bool:
        """The rank may still send something that must be ordered: it neither waits for the
        simulator, nor has finished, nor is outside (a paused rank runs)."""
        return not (self.blocked[rank] or self.finished[rank] or rank in self.outside)

    def rank_done(self, rank: int):
        self.finished[rank] = True
        self.paused.pop(rank, None)
        self._earliest = None

    # -- processing --------------------------------------------------------------------------
    def advance(self) -> list:
        """Process every event that is safe to process; return the replies to send."""
        while True:
            net_t = self.network.next_time()
            if self.inbox and (self.inbox[0][0], self.inbox[0][1]) < (net_t, NETWORK):
                t, cls, rank, _, message = self.inbox[0]
                if not self._safe(t, cls, rank):
                    break
                heapq.heappop(self.inbox)
                if isinstance(message, Listen):
                    self._at(t, lambda _e, r=rank, m=message: self.mail.listen(r, m))
                elif isinstance(message, Post):
                    self._at(t, lambda _e, r=rank, m=message: self.mail.post(r, m))
                elif cls == MESSAGE:
                    self._at(t, lambda _e, r=rank, m=message: self._submit(r, m))
                else:
                    self._answer_probe(rank, message)
            elif net_t < math.inf and self._safe(net_t, NETWORK, -1):
                while self.env.peek() <= net_t:
                    self.env.step()
            else:
                break
        self.resume_if_held()
        replies, self.replies = self.replies, []
        return replies

    def resume_if_held(self, waiting_outside=()) -> bool:
        """Every running rank is paused (waits outside the simulator), or is one of
        `waiting_outside` (ranks that wait outside it for what the simulation holds back:
        the engine's stopping verdicts), and nothing more can be processed: the simulation
        waits for the paused ones, so the one with the lowest bound goes on (Resume, which
        the next advance() answers). It is the lowest, and one at a time, so that which
        ranks a resumed rank's wait still lacked depends on the simulation alone (every
        other rank waits for the simulator or is paused, and none of them moves before it
        does). Whether a rank was resumed."""
        if not self.paused or any(self.running(r) and r not in self.paused and
                                  r not in waiting_outside for r in range(self.topology.size)):
            return False
        rank = min(self.paused, key=lambda r: (self.bound[r], r))
        self.replies.append((rank, Resume(self.paused.pop(rank))))
        return True

    def _safe(self, t: float, cls: int, rank: int) -> bool:
        """No running rank can still send a message that sorts before (t, cls, rank)."""
        for bound, r in self._earliest_running():
            if r != rank:
                return (bound, MESSAGE, r) > (t, cls, rank)
        return True

    def _earliest_running(self):
        """The two running ranks with the lowest bounds, as (bound, rank); cached until a
        rank's bound or state changes."""
        if self._earliest is None:
            # (running(r), inlined: this list is remade after every input, over every rank)
            running = [(b, r) for r, b in enumerate(self.bound)
                       if not (self.blocked[r] or self.finished[r] or r in self.outside)]
            self._earliest = heapq.nsmallest(2, running)
        return self._earliest

    def _at(self, t: float, callback):
        """Run callback at simulated time t, before any network event at t."""
        event = self.env.call_at(max(t, self.env.now), callback, URGENT)
        while event.callbacks is not None:
            self.env.step()

    def _submit(self, rank: int, message: Op):
        t, op_id, key, kind = message.t, message.op_id, message.key, message.kind
        nbytes, participants, root = message.nbytes, message.participants, message.root
        op = self.operations.get(key)
        if op is None:
            plan = self.plans.of(kind, len(participants), root, participants, nbytes)
            op = Operation(key, kind, nbytes, participants, root, plan, (rank, kind, nbytes))
            self.operations[key] = op
        else:
            op.check_matches(rank, kind, nbytes, root)
        index = participants.index(rank)
        self.handles[(rank, op_id)] = (op, index)
        now = self.env.now
        if self.log is not None:
            self.log.append(("join", rank, op.order, kind, nbytes, now))
        op.joined_at[index] = now
        op.joined += 1
        op.latest_join = max(op.latest_join, now)
        if op.joined == len(participants):
            del self.operations[key]  # every participant is in: the key may be reused
        if self.ideal:
            if op.joined == len(participants):
                for i in range(len(participants)):
                    self._participant_done(op, i)
        else:
            for f in op.plan.compiled.gated[index]:
                self._release(op, f, None)
            for f in op.plan.compiled.noticed_at_join.get(index, ()):
                self._notice(op, f, None)
            if op.touching[index] == 0:
                self._participant_done(op, index)
        if message.blocking:
            self._register_wait(rank, t, op_id)
        elif (rank, op_id) in self.early_waits:
            self._register_wait(rank, self.early_waits.pop((rank, op_id)), op_id)

    def _release(self, op: Operation, f: int, before):
        """One of what flow f waits for is there (`before`: the leg whose arrival it was,
        None for a join); the last one starts it."""
        op.waiting[f] -= 1
        if op.waiting[f] == 0:
            plan = op.plan
            op.paths.started(f, self.env.now, before, self.network.start_flow(
                op.participants[plan.src[f]], op.participants[plan.dst[f]],
                plan.fraction[f] * op.nbytes, self._delivered, (op, f), (op.order, f, 1)))

    def _notice(self, op: Operation, f: int, before):
        """Flow f's receiver says it is ready: a message of no payload back to the sender,
        which releases f when it arrives (one latency of the path back)."""
        plan = op.plan
        op.paths.started(-1 - f, self.env.now, before, self.network.start_flow(
            op.participants[plan.dst[f]], op.participants[plan.src[f]], 0, self._noticed,
            (op, f), (op.order, f, 0)))

    def _noticed(self, arg):
        op, f = arg
        self._release(op, f, op.paths.arrived(-1 - f, self.env.now))

    def _delivered(self, arg):
        op, f = arg
        plan = op.plan
        leg = op.paths.arrived(f, self.env.now)
        for g in plan.compiled.successors[f]:
            self._release(op, g, leg)
        for g in plan.compiled.noticed_after.get(f, ()):
            self._notice(op, g, leg)
        for index in (plan.src[f], plan.dst[f]):
            op.touching[index] -= 1
            if op.touching[index] == 0:
                op.paths.end_leg[index] = leg
                self._participant_done(op, index)

    def _participant_done(self, op: Operation, index: int):
        op.done_at[index] = self.env.now
        if self.log is not None:
            self.log.append(("done", op.participants[index], op.order, self.env.now))
        op.last_join_when_done[index] = op.latest_join
        waiter = self.waiters.pop((op, index), None)
        if waiter is not None:
            self.reply_wait(*waiter)

    def _register_wait(self, rank, t, op_id):
        op, index = self.handles[(rank, op_id)]
        if op.done_at[index] is not None:
            self.reply_wait(rank, t, op_id)
        else:
            self.waiters[(op, index)] = (rank, t, op_id)

    def reply_wait(self, rank, t, op_id):
        """The rank waited from t; split the wait into idle (peers not yet there) and comm,
        and comm into its latency and the rest (bandwidth: critical_path.py). A waited
        operation is never asked about again: its handle is dropped."""
        self.mail.listeners.pop(rank, None)
        op, index = self.handles.pop((rank, op_id))
        end = max(t, op.done_at[index])
        idle = max(0.0, min(end, op.last_join_when_done[index]) - t)
        comm = end - t - idle
        latency = wait_latency(op.paths.end_leg[index], comm, t + idle)
        self.wake(rank, end, Waited(end, idle, comm, latency))

    def _answer_probe(self, rank, message: Probe):
        t, op_id = message.t, message.op_id
        op, index = self.handles[(rank, op_id)]
        done = op.done_at[index] is not None and op.done_at[index] <= t
        if done:
            del self.handles[(rank, op_id)]  # the rank's handle now knows; it will not ask again
        self.wake(rank, t, Probed(done))

    def wake(self, rank, t, reply):
        self._earliest = None
        self.outside.discard(rank)
        self.blocked[rank] = False
        self.bound[rank] = max(self.bound[rank], t)
        self.replies.append((rank, reply))

    # -- diagnosis ---------------------------------------------------------------------------
    def stuck(self) -> str | None:
        """If every rank waits and nothing can happen any more, say who waits for what."""
        return why_stuck(self)
