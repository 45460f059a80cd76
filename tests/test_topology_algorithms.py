"""Collective algorithms that see the network's sites (plan_function(..., topology=Sites)).

A plugin's hierarchical all-reduce on a network whose sites list non-contiguous ranks:
its plan crosses sites only between the sites' leaders, and its simulated time is the
closed form below, not the ring's.
"""
import functools
import math
import re
from pathlib import Path

import pytest

import exoframe
from exoframe.errors import ExoframeError
from exoframe.plugins import PluginManager
from exoframe.sim import Plan, Simulator, Sites, resolve_sim
from exoframe.sim.clocks.protocol import Op, Waited
from exoframe.sim.network.collectives import BUILTIN, Plans, plan_for, takes_topology

S = 4e6  # bytes
# Site a: ranks 0, 2, 5 on 10 Gbit/s NICs, 20 us apart; site b: ranks 1, 3, 4 on 40 Gbit/s,
# 5 us apart; one 1 Gbit/s, 30 ms link between them (slower than any NIC). The closed form
# is the exact alpha-beta model's: protocol: none.
NET = """\
algorithm: {all_reduce: %s}
sites:
  a: {ranks: [0, 2, 5], bandwidth: 10gbit, latency: 20us}
  b: {ranks: [1, 3, 4], bandwidth: 40gbit, latency: 5us}
links:
  - between: [a, b]
    bandwidth: 1gbit
    latency: 30ms
protocol: none
"""
SITE = {"a": (1.25e9, 20e-6), "b": (5e9, 5e-6)}  # NIC bytes/s, latency inside
WAN, WAN_LATENCY = 1.25e8, 30e-3
SITE_OF_RANK = {0: "a", 2: "a", 5: "a", 1: "b", 3: "b", 4: "b"}


def hierarchical(kind, n, root=0, topology=None):
    """All-reduce in three phases: every member of a site sends its S to the site's leader
    (its first participant), the leaders all-reduce around a ring (2(k-1) rounds of S/k),
    then each leader sends the sum to its members."""
    if kind != "all_reduce":
        raise ValueError(f"hierarchical does not implement {kind}")
    plan = Plan(n)
    groups = topology.groups()
    leaders = [group[0] for group in groups]
    into = {group[0]: [plan.add(m, group[0], 1.0) for m in group[1:]] for group in groups}
    k, previous = len(leaders), None
    for _ in range(2 * (k - 1)):
        current = []
        for j in range(k):
            src, dst = leaders[j], leaders[(j + 1) % k]
            # The first round waits for both ends' site sums; then as the ring does.
            deps = into[src] + into[dst] if previous is None else (previous[j - 1], previous[j])
            current.append(plan.add(src, dst, 1 / k, deps))
        previous = current
    for j, group in enumerate(groups):
        done = into[group[0]] if previous is None else (previous[j - 1], previous[j])
        for m in group[1:]:
            plan.add(group[0], m, 1.0, done)
    return plan


def hierarchical_ends(members: dict) -> dict:
    """Closed form: when every participant of site s has finished, given members[s] (its
    participant count m_s). Within a site, m_s - 1 flows of S share the leader's NIC (down,
    then up): (m_s - 1) S / B_s + a_s each way. The leaders' ring starts when the slowest
    site's sum is in and its 2(k-1) rounds each carry S/k over the WAN (one flow per
    direction, the WAN slower than any NIC): a + S/(k W) per round."""
    local = {s: (m - 1) * S / SITE[s][0] + SITE[s][1] for s, m in members.items()}
    k = len(members)
    ring = 2 * (k - 1) * (WAN_LATENCY + S / (k * WAN))
    return {s: max(local.values()) + ring + local[s] for s in members}


class HierarchicalPlugin:
    @exoframe.hookimpl
    def exoframe_register_algorithms(self, register):
        register("hierarchical", hierarchical, description="reduce in sites, ring between",
                 aliases=("hier",))


@pytest.fixture
def pm():
    pm = PluginManager(load_entry_points=False)
    pm.register(HierarchicalPlugin(), name="hierarchical-plugin", source="tests")
    return pm


@pytest.fixture
def net(tmp_path):
    def write(algorithm="hier"):
        path = tmp_path / f"two-sites-{algorithm}.yaml"
        path.write_text(NET % algorithm)
        return str(path)
    return write


def simulate(setup, participants, nranks=6):
    """Every participant starts one all_reduce of S at 0; its rank's end time by rank."""
    sim = Simulator(setup.topology, setup.algorithms)
    for rank in set(range(nranks)) - set(participants):
        sim.rank_done(rank)
    for rank in participants:
        sim.receive(rank, Op(0.0, 0, ("c", participants, 0), "all_reduce", S, participants,
                             0, True))
    ends = {}
    while batch := sim.advance():
        for rank, reply in batch:
            assert isinstance(reply, Waited)
            ends[rank] = reply.end
            sim.rank_done(rank)
    return ends


def test_the_view_is_in_the_participants_index_space(pm, net):
    topology = resolve_sim(net(), "fixed:1s", "", 6, pm).topology
    world = Sites.of(topology, range(6))
    assert world.names == ("a", "b") and world.ranks == (0, 1, 2, 3, 4, 5)
    assert world.site_of == (0, 1, 0, 1, 1, 0) and world.groups() == ((0, 2, 5), (1, 3, 4))
    group = Sites.of(topology, (5, 1, 2, 4))  # a subgroup, in its own order
    assert group.n == 4 and group.ranks == (5, 1, 2, 4) and group.site_of == (0, 1, 0, 1)
    assert group.groups() == ((0, 2), (1, 3))
    assert Sites.single(3) == Sites(ranks=(0, 1, 2), site_of=(0, 0, 0), names=("default",))
    with pytest.raises(ValueError, match="2 ranks but 1 site_of"):
        Sites(ranks=(0, 1), site_of=(0,))


@pytest.mark.parametrize("participants", [(0, 1, 2, 3, 4, 5), (5, 1, 2, 4)])
def test_only_the_leaders_cross_sites(pm, net, participants):
    setup = resolve_sim(net(), "fixed:1s", "", 6, pm)
    plans = Plans(setup.topology.algorithms, setup.algorithms, setup.topology)
    plan = plans.of("all_reduce", len(participants), 0, participants)
    rank = dict(enumerate(participants))
    crossing = [(rank[s], rank[d]) for s, d in zip(plan.src, plan.dst)
                if SITE_OF_RANK[rank[s]] != SITE_OF_RANK[rank[d]]]
    leaders = {participants[0], participants[1]}  # the first of site a, the first of b
    assert len(crossing) == 4 and all(set(pair) == leaders for pair in crossing)
    # Bytes sent per participant, as a fraction of S: a member its S; a leader 2(k-1)/k on
    # the ring plus S to each of its m - 1 members.
    members = {s: sum(SITE_OF_RANK[r] == s for r in participants) for s in "ab"}
    expected = [1.0 + members[SITE_OF_RANK[r]] - 1 if r in leaders else 1.0
                for r in participants]
    assert plan.compiled.sent == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("participants", [(0, 1, 2, 3, 4, 5), (5, 1, 2, 4)])
def test_hierarchical_all_reduce_matches_its_closed_form(pm, net, participants):
    members = {s: sum(SITE_OF_RANK[r] == s for r in participants) for s in "ab"}
    expected = hierarchical_ends(members)
    ends = simulate(resolve_sim(net(), "fixed:1s", "", 6, pm), participants)
    assert sorted(ends) == sorted(participants)
    for rank, end in ends.items():
        assert math.isclose(end, expected[SITE_OF_RANK[rank]], rel_tol=1e-9), (rank, end)
    # The ring on the same network crosses the WAN in most of its 10 rounds: the topology
    # mattered.
    ring = simulate(resolve_sim(net("ring"), "fixed:1s", "", 6, pm), participants)
    assert max(ring.values()) > 1.5 * max(ends.values())


def test_an_alias_names_the_algorithm_in_network_yaml(pm, net):
    path = net("hier")
    setup = resolve_sim(path, "fixed:1s", "", 6, pm)
    assert setup.topology.algorithms["all_reduce"] == "hier"
    assert setup.algorithms["hier"] is setup.algorithms["hierarchical"] is hierarchical
    expected = hierarchical_ends({"a": 3, "b": 3})
    for rank, end in simulate(setup, tuple(range(6))).items():
        assert math.isclose(end, expected[SITE_OF_RANK[rank]], rel_tol=1e-9)
    # One name for every collective: the check for what it implements passes it the sites.
    everything = net("hier").replace(".yaml", "-all.yaml")
    with open(everything, "w") as f:
        f.write((NET % "hier").replace("algorithm: {all_reduce: hier}", "algorithm: hier"))
    with pytest.raises(ExoframeError) as error:
        resolve_sim(everything, "fixed:1s", "", 6, pm)
    assert str(error.value) == (f"{everything}: algorithm: 'hier' does not implement "
                                f"all_gather; choose another for it, e.g. algorithm: "
                                f"{{all_gather: ring}}.")


def test_three_argument_plan_functions_still_work(pm, net):
    """Built-in and third-party plan functions without `topology` are called as before;
    which kind a function is, is read from its signature, not found by trying."""
    calls = []

    def legacy(kind, n, root):
        calls.append((kind, n, root))
        return BUILTIN["ring"](kind, n, root)

    def with_kwargs(kind, n, root, **extra):
        calls.append(extra)
        return BUILTIN["ring"](kind, n, root)

    class Planner:
        def __call__(self, kind, n, root=0, *, topology):
            return BUILTIN["ring"](kind, n, root)

    assert not takes_topology(legacy) and not takes_topology(BUILTIN["ring"])
    assert takes_topology(with_kwargs) and takes_topology(Planner())
    assert takes_topology(hierarchical) and not takes_topology(lambda kind, n, root: None)
    assert takes_topology(functools.partial(hierarchical, topology=None))
    topology = resolve_sim(net("ring"), "fixed:1s", "", 6, pm).topology
    ring = Plans(topology.algorithms, BUILTIN, topology).of("all_reduce", 6)
    for function, expected_call in [(legacy, ("all_reduce", 6, 0)),
                                    (with_kwargs, {"topology": Sites.of(topology, range(6))})]:
        calls.clear()
        plans = Plans({"all_reduce": "x"}, {"x": function}, topology)
        plan = plans.of("all_reduce", 6, 0, range(6))
        assert calls == [expected_call]
        assert (plan.src, plan.dst, plan.fraction) == (ring.src, ring.dst, ring.fraction)
        assert plans.of("all_reduce", 6, 0, range(6)) is plan and len(calls) == 1  # cached


def test_without_a_network_an_algorithm_sees_one_site():
    plan = plan_for(hierarchical, "all_reduce", 4)  # everyone sends to participant 0 and back
    assert sorted(zip(plan.src, plan.dst)) == sorted([(1, 0), (2, 0), (3, 0),
                                                      (0, 1), (0, 2), (0, 3)])
    view = Plans({"all_reduce": "h"}, {"h": hierarchical}).sites((7, 3))
    assert view == Sites(ranks=(7, 3), site_of=(0, 0))


def test_the_example_in_the_docs_is_this_algorithm(pm, net):
    text = (Path(__file__).resolve().parent.parent / "docs" / "plugins.md").read_text()
    section = text[text.index("## Collective algorithms"):]
    namespace = {}
    exec(re.search(r"```python\n(.*?)```", section, re.S).group(1), namespace)
    topology = resolve_sim(net(), "fixed:1s", "", 6, pm).topology
    for participants in [range(6), (5, 1, 2, 4), (3, 4)]:
        sites = Sites.of(topology, participants)
        ours, docs = (f("all_reduce", sites.n, 0, topology=sites)
                      for f in (hierarchical, namespace["hierarchical"]))
        assert (docs.src, docs.dst, docs.fraction, docs.deps) == \
            (ours.src, ours.dst, ours.fraction, ours.deps)
    assert NET % "hier" in text.replace("```yaml\n", "")


def test_a_builtin_algorithms_bytes_are_its_plans_from_the_closed_form():
    """A rank counts the bytes it moves from the closed form of a built-in algorithm (no
    plan is built: a ring among 1024 is 2M flows); they equal its plan's, to the last bit."""
    from exoframe.sim.network.collectives import KINDS, _cached_plan, closed_form
    checked = 0
    for function in BUILTIN.values():
        for kind in (*KINDS, "send"):
            for n in [*range(1, 30), 64]:
                for root in sorted({0, n // 2, n - 1}):
                    try:
                        compiled = plan_for(function, kind, n, root).compiled
                    except ValueError:  # not implemented: the plan says so, one line
                        assert closed_form(function, kind, n, root, 0) is None
                        continue
                    for i in range(len(compiled.sent)):
                        assert closed_form(function, kind, n, root, i) == \
                            (compiled.sent[i], compiled.received[i]), (kind, n, root, i)
                        checked += 1
    assert checked > 20_000
    plans_made = _cached_plan.cache_info().misses
    ring_plans = Plans({"all_reduce": "ring"}, BUILTIN)
    assert ring_plans.bytes_moved("all_reduce", tuple(range(1024)), 0, 5, 4096) == \
        (round(2 * 1023 / 1024 * 4096),) * 2
    assert _cached_plan.cache_info().misses == plans_made  # no plan was made
