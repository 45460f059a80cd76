"""gloo's ring all-reduce as the simulator plans it (sim/network/gloo.py), and TCP
connections as byte streams (sim/network/flows.py), against closed forms derived by hand
from gloo's protocol: receiver-driven sends, two segments in flight, notices in order."""
import math

import pytest
from test_maxmin import deliveries
from test_sim import Op, Simulator

from exoframe.sim import Topology
from exoframe.sim.network.collectives import BUILTIN
from exoframe.sim.network.gloo import GLOO_SEGMENT, gloo_segments_per_rank
from exoframe.sim.network.tcp import TcpModel

B = 1.25e7  # 100 Mbit/s in bytes/s


def all_reduce(topology, nbytes, algorithm, rounds=1):
    """The time rank 0 is done with `rounds` all-reduces, each rank starting the next as
    soon as it is done with the last."""
    n = topology.size
    topology.algorithms = {**topology.algorithms, "all_reduce": algorithm}
    sim, parts, at = Simulator(topology, BUILTIN), tuple(range(n)), [0.0] * n
    for k in range(rounds):
        for r in range(n):
            sim.receive(r, Op(at[r], k, ("c", parts, k), "all_reduce", nbytes, parts, 0, True))
        done = 0
        while done < n:
            for rank, reply in sim.advance():
                at[rank], done = reply.end, done + 1
    return at[0]


@pytest.mark.parametrize("n", [2, 3, 4, 8])
@pytest.mark.parametrize("alpha", [0.0, 1e-4, 0.025])
def test_lockstep_segments_pay_a_notice_and_the_payload_at_every_step(n, alpha):
    """Without a protocol (flows share a link max-min), the two segments in flight move
    together: 2(n-1) steps of a notice (alpha) and a payload of S/n (alpha + S/(nB))."""
    S = 2 * n * GLOO_SEGMENT / 4  # two segments per rank
    assert gloo_segments_per_rank(n, S) == 2
    expected = 2 * (n - 1) * (2 * alpha + S / (n * B))
    assert math.isclose(all_reduce(Topology.uniform(n, B, alpha), S, "gloo"), expected,
                        rel_tol=1e-9)


def test_between_two_ranks_a_notice_waits_behind_its_senders_payload():
    """Two ranks, TCP at a 50 ms round trip, 4 segments of s: the notices for steps 2 and 3
    leave behind rank's own segments, so each step pays its latency: by hand, the last
    segment is delivered at 4a + 3s f / B (f: frames and ACKs per payload byte)."""
    a, s = 0.025, 100e3
    top = Topology.uniform(2, B, a)
    top.protocol = TcpModel(window=math.inf, initial_window=10 ** 9)  # (no slow start)
    # both ways carry data and the other way's ACKs: bytes on a link per payload byte
    f = top.protocol.data_factor + top.protocol.ack_factor
    # step 0, 1 start at a (the notices at join), back to back on the connection: s at a +
    # s f / B, delivered a later; the notice for step 2 waits for step 1's bytes
    # (a + 2 s f / B), arrives a later; step 3's is behind step 2 on the same connection.
    step2 = max(2 * a + s * f / B + a, a + 2 * s * f / B + a)
    expected = step2 + 2 * s * f / B + a
    assert math.isclose(all_reduce(top, 4 * s, "gloo"), expected, rel_tol=1e-9)


def test_at_zero_latency_gloo_takes_the_rings_time_under_tcp():
    """Today's clock on a zero-latency network: a connection's segments go one after the
    other, so gloo moves the ring's bytes in the ring's time."""
    for n in (2, 4, 5):
        times = []
        for algorithm in ("ring", "gloo"):
            top = Topology.uniform(n, B, 0.0)
            top.protocol = TcpModel()
            times.append(all_reduce(top, 20e6, algorithm, rounds=2))
        assert math.isclose(*times, rel_tol=1e-9), (n, times)


def test_a_connection_sends_its_messages_in_order_not_side_by_side():
    """Two messages from rank 0 to rank 1 at once: under TCP one byte stream, the first is
    through after its own bytes; without a protocol both share the link and end together."""
    top = Topology.uniform(3, B, 0.01)
    top.protocol = TcpModel(window=math.inf, initial_window=10 ** 9)  # (no slow start)
    f = top.protocol.data_factor
    first, second, other = deliveries(top, [(0, 0, 1, 1e6), (0, 0, 1, 1e6), (0, 0, 2, 1e6)])
    # rank 0's uplink: the stream to 1 and the one to 2 share it (two connections)
    eff = top.protocol.shared_efficiency
    assert math.isclose(first, 0.01 + 2e6 * f / (B * eff), rel_tol=1e-9)
    assert math.isclose(other, first, rel_tol=1e-9)
    assert math.isclose(second, first + 1e6 * f / B, rel_tol=1e-9)  # then alone on it
    plain = Topology.uniform(3, B, 0.01)
    a, b, c = deliveries(plain, [(0, 0, 1, 1e6), (0, 0, 1, 1e6), (0, 0, 2, 1e6)])
    assert math.isclose(a, b) and math.isclose(a, 0.01 + 3e6 / B)
