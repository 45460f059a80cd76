"""Where the delay line acts so that an emulation has the latencies, jitters and losses a
network file states (exoframe/sim/network/topology.py)."""
from __future__ import annotations

from .delay_line import Direction
from .netns import EmulationError


def delays_for(topology) -> tuple[list, dict]:
    """What the delay line does on each link so that the emulation has the latencies a
    Topology states (exoframe/sim/network/topology.py): the one-way latency between two
    ranks of a site is split evenly between their links (the jitter, uniform, on the
    sender's half alone, so that the sum is uniform as the model's), and a link between sites
    adds what its latency leaves after the two sites' halves. Returns (access[r] = (up,
    down), inter[(a, b)]) for Emulation; EmulationError where a link between sites is
    shorter than its sites' own latencies."""
    access = []
    for rank in range(topology.size):
        spec = topology.intra[topology.site_of[rank]]
        half = spec.latency / 2
        access.append((Direction(delay=half, jitter=min(spec.jitter, half), loss=spec.loss),
                       Direction(delay=half)))
    inter = {}
    for (a, b), spec in topology.inter.items():
        inside = (topology.intra[a].latency + topology.intra[b].latency) / 2
        names = f"the link from {topology.sites[a]} to {topology.sites[b]}"
        if spec.latency + 1e-12 < inside:
            raise EmulationError(
                f"{names} has {spec.latency * 1e3:g} ms, less than its sites' own halves "
                f"({inside * 1e3:g} ms): the emulation cannot make that path shorter.")
        sender_loss = topology.intra[a].loss  # on the sender's uplink already
        if spec.loss < sender_loss:
            raise EmulationError(f"{names} loses {spec.loss:g} of its packets, less than "
                                 f"site {topology.sites[a]}'s own {sender_loss:g}: the "
                                 f"emulation cannot lose fewer on that path.")
        inter[(a, b)] = Direction(delay=max(0.0, spec.latency - inside), jitter=spec.jitter,
                                  loss=1 - (1 - spec.loss) / (1 - sender_loss))
    return access, inter
