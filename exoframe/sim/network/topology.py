"""A network resolved for a given number of ranks: what the flow model needs, in SI units.

Bandwidths are bytes per second (math.inf: unlimited), latencies and jitters seconds.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field


FIFO_PACKETS = 1000  # a FIFO's depth when a file gives none: Linux's default txqueuelen


@dataclass(frozen=True)
class Queue:
    """The queue in front of a rank's uplink or of a link between sites (a network file's
    `queue:`). `fair`: pure ACKs and sparse flows go ahead of queued data (a Linux host's
    fq_codel); `fifo`: one first-in first-out queue (a modem's, a router's port,
    pfifo_fast), whose ACKs and small messages wait behind the data queued before them,
    holding `seconds` at the link's rate or `packets` frames (FIFO_PACKETS where neither is
    given)."""
    discipline: str = "fair"
    seconds: float | None = None
    packets: int | None = None

    def capacity(self, rate: float, frame: float) -> float:
        """Bytes a FIFO holds in front of a link of `rate` bytes/s, frames of `frame` bytes."""
        if self.seconds is not None:
            return self.seconds * rate
        return (self.packets or FIFO_PACKETS) * frame

    def describe(self) -> str:
        if self.discipline == "fair":
            return "fair"
        if self.seconds is not None:
            return f"fifo {self.seconds * 1e3:g}ms"
        return f"fifo {self.packets or FIFO_PACKETS} packets"


@dataclass(frozen=True)
class LinkSpec:
    bandwidth: float = math.inf  # bytes/s, one direction
    latency: float = 0.0  # s, one way
    jitter: float = 0.0  # s; each message's latency is drawn uniformly in latency ± jitter
    loss: float = 0.0  # the fraction of packets lost at random on the way (TCP: tcp.py)
    # (time s, bandwidth bytes/s): from each time on, the link's bandwidth (a trace);
    # `bandwidth` holds before the first.
    trace: tuple[tuple[float, float], ...] = ()
    # the queue in front of each direction of a link between sites (a router's port)
    queue: Queue = Queue()


DEFAULT_ALGORITHMS = {"all_reduce": "ring", "all_gather": "ring", "reduce_scatter": "ring",
                      "broadcast": "tree"}
# Over TCP (a network file's `protocol:`), exoframe's real exchanges run on gloo, whose ring
# all-reduce is receiver-driven and keeps two segments in flight (collectives.gloo).
TCP_ALGORITHMS = {**DEFAULT_ALGORITHMS, "all_reduce": "gloo"}


@dataclass
class Topology:
    """uplink[r]/downlink[r]: rank r's NIC in each direction (nic_trace[r]: over time). site_of[r]: index into sites.
    intra[s]: latency/jitter between two ranks of site s. inter[(a, b)]: the directed link
    from site a to site b (bandwidth shared by every flow from a to b, latency, jitter)."""

    uplink: list[float]
    downlink: list[float]
    site_of: list[int]
    sites: list[str] = field(default_factory=lambda: ["default"])
    intra: list[LinkSpec] = field(default_factory=lambda: [LinkSpec()])
    inter: dict[tuple[int, int], LinkSpec] = field(default_factory=dict)
    algorithms: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_ALGORITHMS))
    # nic_trace[r]: rank r's NIC bandwidth over time, both directions, as LinkSpec.trace
    # (empty: none). uplink/downlink hold before its first time.
    nic_trace: list = field(default_factory=list, repr=False)
    # How TCP uses the links (tcp.TcpModel); None: the exact alpha-beta model.
    protocol: object = None
    # uplink_queue[r]: the queue in front of rank r's uplink (empty: every one fair)
    uplink_queue: list = field(default_factory=list)

    @property
    def size(self) -> int:
        return len(self.uplink)

    def queue_of(self, rank: int) -> Queue:
        return self.uplink_queue[rank] if self.uplink_queue else Queue()

    @classmethod
    def uniform(cls, n: int, bandwidth: float = math.inf, latency: float = 0.0,
                jitter: float = 0.0, upload: float | None = None, download: float | None = None,
                algorithms: dict | None = None) -> "Topology":
        return cls(uplink=[bandwidth if upload is None else upload] * n,
                   downlink=[bandwidth if download is None else download] * n,
                   site_of=[0] * n, intra=[LinkSpec(latency=latency, jitter=jitter)],
                   algorithms={**DEFAULT_ALGORITHMS, **(algorithms or {})})

    def bottleneck(self) -> float | None:
        """The slowest link in bytes/s (None if no link is limited): what sweeps plot
        against."""
        links = [*self.uplink, *self.downlink, *(s.bandwidth for s in self.inter.values())]
        slowest = min(links, default=math.inf)
        return None if math.isinf(slowest) else slowest

    def longest_latency(self) -> float:
        """The longest one-way latency of any link, in s: with the bottleneck, what tells
        two networks apart in a report."""
        return max(s.latency for s in [*self.intra, *self.inter.values()])

    def is_ideal(self) -> bool:
        """Unlimited bandwidth and no latency anywhere: every transfer is instantaneous."""
        specs = [*self.intra, *self.inter.values()]
        return (all(math.isinf(b) for b in [*self.uplink, *self.downlink])
                and all(math.isinf(s.bandwidth) and s.latency == 0 and s.jitter == 0
                        for s in specs))


@dataclass(frozen=True)
class Sites:
    """The network as a collective algorithm sees it: the site of each participant. A plan
    function that accepts a `topology` keyword is given one (see collectives.py).

    Indices are the plan's: participant i (0..n-1) is the i-th rank of the group the
    collective runs among (the whole world, or a subgroup). ranks[i]: its global rank.
    site_of[i]: its site, an index into `names`. names: every site of the network in the
    order its YAML lists them (("default",) for a network without sites), so a site may
    hold no participant."""

    ranks: tuple[int, ...]
    site_of: tuple[int, ...]
    names: tuple[str, ...] = ("default",)

    def __post_init__(self):
        if len(self.ranks) != len(self.site_of):
            raise ValueError(f"Sites: {len(self.ranks)} ranks but {len(self.site_of)} "
                             f"site_of entries; give one site per participant.")
        if any(not 0 <= s < len(self.names) for s in self.site_of):
            raise ValueError(f"Sites: site_of {list(self.site_of)} must index names "
                             f"{list(self.names)}.")

    @classmethod
    def of(cls, topology: Topology, participants: Iterable[int]) -> Sites:
        """The view of `participants` (global ranks, in the group's order) on `topology`."""
        ranks = tuple(participants)
        return cls(ranks=ranks, site_of=tuple(topology.site_of[r] for r in ranks),
                   names=tuple(topology.sites))

    @classmethod
    def single(cls, n: int) -> Sites:
        """n participants, ranks 0..n-1, in one site: the view when no network is known."""
        return cls(ranks=tuple(range(n)), site_of=(0,) * n)

    @property
    def n(self) -> int:
        return len(self.ranks)

    def groups(self) -> tuple[tuple[int, ...], ...]:
        """The participant indices in each site that holds any, in site order, each in
        increasing order: ((0, 2, 5), (1, 3, 4)) for sites A = {0, 2, 5}, B = {1, 3, 4}."""
        return tuple(tuple(i for i, s in enumerate(self.site_of) if s == site)
                     for site in sorted(set(self.site_of)))
