"""Flow-level network model: links shared by processor sharing, on a simpy clock.

Each rank has an uplink and a downlink; ranks in different sites also cross the directed
inter-site link between their sites. A link of capacity C carrying n flows serves each at
C/n (equal shares: the max-min fair allocation of one link). A flow is carried by all the
links of its path at once and has been transmitted when its slowest link has carried all
its bytes; it is delivered one latency (plus jitter) later.

Cost grows about linearly with flows: a link keeps a "virtual time" V, the bytes served so
far to each of its flows (dV/dt = C/n), and its flows in a heap keyed by the V at which
each is done. A flow joining or leaving is a heap operation, and a link has one pending
deadline (when its first flow is done); no other flow is touched.

Known approximation: a flow held back elsewhere (by a slower link on its path) keeps its
equal share on its other links; true network-wide max-min would give that share to the
other flows. Times are exact for flows whose links carry only them or equal flows (rings,
uniform topologies, one shared link).
"""
from __future__ import annotations

import heapq
import itertools
import math
import random

import simpy

from .topology import Topology


class Flow:
    __slots__ = ("links_left", "latency", "on_delivered", "arg")

    def __init__(self, links_left, latency, on_delivered, arg):
        self.links_left = links_left
        self.latency = latency
        self.on_delivered = on_delivered
        self.arg = arg


class Link:
    __slots__ = ("capacity", "virtual", "updated", "flows", "generation")

    def __init__(self, capacity: float):
        self.capacity = capacity  # bytes/s
        self.virtual = 0.0  # bytes served to each active flow since the link was last idle
        self.updated = 0.0  # simulated time at which `virtual` was last brought up to date
        self.flows = []  # heap of (virtual finish, seq, flow)
        self.generation = 0  # bumps whenever the link's pending deadline changes


class FlowNetwork:
    """Owns every link. `start_flow` at the simulator's current time; `on_delivered(arg)` is
    called at delivery. Event order is deterministic: (time, insertion sequence)."""

    def __init__(self, env: Environment, topology: Topology, seed: int = 0):
        self.env = env
        self.topology = topology
        self.rng = random.Random(seed)
        self.uplinks = [_link_or_none(b) for b in topology.uplink]
        self.downlinks = [_link_or_none(b) for b in topology.downlink]
        self.site_links = {pair: _link_or_none(spec.bandwidth)
                           for pair, spec in topology.inter.items()}
        self._paths: dict[tuple[int, int], tuple] = {}
        self._agenda = []  # heap of (time, seq, link or None, generation or flow)
        self._seq = itertools.count()
        self._armed_at = math.inf  # time of the simpy wake-up currently scheduled
        self.flows_started = 0

    # -- public ------------------------------------------------------------------------------
    def start_flow(self, src: int, dst: int, nbytes: float, on_delivered, arg=None):
        links, latency, jitter = self._paths.get((src, dst)) or self._path(src, dst)
        if jitter:
            latency = max(0.0, latency + self.rng.uniform(-jitter, jitter))
        self.flows_started += 1
        flow = Flow(0, latency, on_delivered, arg)
        now = self.env.now
        if nbytes > 0:
            for link in links:
                self._join(link, flow, nbytes, now)
        if flow.links_left == 0:
            self._transmitted(flow, now)
        if self._agenda[0][0] < self._armed_at if self._agenda else False:
            self._arm()

    def next_time(self) -> float:
        """Time of the next pending network event (math.inf if none)."""
        agenda = self._agenda
        while agenda:
            _, _, link, generation = agenda[0]
            if link is None or link.generation == generation:
                return agenda[0][0]
            heapq.heappop(agenda)  # a deadline that a later change superseded
        return math.inf

    def busy(self) -> bool:
        return self.next_time() < math.inf

    # -- links ---------------------------------------------------------------------------------
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
            path = (tuple(link for link in links if link is not None), spec.latency, spec.jitter)
            self._paths[(src, dst)] = path
        return path

    def _join(self, link: Link, flow: Flow, nbytes: float, now: float):
        flows = link.flows
        if flows:
            link.virtual += (now - link.updated) * link.capacity / len(flows)
        else:
            link.virtual = 0.0  # restart from zero so that an isolated flow's time is exact
        link.updated = now
        heapq.heappush(flows, (link.virtual + nbytes, next(self._seq), flow))
        flow.links_left += 1
        link.generation += 1
        deadline = now + (flows[0][0] - link.virtual) * len(flows) / link.capacity
        heapq.heappush(self._agenda, (deadline, next(self._seq), link, link.generation))

    def _transmitted(self, flow: Flow, now: float):
        # Delivered through the agenda even without latency: calling back directly would
        # recurse once per hop of a long chain of flows.
        heapq.heappush(self._agenda, (now + flow.latency, next(self._seq), None, flow))

    # -- the simpy side: one wake-up per distinct event time -------------------------------
    def _arm(self):
        when = self.next_time()
        if when < self._armed_at:
            self._armed_at = when
            event = self.env.event()
            event._ok, event._value = True, None
            event.callbacks.append(self._wake)
            self.env.schedule_at(event, simpy.core.NORMAL, when)

    def _wake(self, _event):
        now = self.env.now
        if now != self._armed_at:
            return  # superseded by an earlier wake-up that already handled this time
        self._armed_at = math.inf
        agenda, pop, push, seq = self._agenda, heapq.heappop, heapq.heappush, self._seq
        while agenda and agenda[0][0] <= now:
            _, _, link, item = pop(agenda)
            if link is None:  # a flow's latency has elapsed: delivered
                item.on_delivered(item.arg)
                continue
            if link.generation != item:
                continue  # a deadline that a later change superseded
            # The link's first flow, and any other done at the same virtual time, is carried.
            flows = link.flows
            finish = flows[0][0]
            link.virtual = finish  # where catching up would land, without its rounding drift
            link.updated = now
            done = []
            while flows and flows[0][0] <= finish:
                done.append(pop(flows)[2])
            link.generation += 1
            if flows:
                deadline = now + (flows[0][0] - finish) * len(flows) / link.capacity
                push(agenda, (deadline, next(seq), link, link.generation))
            for flow in done:
                flow.links_left -= 1
                if flow.links_left == 0:
                    self._transmitted(flow, now)
        self._arm()


class Environment(simpy.Environment):
    """simpy's environment, plus scheduling at an absolute time. `now + delay` rounds, and
    events at equal times must compare equal, or events at one instant could swap order."""

    def schedule_at(self, event: simpy.Event, priority, when: float):
        heapq.heappush(self._queue, (when, priority, next(self._eid), event))


def _link_or_none(bandwidth: float):
    return None if math.isinf(bandwidth) else Link(bandwidth)
