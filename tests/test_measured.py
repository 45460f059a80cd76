"""--net real: each rank's waits for exchanges split into waiting for its peers and the
transfer itself (exoframe/sim/clocks/measured.py), from the times every rank noted."""
import threading
import time

import pytest

from exoframe.sim.clocks.clock import operation_key
from exoframe.sim.clocks.measured import RealClock, split_measured
from exoframe.sim.network.collectives import BUILTIN


def exchange(key, arrived, waiting, ended, hidden=0.0):
    return ["x", key, arrived, waiting, ended, hidden]


def test_a_wait_splits_at_the_last_arrival_and_compute_is_the_rest_of_the_wall_clock():
    """Accounting over noted timestamps (made up here, no clock is read): the wait runs to
    the last rank's arrival, the transfer from there to the exchange's end."""
    first, second = ["c", [0, 1], 0], ["c", [0, 1], 1]
    # the first exchange, blocking: rank 0 arrives at 10, rank 1 at 12, it ends at 15
    first_arrivals, first_end = (10.0, 12.0), 15.0
    # the second, async: rank 0 starts it at 20 and waits for it from 25, rank 1 arrives
    # at 22 and waits at once, it ends at 27
    second_arrivals, rank0_waits_from, second_end = (20.0, 22.0), 25.0, 27.0
    ranks = [
        {"simulated_seconds": 20.0, "compute_seconds": 5.0, "trace": [
            exchange(first, first_arrivals[0], first_arrivals[0], first_end),
            ["s", 1],
            exchange(second, second_arrivals[0], rank0_waits_from, second_end)]},
        {"simulated_seconds": 21.0, "compute_seconds": 6.0, "trace": [
            exchange(first, first_arrivals[1], first_arrivals[1], first_end),
            ["s", 1],
            exchange(second, second_arrivals[1], second_arrivals[1], second_end)]},
    ]
    split_measured(ranks)
    zero, one = ranks
    last_first = max(first_arrivals)
    assert zero["wait_seconds"] == pytest.approx(last_first - first_arrivals[0])
    # from 25 both are long there: all of it is transfer
    assert zero["transfer_seconds"] == pytest.approx((first_end - last_first) +
                                                     (second_end - rank0_waits_from))
    assert one["wait_seconds"] == 0.0  # it arrives last both times
    assert one["transfer_seconds"] == pytest.approx((first_end - last_first) +
                                                    (second_end - second_arrivals[1]))
    for rank, cpu in zip(ranks, (5.0, 6.0)):
        assert rank["comm_seconds"] == rank["transfer_seconds"]
        assert rank["idle_seconds"] == rank["wait_seconds"]
        assert rank["compute_cpu_seconds"] == cpu
        assert rank["compute_seconds"] + rank["transfer_seconds"] + rank["wait_seconds"] == \
            pytest.approx(rank["simulated_seconds"])


def test_exchanges_are_matched_by_group_and_order_as_every_rank_names_them():
    sequence = {}
    keys = [operation_key(sequence, kind, participants) for kind, participants in
            [("all_reduce", (0, 1)), ("send", (0, 1)), ("all_reduce", (0, 1)),
             ("recv", (0, 1))]]
    assert keys == [("c", (0, 1), 0), ("p", 0, 1, 0), ("c", (0, 1), 1), ("p", 0, 1, 1)]


class Exchange:
    """A real exchange in flight until the test ends it."""

    def __init__(self):
        self.over = threading.Event()

    def wait(self):
        self.over.wait()

    def is_completed(self):
        return self.over.is_set()


def test_bookkeeping_while_an_overlapped_exchange_is_in_flight_counts_as_transfer():
    """The engine's bookkeeping between steps is left out of a rank's time, except while an
    exchange it started without waiting is in flight: the network moves its bytes meanwhile.
    The clocks are the test's (made-up seconds); the exchange's end is noted by RealClock's
    own thread."""
    t, cpu = [0.0], [0.0]
    clock = RealClock(0, lambda: cpu[0], {"all_reduce": "ring"}, BUILTIN,
                      wall=lambda: t[0], stamp=lambda: t[0])
    exchange = Exchange()
    t[0] = cpu[0] = 1.0
    op = clock.submit("all_reduce", 1000, (0, 1), blocking=False, work=exchange).op_id
    t[0] = cpu[0] = 3.0
    clock.charge()  # 2 s of compute beside the exchange
    t[0] = 5.0
    clock.skip()  # 2 s of bookkeeping, the exchange in flight all along: counted
    t[0], cpu[0] = 6.0, 4.0
    clock.charge()  # 1 s more compute
    t[0] = 6.5
    exchange.over.set()  # the exchange ends halfway into the next bookkeeping
    for _ in range(1000):
        if clock._flights[op][1] is not None:  # noted by its thread
            break
        time.sleep(0.01)
    t[0] = 8.0
    clock.skip()  # 0.5 s of it counted, 1.5 s left out
    assert clock.now == pytest.approx(8.0 - 1.5)
    t[0], cpu[0] = 9.0, 5.0
    clock.wait(op)  # after 1 s more compute
    clock.waited(op)  # asked at 9: done long ago, so no time is waited
    stats = {**clock.stats(), "trace": clock.trace}
    split_measured([stats])
    assert stats["simulated_seconds"] == pytest.approx(9.0 - 1.5)
    assert stats["transfer_seconds"] == pytest.approx(2.0 + 0.5)
    assert stats["wait_seconds"] == 0.0
    assert stats["compute_seconds"] == pytest.approx(cpu[0])  # 1 + 2 + 1 + 1 s of compute


def test_a_failed_overlapped_exchange_is_noted_as_ended_without_a_thread_traceback(monkeypatch):
    """The error is the rank's to raise where it waits; the noting thread stays quiet."""
    class Failed:
        def is_completed(self):
            raise RuntimeError("peer gone")

    uncaught = []
    monkeypatch.setattr(threading, "excepthook", uncaught.append)
    clock = RealClock(0, time.thread_time, {"all_reduce": "ring"}, BUILTIN)
    op = clock.submit("all_reduce", 1000, (0, 1), blocking=False, work=Failed()).op_id
    for _ in range(1000):
        if clock._flights[op][1] is not None:
            break
        time.sleep(0.01)
    assert clock._flights[op][1] is not None and uncaught == []
