"""Replay a run's communication trace through another network, without training again.

A trace is, per rank, what its clock saw: compute segments, operations (kind, bytes,
participants, algorithm by kind), waits and step ends. When a strategy's behaviour does not
depend on timing, the same operations happen on any network, so feeding the trace to a
simulator of another network gives exactly the clocks a full re-run would (same compute
model, same seed). A trace that contains questions ("is it done yet?") came from a
timing-dependent strategy: replay checks every answer and refuses if one would change.

A replay runs the live ranks' own code: each rank's events drive a RankClock (TraceClock:
compute read from the trace), which talks to the simulator over an in-process connection
as a live rank's talks over its pipe, and the simulator runs behind the same Feed as in a
live run's launcher. Each replayed rank is a thread, as its clock blocks while it waits.

Projection (sim/traces/projection.py) rescales a trace to a larger model before it is replayed;
its backward passes run beside the communication stream (["b", seconds] queues compute
without moving the clock, ["r"] waits for the oldest queued compute): waiting while queued
compute still runs is hidden behind it, and only the part past the compute counts as
communication or idle time.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass

from ..clocks.clock import RankClock
from ..clocks.feed import Feed
from ..clocks.protocol import Done, StepEnd, Waited, frozen
from ..clocks.simulator import Simulator
from ..clocks.transport import Arrivals, in_process
from ..network.topology import DEFAULT_ALGORITHMS, Topology

MAX_TRACE_NODES = 1024  # exoframe.config.MAX_NODES: no run records more ranks than this
KINDS = (*DEFAULT_ALGORITHMS, "send", "recv")


class ReplayError(Exception):
    pass


class NotReplayable(ReplayError):
    """A well-formed trace that no other network can replay: its exchanges depend on its
    own timing, or nothing was simulated."""


def check_trace(trace) -> None:
    """Check what a replay reads of a loaded trace.json, against the trace's own content (a
    header claiming 1e9 nodes over two recorded ranks would plan a topology of 1e9 NICs);
    raises ReplayError naming the first bad field."""
    if not isinstance(trace, dict):
        raise ReplayError("expected a JSON object")
    if trace.get("real_network"):
        raise NotReplayable("the run was on the real network (--net real): its trace holds no "
                          "simulated exchanges to replay; re-run it with --net instead")
    if trace.get("faults", "none") != "none":
        raise NotReplayable(f"the run had simulated failures ({trace['faults']}): which nodes "
                          "take part in each exchange depends on its timing, so its trace "
                          "cannot be replayed through another network; run it on that network")
    types = {"strategy": (str, "a string"), "timing_dependent": (bool, "true or false"),
             "bucketed_gradients": (bool, "true or false"), "nodes": (int, "an integer"),
             "steps": (int, "an integer"), "seed": (int, "an integer"),
             "model_parameters": ((int, float), "a number"), "ranks": (list, "a list")}
    for key, (kind, noun) in types.items():
        value = trace.get(key)
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise ReplayError(f"field '{key}' is missing or not {noun}")
    rate = trace.get("overlap_rate")  # absent in traces made before the compute model had it
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float))
                             or not 0 < rate < math.inf):
        raise ReplayError("field 'overlap_rate' is not null or a positive number of bytes/s")
    ranks, nodes = trace["ranks"], trace["nodes"]
    if not 1 <= nodes <= MAX_TRACE_NODES or nodes != len(ranks):
        raise ReplayError(f"'nodes' is {nodes} but the trace holds {len(ranks)} ranks' events "
                          f"(at most {MAX_TRACE_NODES})")
    if not (math.isfinite(trace["model_parameters"]) and trace["model_parameters"] > 0):
        raise ReplayError("'model_parameters' must be a positive number")
    recorded = 0
    for r, events in enumerate(ranks):
        if not isinstance(events, list):
            raise ReplayError(f"ranks[{r}] is not a list of events")
        for i, event in enumerate(events):
            if isinstance(event, list) and event and event[0] in ("p", "l"):
                raise NotReplayable("the run made remote calls (exoframe.distributed): when a "
                                  "rank serves each one depends on its timing, so its trace "
                                  "cannot be replayed through another network; run it on "
                                  "that network")
            if not _valid_event(event, nodes):
                raise ReplayError(f"ranks[{r}][{i}] is not a valid event: {str(event)[:100]}")
        recorded = max(recorded, sum(1 for e in events if e[0] == "s"))
    if not 0 <= trace["steps"] <= recorded:
        raise ReplayError(f"'steps' is {trace['steps']} but the ranks recorded {recorded} steps")


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def _valid_event(event, nodes: int) -> bool:
    if not isinstance(event, list) or not event or not isinstance(event[0], str):
        return False
    tag, size = event[0], len(event)
    if tag in ("c", "b"):
        return size == 2 and _number(event[1])
    if tag == "r":
        return size == 1
    if tag == "s":
        return size == 2 and isinstance(event[1], int)
    if tag == "w":
        return size == 2
    if tag == "t":  # [t, op, whether it was done in the recorded run]
        return size == 3 and isinstance(event[2], bool)
    if tag == "o":
        if size != 8:
            return False
        _, _, _, kind, nbytes, participants, root, blocking = event
        return (kind in KINDS and _number(nbytes) and isinstance(blocking, bool)
                and isinstance(participants, list) and len(participants) >= 1
                and all(isinstance(p, int) and not isinstance(p, bool) and 0 <= p < nodes
                        for p in participants)
                and len(set(participants)) == len(participants)
                and (root is None or isinstance(root, int) and 0 <= root < nodes))
    return False


class NoCompute:
    """A replayed rank's compute model: its compute comes from the trace, not measured."""
    factor = 1.0

    def start_step(self) -> float:
        return 0.0

    def elapsed(self) -> float:
        return 0.0

    def restart(self):
        pass


class NoTrace(list):
    """A trace that keeps nothing."""

    def append(self, event):
        pass


class TraceClock(RankClock):
    """The clock of a replayed rank: a live rank's clock (the same conversation with the
    simulator), whose compute comes from the trace, plus the compute stream of projected
    backward passes (see the module's docstring)."""

    def __init__(self, rank: int, port, topology: Topology, algorithms: dict):
        super().__init__(rank, port, NoCompute(), topology.algorithms, algorithms, topology)
        self.trace = NoTrace()  # the trace is what is replayed: no second copy
        self.compute_free = 0.0  # when the compute stream has done what was queued on it
        self.ready: list[float] = []  # end of each queued compute not yet waited for
        self.step_times: dict = {}
        self.segments: list[tuple[float, float]] = []  # (start, end) of each compute

    def run_compute(self, seconds: float):
        start = max(self.now, self.compute_free)
        self.now = self.compute_free = start + seconds
        self.segments.append((start, self.now))
        self.compute_seconds += seconds

    def queue_compute(self, seconds: float):
        start = max(self.now, self.compute_free)
        self.compute_free = start + seconds
        self.segments.append((start, self.compute_free))
        self.compute_seconds += seconds
        self.ready.append(self.compute_free)

    def await_queued(self):
        self.now = max(self.now, self.ready.pop(0))

    def _waited(self, reply: Waited):
        """A wait while queued compute still runs is hidden behind it up to its end (what
        is left of its communication keeps its share of latency)."""
        if self.compute_free > self.now:
            hidden_until = min(reply.end, self.compute_free)
            idle = max(0.0, self.now + reply.idle - hidden_until)
            comm = reply.end - hidden_until - idle
            share = reply.latency / reply.comm if reply.comm > 0 else 0.0
            reply = Waited(reply.end, idle, comm, comm * share)
        super()._waited(reply)

    def end_step(self, step: int):
        self.step_times[step] = self.now
        self.port.send(StepEnd(self.now, step))

    def _receive(self):
        reply = super()._receive()
        if reply is STOP:
            raise StopReplay
        return reply

    def stats(self) -> dict:
        stats = super().stats()
        del stats["down_seconds"]  # replays refuse traces with failures
        return stats


@dataclass
class ReplayResult:
    ranks: list[TraceClock]

    @property
    def simulated_seconds(self) -> float:
        return max(r.now for r in self.ranks)

    @property
    def compute_utilization(self) -> float | None:
        total = len(self.ranks) * self.simulated_seconds
        return sum(r.compute_seconds for r in self.ranks) / total if total > 0 else None

    def step_times(self) -> list[float]:
        """Per step, the time its last rank ended it."""
        steps = sorted(self.ranks[0].step_times)
        return [max(r.step_times[s] for r in self.ranks) for s in steps]


@dataclass(frozen=True)
class PlayFailed:
    """A replayed rank stopped on an error (raised again by the driver)."""
    error: BaseException


STOP = None  # sent to a replayed rank still waiting when the replay ends on an error


class StopReplay(Exception):
    pass


def replay(traces: list[list], topology: Topology, algorithms: dict, seed: int = 0,
           overlap_rate: float | None = None, log: list | None = None) -> ReplayResult:
    """traces[r]: rank r's events as recorded by RankClock.trace (JSON-loaded is fine);
    overlap_rate: the recorded compute model's `overlap=` (bytes/s), or None; log: the
    simulator's log (Simulator), and each clock keeps its compute as `segments`.

    Each rank's events drive its own clock in a thread, which talks to the simulator over
    an in-process connection, as a live rank over its pipe; this thread runs the simulator
    through a Feed, as a live run's launcher does (engine/launch/monitor.py)."""
    sim = Simulator(topology, algorithms, seed=seed, overlap_rate=overlap_rate, log=log)
    feed = Feed(sim, record=False)
    arrivals = Arrivals()
    pairs = [in_process(arrivals, tag=r) for r in range(len(traces))]
    clocks = [TraceClock(r, rank_end, topology, algorithms)
              for r, (_, rank_end) in enumerate(pairs)]
    ends, threads = [sim_end for sim_end, _ in pairs], []
    try:
        for events, clock in zip(traces, clocks):
            threads.append(threading.Thread(target=_play, args=(events, clock), daemon=True,
                                            name=f"replay-rank-{clock.rank}"))
            threads[-1].start()
        _drive(feed, ends, arrivals)
    finally:
        for end, thread in zip(ends, threads):  # a rank still waiting stops
            end.send(STOP)
            thread.join()
    return ReplayResult(clocks)


def all_reduce_alone(topology: Topology, algorithms: dict, nodes: int, seed: int = 0):
    """seconds(nbytes, participants): how long one blocking all-reduce of nbytes among
    `participants` takes alone on this network (replayed through it)."""
    def seconds(nbytes: float, participants: tuple) -> float:
        op = ["o", 0, ["c", list(participants), 0], "all_reduce", nbytes, list(participants),
              0, True]
        traces = [[op, ["s", 1]] if r in participants else [["s", 1]] for r in range(nodes)]
        return replay(traces, topology, algorithms, seed).simulated_seconds
    return seconds


def _drive(feed: Feed, ends: list, arrivals: Arrivals):
    """Hand every rank's messages to the simulator and its answers back, until all are done."""
    sim, done = feed.sim, 0
    while done < len(ends):
        for rank in arrivals.wait():  # one tag per message, in the order they were sent
            message = ends[rank].recv()
            if isinstance(message, Done):
                feed.rank_done(rank)
                done += 1
            elif isinstance(message, PlayFailed):
                raise message.error
            else:
                feed.message(rank, message)
        replies = feed.advance()
        for rank, reply in replies:
            ends[rank].send(reply)
        if not replies and done < len(ends):
            waiting = [r for r in range(len(ends)) if sim.blocked[r] and not sim.finished[r]]
            stuck = sim.stuck()
            if stuck or (not sim.inbox and not sim.network.busy() and
                         len(waiting) + done == len(ends)):
                raise ReplayError(stuck or f"ranks {waiting} never got their answers")


def _play(events: list, clock: TraceClock):
    """Rank `clock.rank`'s recorded events, through its clock."""
    port, ids = clock.port, {}  # recorded op id -> this replay's

    def replayed_id(recorded):
        op_id = ids.get(frozen(recorded))
        if op_id is None:
            raise ReplayError(f"rank {clock.rank} waits for operation {recorded!r}, which it "
                              "did not start (or waited for already)")
        return op_id

    try:
        for event in events:
            tag = event[0]
            if tag == "c":
                clock.run_compute(event[1])
            elif tag == "b":
                clock.queue_compute(event[1])
            elif tag == "r":
                clock.await_queued()
            elif tag == "o":
                _, op_id, _, kind, nbytes, participants, root, blocking = event
                submitted = clock.submit(kind, nbytes, tuple(participants), root, blocking)
                if not blocking:
                    ids[frozen(op_id)] = submitted.op_id
            elif tag == "w":
                clock.wait(replayed_id(event[1]))
                del ids[frozen(event[1])]
            elif tag == "t":
                if clock.is_done(replayed_id(event[1])) != event[2]:
                    raise ReplayError(
                        f"rank {clock.rank}: an operation that was "
                        f"{'done' if event[2] else 'not done'} at this point of the recorded "
                        f"run is {'not done' if event[2] else 'done'} on this network: the "
                        "strategy's behaviour depends on timing; re-run it instead.")
            elif tag == "s":
                clock.end_step(event[1])
        port.send(Done())
    except StopReplay:
        pass
    except BaseException as e:
        port.send(PlayFailed(e))
