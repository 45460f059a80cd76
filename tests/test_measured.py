"""--net real: each rank's waits for exchanges split into waiting for its peers and the
transfer itself (exoframe/sim/measured.py), from the times every rank noted."""
import pytest

from exoframe.sim.clock import operation_key
from exoframe.sim.measured import split_measured


def exchange(key, arrived, waiting, ended):
    return ["x", key, arrived, waiting, ended]


def test_a_wait_splits_at_the_last_arrival_and_compute_is_the_rest_of_the_wall_clock():
    first, second = ["c", [0, 1], 0], ["c", [0, 1], 1]
    ranks = [
        {"simulated_seconds": 20.0, "compute_seconds": 5.0, "trace": [
            exchange(first, 10.0, 10.0, 15.0),    # blocking; rank 1 comes at 12
            ["s", 1],
            exchange(second, 20.0, 25.0, 27.0)]},  # async: waited for from 25
        {"simulated_seconds": 21.0, "compute_seconds": 6.0, "trace": [
            exchange(first, 12.0, 12.0, 15.0),
            ["s", 1],
            exchange(second, 22.0, 22.0, 27.0)]},  # arrives last: no wait
    ]
    split_measured(ranks)
    zero, one = ranks
    # rank 0: waits 10 -> 12 for rank 1, then 12 -> 15 of transfer; from 25 (both long
    # there) 2 more of transfer.
    assert zero["wait_seconds"] == pytest.approx(2.0)
    assert zero["transfer_seconds"] == pytest.approx(3.0 + 2.0)
    assert one["wait_seconds"] == 0.0
    assert one["transfer_seconds"] == pytest.approx(3.0 + 5.0)
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
