"""Speed of the network simulator alone (no training).

    python benchmarks/simulator.py

1. N concurrent point-to-point flows of random sizes among 100 ranks on 1 Gbit/s, 10 ms
   links, all started at once (many share links): real seconds to simulate them all, for
   N = 1,000 ... 10,000. They form one connected component, where exact max-min fairness
   recomputes every flow's rate at each of the N finishes (one finish changes about 60 % of
   the rates there), so the cost grows as N².
2. One ring all-reduce of 400 MB among 64 ranks (8,064 flows): real milliseconds; the
   simulated time is checked against 2(n-1)(a + S/(nB)). Each round's flows use disjoint
   links, so the cost grows linearly.
Targets (issue 3, under equal per-link shares): 10,000 flows under 1 s; ring under 50 ms.
"""
import random
import statistics
import time

from exoframe.sim import Simulator, Topology
from exoframe.sim.clocks.protocol import Op
from exoframe.sim.network.collectives import BUILTIN, plan_for

BANDWIDTH, LATENCY = 1.25e8, 0.01


def concurrent_flows(count=10_000, ranks=100, seed=0) -> tuple[float, float]:
    rng = random.Random(seed)
    sim = Simulator(Topology.uniform(ranks, BANDWIDTH, LATENCY), BUILTIN)
    messages, pair_count = [], {}
    for i in range(count):
        src = rng.randrange(ranks)
        dst = (src + 1 + rng.randrange(ranks - 1)) % ranks
        seq = pair_count.get((src, dst), 0)
        pair_count[(src, dst)] = seq + 1
        size = rng.uniform(1e5, 1e7)
        key = ("p", src, dst, seq)
        messages.append((src, Op(0.0, i, key, "send", size, (src, dst), 0, False)))
        messages.append((dst, Op(0.0, i, key, "recv", size, (src, dst), 0, False)))
    start = time.perf_counter()
    for rank, message in messages:
        sim.receive(rank, message)
    for rank in range(ranks):
        sim.rank_done(rank)
    sim.advance()
    assert sim.network.flows_started == count
    return time.perf_counter() - start, sim.env.now


def ring_all_reduce(n=64, size=4e8) -> tuple[float, float]:
    plan_for(BUILTIN["ring"], "all_reduce", n)  # built once per (algorithm, kind, n)
    parts = tuple(range(n))
    start = time.perf_counter()
    sim = Simulator(Topology.uniform(n, BANDWIDTH, LATENCY), BUILTIN)
    for rank in parts:
        sim.receive(rank, Op(0.0, 0, ("c", parts, 0), "all_reduce", size, parts, 0, True))
    (_, reply), *_ = sim.advance()
    end = reply.end
    elapsed = time.perf_counter() - start
    expected = 2 * (n - 1) * (LATENCY + size / (n * BANDWIDTH))
    assert abs(end - expected) <= 1e-9 * expected, (end, expected)
    return elapsed, end


if __name__ == "__main__":
    for count in (1_000, 2_000, 4_000, 10_000):
        seconds, simulated = concurrent_flows(count=count)
        print(f"{count:>6,} concurrent flows: {seconds:.2f} s real (simulated {simulated:.2f} s)")
    rings = [ring_all_reduce() for _ in range(5)]
    print(f"64-rank ring all-reduce:  median {1000 * statistics.median(r[0] for r in rings):.1f} ms "
          f"real (runs: {', '.join(f'{1000 * r[0]:.1f}' for r in rings)}; simulated "
          f"{rings[0][1]:.3f} s = closed form)")
