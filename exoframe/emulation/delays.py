"""Where the delay line acts so that an emulation has the latencies, jitters and losses a
network file states (exoframe/sim/network/topology.py)."""
from __future__ import annotations

from .delay_line import Direction
from .netns import EmulationError


def delays_for(topology) -> tuple[list, dict]:
    """What the delay line does on each link so that the emulation has the latencies,
    jitters and losses a Topology states (exoframe/sim/network/topology.py). The one-way
    latency between two ranks of a site, its jitter (uniform, as the model's) and its loss
    are on each rank's uplink; a link between sites adds what its own latency and loss leave
    after the sender's uplink, and its own jitter. Returns (access[r] = (up, down),
    inter[(a, b)]) for Emulation; EmulationError where a link between sites is shorter or
    loses less than a sending site's own uplinks already do."""
    access = []
    for rank in range(topology.size):
        spec = topology.intra[topology.site_of[rank]]
        access.append((Direction(delay=spec.latency, jitter=spec.jitter, loss=spec.loss),
                       Direction()))
    inter = {}
    for (a, b), spec in topology.inter.items():
        sender = topology.intra[a]
        names = f"the link from {topology.sites[a]} to {topology.sites[b]}"
        if spec.latency + 1e-12 < sender.latency:
            raise EmulationError(
                f"{names} has {spec.latency * 1e3:g} ms, less than site {topology.sites[a]}'s "
                f"own latency ({sender.latency * 1e3:g} ms): the emulation cannot make that "
                f"path shorter.")
        if spec.loss < sender.loss:
            raise EmulationError(f"{names} loses {spec.loss:g} of its packets, less than "
                                 f"site {topology.sites[a]}'s own {sender.loss:g}: the "
                                 f"emulation cannot lose fewer on that path.")
        delay = max(0.0, spec.latency - sender.latency)
        inter[(a, b)] = Direction(delay=delay, jitter=min(spec.jitter, delay),
                                  loss=1 - (1 - spec.loss) / (1 - sender.loss))
    return access, inter
