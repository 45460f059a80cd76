"""Network YAML: units, the shipped presets, and one-line errors that name the file and field."""
import math
import textwrap

import pytest

from exoframe.errors import ExoframeError
from exoframe.plugins import Entry, Registry
from exoframe.sim.network import presets
from exoframe.sim.network.netconfig import NetConfig, load_network
from exoframe.sim.network.topology import DEFAULT_ALGORITHMS
from exoframe.sim.network.units import (format_bandwidth, format_duration, parse_bandwidth,
                                        parse_duration)

SHIPPED = ["ideal", "nvlink", "dc-100gbps", "lan-10gbps", "lan-1gbps", "wan-1gbps",
           "wan-100mbps", "wan-10mbps", "home-broadband", "geo-2dc"]


def preset_registry() -> Registry:
    registry = Registry("networks")
    for name, path in presets.presets():
        registry.add(Entry(name=name, target=path, description=presets.description(path),
                           source="exoframe", version="test", plugin="exoframe.builtins"))
    return registry


@pytest.fixture
def write(tmp_path):
    def write(text: str, name: str = "net.yaml"):
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return str(path)
    return write


def error_of(fn, *args) -> str:
    with pytest.raises(ExoframeError) as info:
        fn(*args)
    message = str(info.value)
    assert "\n" not in message
    return message


# -- units ---------------------------------------------------------------------------------


@pytest.mark.parametrize("text, bytes_per_s", [
    ("100mbit", 12_500_000.0), ("100Mbit/s", 12_500_000.0), ("1 gbit", 125_000_000.0),
    ("2.5Gbit/s", 312_500_000.0), ("1tbit", 125e9), ("8bit", 1.0), ("64kbit", 8000.0),
    ("12.5MB/s", 12_500_000.0), ("450GB/s", 450e9), ("1kB/s", 1000.0), ("1KB/s", 1000.0),
    ("3B/s", 3.0), ("1TB/s", 1e12), ("inf", math.inf), ("unlimited", math.inf),
    (math.inf, math.inf),
])
def test_parse_bandwidth(text, bytes_per_s):
    assert parse_bandwidth(text, "bandwidth", "net.yaml") == bytes_per_s


@pytest.mark.parametrize("text, seconds", [
    ("25ms", 0.025), ("5us", 5e-6), ("5µs", 5e-6), ("5\u03bcs", 5e-6), ("100ns", 1e-7),
    ("2s", 2.0), ("1.5 ms", 0.0015), (0, 0.0), ("0", 0.0), ("0ms", 0.0),
])
def test_parse_duration(text, seconds):
    assert parse_duration(text, "latency", "net.yaml") == seconds


@pytest.mark.parametrize("text, problem", [
    ("100mbs", "unknown unit 'mbs'. Did you mean 'mbit'?"),
    ("100mbps", "'mbps' is ambiguous"),
    ("1Gbps", "'Gbps' is ambiguous"),
    ("100", "has no unit; write e.g. '100mbit'"),
    (100, "has no unit; write e.g. '100mbit'"),
    ("0mbit", "must be positive"),
    ("-5mbit", "must be positive"),
    ("fast", "expected a number and a unit"),
])
def test_bad_bandwidth(text, problem):
    message = error_of(parse_bandwidth, text, "sites.us.bandwidth", "net.yaml")
    assert message.startswith("net.yaml: sites.us.bandwidth: ")
    assert problem in message


def test_mbps_message_suggests_bits_and_bytes():
    message = error_of(parse_bandwidth, "100mbps", "bandwidth", "net.yaml")
    assert "tc reads it as bytes/s" in message and "'100mbit'" in message
    assert "'12.5MB/s'" in message


@pytest.mark.parametrize("text, problem", [
    ("25", "has no unit; write e.g. '25ms'"),
    (25, "has no unit"),
    ("-1ms", "must not be negative"),
    ("25MS", "unknown unit 'MS'. Did you mean 'ms'?"),
    ("3sec", "unknown unit 'sec'"),
])
def test_bad_duration(text, problem):
    message = error_of(parse_duration, text, "links[0].latency", "net.yaml")
    assert message.startswith("net.yaml: links[0].latency: ")
    assert problem in message


def test_format():
    assert format_bandwidth(12_500_000.0) == "100 Mbit/s"
    assert format_bandwidth(450e9) == "3.6 Tbit/s"
    assert format_bandwidth(125_000_000.0) == "1 Gbit/s"
    assert format_bandwidth(math.inf) == "unlimited"
    assert format_duration(0.025) == "25 ms"
    assert format_duration(5e-6) == "5 µs"
    assert format_duration(0) == "0"
    assert format_duration(2.0) == "2 s"


# -- shipped presets -------------------------------------------------------------------------


def test_every_shipped_preset_is_registered_with_its_description():
    registry = preset_registry()
    names = [entry.name for entry in registry]
    assert set(SHIPPED) <= set(names)
    for entry in registry:
        assert entry.describe() and "\n" not in entry.describe()


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_preset_gives_a_sane_topology(name):
    net = load_network(name, preset_registry())
    assert net.name == name
    topology = net.topology(4)
    assert topology.size == 4
    assert all(b > 0 for b in [*topology.uplink, *topology.downlink])
    for spec in [*topology.intra, *topology.inter.values()]:
        assert spec.bandwidth > 0 and 0 <= spec.jitter <= spec.latency < 1
    assert set(topology.algorithms) == set(DEFAULT_ALGORITHMS)
    assert net.summary()
    # Fewer ranks than sites is fine.
    assert net.topology(1).size == 1


def test_preset_numbers():
    registry = preset_registry()
    ideal = load_network("ideal", registry).topology(4)
    assert ideal.is_ideal()
    wan = load_network("wan-100mbps", registry).topology(4)
    assert wan.uplink == [12_500_000.0] * 4
    assert 0.01 <= wan.intra[0].latency <= 0.05 and wan.intra[0].jitter > 0
    nvlink = load_network("nvlink", registry).topology(2)
    assert nvlink.uplink == [450e9, 450e9]


def test_home_broadband_is_asymmetric():
    net = load_network("home-broadband", preset_registry())
    topology = net.topology(4)
    assert topology.uplink == [20e6 / 8] * 4
    assert topology.downlink == [300e6 / 8] * 4
    assert net.summary() == "up 20 Mbit/s / down 300 Mbit/s, 15 ms ± 3 ms"


def test_geo_2dc_splits_ranks_between_two_sites():
    net = load_network("geo-2dc", preset_registry())
    topology = net.topology(4)
    assert topology.site_of == [0, 0, 1, 1]
    assert len(topology.sites) == 2
    link = topology.inter[(0, 1)]
    assert topology.inter[(1, 0)] == link
    assert link.bandwidth == 125_000_000.0 and link.latency == 0.04
    assert topology.intra[0].latency < link.latency
    assert topology.uplink[0] > link.bandwidth
    assert net.summary() == ("2 sites (us, eu): 100 Gbit/s inside; 1 Gbit/s, 40 ms ± 1 ms "
                             "between")


# -- files and sites ------------------------------------------------------------------------


def test_load_file_with_sites_links_and_algorithms(write):
    path = write("""
        description: three sites
        bandwidth: 1gbit
        latency: 1ms
        algorithm: {all_reduce: tree}
        sites:
          a: {ranks: [4], upload: 10mbit}
          b: {bandwidth: 10gbit, latency: 50us, jitter: 10us}
          c:
        links:
          - {between: [a, b], bandwidth: 100mbit, latency: 30ms, jitter: 2ms}
          - {between: [c, b], bandwidth: 1gbit}
          - {between: [a, c], bandwidth: 50mbit, latency: 80ms}
    """, name="three.yaml")
    net = load_network(path, Registry("networks"))
    assert net.name == "three" and net.where == path
    topology = net.topology(7)
    # Unlisted ranks 0-3, 5, 6 split over b and c in contiguous blocks, b getting 3 and c 3.
    assert topology.sites == ["a", "b", "c"]
    assert topology.site_of == [1, 1, 1, 2, 0, 2, 2]
    assert topology.uplink[4] == 10e6 / 8 and topology.downlink[4] == 1e9 / 8
    assert topology.uplink[0] == 10e9 / 8
    assert topology.intra[1].latency == 50e-6 and topology.intra[2].latency == 0.001
    assert topology.inter[(2, 1)].latency == 0 and topology.inter[(0, 2)].latency == 0.08
    assert topology.algorithms == {**DEFAULT_ALGORITHMS, "all_reduce": "tree"}
    # Uneven split: earlier sites get the extra rank.
    assert net.topology(6).site_of == [1, 1, 1, 2, 0, 2]
    assert net.summary() == "3 sites (a, b, c): NICs differ by site; 3 links between"


def test_preset_given_as_a_dict():
    registry = Registry("networks")
    registry.add(Entry(name="mine", target={"bandwidth": "1gbit", "latency": "40ms"},
                       description="", source="plugin", version="1", plugin="p"))
    net = load_network("mine", registry)
    assert net.topology(2).intra[0].latency == 0.04
    assert net.summary() == "1 Gbit/s, 40 ms"


def test_algorithm_name_for_every_collective(write):
    net = load_network(write("algorithm: direct\n"), Registry("networks"))
    assert set(net.topology(3).algorithms.values()) == {"direct"}
    assert net.topology(3, ["direct", "x"]).algorithms["broadcast"] == "direct"


# -- errors name the file and the field ------------------------------------------------------


def test_unknown_preset_suggests_the_closest():
    message = error_of(load_network, "wan-100mbit", preset_registry())
    assert "unknown network preset 'wan-100mbit'" in message
    assert "Did you mean 'wan-100mbps'?" in message


def test_missing_file():
    message = error_of(load_network, "nets/missing.yaml", Registry("networks"))
    assert "nets/missing.yaml" in message and "not found" in message


@pytest.mark.parametrize("text, field, problem", [
    ("bandwidth: 0mbit", "bandwidth", "must be positive"),
    ("bandwidth: -100mbit", "bandwidth", "must be positive"),
    ("bandwidth: 100mbs", "bandwidth", "unknown unit 'mbs'. Did you mean 'mbit'?"),
    ("upload: 100mbps", "upload", "ambiguous"),
    ("bandwidth: 100", "bandwidth", "has no unit"),
    ("latency: 25", "latency", "has no unit"),
    ("latency: 1ms\njitter: 2ms", "jitter", "jitter must be at most the latency"),
    ("sites: {us: {latency: 5sec}}", "sites.us.latency", "unknown unit 'sec'"),
    ("sites: {us: {}, eu: {}}\nlinks: [{between: [us, eu], bandwidth: 0gbit}]",
     "links[0].bandwidth", "must be positive"),
    ("sites: {us: {}, eu: {}}\nlinks: [{between: [us, eu]}]", "links[0].bandwidth", "missing"),
    ("sites: {us: {}, eu: {}}\nlinks: [{between: [us, europe], bandwidth: 1gbit}]",
     "links[0].between", "unknown site 'europe'. Did you mean 'eu'?"),
    ("sites: {us: {}, eu: {}}\nlinks: [{between: [us], bandwidth: 1gbit}]",
     "links[0].between", "expected two site names"),
    ("sites: {us: {}, eu: {}}\nlinks: [{between: [us, us], bandwidth: 1gbit}]",
     "links[0].between", "two different sites"),
    (("sites:\n  us: {ranks: [0, 1]}\n  eu: {ranks: [1, 2]}\n"
      "links: [{between: [us, eu], bandwidth: 1gbit}]"),
     "sites.eu.ranks", "rank 1 is listed twice (also under sites.us.ranks)"),
    ("sites: {us: {ranks: [0, 0]}}", "sites.us.ranks", "rank 0 is listed twice"),
    ("sites: {us: {ranks: [-1]}}", "sites.us.ranks", "integers from 0"),
    ("sites: {us: {}, eu: {}}\nlinks: [{between: [us, eu], bandwidth: inf, bandwidth_trace: [[0, 1gbit]]}]",
     "links[0].bandwidth", "needs a finite bandwidth"),
    ("sites: {us: {}, eu: {}}\nlinks: [{between: [us, eu], bandwidth: 1gbit, "
     "bandwidth_trace: [[1s, 1gbit], [1s, 2gbit]]}]",
     "links[0].bandwidth_trace[1]", "times must increase"),
    ("sites: {us: {}, eu: {}}\nlinks: [{between: [us, eu], bandwidth: 1gbit, "
     "bandwidth_trace: [[1s, 0gbit]]}]", "links[0].bandwidth_trace[0] bandwidth",
     "must be positive"),
    ("sites: {us: {}, eu: {}}\nlinks: [{between: [us, eu], bandwidth: 1gbit, "
     "bandwidth_trace: [1s]}]", "links[0].bandwidth_trace[0]", "expected [time, bandwidth]"),
    ("sites: {us: {}, eu: {}}\nlinks: [{between: [us, eu], bandwidth: 1gbit, "
     "bandwidth_trace: [[null, 1gbit]]}]", "links[0].bandwidth_trace[0]",
     "expected [time, bandwidth]"),
    ("sites: {us: {}, eu: {}}\nlinks: [{between: [us, eu], bandwidth: 1gbit, "
     "bandwidth_trace: nowhere.csv}]", "links[0].bandwidth_trace",
     "nowhere.csv: No such file or directory"),
    ("queue: lifo", "queue", "expected fair, fifo, 'fifo 50ms' or 'fifo 100 packets'"),
    ("queue: fifo 0ms", "queue", "a FIFO's depth is more than 0"),
    ("queue: fifo 1.5 packets", "queue", "a whole number of packets, at least 1"),
    ("queue: fifo 50", "queue", "has no unit"),
    ("sites: {us: {queue: fair 2}}", "sites.us.queue", "expected fair, fifo"),
    ("sites: {us: {}, eu: {}}\nlinks: [{between: [us, eu], bandwidth: 1gbit, queue: fifo 0s}]",
     "links[0].queue", "a FIFO's depth is more than 0"),
    ("algorithm: rng", "algorithm", "unknown collective algorithm 'rng'. Did you mean 'ring'?"),
    ("algorithm: {allreduce: ring}", "algorithm.allreduce",
     "unknown collective 'allreduce'. Did you mean 'all_reduce'?"),
])
def test_bad_values_fail_at_load_naming_file_and_field(write, text, field, problem):
    path = write(text + "\n")
    registry = Registry("networks")

    def load_and_resolve():
        load_network(path, registry).topology(4)

    message = error_of(load_and_resolve)
    assert message.startswith(f"{path}: {field}: "), message
    assert problem in message


def test_each_uplink_has_the_queue_its_scope_states(write):
    from exoframe.sim.network.topology import Queue

    net = load_network(write("queue: fifo 50ms\nsites:\n  us: {queue: fair}\n  eu: {}\n"
                             "  ap: {queue: fifo 100 packets}\n"
                             "links: [{between: [us, eu], bandwidth: 1gbit},\n"
                             "        {between: [us, ap], bandwidth: 1gbit},\n"
                             "        {between: [eu, ap], bandwidth: 1gbit}]\n"),
                       Registry("networks"))
    topology = net.topology(3)
    assert [topology.queue_of(r) for r in range(3)] == [
        Queue("fair"), Queue("fifo", seconds=0.05), Queue("fifo", packets=100)]
    # a FIFO's depth in bytes: its time at the link's rate, or its frames
    assert topology.queue_of(1).capacity(12.5e6, 1514) == pytest.approx(625e3)
    assert topology.queue_of(2).capacity(12.5e6, 1514) == 151400
    assert load_network(write("queue: fifo\n"), Registry("networks")).topology(1).queue_of(0) \
        == Queue("fifo", packets=1000)  # Linux's txqueuelen
    # a link between sites has its own queue (a router's port), fair where it says none
    links = load_network(write("sites: {us: {}, eu: {}, ap: {}}\n"
                               "links: [{between: [us, eu], bandwidth: 1gbit, queue: fifo 20ms},"
                               "\n        {between: [us, ap], bandwidth: 1gbit},"
                               "\n        {between: [eu, ap], bandwidth: 1gbit}]\n"),
                         Registry("networks"))
    inter = links.topology(3).inter
    assert inter[(0, 1)].queue == inter[(1, 0)].queue == Queue("fifo", seconds=0.02)
    assert inter[(0, 2)].queue == Queue("fair")
    two = load_network(write("sites: {us: {}, eu: {}}\nlinks: [{between: [us, eu], "
                             "bandwidth: 1gbit, queue: fifo 20ms}]\n"), Registry("networks"))
    assert two.summary().endswith("1 Gbit/s, no latency, fifo 20ms queue between"), two.summary()
    assert load_network(write("bandwidth: 1gbit\n"), Registry("networks")).topology(2) \
        .queue_of(1) == Queue("fair")
    assert "fifo 100 packets" not in net.summary()
    assert load_network(write("bandwidth: 20mbit\nqueue: fifo 50ms\n"),
                        Registry("networks")).summary() == \
        "20 Mbit/s, no latency, fifo 50ms uplink queue"


def test_what_a_file_leaves_out_is_named_as_the_default_it_gets(write):
    registry = Registry("networks")
    assert load_network(write("bandwidth: 1gbit\n"), registry).defaults_taken() == \
        ["queue: fair", "loss: 0"]
    assert load_network(write("bandwidth: 1gbit\nsites: {a: {loss: 1%}}\n"),
                        registry).defaults_taken() == ["queue: fair"]
    assert load_network(write("queue: fifo\nloss: 0\n"), registry).defaults_taken() == []
    # the alpha-beta model reads neither
    assert load_network(write("protocol: none\n"), registry).defaults_taken() == []


def test_bad_values_fail_at_load_not_later(write):
    # Unit errors surface from load_network itself, before any topology() call.
    message = error_of(load_network, write("latency: 25mss\n"), Registry("networks"))
    assert ": latency: unknown unit 'mss'" in message


@pytest.mark.parametrize("text, problem", [
    ("sites: 3", "field 'sites' must be dict, got 3"),
    ("queue: 3", "field 'queue' must be str or None, got 3"),
    ("latency: [1]", "field 'latency' must be str or float or None, got [1]"),
    ("links: {between: [a, b]}", "field 'links' must be list"),
    ("bandwdith: 1gbit", "unknown field 'bandwdith'. Did you mean 'bandwidth'?"),
    ("sites: {us: {latency: [1]}}", "sites.us: field 'latency' must be"),
    ("sites: {us: {rank: [0]}}", "sites.us: unknown field 'rank'. Did you mean 'ranks'?"),
    ("sites: {us: {}}\nlinks: [{between: [us, us], bandwith: 1gbit}]",
     "links[0]: unknown field 'bandwith'"),
])
def test_wrong_keys_and_types(write, text, problem):
    path = write(text + "\n")
    message = error_of(load_network, path, Registry("networks"))
    assert message.startswith(f"{path}: ") and problem in message


@pytest.mark.parametrize("text, n, field, problem", [
    ("sites: {us: {}, eu: {}}", 4, "links", "no link between sites 'us' and 'eu'; add one"),
    ("sites: {us: {ranks: [0, 5]}, eu: {}}\nlinks: [{between: [us, eu], bandwidth: 1gbit}]",
     4, "sites.us.ranks", "rank 5 is out of range: this run has 4 ranks"),
    (("sites: {us: {ranks: [0]}, eu: {ranks: [1]}}\n"
      "links: [{between: [us, eu], bandwidth: 1gbit}]"), 4, "sites", "ranks 2, 3 are in no site"),
])
def test_errors_that_depend_on_the_number_of_ranks(write, text, n, field, problem):
    path = write(text + "\n")
    net = load_network(path, Registry("networks"))
    message = error_of(net.topology, n)
    assert message.startswith(f"{path}: {field}: ") and problem in message


def test_no_link_needed_when_a_site_is_empty(write):
    net = load_network(write("sites: {us: {}, eu: {}}\n"), Registry("networks"))
    assert net.topology(1).site_of == [0]


def test_malformed_yaml_names_the_line(write):
    path = write("bandwidth: 1gbit\nlatency: [1\n")
    message = error_of(load_network, path, Registry("networks"))
    assert message.startswith(f"{path}:2: malformed YAML")


def test_unknown_algorithm_against_a_registry(write):
    net = load_network(write("algorithm: {broadcast: butterfly}\n"), Registry("networks"))
    algorithms = Registry("algorithms")
    algorithms.add(Entry(name="ring", target=None, description="", source="exoframe",
                         version="", plugin="p"))
    message = error_of(net.topology, 2, algorithms.names())
    assert ": algorithm.broadcast: unknown collective algorithm 'butterfly'" in message
    assert "Known: ring." in message
    assert NetConfig.from_dict({"algorithm": "ring"}, "x", "x").topology(2, algorithms.names())


def test_an_algorithm_alias_works_in_network_yaml(write):
    """An algorithm a plugin registers with aliases is found by any of its names."""
    import exoframe
    from exoframe.plugins import PluginManager
    from exoframe.sim import resolve_sim
    from exoframe.sim.network.collectives import BUILTIN

    class Plugin:
        @exoframe.hookimpl
        def exoframe_register_algorithms(self, register):
            register("halving", BUILTIN["ring"], aliases=["rabenseifner"])

    pm = PluginManager(load_entry_points=False)
    pm.register(Plugin(), name="halving-plugin", source="tests")
    net = write("bandwidth: 1gbit\nlatency: 1ms\nalgorithm: rabenseifner\n")
    sim = resolve_sim(net, "fixed:1ms", "", 4, pm)
    assert sim.topology.algorithms["all_reduce"] == "rabenseifner"
    assert sim.algorithms["rabenseifner"] is sim.algorithms["halving"] is BUILTIN["ring"]
