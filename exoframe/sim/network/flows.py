"""Flow-level network model: links shared max-min fairly, on a simpy clock.

Each rank has an uplink and a downlink; ranks in different sites also cross the directed
inter-site link between their sites. A flow is carried by all the links of its path at once,
at one rate, and is delivered one latency (plus jitter) after its last byte was sent. Under
a protocol (TCP), the flows from one rank to another share one connection, a byte stream:
each sends after the one before it on that connection has sent its last byte.

Rates are the max-min fair allocation (progressive filling, as SimGrid and the textbooks
define it): every flow's rate grows at the same pace; a link saturates when its flows' rates
add up to its capacity, and its flows then keep the rate they reached, which is that link's
"level". A flow held back by a slow link elsewhere therefore leaves the rest of its other
links to the flows beside it.

A rank's host: with `busy_rate` (the compute model's `overlap=`), every flow also crosses a
link out of its sender's host and one into its receiver's, which carry `busy_rate` while
that rank computes (`computing`) and are unlimited otherwise.

Rates change only when a flow starts or finishes, or a link's capacity moves. All changes
at one instant are applied together, once, and only to the connected part of the network
they touch (the links reached from a changed link through shared flows); a flow whose rate
is unchanged keeps its finish time. Collectives whose rounds use disjoint links (rings,
trees) touch a flow or two per change, so their cost grows linearly with flows. One large
shared component (thousands of flows crossing the same links at once) costs a progressive
filling of that component per change: every flow there may get a new rate, which exact
max-min requires.
"""
from __future__ import annotations

import collections
import heapq
import itertools
import math
import random

from .connections import TcpConnections
from .events import Environment
from .links import Flow, Link, RoundTrips
from .topology import Topology


IDLE_HOST = 1e30  # bytes/s of a host link while its rank is not computing: no limit


class FlowNetwork(TcpConnections):
    """Owns every link. `start_flow` at the simulator's current time; `on_delivered(arg)` is
    called at delivery. Event order is deterministic: (time, insertion sequence)."""

    def __init__(self, env: Environment, topology: Topology, seed: int = 0,
                 busy_rate: float | None = None):
        self.env = env
        self.topology = topology
        self.rng = random.Random(seed)
        self.seed = seed
        self._connection_rngs: dict[tuple[int, int], random.Random] = {}
        self.protocol = topology.protocol  # tcp.TcpModel, or None: the exact alpha-beta model
        efficiency = self.protocol.shared_efficiency if self.protocol else 1.0
        self.log: list | None = None  # what happened, for a timeline (Simulator's log)
        self._link_ids = ids = itertools.count()
        # A TCP connection (src, dst) sending -> its flows waiting to send after it
        self._streams: dict[tuple[int, int], collections.deque] = {}
        # A TCP connection -> what it carries to its next message (tcp.Connection)
        self._reached: dict = {}
        self._arriving: list[Flow] = []  # messages on TCP connections, this instant
        self._delivered_until: dict[tuple[int, int], float] = {}  # a connection's last
        self._packets: dict[tuple[int, int], float] = {}  # a TCP connection's, so far
        self._round_trips: dict[tuple[int, int], RoundTrips] = {}  # a TCP connection's
        self._overflowed: set = set()  # TCP connections whose window reached a FIFO's limit
        self.uplinks = [_link_or_none(next(ids), b, efficiency) for b in topology.uplink]
        self.downlinks = [_link_or_none(next(ids), b, efficiency) for b in topology.downlink]
        self.site_links = {pair: _link_or_none(next(ids), spec.bandwidth, efficiency)
                           for pair, spec in topology.inter.items()}
        if self.protocol is not None:
            frame = self.protocol.mtu + self.protocol.link_header
            for (a, b), link in self.site_links.items():
                queue = topology.inter[(a, b)].queue
                if link is not None and queue.discipline == "fifo":
                    link.fifo = queue.capacity(link.capacity, frame)
                    link.reverse = self.site_links.get((b, a))
        self.busy_rate = busy_rate
        self.host_out = self.host_in = None
        if busy_rate is not None:
            self.host_out = [Link(next(ids), IDLE_HOST) for _ in range(topology.size)]
            self.host_in = [Link(next(ids), IDLE_HOST) for _ in range(topology.size)]
        self._paths: dict[tuple[int, int], tuple] = {}
        self._agenda = []  # heap of (time, seq, flow, version); version None: a delivery
        self._seq = itertools.count()
        self._flow_ids = itertools.count()
        self._changed = {}  # link id -> Link whose flows changed since rates were computed
        # Flows slower than every flow that finished since (and none started) keep their rates.
        self._floor = math.inf
        self._armed_at = math.inf  # time of the simpy wake-up currently scheduled
        self.flows_started = 0
        # (site a, site b) -> bytes of the flows from a rank of a to a rank of b, a != b
        self.bytes_between_sites: dict[tuple[int, int], float] = {}
        for pair, spec in topology.inter.items():
            for t, bandwidth in spec.trace:
                self._at_time(t, self._set_capacity, (self.site_links[pair], bandwidth))
        for rank, trace in enumerate(topology.nic_trace):
            for t, bandwidth in trace:
                self._at_time(t, self._set_capacity, (self.uplinks[rank], bandwidth))
                self._at_time(t, self._set_capacity, (self.downlinks[rank], bandwidth))
        self._arm_at(self.next_time())

    # -- public ------------------------------------------------------------------------------
    def start_flow(self, src: int, dst: int, nbytes: float, on_delivered, arg=None,
                   order: tuple | None = None) -> Flow:
        """order: where the message goes among those its TCP connection gets at the same
        instant (a key that does not depend on the order they were started in). Returns the
        flow, whose `sent` and `round_trips` say where its time went once it is delivered."""
        links, latency, jitter, _ = self._paths.get((src, dst)) or self._path(src, dst)
        self.flows_started += 1
        a, b = self.topology.site_of[src], self.topology.site_of[dst]
        if a != b:
            self.bytes_between_sites[(a, b)] = self.bytes_between_sites.get((a, b), 0) + nbytes
        flow = Flow(next(self._flow_ids), links, nbytes, latency, on_delivered, arg)
        flow.ends = (src, dst)
        now = self.env.now
        if links and self.protocol is not None:
            # A TCP connection is one byte stream: a message (a notice of no payload too)
            # goes on the wire after every byte written before it; those written at one
            # instant in their `order` (_admit, once every start of the instant is in).
            flow.connection = (src, dst)
            if order is not None:
                flow.order = order
            flow.stream = self._round_trips.get(flow.connection)
            if flow.stream is None:
                flow.stream = self._round_trips[flow.connection] = RoundTrips()
            flow.round_trips = -flow.stream.at(now)
            self._arriving.append(flow)
            self._arm_at(now)
            return flow
        if jitter:
            flow.latency = max(0.0, latency + self.rng.uniform(-jitter, jitter))
        if nbytes > 0 and self.host_out is not None:
            flow.links = (*flow.links, self.host_out[src], self.host_in[dst])
        if nbytes > 0 and flow.links:
            self._attach(flow, now)
        else:
            self._deliver_after_latency(flow, now)
            self._arm()
        return flow

    def _jitter_draws(self, connection: tuple[int, int]) -> random.Random:
        """A TCP connection's own stream of jitter draws, so that a draw does not depend
        on what other connections sent meanwhile (a run's last step takes the time it takes
        in a longer run)."""
        rng = self._connection_rngs.get(connection)
        if rng is None:
            src, dst = connection
            rng = self._connection_rngs[connection] = random.Random(f"{self.seed}/{src}/{dst}")
        return rng

    def _attach(self, flow: Flow, now: float):
        """The flow starts sending on its links (logged, for a timeline: ("send", src, dst,
        flow id, t, bytes), then ("sent", flow id, t) at its last byte)."""
        if self.log is not None:
            self.log.append(("send", *flow.ends, flow.id, now, flow.size))
        if flow.connection is not None:
            self._through_fifos(flow)
        if flow.window is not None:
            self._slow_start(flow, now)
        flow.since = now
        self._floor = 0.0
        for i, link in enumerate(flow.links):
            link.flows[flow.id] = flow
            link.data_flows += i < flow.data
            self._changed[link.id] = link
        # Rates are computed once every start at this instant is in: wake up now.
        self._arm_at(now)

    def computing(self, rank: int, start: float, end: float):
        """Rank `rank` computes from `start` to `end` (not earlier than now): its host links
        carry `busy_rate` meanwhile. Nothing without `busy_rate`."""
        start = max(start, self.env.now)
        if self.busy_rate is None or end <= start:
            return
        for link in (self.host_out[rank], self.host_in[rank]):
            self._at_time(start, self._set_capacity, (link, self.busy_rate))
            self._at_time(end, self._set_capacity, (link, IDLE_HOST))
        self._arm_at(self.next_time())

    def next_time(self) -> float:
        """Time of the next pending network event (math.inf if none). Flows that started or
        finished make it now: the new rates are computed once, when the simulator steps to
        the wake-up armed at this instant, after every message of the instant is in."""
        if self._changed or self._arriving:
            return self.env.now
        agenda = self._agenda
        while agenda:
            _, _, flow, version = agenda[0]
            if version is None or flow.version == version:
                return agenda[0][0]
            heapq.heappop(agenda)  # a finish time that a later rate change superseded
        return math.inf

    def busy(self) -> bool:
        return self.next_time() < math.inf

    def stalled(self) -> bool:
        """Whether a flow waits on a link that is down with no later trace entry."""
        links = [*self.site_links.values(), *self.uplinks, *self.downlinks]
        return not self.busy() and any(link and link.flows and link.capacity == 0
                                       for link in links)

    def _at_time(self, t: float, callback, arg):
        """callback(arg) at time t, among the deliveries (a flow of no bytes, no links)."""
        heapq.heappush(self._agenda, (t, next(self._seq),
                                      Flow(-1, (), 0.0, 0.0, callback, arg), None))

    def _set_capacity(self, arg):
        link, capacity = arg
        link.capacity = capacity
        if link.flows:
            self._changed[link.id] = link
            self._floor = 0.0  # a link's capacity moved: every rate is recomputed

    # -- paths ---------------------------------------------------------------------------------
    def _path(self, src, dst):
        path = self._paths.get((src, dst))
        if path is None:
            top = self.topology
            links = [self.uplinks[src]]
            a, b = top.site_of[src], top.site_of[dst]
            if a == b:
                spec = top.intra[a]
            else:
                spec = top.inter[(a, b)]
                links.append(self.site_links[(a, b)])
            links.append(self.downlinks[dst])
            path = (tuple(link for link in links if link is not None), spec.latency, spec.jitter,
                    spec.loss)
            self._paths[(src, dst)] = path
        return path

    # -- max-min fair rates ----------------------------------------------------------------------
    def _reallocate(self, now: float):
        """Progressive filling over the links connected to those that changed."""
        changed, self._changed = self._changed, {}
        floor, self._floor = self._floor, math.inf
        # per link: capacity not yet given out, flows without a rate, and the bytes they put
        # on it per payload byte (their count, without a protocol)
        left, unfixed, weight = {}, {}, {}
        pieces = _connected_pieces(changed)
        component = [link for links, _ in pieces for link in links]
        for link in component:
            capacity, count, total = link.usable(), 0, 0.0
            weights = link.weights
            for flow in link.flows.values():
                w = weights.get(flow.id, 1.0) if weights else 1.0
                if flow.rate < floor:
                    capacity -= w * flow.rate
                else:
                    count += 1
                    total += w
            left[link.id], unfixed[link.id], weight[link.id] = capacity, count, total
        fixed = set()
        heap = [(left[link.id] / weight[link.id], link.id, link)
                for link in component if unfixed[link.id]]
        heapq.heapify(heap)
        level = 0.0
        agenda, seq = self._agenda, self._seq
        while heap:
            share, link_id, link = heapq.heappop(heap)
            if unfixed[link_id] == 0 or share != left[link_id] / weight[link_id]:
                continue  # saturated already, or an entry that a later push superseded
            level = max(level, share)  # rounding must not let a level fall below the last
            for flow in link.flows.values():
                if flow.id in fixed or flow.rate < floor:
                    continue
                fixed.add(flow.id)
                for other in flow.links:
                    w = other.weights.get(flow.id, 1.0) if other.weights else 1.0
                    left[other.id] -= w * level
                    unfixed[other.id] -= 1
                    weight[other.id] -= w
                    if unfixed[other.id] and other is not link:
                        heapq.heappush(heap, (left[other.id] / weight[other.id], other.id,
                                              other))
                if flow.rate != level:
                    # max: a flow due to finish right now must not finish in the past
                    flow.remaining = max(0.0, flow.remaining - flow.rate * (now - flow.since))
                    flow.since, flow.rate = now, level
                    # level 0: a link that is down; its trace's next entry reallocates
                    flow.finish = now + flow.remaining / level if level else math.inf
                    flow.version += 1
                if flow.window is not None:  # held by its window: round trips (links.py)
                    flow.stream.hold(link is flow.window, now)
        # The agenda needs only each piece's first finish: any other flow's finish can only
        # change through a reallocation of its piece, which happens at the latest then.
        for _, flows in pieces:
            first = min(flow.finish for flow in flows)
            if first == math.inf:
                continue
            for flow in flows:
                if flow.finish == first:
                    heapq.heappush(agenda, (first, next(seq), flow, flow.version))

    def _transmitted(self, flow: Flow, now: float):
        if self.log is not None:
            self.log.append(("sent", flow.id, now))
        self._floor = min(self._floor, flow.rate)
        flow.version += 1  # any other entry of its finish is void
        for i, link in enumerate(flow.links):
            del link.flows[flow.id]
            if link.weights:
                link.weights.pop(flow.id, None)
                link.data_flows -= i < flow.data
            self._changed[link.id] = link
        self._deliver_after_latency(flow, now)
        if flow.fifo_window:
            self._leave_fifos(flow)
        if flow.window is not None:
            flow.stream.hold(False, now)
            self._sent(flow, now)
        if flow.connection is not None:
            self._next_on(flow.connection, now)

    def _deliver_after_latency(self, flow: Flow, now: float):
        # Delivered through the agenda even without latency: calling back directly would
        # recurse once per hop of a long chain of flows. A TCP connection delivers in order:
        # never before what was sent on it earlier (whatever jitter or repair it drew).
        flow.sent = now
        if flow.stream is not None:  # (its round trips since it started: see links.Flow)
            flow.round_trips += flow.stream.at(now)
        at = now + flow.latency
        if flow.connection is not None:
            at = max(at, self._delivered_until.get(flow.connection, at))
            self._delivered_until[flow.connection] = at
        heapq.heappush(self._agenda, (at, next(self._seq), flow, None))

    # -- the simpy side: one wake-up per distinct event time -------------------------------
    def _arm(self):
        if self._changed:
            self._reallocate(self.env.now)
        self._arm_at(self.next_time())

    def _arm_at(self, when: float):
        if when < self._armed_at:
            self._armed_at = when
            self.env.call_at(when, self._wake)

    def _wake(self, _event):
        now = self.env.now
        if now != self._armed_at:
            return  # superseded by an earlier wake-up that already handled this time
        self._armed_at = math.inf
        agenda, pop = self._agenda, heapq.heappop
        while agenda and agenda[0][0] <= now:
            _, _, flow, version = pop(agenda)
            if version is None:  # a flow's latency has elapsed: delivered
                flow.on_delivered(flow.arg)
            elif version == flow.version:  # its last byte is sent
                self._transmitted(flow, now)
        if self._arriving:
            self._admit(now)
        self._arm()  # computes the new rates first, if any flow started or finished


def _connected_pieces(changed: dict) -> list[tuple[list, list]]:
    """The links reachable from `changed` through shared flows, as connected pieces:
    (links, flows) each."""
    pieces, seen, flows_seen = [], set(), set()
    for start in changed.values():
        if start.id in seen:
            continue
        seen.add(start.id)
        links, flows, stack = [], [], [start]
        while stack:
            link = stack.pop()
            links.append(link)
            for flow in link.flows.values():
                if flow.id not in flows_seen:
                    flows_seen.add(flow.id)
                    flows.append(flow)
                    for other in flow.links:
                        if other.id not in seen:
                            seen.add(other.id)
                            stack.append(other)
        if flows:
            pieces.append((links, flows))
    return pieces


def _link_or_none(id: int, bandwidth: float, shared_efficiency: float = 1.0):
    return None if math.isinf(bandwidth) else Link(id, bandwidth, shared_efficiency)
