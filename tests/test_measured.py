"""--net real: each rank's waits for exchanges split into waiting for its peers and the
transfer itself (exoframe/sim/measured.py), from the times every rank noted."""
import pytest

from exoframe.sim.clock import operation_key
from exoframe.sim.measured import split_measured


def exchange(key, arrived, waiting, ended):
    return ["x", key, arrived, waiting, ended]


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
