"""The network simulator alone, fed rank messages directly, checked against closed forms."""
import dataclasses
import itertools
import math
import random

import pytest

from exoframe.sim import LinkSpec, SimulationError, Simulator, Topology
from exoframe.sim.clocks.protocol import Op, Probe, Probed, Wait, Waited
from exoframe.sim.network.collectives import BUILTIN

B = 1.25e8  # 1 Gbit/s in bytes/s
ALPHA = 0.01
S = 4e6


def close(a, b, rel=1e-9):
    return math.isclose(a, b, rel_tol=rel)


def collective(kind, n, t=0.0, seq=0, root=0, blocking=True, starts=None, op_id=None):
    parts = tuple(range(n))
    return [(r, Op((starts or {}).get(r, t), seq if op_id is None else op_id,
                   ("c", parts, seq), kind, S, parts, root, blocking)) for r in range(n)]


def run(topology, messages, algorithm=None):
    if algorithm:
        topology.algorithms = {k: algorithm for k in topology.algorithms}
    """Feed the messages; a rank that gets its reply has nothing more to say."""
    sim = Simulator(topology, BUILTIN)
    for rank in set(range(topology.size)) - {rank for rank, _ in messages}:
        sim.rank_done(rank)
    for rank, message in messages:
        sim.receive(rank, message)
    replies = {}
    while batch := sim.advance():
        for rank, reply in batch:
            replies[rank] = reply
            sim.rank_done(rank)
    return replies, sim


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_ring_collectives_match_closed_forms(n):
    step = ALPHA + S / (n * B)
    for kind, expected in [("all_reduce", 2 * (n - 1) * step), ("all_gather", (n - 1) * step),
                           ("reduce_scatter", (n - 1) * step)]:
        replies, _ = run(Topology.uniform(n, B, ALPHA), collective(kind, n))
        assert sorted(replies) == list(range(n))
        for reply in replies.values():
            assert isinstance(reply, Waited) and close(reply.end, expected)
            assert reply.idle == 0 and close(reply.comm, reply.end)


@pytest.mark.parametrize("n", [3, 5, 8])
def test_other_algorithms_match_closed_forms(n):
    rounds = math.ceil(math.log2(n))
    cases = [
        ("tree", "broadcast", rounds * (ALPHA + S / B)),  # root's uplink carries one at a time
        ("ring", "broadcast", (n - 1) * (ALPHA + S / B)),  # a chain
        ("ps", "all_reduce", 2 * (ALPHA + (n - 1) * S / B)),  # server's links carry n-1 flows
        ("direct", "all_gather", ALPHA + (n - 1) * S / (n * B)),
        ("direct", "all_reduce", 2 * (ALPHA + (n - 1) * S / (n * B))),
    ]
    for algorithm, kind, expected in cases:
        replies, _ = run(Topology.uniform(n, B, ALPHA), collective(kind, n), algorithm)
        assert close(max(r.end for r in replies.values()), expected), (algorithm, kind)


def send_recv(src, dst, size, t=0.0, seq=0, op_ids=(0, 0), blocking=True):
    key = ("p", src, dst, seq)
    return [(src, Op(t, op_ids[0], key, "send", size, (src, dst), 0, blocking)),
            (dst, Op(t, op_ids[1], key, "recv", size, (src, dst), 0, blocking))]


def test_equal_concurrent_flows_share_a_link_and_a_slower_site_link_bounds_a_flow():
    # Rank 0 sends S to rank 1 and S to rank 2 at once: both cross rank 0's uplink.
    messages = send_recv(0, 1, S, op_ids=(0, 0)) + send_recv(0, 2, S, op_ids=(1, 0))
    messages[0] = (0, dataclasses.replace(messages[0][1], blocking=False))  # rank 0's send: async
    replies, sim = run(Topology.uniform(3, B, ALPHA), messages)
    assert close(replies[1].end, ALPHA + 2 * S / B) and close(replies[2].end, ALPHA + 2 * S / B)

    # Two sites at 1 Gbit/s inside, joined by 100 Mbit/s, 40 ms: a cross-site flow is
    # bounded by the site link, a flow inside a site is not.
    slow = LinkSpec(bandwidth=B / 10, latency=0.04)
    geo = Topology(uplink=[B] * 4, downlink=[B] * 4, site_of=[0, 0, 1, 1], sites=["a", "b"],
                   intra=[LinkSpec(latency=ALPHA)] * 2, inter={(0, 1): slow, (1, 0): slow})
    replies, _ = run(geo, send_recv(0, 2, S))
    assert close(replies[2].end, 0.04 + S / (B / 10))
    replies, _ = run(geo, send_recv(1, 0, S))
    assert close(replies[0].end, ALPHA + S / B)


def test_late_participant_makes_the_others_idle_not_communicating():
    n, late = 4, 2.5
    replies, _ = run(Topology.uniform(n, B, ALPHA),
                     collective("all_reduce", n, starts={3: late}))
    expected = late + 2 * (n - 1) * (ALPHA + S / (n * B))
    for rank, reply in replies.items():
        end, idle, comm = reply.end, reply.idle, reply.comm
        assert close(end, expected)
        assert close(idle, late if rank != 3 else 0.0, 1e-12)
        assert close(idle + comm, end - (late if rank == 3 else 0.0))


def test_async_operation_is_done_only_by_the_simulated_time_it_completes():
    n = 2
    done_at = 2 * (n - 1) * (ALPHA + S / (n * B))
    sim = Simulator(Topology.uniform(n, B, ALPHA), BUILTIN)
    for rank, message in collective("all_reduce", n, blocking=False):
        sim.receive(rank, message)
    sim.receive(0, Probe(done_at * 0.99, 0))
    sim.receive(1, Probe(done_at, 0))
    # rank 1's question waits until rank 0, answered at 0.99 T, can no longer act before T
    assert sim.advance() == [(0, Probed(False))]
    sim.receive(0, Wait(done_at * 0.99, 0))
    (rank, reply), = sim.advance()
    end, idle, comm = reply.end, reply.idle, reply.comm
    assert rank == 0 and close(end, done_at) and close(comm, done_at * 0.01) and idle == 0
    sim.rank_done(0)  # rank 0 could still act at T, before the question at T; now it cannot
    assert sim.advance() == [(1, Probed(True))]


def test_results_do_not_depend_on_the_order_messages_arrive_in():
    """Jittery network, 4 ranks at different clocks, ring all-reduce then sends: every
    interleaving of the ranks' message streams gives the same replies."""
    jittery = Topology.uniform(4, B, ALPHA, jitter=0.004)
    parts = (0, 1, 2, 3)
    streams = {r: [Op(0.1 * r, 0, ("c", parts, 0), "all_reduce", S, parts, 0, False),
                   Op(0.5 + 0.01 * r, 1, ("p", r, (r + 1) % 4, 0), "send", S / 2,
                    (r, (r + 1) % 4), 0, False),
                   Op(0.5 + 0.01 * r, 2, ("p", (r - 1) % 4, r, 0), "recv", S / 2,
                    ((r - 1) % 4, r), 0, False),
                   Wait(0.6 + 0.01 * r, 0), Wait(0.6 + 0.01 * r, 2)] for r in parts}
    outcomes = set()
    for seed in range(12):
        rng = random.Random(seed)
        sim = Simulator(jittery, BUILTIN, seed=7)
        position = dict.fromkeys(parts, 0)
        replies = {}
        while any(position[r] < len(streams[r]) for r in parts):
            # a rank sends its next message only when it is not waiting for a reply
            ready = [r for r in parts if position[r] < len(streams[r]) and not sim.blocked[r]]
            rank = rng.choice(ready)
            sim.receive(rank, streams[rank][position[rank]])
            position[rank] += 1
            for r, reply in sim.advance():
                replies.setdefault(r, []).append(reply)
        outcomes.add(tuple(sorted((r, tuple(v)) for r, v in replies.items())))
    assert len(outcomes) == 1
    (result,) = outcomes
    assert all(len(v) == 2 for _, v in result)


def test_deadlock_and_mismatched_collectives_are_reported():
    sim = Simulator(Topology.uniform(2, B, ALPHA), BUILTIN)
    sim.receive(0, Op(0.0, 0, ("p", 1, 0, 0), "recv", S, (1, 0), 0, True))
    sim.rank_done(1)
    sim.advance()
    assert sim.stuck() == "deadlock: rank 0 waits for the transfer 1 -> 0, which rank(s) 1 never started"

    parts = (0, 1)
    sim = Simulator(Topology.uniform(2, B, ALPHA), BUILTIN)
    sim.receive(0, Op(0.0, 0, ("c", parts, 0), "all_reduce", S, parts, 0, True))
    sim.receive(1, Op(0.0, 0, ("c", parts, 0), "all_gather", S, parts, 0, True))
    with pytest.raises(SimulationError, match="rank 1 called all_gather .* rank 0 called all_reduce"):
        sim.advance()


def test_every_algorithm_completes_every_collective_it_implements_and_conserves_bytes():
    for (name, function), kind, n in itertools.product(
            BUILTIN.items(), ["all_reduce", "all_gather", "reduce_scatter", "broadcast"],
            [1, 2, 5, 8]):
        try:
            plan = function(kind, n, n - 1)
        except ValueError:
            continue
        compiled = plan.compiled
        assert math.isclose(sum(compiled.sent), sum(compiled.received), abs_tol=1e-12)
        if kind == "broadcast" and n > 1:  # everyone but the root receives the payload once
            assert [close(r, 1.0) for r in compiled.received] == [i != n - 1 for i in range(n)]
        topology = Topology.uniform(n, B, ALPHA)
        topology.algorithms = {k: name for k in topology.algorithms}
        replies, sim = run(topology, collective(kind, n, root=n - 1))
        assert sorted(replies) == list(range(n)), (name, kind, n)  # nobody left waiting
        assert not sim.network.busy()


def test_the_network_model_imports_without_torch():
    """exoframe.sim knows nothing of torch: it imports (replay included) with torch blocked."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys; sys.modules['torch'] = None\n"
            "import exoframe, exoframe.sim, exoframe.sim.traces.replay\n"
            "import exoframe.sim.clocks.protocol, exoframe.sim.clocks.simulator\n"
            "import exoframe.sim.clocks.transport\n"
            "assert sys.modules['torch'] is None and exoframe.__version__\n")
    repo = Path(__file__).resolve().parent.parent
    subprocess.run([sys.executable, "-c", code], check=True, cwd=repo)


def test_a_replayed_wait_for_an_operation_never_started_is_one_error():
    from exoframe.sim.traces.replay import ReplayError, replay

    topology = Topology.uniform(2, B, ALPHA)
    with pytest.raises(ReplayError, match="rank 0 waits for operation 5, which it did not start"):
        replay([[["c", 1.0], ["w", 5]], [["c", 1.0]]], topology, BUILTIN)
    with pytest.raises(ReplayError, match=r"deadlock: rank 0 waits for the transfer 0 -> 1"):
        replay([[["o", 0, 0, "send", 8.0, [0, 1], 0, True]], []], topology, BUILTIN)


def traced_finish(start, nbytes, bandwidth, trace):
    """When a lone transfer's last byte leaves, integrating the trace's piecewise-constant
    bandwidth: a reference computed apart from the flow model."""
    pieces = [(0.0, bandwidth), *trace, (math.inf, None)]
    t, left = start, nbytes
    for (begin, rate), (end, _) in zip(pieces, pieces[1:]):
        if end <= t:
            continue
        if left <= rate * (end - t):
            return t + left / rate
        left -= rate * (end - t)
        t = end


@pytest.mark.parametrize("start", [0.0, 2.0, 3.5, 10.0])  # across, into, after the window
def test_a_bandwidth_trace_window_moves_a_transfer_by_the_closed_form(tmp_path, start):
    """A link between two sites runs at half its bandwidth from 1 s to 3 s (a CSV trace)."""
    from exoframe.plugins import Registry
    from exoframe.sim.network.netconfig import load_network

    (tmp_path / "window.csv").write_text("time,bandwidth\n1s,4mbit\n3s,8mbit\n")
    (tmp_path / "net.yaml").write_text(
        "sites: {a: {ranks: [0]}, b: {ranks: [1]}}\n"
        "links: [{between: [a, b], bandwidth: 8mbit, latency: 10ms, "
        "bandwidth_trace: window.csv}]\nprotocol: none\n")
    topology = load_network(str(tmp_path / "net.yaml"), Registry("networks")).topology(2)
    link = topology.inter[(0, 1)]
    assert link.bandwidth == 1e6 and link.trace == ((1.0, 5e5), (3.0, 1e6))
    key = ("p", 0, 1, 0)
    replies, _ = run(topology, [(0, Op(start, 0, key, "send", S, (0, 1), 0, True)),
                                (1, Op(start, 0, key, "recv", S, (0, 1), 0, True))])
    expected = traced_finish(start, S, 1e6, [(1.0, 5e5), (3.0, 1e6)]) + 0.01
    assert close(replies[1].end, expected, rel=1e-12)
    untraced = start + S / 1e6 + 0.01
    window_delay = {0.0: 1.0, 2.0: 0.5, 3.5: 0.0, 10.0: 0.0}[start]  # (t2 − t1 overlap) / 2
    assert math.isclose(replies[1].end - untraced, window_delay, abs_tol=1e-9)


@pytest.mark.parametrize("start", [0.0, 2.0, 3.5])  # across, into, after the outage
def test_a_link_that_is_down_holds_its_transfers_for_the_outage(start):
    """The a–b link is down from 1 s to 3 s: a transfer on it waits that long and no more,
    while a flow from the same uplink to a rank of its own site takes the whole uplink."""
    from exoframe.sim.network.netconfig import NetConfig

    net = NetConfig.from_dict({
        "bandwidth": "16mbit",
        "sites": {"a": {"ranks": [0, 2]}, "b": {"ranks": [1]}},
        "links": [{"between": ["a", "b"], "bandwidth": "8mbit", "latency": "10ms",
                   "bandwidth_trace": [["1s", "down"], ["3s", "8mbit"]]}],
        "protocol": "none"}, "t", "t")
    topology = net.validate().topology(3)
    assert topology.inter[(0, 1)].trace == ((1.0, 0.0), (3.0, 1e6))
    wan, local = ("p", 0, 1, 0), ("p", 0, 2, 1)
    replies, _ = run(topology, [(0, Op(start, 0, local, "send", S, (0, 2), 0, False)),
                                (0, Op(start, 1, wan, "send", S, (0, 1), 0, True)),
                                (1, Op(start, 0, wan, "recv", S, (0, 1), 0, True)),
                                (2, Op(start, 0, local, "recv", S, (0, 2), 0, True))])
    assert close(replies[1].end,
                 traced_finish(start, S, 1e6, [(1.0, 0.0), (3.0, 1e6)]) + 0.01, rel=1e-12)
    outage = {0.0: 2.0, 2.0: 1.0, 3.5: 0.0}[start]
    assert math.isclose(replies[1].end - (start + S / 1e6 + 0.01), outage, abs_tol=1e-9)
    # The local flow runs at 1e6 B/s beside the WAN flow (max-min: the WAN link caps that
    # one at 8 Mbit/s of the 16) and at the uplink's 2e6 B/s while the WAN link is down.
    local_end = {0.0: 1.0 + 3e6 / 2e6, 2.0: 3.0 + 2e6 / 1e6, 3.5: 3.5 + S / 1e6}[start]
    assert close(replies[2].end, local_end, rel=1e-12)


@pytest.mark.parametrize("start", [0.0, 2.0, 3.5, 10.0])
def test_a_nic_bandwidth_trace_moves_a_transfer_by_the_closed_form(start):
    """Site a's NICs run at half speed from 1 s to 3 s; site b's do not: a transfer from a
    to b is held by a's uplink through the window."""
    from exoframe.sim.network.netconfig import NetConfig

    net = NetConfig.from_dict({
        "bandwidth": "8mbit",
        "sites": {"a": {"ranks": [0], "bandwidth_trace": [["1s", "4mbit"], ["3s", "8mbit"]]},
                  "b": {"ranks": [1, 2]}},
        "links": [{"between": ["a", "b"], "bandwidth": "1gbit", "latency": "10ms"}],
        "protocol": "none"}, "t", "t")
    topology = net.validate().topology(3)
    assert topology.nic_trace == [((1.0, 5e5), (3.0, 1e6)), (), ()]
    key = ("p", 0, 1, 0)
    replies, _ = run(topology, [(0, Op(start, 0, key, "send", S, (0, 1), 0, True)),
                                (1, Op(start, 0, key, "recv", S, (0, 1), 0, True))])
    assert close(replies[1].end,
                 traced_finish(start, S, 1e6, [(1.0, 5e5), (3.0, 1e6)]) + 0.01, rel=1e-12)


def test_a_nic_trace_needs_a_finite_bandwidth_first():
    from exoframe.sim.network.netconfig import NetConfig

    from exoframe.errors import ExoframeError

    with pytest.raises(ExoframeError,
                       match="bandwidth_trace: a NIC with a bandwidth_trace needs a finite"):
        NetConfig.from_dict({"bandwidth_trace": [["1s", "1gbit"]]}, "t", "t").validate()


def test_a_transfer_on_a_link_that_never_comes_back_is_reported_not_hung():
    from exoframe.sim.network.netconfig import NetConfig

    net = NetConfig.from_dict({
        "sites": {"a": {"ranks": [0]}, "b": {"ranks": [1]}},
        "links": [{"between": ["a", "b"], "bandwidth": "8mbit",
                   "bandwidth_trace": [["1s", 0]]}]}, "t", "t")
    key = ("p", 0, 1, 0)
    replies, sim = run(net.validate().topology(2),
                       [(0, Op(0.0, 0, key, "send", S, (0, 1), 0, True)),
                        (1, Op(0.0, 0, key, "recv", S, (0, 1), 0, True))])
    assert replies == {}
    assert "down for good: its bandwidth_trace ends with 'down'" in sim.stuck()


def test_mail_reaches_a_listening_rank_at_its_delivery_and_ends_a_listen_before_its_op():
    """Rank 0 posts S bytes to rank 1 at t=0. Rank 1 listens while its all-reduce with rank
    2 (who joins at t=10) is pending: the mail ends the listen at S/B + α; listening again,
    it gets the all-reduce's end. Rank 2 asks for mail without waiting: none."""
    from exoframe.sim.clocks.protocol import Listen, Mail, Post

    sim = Simulator(Topology.uniform(3, B, ALPHA), BUILTIN)
    key = ("c", (1, 2), 0)
    sim.receive(0, Post(0.0, 0, 1, S))
    sim.rank_done(0)
    sim.receive(1, Op(0.0, 0, key, "all_reduce", S, (1, 2), 0, False))
    sim.receive(1, Listen(0.0, 0))
    sim.receive(2, Listen(5.0, None, block=False))
    replies = dict(sim.advance())
    arrival = S / B + ALPHA
    latency = replies[1].latency  # of the wait: the message's α, the rest its bytes' S/B
    assert replies == {1: Mail(arrival, 0.0, arrival, ((0, 0, S),), latency=latency)}
    assert close(latency, ALPHA)  # (rank 2 waits: rank 1 runs again from `arrival` and might
    sim.receive(1, Listen(arrival, 0))  # post before 5 s)
    assert dict(sim.advance()) == {2: Mail(5.0, 0.0, 0.0, ())}
    sim.receive(2, Op(10.0, 0, key, "all_reduce", S, (1, 2), 0, True))
    replies = dict(sim.advance())
    ring = 2 * (ALPHA + S / (2 * B))  # two ranks: one reduce-scatter and one all-gather round
    assert close(replies[1].end, 10.0 + ring) and close(replies[2].end, 10.0 + ring)
    assert close(replies[1].idle, 10.0 - arrival)


@pytest.mark.parametrize("overlap", [None, 2.5e6, 8e6, 2e7])
def test_exchanges_move_at_the_overlap_rate_while_their_ranks_compute(overlap):
    """The compute model's overlap=R: an all-reduce started before a second of compute
    moves at most R bytes/s a way on each rank while the ranks compute, then at the
    network's pace B. Two ranks, a ring: two rounds one after the other, each a flow of
    S/2 a way, so S bytes go each way at min(R, B) until the compute ends, then at B."""
    bandwidth, nbytes, compute = 12.5e6, 10e6, 1.0  # 100 Mbit/s links, no latency
    sim = Simulator(Topology.uniform(2, bandwidth, 0.0), BUILTIN, overlap_rate=overlap)
    parts = (0, 1)
    for rank in parts:
        sim.receive(rank, Op(0.0, 0, ("c", parts, 0), "all_reduce", nbytes, parts, 0, False))
    sim.advance()
    for rank in parts:
        sim.receive(rank, Wait(compute, 0))
    replies = dict(sim.advance())
    during = min(overlap or math.inf, bandwidth)
    done = nbytes / during if nbytes <= during * compute \
        else compute + (nbytes - during * compute) / bandwidth
    for rank in parts:
        assert close(replies[rank].end, max(compute, done)), (overlap, replies[rank])
    assert replies[0].end == pytest.approx({None: 1.0, 2.5e6: 1.6, 8e6: 1.16, 2e7: 1.0}[overlap])


def test_messages_a_connection_gets_at_one_instant_go_in_the_order_they_were_called():
    """Twelve sends from rank 0 to rank 1 at one instant, under TCP: one connection, one
    byte stream, so each is received after every earlier call and before every later one,
    also past the tenth (calls are not ordered by the text of their keys)."""
    from exoframe.sim.network.netconfig import NetConfig

    topology = NetConfig.from_dict({"bandwidth": "100mbit", "latency": "5ms"}, "t",
                                   "t").validate().topology(2)
    calls = 12
    keys = [("p", 0, 1, i) for i in range(calls)]
    streams = {0: [Op(0.0, i, key, "send", 1e5, (0, 1), 0, False) for i, key in enumerate(keys)]
               + [Wait(0.0, calls - 1)],
               1: [Op(0.0, i, key, "recv", 1e5, (0, 1), 0, False) for i, key in enumerate(keys)]
               + [Wait(0.0, i) for i in range(calls)]}
    sim = Simulator(topology, BUILTIN)
    ends = {0: [], 1: []}
    position = {0: 0, 1: 0}
    for _ in range(4 * calls):  # (a stream that stops answering fails, not hangs)
        for rank in streams:
            while position[rank] < len(streams[rank]) and not sim.blocked[rank]:
                sim.receive(rank, streams[rank][position[rank]])
                position[rank] += 1
        for rank, reply in sim.advance():
            ends[rank].append(reply.end)
        if all(position[r] == len(streams[r]) for r in streams) and len(ends[1]) == calls:
            break
    received = ends[1]
    assert len(received) == calls and received == sorted(received)
    assert len(set(received)) == calls  # one after another, none at once
    # the stream carries them back to back: the last is in after all their bytes
    assert received[-1] > calls * 1e5 / 12.5e6
