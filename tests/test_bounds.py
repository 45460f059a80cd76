"""What bounds a run: the simulator splits each rank's communication into round trips
(latency) and bytes (bandwidth) on the paths that ended its waits, and the report says in
one line per setup which is larger and what a 10× faster link or no latency would save.
Checked against the ring's closed form, 2(n-1)(a + S/(nB)) = 2(n-1)a + 2(n-1)S/(nB), and
against replays on a 10× faster link."""
import math
import re
from pathlib import Path

import pytest

from exoframe.cli import main
from exoframe.config import RunConfig, config_to_dict
from exoframe.engine import execute, job_from_config
from exoframe.experiments.run_replays import replay_run
from exoframe.plugins import get_plugin_manager
from exoframe.sim import resolve_sim
from exoframe.sim.clocks.protocol import Op, Wait
from exoframe.sim.clocks.simulator import Simulator
from exoframe.sim.network.collectives import BUILTIN
from exoframe.sim.network.topology import Topology
from exoframe.sim.traces.replay import replay

N, STEPS, COMPUTE = 4, 4, 0.01  # nodes, steps, seconds of compute per step
PRESETS = {"wan-1gbps": (1e9 / 8, 0.010), "wan-100mbps": (1e8 / 8, 0.025)}  # B, a
LINE = re.compile(r"(?P<kind>latency|bandwidth): (?P<rt>[\d.]+)% of communication is round "
                  r"trips, (?P<bytes>[\d.]+)% bytes \(communication: (?P<comm>[\d.]+)% of the "
                  r"time\); a 10× faster link would save (?P<faster>[\d.]+)% of the simulated "
                  r"time, no latency (?P<none>[\d.]+)%")


def network(folder: Path, name: str, bandwidth: str, latency: str, tcp: bool = False) -> str:
    """A network file: the exact alpha-beta ring (no TCP, no jitter), or TCP without jitter."""
    path = folder / f"{name}.yaml"
    path.write_text(f"bandwidth: {bandwidth}\nlatency: {latency}\n" + (
        "protocol: tcp\n" if tcp else "protocol: none\nalgorithm: ring\n"))
    return str(path)


def close_to(shown: str, exact: float) -> bool:
    """A printed percentage against the exact share: within 1 %, or within half a unit of
    its last digit where rounding to it moves more than that."""
    places = len(shown.split(".")[1]) if "." in shown else 0
    return abs(float(shown) - exact) <= max(0.01 * exact, 0.5 * 10 ** -places)


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    """ddp on 4 nodes (the default gpt: S = 4 × 106,240 bytes a step) on the ring copy of
    wan-1gbps (its bandwidth and latency), replayed through the ring copy of wan-100mbps,
    the presets themselves, and rings 10× faster than each copy."""
    folder = tmp_path_factory.mktemp("bounds")
    rings = {"wan-1gbps": network(folder, "ring-wan-1gbps", "1gbit", "10ms"),
             "wan-100mbps": network(folder, "ring-wan-100mbps", "100mbit", "25ms")}
    faster = {"wan-1gbps": network(folder, "x10-wan-1gbps", "10gbit", "10ms"),
              "wan-100mbps": network(folder, "x10-wan-100mbps", "1gbit", "25ms")}
    config = RunConfig(strategy="ddp", nodes=N, steps=STEPS, net=rings["wan-1gbps"],
                       compute=f"fixed:{COMPUTE * 1000:g}ms", eval_every=STEPS).validate()
    result = execute(job_from_config(config), out=str(folder / "runs"),
                     config_record=config_to_dict(config))
    records = {"ring-wan-1gbps": result.summary,
               "ring-wan-100mbps": replay_run(result.run_dir, rings["wan-100mbps"])}
    for preset in PRESETS:
        records[preset] = replay_run(result.run_dir, preset)
        records[f"x10-{preset}"] = replay_run(result.run_dir, faster[preset], save=False)
    return result, records


def test_ddp_on_a_ring_splits_as_the_closed_form(ddp_run):
    """Each rank's latency is 2(n-1)a a step and its bandwidth 2(n-1)S/(nB), as the
    simulator's clocks add them up (summary.json's per_rank, a replay's), and the run takes
    steps × (compute + 2(n-1)(a + S/(nB))). Every figure here is simulated time under the
    fixed compute model, the same on any machine: none is a wall-clock measurement."""
    result, records = ddp_run
    nbytes = 4 * result.summary["model_parameters"]
    assert result.summary["traffic_by_kind_rank0"].keys() == {"all_reduce"}  # no buffers
    for preset, (bandwidth, latency) in PRESETS.items():
        record = records[f"ring-{preset}"]
        ring = 2 * (N - 1) * (latency + nbytes / (N * bandwidth))
        assert record["simulated_seconds"] == pytest.approx(STEPS * (COMPUTE + ring), rel=1e-9)
        for rank in record["per_rank"]:
            assert rank["idle_seconds"] == pytest.approx(0, abs=1e-12)  # ranks alike
            assert rank["comm_latency_seconds"] == pytest.approx(
                STEPS * 2 * (N - 1) * latency, rel=1e-9)
            assert rank["comm_bandwidth_seconds"] == pytest.approx(
                STEPS * 2 * (N - 1) * nbytes / (N * bandwidth), rel=1e-9)
    assert result.summary["comm_latency_seconds_per_node"] == pytest.approx(
        STEPS * 2 * (N - 1) * 0.010, rel=1e-9)


def test_the_report_says_latency_bounds_ddp_with_the_ring_closed_form(ddp_run, capsys):
    """The report's line for each setup: on the ring copies of wan-1gbps (10 ms) and
    wan-100mbps (25 ms), latency, with the shares of the closed form, and 'a 10× faster link
    would save' what a replay on a 10× faster ring does save; on the presets themselves
    (TCP, gloo's ring), latency too."""
    result, records = ddp_run
    main(["report", str(result.run_dir)])
    lines = {line.split(": ", 1)[0].strip(): line.split(": ", 1)[1]
             for line in capsys.readouterr().out.splitlines() if line.startswith("  ddp on ")}
    nbytes = 4 * result.summary["model_parameters"]
    for preset, (bandwidth, latency) in PRESETS.items():
        rounds = 2 * (N - 1)
        step = COMPUTE + rounds * (latency + nbytes / (N * bandwidth))
        exact = {"rt": 100 * latency / (latency + nbytes / (N * bandwidth)),
                 "comm": 100 * (step - COMPUTE) / step,
                 "faster": 100 * 0.9 * rounds * nbytes / (N * bandwidth) / step,
                 "none": 100 * rounds * latency / step}
        exact["bytes"] = 100 - exact["rt"]
        # (the ring copy and the preset read alike, "1 Gbit/s, 10 ms": by their names)
        ring = LINE.fullmatch(lines[f"ddp on ring-{preset}"])
        assert ring and ring["kind"] == "latency", lines
        for key, value in exact.items():
            assert close_to(ring[key], value), (preset, key, ring[key], value)
        before = records[f"ring-{preset}"]["simulated_seconds"]
        saved = 100 * (before - records[f"x10-{preset}"]["simulated_seconds"]) / before
        assert close_to(ring["faster"], saved)  # as a replay on a 10× faster ring saves
        tcp = LINE.search(lines[f"ddp on {preset}"])
        assert tcp and tcp["kind"] == "latency", lines


def test_ddp_on_the_presets_tcp_pays_gloos_closed_form_of_round_trips_a_step(ddp_run,
                                                                                tmp_path):
    """On the presets' own protocol (TCP, gloo's ring; their jitter left out, so that the
    figures are exact), a step after the first pays gloo's closed form of latency: with P
    segments per rank, 2(n-1)P ring steps, two segments in flight, each pair paying a notice
    and a payload's latency, so 2(n-1)P·a in all. (The first step pays more: slow start on
    new connections, and at 1 Gbit/s the second too, as the windows grow.) The difference of
    a 6-step and a 4-step run is two such steps."""
    from exoframe.sim.network.gloo import gloo_segments_per_rank
    result, _ = ddp_run
    longer = execute(job_from_config(RunConfig(
        strategy="ddp", nodes=N, steps=STEPS + 2, net=network(tmp_path, "ring", "1gbit", "10ms"),
        compute=f"fixed:{COMPUTE * 1000:g}ms", eval_every=STEPS + 2).validate()),
        out=str(tmp_path / "runs"))
    nbytes = 4 * result.summary["model_parameters"]
    segments = gloo_segments_per_rank(N, nbytes)
    assert segments == 2  # (the default gpt's gradients: under a segment a rank)
    for preset, (bandwidth, latency) in PRESETS.items():
        net = network(tmp_path, f"tcp-{preset}", f"{bandwidth * 8 / 1e6:g}mbit",
                      f"{latency * 1000:g}ms", tcp=True)
        six, four = (replay_run(run.run_dir, net, save=False)["per_rank"]
                     for run in (longer, result))
        for a, b in zip(six, four):
            steady = (a["comm_latency_seconds"] - b["comm_latency_seconds"]) / 2
            assert steady == pytest.approx(2 * (N - 1) * segments * latency, rel=0.01), preset
            # round trips are the larger part, as the report's line on the preset says
            assert steady > (a["comm_bandwidth_seconds"] - b["comm_bandwidth_seconds"]) / 2


@pytest.mark.parametrize("wait_at", [0.0, 0.05])
def test_an_all_reduce_waited_late_splits_its_exposed_tail(wait_at):
    """A ring all-reduce started at 0 and waited for at `wait_at`: round k takes S/(nB) of
    bytes, then a of latency; the wait's communication is what is left after `wait_at`,
    split as those pieces fall."""
    n, nbytes, bandwidth, latency = 4, 4e6, 125e6, 0.01
    sim = Simulator(Topology.uniform(n, bandwidth, latency), BUILTIN)
    parts = tuple(range(n))
    for rank in parts:
        sim.receive(rank, Op(0.0, 0, ("c", parts, 0), "all_reduce", nbytes, parts, 0, False))
    for rank in parts:
        sim.receive(rank, Wait(wait_at, 0))
    (reply,) = [r for rank, r in sim.advance() if rank == 0]
    pieces, t = [], 0.0
    for _ in range(2 * (n - 1)):
        sent = t + nbytes / (n * bandwidth)
        pieces += [(t, sent, "b"), (sent, sent + latency, "l")]
        t = sent + latency
    exposed = {kind: sum(max(0.0, end - max(start, wait_at)) for start, end, k in pieces
                         if k == kind) for kind in "lb"}
    assert math.isclose(reply.end, t, rel_tol=1e-12)
    assert math.isclose(reply.latency, exposed["l"], rel_tol=1e-9)
    assert math.isclose(reply.comm - reply.latency, exposed["b"], rel_tol=1e-9)


def test_a_message_held_by_tcp_slow_start_is_round_trips_a_faster_link_does_not_shorten(
        tmp_path):
    """Over TCP a 100 kB message on a cold connection (25 ms one way) is held by its window
    (slow start) all the way: its whole time is round trips, and it takes as long on a link
    10× faster."""
    def send(bandwidth):
        net = network(tmp_path, f"tcp-{bandwidth}", bandwidth, "25ms", tcp=True)
        sim = resolve_sim(net, "measured", "", 2, get_plugin_manager())
        ops = [["o", 0, ["p", 0, 1, 0], kind, 1e5, [0, 1], 0, True] for kind in ("send", "recv")]
        result = replay([[ops[0], ["s", 1]], [ops[1], ["s", 1]]], sim.topology, sim.algorithms)
        return result.ranks[1].stats()

    slow, fast = send("100mbit"), send("1gbit")
    assert slow["comm_seconds"] > 2 * 0.025  # more than one round trip
    assert slow["comm_latency_seconds"] == pytest.approx(slow["comm_seconds"], rel=1e-12)
    assert slow["comm_bandwidth_seconds"] == pytest.approx(0, abs=1e-12)
    assert fast["comm_seconds"] == pytest.approx(slow["comm_seconds"], rel=1e-12)
