"""Max-min fair sharing: textbook cases with their answers worked out by hand, and random
traffic against a from-scratch reference (global progressive filling at every event)."""
import math
import random

import pytest

from exoframe.sim.network.events import Environment
from exoframe.sim.network.flows import FlowNetwork
from exoframe.sim.network.topology import LinkSpec, Topology

INF = math.inf


def deliveries(topology, flows):
    """flows: (start, src, dst, bytes). Returns each flow's delivery time, in order."""
    env = Environment()
    network = FlowNetwork(env, topology)
    done = [None] * len(flows)

    def start(i, at, src, dst, nbytes):
        yield env.timeout(at)
        network.start_flow(src, dst, nbytes, lambda j: done.__setitem__(j, env.now), i)

    for i, flow in enumerate(flows):
        env.process(start(i, *flow))
    env.run()
    assert not network.busy()
    return done


def close(a, b):
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1e-12)


def test_one_bottleneck_shares_equally_and_hands_capacity_on():
    # Four senders into rank 0's 100 B/s downlink; sizes 100 < 200 < 300 < 400 bytes.
    topology = Topology.uniform(5, latency=0.01, download=100.0, upload=INF)
    topology.downlink = [100.0, INF, INF, INF, INF]
    sizes = [100.0, 200.0, 300.0, 400.0]
    got = deliveries(topology, [(0.0, i + 1, 0, s) for i, s in enumerate(sizes)])
    # Water-filling: while k flows remain, each gets 100/k.
    expected, t, sent = [], 0.0, 0.0
    for k, size in enumerate(sizes):
        t += (size - sent) * (len(sizes) - k) / 100.0
        sent = size
        expected.append(t + 0.01)
    assert all(close(g, e) for g, e in zip(got, expected)), (got, expected)


def test_parking_lot_gives_the_spare_capacity_of_the_wider_link_to_its_short_flows():
    # L1 = rank 0's uplink (10 B/s), L2 = rank 1's downlink (30 B/s). The long flow 0->1
    # crosses both; a: 0->2 crosses L1; b, c: 3->1, 4->1 cross L2.
    topology = Topology.uniform(5)
    topology.uplink = [10.0, INF, INF, INF, INF]
    topology.downlink = [INF, 30.0, INF, INF, INF]
    S = 100.0
    long_, a, b, c = deliveries(topology, [(0, 0, 1, S), (0, 0, 2, S), (0, 3, 1, S),
                                           (0, 4, 1, S)])
    # L1 saturates first at 10/2 = 5 each (long, a); L2 gives its other 30 - 5 = 25 to b, c.
    assert close(long_, S / 5) and close(a, S / 5)
    assert close(b, S / 12.5) and close(c, S / 12.5)  # equal per-link shares would say S/10


def test_a_wan_limited_flow_leaves_its_uplink_to_the_local_flow_beside_it():
    # Rank 0 (site A) sends 800 B to rank 1 (site A) and 400 B to rank 2 (site B) through a
    # 20 B/s WAN; its uplink is 100 B/s.
    topology = Topology(uplink=[100.0, INF, INF], downlink=[INF, INF, INF], site_of=[0, 0, 1],
                        sites=["A", "B"], intra=[LinkSpec(latency=0.001), LinkSpec()],
                        inter={(0, 1): LinkSpec(bandwidth=20.0, latency=0.05),
                               (1, 0): LinkSpec(bandwidth=20.0, latency=0.05)})
    local, remote = deliveries(topology, [(0, 0, 1, 800.0), (0, 0, 2, 400.0)])
    # The WAN caps the remote flow at 20; the local one gets 100 - 20 = 80 until it is done.
    assert close(local, 800.0 / 80 + 0.001)  # equal shares would give 800/50: 60 % late
    assert close(remote, 400.0 / 20 + 0.05)


def test_flows_that_start_at_different_times():
    topology = Topology.uniform(3, latency=0.0)
    topology.uplink = [100.0, INF, INF]
    topology.downlink = [INF, INF, INF]
    S1, S2, t1 = 500.0, 300.0, 2.0
    first, second = deliveries(topology, [(0.0, 0, 1, S1), (t1, 0, 2, S2)])
    # Alone until t1 (200 B sent), then 50 B/s each: the first ends 300/50 = 6 s later,
    # when the second has sent its 300 B too.
    t_first = t1 + (S1 - 100.0 * t1) / 50.0
    sent_second = (t_first - t1) * 50.0
    t_second = t_first + (S2 - sent_second) / 100.0
    assert close(first, t_first) and close(second, t_second)
    S2 = 450.0  # the second outlives the first and then has the link to itself
    first, second = deliveries(topology, [(0.0, 0, 1, S1), (t1, 0, 2, S2)])
    assert close(first, 8.0) and close(second, 8.0 + (S2 - 300.0) / 100.0)


def reference_deliveries(topology, flows):
    """From scratch: at every start or finish, global progressive filling over all active
    flows; then advance to the next start or finish."""
    paths = []
    for _, src, dst, _ in flows:
        a, b = topology.site_of[src], topology.site_of[dst]
        links = [("up", src), ("down", dst)]
        spec = topology.intra[a] if a == b else topology.inter[(a, b)]
        if a != b:
            links.append(("site", a, b))
        paths.append(([l for l in links if capacity(topology, l) < INF], spec.latency))
    remaining = [f[3] for f in flows]
    active, done = set(), [None] * len(flows)
    pending = sorted(range(len(flows)), key=lambda i: (flows[i][0], i))
    now = 0.0
    while pending or active:
        rates = progressive_filling({i: paths[i][0] for i in active}, topology)
        finish = min((now + remaining[i] / rates[i] for i in active), default=INF)
        arrive = flows[pending[0]][0] if pending else INF
        t = min(finish, arrive)
        for i in active:
            remaining[i] -= rates[i] * (t - now)
        now = t
        for i in sorted(active):
            if remaining[i] <= 1e-9 * flows[i][3]:
                active.discard(i)
                done[i] = now + paths[i][1]
        while pending and flows[pending[0]][0] <= now:
            i = pending.pop(0)
            if paths[i][0]:
                active.add(i)
            else:  # no limited link on its path: sent at once
                done[i] = now + paths[i][1]
    return done


def capacity(topology, link):
    if link[0] == "up":
        return topology.uplink[link[1]]
    if link[0] == "down":
        return topology.downlink[link[1]]
    return topology.inter[(link[1], link[2])].bandwidth


def progressive_filling(paths, topology):
    rates, left = {}, {}
    for links in paths.values():
        for link in links:
            left[link] = capacity(topology, link)
    while len(rates) < len(paths):
        unfixed = {link: [i for i, ls in paths.items() if link in ls and i not in rates]
                   for link in left}
        level, link = min((left[l] / len(fs), l) for l, fs in unfixed.items() if fs)
        for i in unfixed[link]:
            rates[i] = level
            for other in paths[i]:
                left[other] -= level
    return rates


@pytest.mark.parametrize("seed", range(6))
def test_random_traffic_matches_global_progressive_filling(seed):
    rng = random.Random(seed)
    n = 6
    topology = Topology(uplink=[rng.choice([50.0, 100.0, INF]) for _ in range(n)],
                        downlink=[rng.choice([40.0, 100.0, INF]) for _ in range(n)],
                        site_of=[0, 0, 0, 1, 1, 1], sites=["A", "B"],
                        intra=[LinkSpec(latency=0.001), LinkSpec(latency=0.002)],
                        inter={(0, 1): LinkSpec(bandwidth=30.0, latency=0.05),
                               (1, 0): LinkSpec(bandwidth=60.0, latency=0.04)})
    flows = []
    for _ in range(14):
        src = rng.randrange(n)
        dst = rng.choice([d for d in range(n) if d != src])
        flows.append((round(rng.uniform(0, 3), 2), src, dst, rng.uniform(10, 200)))
    got = deliveries(topology, flows)
    expected = reference_deliveries(topology, flows)
    assert all(close(g, e) for g, e in zip(got, expected)), (got, expected)
