"""The simulated clock against a real network stack: each case builds an emulated network
(exoframe/emulation/netns.py: a namespace per rank, links shaped with tc tbf) from a network
description, runs N ranks in it under torchrun with `--net real`, then runs the same config
through the simulator on the very same description, with `--compute fixed:` set to the
compute per step the real run measured, so that only the network differs.

    sudo python benchmarks/emulated_network.py                      # the cases fitted on
    sudo python benchmarks/emulated_network.py --cases held-out     # the cases only checked
    sudo python benchmarks/emulated_network.py --cases star-100mbit --strategies diloco
    sudo python benchmarks/emulated_network.py --cases wan          # a 50 ms round trip
    sudo python benchmarks/emulated_network.py --cases presets      # wan-*, home-broadband
    sudo python benchmarks/emulated_network.py --cases wan-held-out --strategies \
        ddp,diloco,streaming-diloco                                 # round trips and loss

Links with a latency or a loss get the delay line (exoframe/emulation/delayline.c).

The TCP model's measured constants are fitted on the first set (--json, then
benchmarks/fit_tcp_model.py; each row records the twin's tcp model); the held-out set
(other payload sizes, step counts, bandwidths, layouts, CUBIC) checks them, and the last
lines give each set's error apart.

Needs root on Linux (one line otherwise); leaves no namespace, link or process behind, also
when interrupted. The twin's compute per step is the slowest real rank's compute per step
(exoframe/emulation/runner.py says why not its waits too). Columns:
real (the ranks' mean: each rank's clock starts when that rank does) and simulated
wall-clock, and their ratio; comm: the simulated
share of communication in the wall-clock (where it is small, the CPU is the limit, not
the network); per exchange, the ranks' mean measured transfer time, the simulated
communication and their ratio, and the measured wait for peers; tc/payload: the bytes tc
counted on the ranks' shaped uplinks per payload byte the run counted (frames and ACKs:
about 1.06; evaluation would add a model's bytes per step); acks: of those, the ACK-sized
packets the uplinks sent ahead of the data (0 with --host-queue fifo); drops: packets the
shaped queues dropped, retx: segments TCP retransmitted (neither is in the model); same:
the losses and byte counts of the real and simulated runs are equal; load: the machine's
1-minute load average when the case ended.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
from exoframe.errors import ExoframeError  # noqa: E402
from exoframe.sim.clocks.compute import MACHINE_OVERLAP  # noqa: E402
from exoframe.sim.network.tcp import parse_protocol  # noqa: E402
from exoframe.emulation.netns import (OPTION_QUEUES, Counts,  # noqa: E402
                                      EmulationError, EmulationOptions, add_emulation_options,
                                      check_can_emulate, emulation_options, leftovers, sh)
from exoframe.emulation.runner import side_by_side  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
GBIT_NIC = "1gbit"


@dataclass
class Case:
    name: str
    network: dict  # a network YAML (exoframe/netmodels format), without its protocol
    seconds_per_exchange: float  # the all-reduce's size is chosen to take about this long
    held_out: bool = False  # checked only: no model constant was fitted on it
    steps: int | None = None  # None: the strategy's (STRATEGIES)
    # The ranks' TCP congestion control: the model's constants were measured with BBR.
    congestion: str = "bbr"
    hidden: int | None = None  # the MLP's width; None: from seconds_per_exchange
    nodes: int | None = None  # None: --nodes
    group: str | None = None  # a set of its own (--cases GROUP); None: fit or held-out


def wan(latency: str) -> dict:
    return {"description": f"star, 100mbit per link, {latency} one way",
            "bandwidth": "100mbit", "latency": latency}


def star(rate: str) -> dict:
    return {"description": f"star, {rate} per link", "bandwidth": rate}


def two_sites(interleaved: bool, nodes: int) -> dict:
    """1 Gbit/s NICs, 50 Mbit/s between the sites. Contiguous halves: a ring crosses the
    WAN once in each direction; interleaved: every hop crosses it, nodes/2 flows a way."""
    net = {"description": "two sites, 1 Gbit/s NICs, 50 Mbit/s between them",
           "bandwidth": GBIT_NIC, "sites": {"a": {}, "b": {}},
           "links": [{"between": ["a", "b"], "bandwidth": "50mbit"}]}
    if interleaved:
        net["sites"] = {"a": {"ranks": list(range(0, nodes, 2))},
                        "b": {"ranks": list(range(1, nodes, 2))}}
    return net


def asymmetric(up: str, down: str) -> dict:
    return {"description": f"star, {up} up and {down} down per node", "upload": up,
            "download": down}


def uneven_sites(nodes: int) -> dict:
    """All but one node in site a (1 Gbit/s NICs), the last in site b behind a 100 Mbit/s
    NIC, 80 Mbit/s between them: the ring crosses the link once each way, and the slow NIC
    is not the bottleneck. (Two sites at most: the emulation's sites are bridges, and three
    joined in a triangle would loop.)"""
    return {"description": "two uneven sites, 80 Mbit/s between them",
            "bandwidth": GBIT_NIC,
            "sites": {"a": {"ranks": list(range(nodes - 1))},
                      "b": {"ranks": [nodes - 1], "bandwidth": "100mbit"}},
            "links": [{"between": ["a", "b"], "bandwidth": "80mbit"}]}


def wan_star(rate: str, latency: str, loss: str | None = None, **more) -> dict:
    net = {"description": f"star, {rate}, {latency} one way" + (f", {loss} loss" if loss else ""),
           "bandwidth": rate, "latency": latency, **more}
    return {**net, "loss": loss} if loss else net


def wan_sites(latency: str, loss: str | None = None, rate: str = "50mbit",
              port: str | None = None, interleaved: bool = False, **more) -> dict:
    """Two sites of 1 Gbit/s NICs 1 ms apart inside, `rate` and `latency` between, the link's
    port queued as `port` says (None: --port-queue's); interleaved: ranks alternate between
    the sites (every hop of a ring crosses, two flows a way on 4 ranks)."""
    link = {"between": ["a", "b"], "bandwidth": rate, "latency": latency,
            **({"loss": loss} if loss else {}), **({"queue": port} if port else {})}
    sites = {"a": {}, "b": {}}
    if interleaved:
        sites = {"a": {"ranks": [0, 2]}, "b": {"ranks": [1, 3]}}
    return {"description": f"two sites, {rate} and {latency} between"
                           + (f", {port} port" if port else ""),
            "bandwidth": "1gbit", "latency": "1ms", "sites": sites, "links": [link], **more}


def wan_held_out() -> list[Case]:
    """Round trips of 0, 10, 50 and 150 ms, loss of 0, 0.1 % and 1 %, cubic and bbr, fair
    and FIFO uplinks, stars, two sites and asymmetric links: none of the model's constants
    was fitted on them."""
    def case(name, network, seconds, congestion="bbr", nodes=2):
        return Case(name, network, seconds, held_out=True, congestion=congestion,
                    nodes=nodes, group="wan-held-out")
    return [
        case("w-200m-rtt0", wan_star("200mbit", "0ms"), 0.5),
        case("w-50m-rtt10", wan_star("50mbit", "5ms"), 1.0),
        case("w-50m-rtt10-cubic", wan_star("50mbit", "5ms"), 1.0, "cubic"),
        case("w-100m-rtt50-cubic", wan_star("100mbit", "25ms"), 1.0, "cubic"),
        case("w-20m-rtt150", wan_star("20mbit", "75ms"), 1.5),
        case("w-20m-rtt150-cubic", wan_star("20mbit", "75ms"), 1.5, "cubic"),
        case("w-100m-rtt50-loss0.1", wan_star("100mbit", "25ms", "0.1%"), 1.0),
        case("w-100m-rtt50-loss0.1-cubic", wan_star("100mbit", "25ms", "0.1%"), 1.0, "cubic"),
        case("w-50m-rtt50-loss1", wan_star("50mbit", "25ms", "1%"), 1.0),
        case("w-20m-rtt10-loss1-cubic", wan_star("20mbit", "5ms", "1%"), 1.0, "cubic"),
        case("w-asym-rtt30-cubic", {**asymmetric("20mbit", "100mbit"), "latency": "15ms"}, 1.0,
             "cubic"),
        case("w-sites-rtt50", wan_sites("25ms"), 1.0, nodes=4),
        case("w-sites-rtt50-loss0.1-cubic", wan_sites("25ms", "0.1%"), 1.0, "cubic", nodes=4),
        # FIFO uplinks (a modem's queue): ACKs and gloo's notices wait behind data
        case("w-20m-rtt10-fifo", wan_star("20mbit", "5ms", queue="fifo 50ms"), 1.0),
        case("w-20m-rtt10-fifo-cubic", wan_star("20mbit", "5ms", queue="fifo 50ms"), 1.0,
             "cubic"),
        case("w-100m-rtt50-fifo", wan_star("100mbit", "25ms", queue="fifo"), 1.0),
        case("w-sites-rtt50-fifo-cubic", wan_sites("25ms", queue="fifo"), 1.0, "cubic",
             nodes=4),
    ]


def fifo_case(group: str):
    """A maker of `group`'s cases: two sites (wan_sites' keywords), 4 ranks, CUBIC unless
    said, held out."""
    def case(name, seconds=1.0, congestion="cubic", **sites):
        return Case(name, wan_sites(**sites), seconds, held_out=True, congestion=congestion,
                    nodes=4, group=group)
    return case


def fifo_held_out() -> list[Case]:
    """FIFO ports between two sites (a router's drop-tail queue): other rates, round trips,
    depths (in time and in packets), Reno beside CUBIC, two flows a way, and BBR, which
    paces. The model's FIFO terms (tcp.fifo_limit, tcp.sawing, connections.burst_wait) were
    worked out on two sites at 50 Mbit/s and 25 ms behind FIFOs of 20, 50 and 100 ms (ddp,
    CUBIC): none of these cases."""
    case = fifo_case("fifo-held-out")
    return [
        case("f-100m-rtt20-fifo30ms-cubic", latency="10ms", rate="100mbit", port="fifo 30ms"),
        case("f-20m-rtt80-fifo200p-reno", congestion="reno", latency="40ms", rate="20mbit",
             port="fifo 200 packets"),
        case("f-50m-rtt150-fifo40ms-cubic", 1.5, latency="75ms", port="fifo 40ms"),
        case("f-200m-rtt10-fifo10ms-cubic", 0.5, latency="5ms", rate="200mbit",
             port="fifo 10ms"),
        case("f-50m-rtt50-fifo60ms-cubic-2flows", 1.2, latency="25ms", port="fifo 60ms",
             interleaved=True),
        case("f-30m-rtt30-fifo80ms-reno", congestion="reno", latency="15ms", rate="30mbit",
             port="fifo 80ms"),
        case("f-50m-rtt50-fifo30ms-bbr", congestion="bbr", latency="25ms", port="fifo 30ms"),
    ]


def fifo_held_out_2() -> list[Case]:
    """A second set like fifo_held_out, run only after the model's FIFO terms last
    changed (a connection saws only from its first loss on): other rates, round trips and
    depths again."""
    case = fifo_case("fifo-held-out-2")
    return [
        case("g-40m-rtt40-fifo25ms-cubic", latency="20ms", rate="40mbit", port="fifo 25ms"),
        case("g-80m-rtt60-fifo500p-cubic", latency="30ms", rate="80mbit",
             port="fifo 500 packets"),
        case("g-25m-rtt100-fifo120ms-reno", congestion="reno", latency="50ms", rate="25mbit",
             port="fifo 120ms"),
        case("g-150m-rtt30-fifo15ms-cubic", 0.5, latency="15ms", rate="150mbit",
             port="fifo 15ms"),
        case("g-60m-rtt20-fifo40ms-reno-2flows", 1.2, congestion="reno", latency="10ms",
             rate="60mbit", port="fifo 40ms", interleaved=True),
        case("g-50m-rtt80-fifo50ms-cubic", latency="40ms", port="fifo 50ms"),
        case("g-100m-rtt40-fifo20ms-bbr", congestion="bbr", latency="20ms", rate="100mbit",
             port="fifo 20ms"),
    ]


def fifo_held_out_3() -> list[Case]:
    """A third set like fifo_held_out, run only after the model's FIFO terms last changed
    (a message smaller than the window bursts only itself): other rates, round trips and
    depths again."""
    case = fifo_case("fifo-held-out-3")
    return [
        case("h-30m-rtt60-fifo35ms-cubic", latency="30ms", rate="30mbit", port="fifo 35ms"),
        case("h-120m-rtt24-fifo300p-cubic", 0.7, latency="12ms", rate="120mbit",
             port="fifo 300 packets"),
        case("h-40m-rtt120-fifo90ms-reno", congestion="reno", latency="60ms", rate="40mbit",
             port="fifo 90ms"),
        case("h-70m-rtt16-fifo25ms-cubic-2flows", 1.2, latency="8ms", rate="70mbit",
             port="fifo 25ms", interleaved=True),
        case("h-35m-rtt44-fifo60ms-reno", congestion="reno", latency="22ms", rate="35mbit",
             port="fifo 60ms"),
    ]


def preset(name: str) -> dict:
    """A network preset's keys (its protocol is the benchmark's --protocol)."""
    from exoframe.sim.network.presets import PRESET_DIR

    keys = yaml.safe_load((PRESET_DIR / f"{name}.yaml").read_text())
    keys.pop("protocol", None)
    return keys


def cases(nodes: int) -> dict[str, Case]:
    """The cases the TCP model's measured constants (sim/network/tcp.py: segments_per_ack,
    shared_efficiency) were fitted on, and held-out cases that only check it: other payload
    sizes, step counts, bandwidths, layouts and CUBIC beside BBR."""
    return {case.name: case for case in (
        Case("star-20mbit", star("20mbit"), 1.0),
        Case("star-100mbit", star("100mbit"), 1.0),
        Case("star-1gbit", star("1gbit"), 0.12),  # the CPU, not the network, is the limit
        Case("sites-1flow", two_sites(False, nodes), 1.0),
        Case("sites-2flows", two_sites(True, nodes), 1.2),
        Case("sites-2flows-cubic", two_sites(True, nodes), 1.2, congestion="cubic"),
        Case("star-50mbit-big", star("50mbit"), 2.0, held_out=True),
        Case("star-200mbit-small", star("200mbit"), 0.5, held_out=True),
        Case("star-100mbit-cubic", star("100mbit"), 1.0, held_out=True, congestion="cubic"),
        Case("asym-50up-200down", asymmetric("50mbit", "200mbit"), 1.0, held_out=True),
        Case("uneven-sites", uneven_sites(nodes), 1.0, held_out=True),
        Case("sites-2flows-cubic-big", two_sites(True, nodes), 2.0, held_out=True, steps=6,
             congestion="cubic"),
        Case("star-20mbit-8", star("20mbit"), 0.5, held_out=True, steps=8),
        # a 50 ms round trip through the delay line (exoframe/emulation/delayline.c)
        Case("rtt50-1024", wan("25ms"), 0, held_out=True, steps=8, hidden=1024, nodes=2,
             group="wan"),
        Case("rtt50-2048", wan("25ms"), 0, held_out=True, steps=4, hidden=2048, nodes=2,
             group="wan"),
        Case("rtt50-256", wan("25ms"), 0, held_out=True, steps=10, hidden=256, nodes=2,
             group="wan"),
        *wan_held_out(),
        *fifo_held_out(),
        *fifo_held_out_2(),
        *fifo_held_out_3(),
        # the presets users mean, each emulated as its file says (latency, jitter, loss)
        *(Case(name, preset(name), seconds, held_out=True, nodes=2, group="presets")
          for name, seconds in (("wan-100mbps", 1.0), ("wan-10mbps", 2.0),
                                ("wan-1gbps", 0.3), ("home-broadband", 1.0))),
    )}


STRATEGIES = {  # strategy -> (steps, extra arguments)
    "ddp": (4, []),
    "diloco": (4, ["-p", "H=2"]),
    "streaming-diloco": (4, ["-p", "H=2", "-p", "fragments=2"]),
}


class CaseError(Exception):
    """A case that could not run, in one line."""


def case_topology(network: dict, nodes: int):
    from exoframe.sim.network.netconfig import NetConfig

    return NetConfig.from_dict(network, "case", "case").validate().topology(nodes)


def ring_flows_per_site_link(topology, nodes: int) -> int:
    """The most of a ring's flows (rank r to r + 1) that cross one direction of a link
    between sites (0 on a star)."""
    crossings: dict = {}
    for rank in range(nodes):
        hop = (topology.site_of[rank], topology.site_of[(rank + 1) % nodes])
        if hop[0] != hop[1]:
            crossings[hop] = crossings.get(hop, 0) + 1
    return max(crossings.values(), default=0)


def hidden_for(network: dict, nodes: int, seconds: float) -> int:
    """The MLP width whose ring all-reduce takes about `seconds` on the slowest hop."""
    topology = case_topology(network, nodes)
    slowest = topology.bottleneck() / max(1, ring_flows_per_site_link(topology, nodes))
    size = seconds * slowest * nodes / (2 * (nodes - 1))  # bytes of the all-reduce
    hidden = int((-44 + (44 ** 2 + size) ** 0.5) / 2)  # about 4 (h² + 44 h) bytes
    return max(64, hidden // 64 * 64)


def run_args(strategy: str, hidden: int, steps: int, seed: int, extra: list[str]) -> list[str]:
    """Validation at the last step only: a snapshot per rank and step (a model's bytes
    pickled to the launcher) would take the CPUs that the real exchanges' threads need
    (4 ranks on 2 cores), a cost of the machine, not of the network, which the simulator
    leaves out. Its bytes would show in tc/payload if they crossed a shaped link."""
    return ["--workload", "mlp", "-w", f"hidden={hidden}", "--strategy", strategy,
            *STRATEGIES[strategy][1], "--steps", str(steps), "--seed", str(seed),
            "--eval-every", str(steps), "--threads", "1", "--no-progress", *extra]


def per_sync(said: dict, key: str) -> float:
    """The ranks' mean of `key` per exchange."""
    exchanges = sum(kind["calls"] for kind in said["traffic_by_kind_rank0"].values())
    return sum(rank[key] for rank in said["per_rank"]) / len(said["per_rank"]) / exchanges


def run_case(case: Case, strategy: str, nodes: int, seed: int, protocol, workdir: str,
             tag: str, extra: list[str] = (), overlap: str | None = None,
             emulation_as: EmulationOptions = EmulationOptions(),
             algorithm: str | None = None, queue: str | None = None) -> dict:
    """overlap: the twin's compute model's overlap= (what this machine's exchanges move while
    its ranks compute), or None; emulation_as: the emulation's sysctls and queues
    (netns.py); algorithm: the twin's (None: the network file's default); queue: every
    rank's uplink queue, as a network file writes it (None: the case's)."""
    steps = case.steps or STRATEGIES[strategy][0]
    nodes = case.nodes or nodes
    if protocol == "tcp":  # the twin's congestion control: the emulation's
        protocol = {"congestion": case.congestion}
    network = {**case.network, "protocol": protocol,
               **({"algorithm": algorithm} if algorithm else {}),
               **({"queue": queue} if queue else {})}
    if queue and "sites" in network:
        network["sites"] = {name: {key: value for key, value in (site or {}).items()
                                   if key != "queue"}
                            for name, site in network["sites"].items()}
    # a link between sites is a switch's port: queued as --port-queue says, where the case
    # does not say (the twin reads the same file)
    network["links"] = [{"queue": OPTION_QUEUES[emulation_as.port_queue].describe(), **link}
                        for link in network.get("links", [])]
    if not network["links"]:
        del network["links"]
    hidden = case.hidden or hidden_for(case.network, nodes, case.seconds_per_exchange)
    args = run_args(strategy, hidden, steps, seed, list(extra))
    folder = Path(tempfile.mkdtemp(prefix=f"{case.name}-{strategy}-", dir=workdir))
    net_file = folder / "network.yaml"
    net_file.write_text(yaml.safe_dump(network, sort_keys=False))
    try:
        done = side_by_side(net_file, nodes, args, folder, tag, case.congestion,
                            emulation_as, seed, overlap, timeout=300)
    except EmulationError as e:
        raise CaseError(str(e)) from None
    real, twin, counted = done.real, done.twin, done.counts
    payload = sum(real["bytes_sent_per_rank"])
    uplinks = Counts.on_uplinks(counted.sent)
    return {
        "case": f"{case.name} {strategy}", "hidden": hidden, "held_out": case.held_out,
        "real": done.real_seconds, "simulated": done.simulated_seconds,
        "transfer_per_sync": per_sync(real, "transfer_seconds"),
        "wait_per_sync": per_sync(real, "wait_seconds"),
        "sim_comm_per_sync": per_sync(twin, "comm_seconds"),
        "comm_share": 1 - done.compute_per_step * steps / done.simulated_seconds,
        "compute_per_step": done.compute_per_step,
        # what crossed the ranks' shaped uplinks, per byte the run sent
        "tc_per_payload": uplinks,
        "payload": payload,
        # what the uplinks sent ahead of the data (ACK-sized packets), per byte they sent
        "small_share": Counts.on_uplinks(counted.small) / max(1, uplinks),
        # what the model leaves out: packets the shaped queues dropped, and TCP's repairs
        "dropped": sum(counted.dropped.values()), **counted.tcp,
        "same_losses": [r["loss"] for r in done.real_rows] == [r["loss"] for r in done.twin_rows],
        "same_bytes": real["bytes_sent_per_rank"] == twin["bytes_sent_per_rank"],
        # the twin's tcp model (None: protocol none), for benchmarks/fit_tcp_model.py
        "tcp": twin_tcp(protocol),
        "load": os.getloadavg()[0],
    }


def twin_tcp(protocol) -> dict | None:
    model = parse_protocol(protocol, "--protocol")
    return None if model is None else asdict(model)


def median_run(runs: list[dict]) -> dict:
    """Of a case run several times, the run whose real/simulated ratio is the median, with
    every run's ratio and drops beside it (`ratios`, `drops`): one run on a busy 2-core
    machine varies by a few percent, more where its queues drop packets."""
    ordered = sorted(runs, key=lambda r: r["real"] / r["simulated"])
    return {**ordered[(len(ordered) - 1) // 2],
            "ratios": [round(r["real"] / r["simulated"], 4) for r in runs],
            "drops": [r["dropped"] for r in runs]}


def print_table(results: list[dict], errors: bool = True):
    print(f"{'case':30s} {'real s':>7s} {'sim s':>7s} {'ratio':>6s} {'comm':>5s} "
          f"{'xfer/sync':>9s} {'sim/sync':>8s} {'x ratio':>7s} {'wait/sync':>9s} "
          f"{'tc/payload':>10s} {'acks':>6s} {'drops':>5s} {'retx':>5s} {'same':>5s} "
          f"{'load':>5s}")
    for r in results:
        same = "yes" if r["same_losses"] and r["same_bytes"] else "NO"
        print(f"{r['case']:30s} {r['real']:7.2f} {r['simulated']:7.2f} "
              f"{r['real'] / r['simulated']:6.3f} {r['comm_share']:5.0%} "
              f"{r['transfer_per_sync']:9.3f} "
              f"{r['sim_comm_per_sync']:8.3f} "
              f"{r['transfer_per_sync'] / r['sim_comm_per_sync']:7.3f} "
              f"{r['wait_per_sync']:9.3f} {r['tc_per_payload'] / r['payload']:10.4f} "
              f"{r['small_share'] * r['tc_per_payload'] / r['payload']:6.4f} "
              f"{r.get('dropped', '-'):>5} {r.get('retransmitted', '-'):>5} "
              f"{same:>5s} {r['load']:5.2f}{each_run(r)}", flush=True)
    if not errors:
        return
    fitted = [r for r in results if not r.get("held_out")]
    for label, chosen in (("fit cases", fitted),
                          ("fit, network-bound (comm >= 50%)",
                           [r for r in fitted if r["comm_share"] >= 0.5]),
                          ("held-out cases", [r for r in results if r.get("held_out")])):
        if chosen:
            print(f"{label}: {error_line(chosen)}")


def each_run(result: dict) -> str:
    """A median run's note of every run: their ratios, and drops (rows from before the
    drops were counted have none)."""
    if len(result.get("ratios", ())) < 2:
        return ""
    drops = f"; drops {', '.join(map(str, result['drops']))}" if "drops" in result else ""
    return f"  (ratios {', '.join(map(str, result['ratios']))}{drops})"


def error_line(results: list[dict]) -> str:
    return ratios_line([r["real"] / r["simulated"] for r in results])


def ratios_line(ratios: list[float]) -> str:
    """Mean and max |real/simulated - 1|, and how many are on each side."""
    errors = [abs(x - 1) for x in ratios]
    slower = sum(x > 1 for x in ratios)
    return (f"{len(ratios)} runs, mean |real/simulated - 1| = {sum(errors) / len(errors):.3f}, "
            f"max {max(errors):.3f}; real slower in {slower}, faster in "
            f"{len(ratios) - slower}")


def parse_options(names):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="fit",
                        help=f"comma-separated: 'fit' (the default: the cases the model's "
                             f"constants were fitted on), 'held-out' (the cases only checked), or "
                             f"names among {', '.join(names)}")
    # streaming-diloco (add it with --strategies) overlaps its exchanges with compute, and
    # on 2 cores its gloo threads wait for the cores the ranks compute on: a cost of the
    # machine that the network model does not have (docs/guides/network-fidelity.md).
    parser.add_argument("--strategies", default="ddp,diloco")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=1,
                        help="run each case this many times and report the run whose ratio "
                             "is the median (an odd number)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--protocol", default="tcp",
                        help="the twin's protocol: section, in YAML: tcp (default), none "
                             "(the exact alpha-beta model), or e.g. '{shared_efficiency: 0.8}'")
    parser.add_argument("--algorithm",
                        help="the twin's collective algorithm (the network file's algorithm:"
                             "), e.g. ring; left out: the file's default")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--extra", default="",
                        help="more `exoframe run` arguments for every run, e.g. '--threads 2'")
    parser.add_argument("--keep", help="keep the runs' folders in this folder")
    parser.add_argument("--overlap", metavar="BANDWIDTH",
                        help="the twin's compute model's overlap=: what an exchange moves while "
                             "its rank computes (this machine, 4 ranks on 2 cores: "
                             f"{MACHINE_OVERLAP})")
    add_emulation_options(parser)
    return parser.parse_args()


def stop_on_signal(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    options = parse_options(list(cases(4)))
    known = cases(options.nodes)
    groups = {"fit": [n for n, c in known.items() if not c.held_out and not c.group],
              "held-out": [n for n, c in known.items() if c.held_out and not c.group]}
    for name, case in known.items():
        if case.group:
            groups.setdefault(case.group, []).append(name)
    chosen = [name for part in options.cases.split(",") if part.strip()
              for name in groups.get(part.strip(), [part.strip()])]
    strategies = [s.strip() for s in options.strategies.split(",") if s.strip()]
    for name in chosen:
        if name not in known:
            print(f"--cases: unknown case '{name}'; choose among {', '.join(known)}.",
                  file=sys.stderr)
            return 2
    if options.repeat < 1 or options.repeat % 2 == 0:
        print(f"--repeat: give an odd number of runs (1, 3, 5: the median is one of them), "
              f"not {options.repeat}.", file=sys.stderr)
        return 2
    for strategy in strategies:
        if strategy not in STRATEGIES:
            print(f"--strategies: unknown '{strategy}'; choose among "
                  f"{', '.join(STRATEGIES)}.", file=sys.stderr)
            return 2
    protocol = yaml.safe_load(options.protocol)
    try:
        twin_tcp(protocol)
    except ExoframeError as e:
        print(e, file=sys.stderr)
        return 2
    try:
        emulation_as = emulation_options(options)
    except EmulationError as e:
        print(e, file=sys.stderr)
        return 2
    queue = OPTION_QUEUES[options.host_queue].describe() if options.host_queue else None
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, stop_on_signal)
    tag = f"b{os.getpid()}"
    results = []
    try:
        check_can_emulate()
        congestion = sh("sysctl", "-n", "net.ipv4.tcp_congestion_control").strip()
        print(f"{options.nodes} ranks; TCP congestion control: each case's (bbr unless its "
              f"name says cubic; this machine's default: {congestion}); "
              f"uplink queues: {queue or 'as each network says (fair if it does not)'}; "
              f"switch ports: {emulation_as.port_queue}; {os.cpu_count()} CPUs", flush=True)
        with tempfile.TemporaryDirectory(prefix="exoframe-emulated-") as scratch:
            workdir = options.keep or scratch
            Path(workdir).mkdir(parents=True, exist_ok=True)
            for name in chosen:
                for strategy in strategies:
                    started = time.monotonic()
                    runs = [run_case(known[name], strategy, options.nodes, options.seed,
                                     protocol, workdir, tag, shlex.split(options.extra),
                                     options.overlap, emulation_as, options.algorithm,
                                     queue)
                            for _ in range(options.repeat)]
                    results.append(median_run(runs))
                    print_table(results[-1:], errors=False)
                    print(f"  ({time.monotonic() - started:.0f} s)", flush=True)
    except (EmulationError, CaseError) as e:
        print(f"emulated_network: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("emulated_network: interrupted; the emulated network is removed.",
              file=sys.stderr)
        return 130
    finally:
        left = leftovers(tag) if os.geteuid() == 0 else []
        if left:
            print(f"emulated_network: left behind: {', '.join(left)}", file=sys.stderr)
    print()
    print_table(results)
    if options.json:
        Path(options.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
