"""A rank's clock on a real network (`--net real`), and the split of its measured time.

Each rank records, per exchange, when it arrived (started the operation), when it began to
wait for it, and when the exchange ended, on the machines' wall clocks (time.time(): one
clock on one machine; across hosts, clocks kept in step by NTP or PTP). Once every rank
is done, `split_measured` matches the exchanges by key across ranks and splits each
rank's wait for one into:

- wait: from the rank's start of waiting to the last participant's arrival (its peers
  were not there yet; idle in the simulated clock's terms);
- transfer: from then (or from the rank's own start of waiting, if later) to the end.

Compute is then the rank's wall-clock time outside those waits. A rank descheduled on a
busy machine, or slowed by another process, takes longer to compute in wall time than in
CPU time: that time counts as compute (and its peers' wait), never as transfer. The CPU
time is kept as `compute_cpu_seconds`.

The engine's bookkeeping between steps (records, evaluation snapshots, checkpoints) is left
out of a rank's time, as the simulated clock leaves it out, except while an exchange the
rank started without waiting (an overlapped one, e.g. streaming DiLoCo's) is in flight:
the network moves its bytes meanwhile, so leaving that time out would make the transfer
look faster than the link. That time counts as transfer (an exchange's `hidden` seconds).
A thread per overlapped exchange notes when it really ends.
"""
from __future__ import annotations

import threading
import time

from ..network.collectives import Plans
from ..network.topology import Topology
from .clock import Submitted, operation_key


POLL_SECONDS = 0.001  # how often an overlapped exchange is asked whether it has ended


class RealClock:
    """`now` is the wall-clock time the rank has trained (the engine's bookkeeping between
    `charge()` and `skip()` left out, as the simulated clock leaves it out). Bytes are
    counted per operation as the network's algorithm would move them. Operations complete
    for real: is_done() asks the exchange itself."""

    def __init__(self, rank: int, timer, topology_algorithms: dict, algorithms: dict,
                 topology: Topology | None = None, wall=time.perf_counter, stamp=time.time):
        """timer: the rank's compute time (CPU, or a GPU timer); wall: its wall clock;
        stamp: the trace's clock, shared by every rank."""
        self.rank = rank
        self.plans = Plans(topology_algorithms, algorithms, topology)
        self._wall, self._stamp = wall, stamp
        self._timer = timer
        self._started = self._charged_at = self._wall()
        self._charged_stamp = self._stamp()
        self._mark = timer()
        self._left_out = 0.0  # bookkeeping wall time, not the run's
        self.compute_seconds = 0.0  # CPU (or GPU timer) time between exchanges
        self.down = False
        # Step ends, and per exchange ["x", key, arrived, waiting from, ended, hidden]
        # (time.time(); hidden: bookkeeping seconds counted while it was in flight).
        self.trace: list = []
        self._next_id = 0
        self._sequence: dict = {}
        self._open: dict[int, list] = {}  # op_id -> its trace entry, until waited
        self._flights: dict[int, list] = {}  # overlapped op_id -> [started, really ended]

    @property
    def now(self) -> float:
        return self._wall() - self._started - self._left_out

    def stats(self) -> dict:
        """compute: CPU time so far; comm: the rest. split_measured() corrects both once
        every rank's exchanges are known."""
        now = self.now
        compute = min(now, self.compute_seconds)
        return {"simulated_seconds": now, "compute_seconds": compute,
                "comm_seconds": now - compute, "idle_seconds": 0.0, "down_seconds": 0.0}

    def start_step(self):
        pass

    def charge(self):
        """Count the compute since the last mark."""
        now = self._timer()
        self.compute_seconds += now - self._mark
        self._mark, self._charged_at, self._charged_stamp = now, self._wall(), self._stamp()

    def skip(self):
        """Leave out what was done since the last charge (bookkeeping), except the time an
        overlapped exchange was in flight (see the module's docstring)."""
        hidden = self._in_flight_between(self._charged_stamp, self._stamp())
        self._left_out += max(0.0, self._wall() - self._charged_at - hidden)
        if hidden:
            self._open[min(self._flights)][5] += hidden
        self._mark, self._charged_at, self._charged_stamp = (self._timer(), self._wall(),
                                                             self._stamp())

    def _in_flight_between(self, start: float, end: float) -> float:
        """Seconds of [start, end] during which an overlapped exchange was in flight."""
        if not self._flights:
            return 0.0
        spans = sorted((max(start, began), min(end, ended if ended is not None else end))
                       for began, ended in self._flights.values())
        covered, reach = 0.0, start
        for began, ended in spans:
            began = max(began, reach)
            if ended > began:
                covered, reach = covered + ended - began, ended
        return covered

    def add_compute(self, seconds: float):
        pass

    def end_step(self, step: int):
        self.trace.append(["s", step])

    def submit(self, kind: str, nbytes: int, participants: tuple, root: int = 0,
               blocking: bool = True, work=None) -> Submitted:
        self.charge()
        op_id, self._next_id = self._next_id, self._next_id + 1
        arrived = self._stamp()
        entry = ["x", list(operation_key(self._sequence, kind, tuple(participants))),
                 arrived, arrived if blocking else None, None, 0.0]
        self._open[op_id] = entry
        self.trace.append(entry)
        if not blocking and work is not None:
            self._flights[op_id] = flight = [arrived, None]
            threading.Thread(target=self._note_end, args=(flight, work), daemon=True).start()
        return Submitted(op_id, *self.plans.bytes_moved(kind, participants, root, self.rank,
                                                        nbytes))

    def _note_end(self, flight: list, work):
        """Polls rather than waits: a NCCL work's wait() would make this thread's CUDA
        stream, the rank's default one, wait for the exchange. A failed exchange counts as
        ended; it raises where the rank waits for it."""
        try:
            while not work.is_completed():
                time.sleep(POLL_SECONDS)
        except Exception:
            pass
        flight[1] = self._stamp()

    def wait(self, op_id: int):
        entry = self._open.get(op_id)
        if entry is not None and entry[3] is None:
            entry[3] = self._stamp()

    def waited(self, op_id: int | None = None):
        """A real exchange was waited for: that time is not compute (a GPU timer counts it)."""
        self._mark = self._timer()
        self._flights.pop(op_id, None)
        entry = self._open.pop(op_id, None)
        if entry is not None:
            ended = self._stamp()
            entry[3] = ended if entry[3] is None else entry[3]  # done when first asked
            entry[4] = ended

    def is_done(self, op_id: int, work=None) -> bool:
        """Whether the real exchange has completed (gloo's point-to-point handles say so
        only once waited for: timing-dependent strategies are refused with --net real)."""
        return work is None or work.is_completed()


def split_measured(results: list[dict]) -> None:
    """results[r]: rank r's final stats with its trace (as RankDone carries them); adds
    transfer_seconds, wait_seconds and compute_cpu_seconds to each, and makes comm the
    transfer, idle the wait and compute the rest of its wall-clock time (see above)."""
    last_arrival: dict = {}
    for result in results:
        for entry in result["trace"]:
            if entry[0] == "x":
                key = _key(entry[1])
                last_arrival[key] = max(last_arrival.get(key, entry[2]), entry[2])
    for result in results:
        transfer = wait = 0.0
        for entry in result["trace"]:
            if entry[0] != "x" or entry[4] is None:
                continue
            _, key, _, waiting, ended, hidden = entry
            last = last_arrival[_key(key)]
            wait += max(0.0, min(ended, last) - waiting)
            transfer += max(0.0, ended - max(waiting, last)) + hidden
        wall = result["simulated_seconds"]
        result["compute_cpu_seconds"] = result["compute_seconds"]
        result.update(transfer_seconds=transfer, wait_seconds=wait, comm_seconds=transfer,
                      idle_seconds=wait, compute_seconds=max(0.0, wall - transfer - wait))


def _key(key) -> tuple:
    """A trace's key (lists, once sent) as a hashable tuple."""
    return tuple(_key(part) if isinstance(part, (list, tuple)) else part for part in key)
