"""A network as written in YAML (netmodels/*.yaml), in tc-netem / Mininet vocabulary.

Unit strings ("100mbit", "25ms") stay strings here; `validate()` and `topology()` parse them,
and every error names the file and the field ("net.yaml: sites.us.bandwidth: ...").
"""
from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field, fields
from itertools import combinations
from pathlib import Path

from ...errors import ExoframeError, did_you_mean, shorten
from ...inputs import build_dataclass, load_yaml
from .bandwidth_trace import parse_trace
from .collectives import BUILTIN
from .site_ranks import assign_ranks, check_listed_ranks
from .tcp import parse_protocol
from .topology import DEFAULT_ALGORITHMS, TCP_ALGORITHMS, LinkSpec, Queue, Topology
from .units import (format_bandwidth, format_duration, parse_bandwidth, parse_duration,
                    parse_loss, parse_queue)

BUILTIN_ALGORITHMS = tuple(BUILTIN)

# A bandwidth or duration as written: "100mbit", "25ms", 0, .inf. None: not given.
Unit = str | float | None


@dataclass
class SiteConfig:
    """One site (e.g. a datacenter). Keys left out take the top level's values."""

    ranks: list[int] | None = None  # None: a share of the ranks no site lists
    bandwidth: Unit = None
    upload: Unit = None
    download: Unit = None
    latency: Unit = None  # between two ranks of this site
    jitter: Unit = None
    loss: Unit = None  # packets lost at random between two ranks of this site
    queue: str | None = None  # the queue in front of each of this site's nodes' uplinks
    bandwidth_trace: list | str | None = None  # each node's NIC over time (as a link's)


@dataclass
class LinkConfig:
    """A full-duplex link between two sites; each direction has `bandwidth`."""

    between: list[str] = field(default_factory=list)
    bandwidth: Unit = None  # required
    latency: Unit = None  # None: 0
    jitter: Unit = None
    loss: Unit = None  # packets lost at random on the link; None: 0
    # The queue in front of each direction of the link (a router's port), as the top
    # level's `queue:`; None: fair. exoframe emulate builds it; the simulator times a
    # FIFO as a fair queue (the network guide)
    queue: str | None = None
    # The bandwidth over time: [[time, bandwidth], ...] or a CSV file of time,bandwidth
    # lines (relative to this file's folder); each bandwidth holds from its time on, and
    # 'down' (or 0) stops the link until the next entry.
    bandwidth_trace: list | str | None = None


@dataclass
class NetKeys:
    """The keys of a network YAML file."""

    description: str = ""
    bandwidth: Unit = None  # each node's NIC, each direction; None: unlimited
    upload: Unit = None  # asymmetric overrides of bandwidth
    download: Unit = None
    latency: Unit = None  # one way; None: 0
    jitter: Unit = None  # each message's latency is uniform in latency ± jitter
    loss: Unit = None  # the fraction of packets lost at random (0.001 or '0.1%'); None: 0
    # The queue in front of each node's uplink: fair (pure ACKs and sparse flows first, as a
    # Linux host's fq_codel), fifo (a modem's: ACKs wait behind data), 'fifo 50ms' or
    # 'fifo 100 packets' (its depth; fifo alone: 1000 packets); None: fair. exoframe
    # emulate builds it; the simulator times a FIFO as a fair queue (the network guide)
    queue: str | None = None
    # Each node's NIC bandwidth over time, both directions: [[time, bandwidth], ...] or a
    # CSV file, as a link's (below); `bandwidth`/`upload`/`download` hold before the first.
    bandwidth_trace: list | str | None = None
    algorithm: str | dict | None = None  # one name for every collective, or {collective: name}
    sites: dict[str, SiteConfig] = field(default_factory=dict)
    links: list[LinkConfig] = field(default_factory=list)
    # How TCP uses the links (exoframe/sim/network/tcp.py): tcp (left out: the presets' TCP model),
    # none (the exact alpha-beta model), or a dict of TcpModel's fields, e.g. {window: 64KiB}.
    protocol: str | dict | None = "tcp"


@dataclass
class NetConfig(NetKeys):
    """A loaded network: its YAML keys plus where it came from (for messages)."""

    name: str = ""  # preset name or file stem
    where: str = ""  # file path, or "network 'name'" for a preset given as a dict

    @classmethod
    def from_dict(cls, values: dict, name: str, where: str) -> NetConfig:
        """Check key names and types; units are parsed later, by validate() and topology()."""
        if isinstance(values, dict):
            # `sites:` or `links:` with nothing under it reads as None: the same as leaving it out.
            values = {k: v for k, v in values.items()
                      if not (k in ("sites", "links") and v is None)}
        keys = build_dataclass(NetKeys, values, where, finite=False)
        sites = {str(site): build_dataclass(SiteConfig, {} if raw is None else raw,
                                            f"{where}: sites.{site}", finite=False)
                 for site, raw in keys.sites.items()}
        links = [build_dataclass(LinkConfig, raw, f"{where}: links[{i}]", finite=False)
                 for i, raw in enumerate(keys.links)]
        top = {f.name: getattr(keys, f.name) for f in fields(NetKeys)}
        return cls(**{**top, "sites": sites, "links": links}, name=name, where=where)

    def validate(self, algorithms: Collection[str] | None = None) -> NetConfig:
        """Parse every unit and check sites, links and algorithm names (if `algorithms` is
        given) so that a bad network fails before training. Checks that need the number of
        ranks (ranks out of range, a missing link) are left to topology()."""
        self._endpoint(None)
        self._nic_trace(None)
        self._queue(None)
        for site in self.sites:
            self._endpoint(site)
            self._nic_trace(site)
            self._queue(site)
        self._links()
        check_listed_ranks(self.sites, self._error)
        self._algorithms(algorithms)
        parse_protocol(self.protocol, self.where)
        return self

    def topology(self, n: int,
                 algorithms: Collection[str] | None = BUILTIN_ALGORITHMS) -> Topology:
        """This network resolved for `n` ranks. `algorithms`: the known collective algorithm
        names (None: names are not checked)."""
        if n < 1:
            raise ExoframeError(f"{self.where}: a network needs at least one rank, got {n}.")
        chosen = self._algorithms(algorithms)
        if not self.sites:
            up, down, intra = self._endpoint(None)
            return Topology(uplink=[up] * n, downlink=[down] * n, site_of=[0] * n,
                            intra=[intra], algorithms=chosen,
                            nic_trace=[self._nic_trace(None)] * n,
                            protocol=parse_protocol(self.protocol, self.where),
                            uplink_queue=[self._queue(None)] * n)
        names = list(self.sites)
        endpoints = [self._endpoint(site) for site in names]
        links = self._links()
        check_listed_ranks(self.sites, self._error)
        site_of = assign_ranks(self.sites, n, self._error)
        for a, b in combinations(sorted(set(site_of)), 2):
            if (a, b) not in links:
                raise self._error("links", f"no link between sites '{names[a]}' and "
                                           f"'{names[b]}'; add one under links:.")
        inter = {}
        for (a, b), spec in links.items():
            inter[(a, b)] = inter[(b, a)] = spec
        traces = [self._nic_trace(site) for site in names]
        return Topology(uplink=[endpoints[s][0] for s in site_of],
                        downlink=[endpoints[s][1] for s in site_of], site_of=site_of,
                        sites=names, intra=[intra for _, _, intra in endpoints], inter=inter,
                        algorithms=chosen, nic_trace=[traces[s] for s in site_of],
                        protocol=parse_protocol(self.protocol, self.where),
                        uplink_queue=[self._queue(names[s]) for s in site_of])

    def summary(self) -> str:
        """One line for listings, e.g. '100 Mbit/s, 25 ms ± 2 ms'."""
        if not self.sites:
            up, down, intra = self._endpoint(None)
            return f"{_nic_text(up, down)}, {_delay_text(intra)}{_queue_text(self._queue(None))}"
        names = list(self.sites)
        nics = {_nic_text(up, down) for up, down, _ in map(self._endpoint, names)}
        text = f"{len(names)} sites ({', '.join(names)}): "
        text += f"{nics.pop()} inside" if len(nics) == 1 else "NICs differ by site"
        links = self._links()
        between = {f"{format_bandwidth(s.bandwidth)}, {_delay_text(s)}"
                   + ("" if s.queue.discipline == "fair" else f", {s.queue.describe()} queue")
                   for s in links.values()}
        if len(between) == 1:
            text += f"; {between.pop()} between"
        elif between:
            text += f"; {len(links)} links between"
        return text

    # -- resolution helpers ------------------------------------------------------------------

    def _error(self, path: str, problem: str) -> ExoframeError:
        return ExoframeError(f"{self.where}: {path}: {problem}")

    def _pick(self, site: str | None, *keys: str) -> tuple[Unit, str]:
        """The first value given among site.<key> for each key, then top-level <key> for each
        key, with its field path (for messages)."""
        scopes = ([(self.sites[site], f"sites.{site}.")] if site is not None else []) + [(self, "")]
        for scope, prefix in scopes:
            for key in keys:
                value = getattr(scope, key)
                if value is not None:
                    return value, prefix + key
        return None, keys[0]

    def _endpoint(self, site: str | None) -> tuple[float, float, LinkSpec]:
        """(upload, download, LinkSpec(latency, jitter)) of a site's nodes (None: top level)."""
        up, down = (self._bandwidth(*self._pick(site, direction, "bandwidth"))
                    for direction in ("upload", "download"))
        latency = self._duration(*self._pick(site, "latency"))
        jitter = self._jitter(latency, *self._pick(site, "jitter"))
        loss = self._loss(*self._pick(site, "loss"))
        return up, down, LinkSpec(latency=latency, jitter=jitter, loss=loss)

    def _queue(self, site: str | None) -> Queue:
        """The queue in front of a site's nodes' uplinks (None: top level)."""
        value, path = self._pick(site, "queue")
        return Queue() if value is None else parse_queue(value, path, self.where)

    def defaults_taken(self) -> list[str]:
        """What the file leaves out that the TCP model reads, as 'key: default' (a run's
        summary says it): the queue and the loss, where no scope states them."""
        if parse_protocol(self.protocol, self.where) is None:
            return []
        scopes = [self, *self.sites.values()]
        taken = []
        for key, default in (("queue", Queue().describe()), ("loss", "0")):
            if all(getattr(scope, key) is None for scope in scopes) and \
                    not (key == "loss" and any(link.loss is not None for link in self.links)):
                taken.append(f"{key}: {default}")
        return taken

    def _nic_trace(self, site: str | None) -> tuple:
        """The bandwidth trace of a site's nodes' NICs (None: top level), () if none."""
        value, path = self._pick(site, "bandwidth_trace")
        if value is None:
            return ()
        up, down, _ = self._endpoint(site)
        if math.inf in (up, down):
            raise self._error(path, "a NIC with a bandwidth_trace needs a finite bandwidth "
                                    "(upload and download) until the trace's first time, "
                                    "e.g. bandwidth: 1gbit.")
        return self._trace(value, path)

    def _bandwidth(self, value: Unit, path: str) -> float:
        return parse_bandwidth("inf" if value is None else value, path, self.where)

    def _duration(self, value: Unit, path: str) -> float:
        return parse_duration(0 if value is None else value, path, self.where)

    def _loss(self, value: Unit, path: str) -> float:
        return parse_loss(0 if value is None else value, path, self.where)

    def _jitter(self, latency: float, value: Unit, path: str) -> float:
        jitter = self._duration(value, path)
        if jitter > latency:
            # latency ± jitter would draw negative delays.
            raise self._error(path, f"{format_duration(jitter)} exceeds the latency "
                                    f"{format_duration(latency)}; jitter must be at most the "
                                    f"latency.")
        return jitter

    def _links(self) -> dict[tuple[int, int], LinkSpec]:
        """(site index, site index) in increasing order -> the link's spec."""
        names = list(self.sites)
        specs: dict[tuple[int, int], LinkSpec] = {}
        first: dict[tuple[int, int], int] = {}
        for i, link in enumerate(self.links):
            path = f"links[{i}]"
            ends = link.between
            if len(ends) != 2 or not all(isinstance(end, str) for end in ends):
                raise self._error(f"{path}.between", f"expected two site names like [us, eu], "
                                                     f"got {shorten(ends)}.")
            for end in ends:
                if end not in self.sites:
                    known = (f"Sites: {', '.join(names)}." if names
                             else "No sites are defined; add them under sites:.")
                    raise self._error(f"{path}.between", f"unknown site '{end}'."
                                                         f"{did_you_mean(end, names)} {known}")
            if ends[0] == ends[1]:
                raise self._error(f"{path}.between", f"a link joins two different sites, "
                                                     f"got [{ends[0]}, {ends[1]}].")
            key = tuple(sorted(names.index(end) for end in ends))
            if key in first:
                raise self._error(f"{path}.between", f"a second link between '{ends[0]}' and "
                                                     f"'{ends[1]}' (the first is "
                                                     f"links[{first[key]}]); keep one.")
            first[key] = i
            if link.bandwidth is None:
                raise self._error(f"{path}.bandwidth", "missing; give the link's bandwidth in "
                                                       "each direction, e.g. '1gbit'.")
            latency = self._duration(link.latency, f"{path}.latency")
            if link.bandwidth_trace is not None and \
                    self._bandwidth(link.bandwidth, f"{path}.bandwidth") == math.inf:
                raise self._error(f"{path}.bandwidth", "a link with a bandwidth_trace needs a "
                                                       "finite bandwidth until the trace's "
                                                       "first time, e.g. '1gbit'.")
            specs[key] = LinkSpec(bandwidth=self._bandwidth(link.bandwidth, f"{path}.bandwidth"),
                                  latency=latency,
                                  jitter=self._jitter(latency, link.jitter, f"{path}.jitter"),
                                  loss=self._loss(link.loss, f"{path}.loss"),
                                  trace=self._trace(link.bandwidth_trace,
                                                    f"{path}.bandwidth_trace"),
                                  queue=Queue() if link.queue is None else
                                  parse_queue(link.queue, f"{path}.queue", self.where))
        return specs

    def _trace(self, value: list | str | None, path: str) -> tuple:
        return () if value is None else parse_trace(value, path, self.where)

    def _algorithms(self, algorithms: Collection[str] | None) -> dict[str, str]:
        """The collective -> algorithm mapping for Topology, over the defaults: TCP_ALGORITHMS
        under a TCP protocol (gloo's all-reduce), DEFAULT_ALGORITHMS under `protocol: none`."""
        defaults = DEFAULT_ALGORITHMS if self.protocol == "none" else TCP_ALGORITHMS
        if self.algorithm is None:
            return dict(defaults)
        if isinstance(self.algorithm, str):
            chosen = {kind: (self.algorithm, "algorithm") for kind in DEFAULT_ALGORITHMS}
        else:
            chosen = {}
            for kind, name in self.algorithm.items():
                path = f"algorithm.{kind}"
                if kind not in DEFAULT_ALGORITHMS:
                    raise self._error(path, f"unknown collective '{kind}'."
                                            f"{did_you_mean(kind, DEFAULT_ALGORITHMS)} "
                                            f"Collectives: {', '.join(DEFAULT_ALGORITHMS)}.")
                if not isinstance(name, str):
                    raise self._error(path, f"expected an algorithm name like 'ring', "
                                            f"got {shorten(name)}.")
                chosen[kind] = (name, path)
        if algorithms is not None:
            known = sorted(algorithms)
            for name, path in chosen.values():
                if name not in known:
                    raise self._error(path, f"unknown collective algorithm '{name}'."
                                            f"{did_you_mean(name, known)} "
                                            f"Known: {', '.join(known)}.")
        return {**defaults, **{kind: name for kind, (name, _) in chosen.items()}}


def _nic_text(up: float, down: float) -> str:
    if up == down:
        return format_bandwidth(up)
    return f"up {format_bandwidth(up)} / down {format_bandwidth(down)}"


def _delay_text(spec: LinkSpec) -> str:
    if spec.latency == 0 and spec.jitter == 0 and not spec.loss:
        return "no latency"
    jitter = f" ± {format_duration(spec.jitter)}" if spec.jitter else ""
    loss = f", {spec.loss:.3g} loss" if spec.loss else ""
    return f"{format_duration(spec.latency)}{jitter}{loss}"


def _queue_text(queue: Queue) -> str:
    return "" if queue.discipline == "fair" else f", {queue.describe()} uplink queue"


def _looks_like_path(spec: str) -> bool:
    return "/" in spec or "\\" in spec or spec.endswith((".yaml", ".yml"))


def load_file(path: Path, name: str) -> NetConfig:
    """A network from a YAML file, checked (all but what depends on the number of ranks)."""
    return NetConfig.from_dict(load_yaml(path, "network file"), name=name,
                               where=str(path)).validate()


def load_network(spec: str, registry) -> NetConfig:
    """`spec`: a preset name registered in `registry` (exoframe's registry of network presets:
    registry.get(name) returns an entry with .name, .obj and .source), or a path to a
    .yaml/.yml file."""
    if _looks_like_path(spec):
        path = Path(spec)
        if not path.is_file():
            raise ExoframeError(f"network file '{spec}' not found. Give the path to a .yaml "
                                f"file, or a preset name (see `exoframe nets`).")
        return load_file(path, name=path.stem)
    try:
        entry = registry.get(spec)
    except ExoframeError as e:
        raise ExoframeError(f"{e} A network can also be the path to a .yaml file.") from None
    source = entry.obj
    if isinstance(source, (str, Path)):
        return load_file(Path(source), name=entry.name)
    if isinstance(source, dict):
        return NetConfig.from_dict(source, name=entry.name,
                                   where=f"network '{entry.name}'").validate()
    raise ExoframeError(f"network preset '{entry.name}' (from {entry.source}) is a "
                        f"{type(source).__name__}; a preset must be a path to a YAML file or a "
                        f"dict.")
