"""What the flow model is made of: a flow (a message's bytes on its path) and a link (a
capacity its flows share)."""
from __future__ import annotations

import math


class Flow:
    __slots__ = ("id", "links", "remaining", "rate", "since", "finish", "version", "latency",
                 "on_delivered", "arg", "data", "connection", "window", "rtt", "size",
                 "start_rate", "began", "order", "ends", "sent", "round_trips", "stream",
                 "fifo_window", "fifo_limit", "fifo_burst", "cap", "ramp_rate")

    def __init__(self, id, links, nbytes, latency, on_delivered, arg):
        self.id = id  # creation order: breaks ties deterministically
        self.links = links
        self.remaining = nbytes  # bytes still to send as of `since`
        self.rate = 0.0  # bytes/s
        self.since = 0.0
        self.finish = math.inf  # when its last byte is sent, at its current rate
        self.version = 0  # bumps whenever `finish` changes or the flow is done
        self.latency = latency
        self.on_delivered = on_delivered
        self.arg = arg
        self.data = 0  # under a protocol: its first `data` links carry its data (the rest ACKs)
        self.connection = None  # under a protocol: (src, dst), the TCP connection it is sent on
        self.window = None  # under a protocol, over a round trip: the link its window makes
        self.rtt = 0.0
        self.size = nbytes
        self.start_rate = 0.0  # bytes/s: the pace it started at (slow start, BBR)
        self.began = 0.0  # s: when it started sending
        self.ends = (-1, -1)  # (src, dst) ranks
        # What its time went to (the simulator splits exchanges by it): when its last byte
        # was sent (None until then), and of the time from its start to then, the seconds
        # its TCP connection lost to round trips (RoundTrips: slow start, a window too small
        # for the path), in its own sending and that of the messages it waited behind;
        # `stream`: its connection's RoundTrips
        self.sent = None
        self.round_trips = 0.0
        self.stream = None
        self.order = ((-1,), id, 0)  # among messages a connection gets at one instant: its place
        # through a FIFO, loss-based: the window at which it loses a packet, its window (its
        # mean, once it has) and its bursts (the window, or the message if smaller), in
        # bytes on the wire
        self.fifo_limit = 0.0
        self.fifo_window = 0.0
        self.fifo_burst = 0.0
        self.cap = math.inf  # bytes/s: what its window allows (the kernel's, random loss)
        self.ramp_rate = math.inf  # bytes/s: its slow start's pace so far (inf: done)


class Link:
    __slots__ = ("id", "capacity", "flows", "weights", "data_flows", "shared_efficiency",
                 "fifo", "reverse", "fifo_flows")

    def __init__(self, id: int, capacity: float, shared_efficiency: float = 1.0):
        self.id = id
        self.capacity = capacity  # bytes/s
        self.flows = {}  # flow id -> Flow, in creation order (dicts iterate deterministically)
        # Under a protocol (tcp.py): flow id -> bytes on this link per payload byte, for the
        # flows that do not take exactly 1 (no entry: 1); how many flows send data over it.
        self.weights = {}
        self.data_flows = 0
        self.shared_efficiency = shared_efficiency
        # A FIFO in front of it (tcp.py): its depth in bytes (None: a fair queue), the link
        # the other way (its ACKs and notices), and the loss-based flows sending through it
        # (flow id -> Flow), whose bursts the packets behind them wait for (connections.py)
        self.fifo = None
        self.reverse = None
        self.fifo_flows = {}

    def usable(self) -> float:
        """The capacity its flows share: less when several TCP flows send through it."""
        if self.data_flows >= 2 and self.shared_efficiency != 1.0:
            return self.capacity * self.shared_efficiency
        return self.capacity


class RoundTrips:
    """The seconds a TCP connection's window, not a link, has held its rate so far: round
    trips (slow start, a window too small for the path), which a faster link would not
    shorten."""

    __slots__ = ("seconds", "since")

    def __init__(self):
        self.seconds = 0.0
        self.since = None  # when its window began to hold it, while it does

    def hold(self, by_window: bool, now: float):
        """From `now` on its window holds it (or a link does)."""
        if self.since is not None:
            self.seconds += now - self.since
        self.since = now if by_window else None

    def at(self, now: float) -> float:
        return self.seconds + (now - self.since if self.since is not None else 0.0)
