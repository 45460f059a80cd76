"""Everything a run needs from the simulator side, resolved before any rank starts."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ExoframeError
from .clocks.compute import ComputeModel, Stragglers, parse_compute, parse_stragglers
from .network.collectives import plan_for
from .network.netconfig import load_network
from .network.topology import Sites, Topology


# `--net real`: no simulator; the ranks' exchanges take the time they take (measured.RealClock).
REAL = "real"


@dataclass(frozen=True)
class SimSetup:
    net: str  # preset name or file stem
    topology: Topology
    algorithms: dict  # name -> plan function, every registered algorithm
    compute: ComputeModel
    stragglers: Stragglers
    real: bool = False  # --net real: measured time, no simulated network
    # what the network file left out that the model reads, as 'key: default' (its summary)
    defaults: tuple[str, ...] = ()


def resolve_sim(net: str, compute: str, stragglers: str, nodes: int, pm) -> SimSetup:
    """net: preset name, YAML path or "real"; compute and stragglers: the spec strings of
    exoframe.sim.clocks.compute. pm: the plugin manager (network presets and algorithms)."""
    # Aliases too: a network file may name an algorithm by any name it was registered under.
    algorithms = {name: entry.obj for entry in pm.algorithms
                  for name in (entry.name, *entry.aliases)}
    if net == REAL:
        if compute != "measured":
            raise ExoframeError(f"compute: '{compute}' is a model of the simulated clock; with "
                                "--net real times are measured: drop --compute.")
        if stragglers:
            raise ExoframeError("stragglers: they slow the simulated clock; with --net real "
                                "nothing is simulated: drop --stragglers.")
        # Bytes are still counted per operation as ring, tree, ... would move them.
        name, topology, defaults = REAL, Topology.uniform(nodes), ()
    else:
        network = load_network(net, pm.networks)
        topology = network.topology(nodes, algorithms)
        # Two participants: ranks 0 and 1 (two in one site for a single rank).
        pair = Sites.of(topology, (0, 1)) if topology.size >= 2 else Sites.single(2)
        for kind, algorithm in topology.algorithms.items():
            try:
                plan_for(algorithms[algorithm], kind, 2, 0, pair)
            except ValueError:
                raise ExoframeError(f"{network.where}: algorithm: '{algorithm}' does not "
                                    f"implement {kind}; choose another for it, e.g. "
                                    f"algorithm: {{{kind}: ring}}.") from None
        name, defaults = network.name, tuple(network.defaults_taken())
    # Each text parsed here once (engine/plan/resolve.py calls this for a run's Job).
    parsed = parse_stragglers(stragglers)
    parsed.check_ranks(nodes)
    return SimSetup(net=name, topology=topology, algorithms=algorithms,
                    compute=parse_compute(compute), stragglers=parsed, real=net == REAL,
                    defaults=defaults)
