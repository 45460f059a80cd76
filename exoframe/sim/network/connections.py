"""TCP connections in the flow model (a network's `protocol:`, tcp.py): each message from
one rank to another goes on their connection, a byte stream, after what was written before
it; its frames and ACKs weigh on the links; its window, from slow start on, caps it."""
from __future__ import annotations

import collections
import math

from .links import Flow, Link


class TcpConnections:
    """The part of FlowNetwork that keeps TCP connections (its `protocol` is set)."""

    def _admit(self, now: float):
        """The messages TCP connections got at this instant, in their order: each goes on
        the wire, or waits for the bytes written before it on its connection."""
        arriving, self._arriving = self._arriving, []
        for flow in sorted(arriving, key=lambda flow: (flow.connection, flow.order)):
            self._as_message(flow)
            waiting = self._streams.get(flow.connection)
            if waiting is not None:
                waiting.append(flow)
            elif flow.remaining > 0:
                self._streams[flow.connection] = collections.deque()
                self._attach(flow, now)
            else:
                self._notice_on_wire(flow, now)

    def _as_message(self, flow: Flow):
        """What a message on its connection draws and weighs, in the connection's order:
        its jitter, its frames, ACKs and window (_as_tcp), the host links it crosses."""
        src, dst = flow.connection
        _, latency, jitter, loss = self._paths[flow.connection]
        if jitter:
            draw = self._jitter_draws(flow.connection).uniform(-jitter, jitter)
            flow.latency = max(0.0, latency + draw)
        if flow.remaining > 0:
            self._as_tcp(flow, src, dst, latency, loss)
            if self.host_out is not None:  # payload bytes: after the TCP weights
                flow.links = (*flow.links, self.host_out[src], self.host_in[dst])

    def _as_tcp(self, flow: Flow, src: int, dst: int, latency: float, loss: float):
        """The flow as a TCP connection (tcp.py): its data links carry data_factor bytes per
        payload byte, the reverse path its ACKs, and a link of its own caps it at
        window / RTT (growing in slow start: _slow_start)."""
        tcp = self.protocol
        reverse = [link for link in self._path(dst, src)[0] if link not in flow.links]
        for link in flow.links:  # (a lost packet is sent again)
            link.weights[flow.id] = tcp.data_factor / (1 - loss)
        for link in reverse:
            link.weights[flow.id] = tcp.ack_factor
        flow.data = len(flow.links)
        window = []
        if latency > 0:
            cap = tcp.rate_cap(latency)
            # random loss holds a connection back from its first loss on: the expected
            # number of packets before it is 1 / loss
            sent = self._packets.get((src, dst), 0.0)
            self._packets[(src, dst)] = sent + flow.remaining / tcp.mss
            if loss > 0:
                if sent * loss >= 1:
                    cap = min(cap, tcp.loss_cap(2 * latency, loss))
                # the packets of its last round trip (lost ones too)
                sent_per_rtt = min(self._payload_rate(flow), cap) / (1 - loss) * 2 * latency
                flow.latency += tcp.recovery_delay(flow.remaining, 2 * latency, loss,
                                                   sent_per_rtt)
            flow.window, flow.rtt, flow.cap = Link(next(self._link_ids), cap), 2 * latency, cap
            window.append(flow.window)
        flow.links = (*flow.links, *reverse, *window)

    def _payload_rate(self, flow: Flow) -> float:
        """The most payload bytes/s the flow's data links could carry it at."""
        return min(link.capacity / link.weights.get(flow.id, 1.0)
                   for link in flow.links[:flow.data])

    def _notice_on_wire(self, flow: Flow, now: float):
        """A message of no payload goes on the wire, behind the bursts in the FIFOs it
        crosses (burst_wait)."""
        flow.latency += sum(burst_wait(link) for link in flow.links if link.fifo_flows)
        self._deliver_after_latency(flow, now)

    def _through_fifos(self, flow: Flow):
        """The flow starts sending through the FIFOs on its path (tcp.py): under a
        loss-based congestion control its window there (tcp.fifo_limit, tcp.sawing) holds it,
        over a round trip that its ACKs' wait behind the other direction's bursts
        lengthens; its own bursts lengthen that of the flows the other way."""
        tcp, data = self.protocol, flow.links[:flow.data]
        limits = []
        for i, link in enumerate(data):
            if link.fifo is not None:
                feed = min((before.capacity for before in data[:i]), default=math.inf)
                limits.append(tcp.fifo_limit(link.fifo, link.capacity, feed,
                                             link.capacity * flow.rtt,
                                             len(link.fifo_flows) + 1))
        if not limits or math.isinf(min(limits)):
            return
        flow.fifo_limit = min(limits)
        window = flow.fifo_limit
        if flow.connection in self._overflowed:
            window = tcp.sawing(window)
        # what else caps its window (the kernel's, random loss) caps its bursts too
        held = flow.cap * flow.rtt * tcp.data_factor if flow.window is not None else math.inf
        flow.fifo_window = min(window, held)
        flow.fifo_burst = min(flow.fifo_window, flow.size * tcp.data_factor)
        for link in data:
            if link.fifo is not None:
                link.fifo_flows[flow.id] = flow
                self._rehold(link)

    def _leave_fifos(self, flow: Flow):
        """The flow's last byte is sent: its bursts no longer hold the flows the other way."""
        for link in flow.links[:flow.data]:
            if link.fifo_flows.pop(flow.id, None) is not None:
                self._rehold(link)

    def _rehold(self, link):
        """The bursts through `link`'s FIFO changed: the windows of the flows whose ACKs
        cross it (those sending the other way) hold them at a new rate."""
        if link is None or link.reverse is None:
            return
        for flow in link.reverse.fifo_flows.values():
            if flow.window is not None:
                self._set_capacity((flow.window, min(flow.ramp_rate, self._window_rate(flow))))

    def _window_rate(self, flow: Flow) -> float:
        """The payload rate its window allows (bytes/s): the kernel's window (and random
        loss's cap) over the round trip, and its window through a FIFO over the round trip
        its ACKs take behind the bursts coming the other way."""
        if not flow.fifo_window:
            return flow.cap
        back = self._path(flow.ends[1], flow.ends[0])[0]
        rtt = flow.rtt + sum(burst_wait(link) for link in back if link.fifo_flows)
        return min(flow.cap, flow.fifo_window / self.protocol.data_factor / rtt)

    def _slow_start(self, flow: Flow, now: float):
        """The flow's pace from what its connection reached (tcp.py), growing every round
        trip until the window or its links hold it."""
        tcp, link = self.protocol, flow.window
        start = flow.start_rate = tcp.start_rate(self._reached.get(flow.connection), now,
                                                 flow.rtt)
        flow.began = now
        final = link.capacity = self._window_rate(flow)
        rates = tcp.ramp(start, flow.rtt, min(final, self._payload_rate(flow)))
        if rates:
            flow.ramp_rate = link.capacity = rates[0]
            self._at_time(now + flow.rtt, self._ramp_step, (flow, [*rates[1:], math.inf]))

    def _ramp_step(self, arg):
        """A round trip of the flow's ramp has passed: its window's next rate (inf: the
        ramp is over), while it is still sending (nothing is left behind once it is
        through)."""
        flow, rates = arg
        if flow.id not in flow.window.flows:
            return
        flow.ramp_rate = rates[0]
        self._set_capacity((flow.window, min(rates[0], self._window_rate(flow))))
        if len(rates) > 1:
            self._at_time(self.env.now + flow.rtt, self._ramp_step, (flow, rates[1:]))

    def _sent(self, flow: Flow, now: float):
        """The flow's last byte is sent: what its connection carries to the next message
        (and whether it burst a FIFO's limit, its window and its message as large: it
        saws from then on)."""
        tcp = self.protocol
        reached = self._reached[flow.connection] = tcp.after(
            self._reached.get(flow.connection), flow.began, now, flow.size, flow.start_rate,
            flow.window.capacity, flow.rtt)
        burst = min(reached.window, flow.size) * tcp.data_factor  # (what it had to send)
        if flow.fifo_limit and burst >= 0.99 * flow.fifo_limit:
            self._overflowed.add(flow.connection)

    def _next_on(self, connection: tuple[int, int], now: float):
        """The connection's last flow has sent its last byte: what waits next goes on the
        wire (messages of no payload at once, delivered one latency later)."""
        waiting = self._streams[connection]
        while waiting and waiting[0].remaining == 0:
            self._notice_on_wire(waiting.popleft(), now)
        if waiting:
            self._attach(waiting.popleft(), now)
        else:
            del self._streams[connection]


def burst_wait(link) -> float:
    """Seconds a packet entering `link`'s FIFO waits behind the bursts of the loss-based
    flows sending through it (tcp.py). Every round trip each sends its window at once,
    faster than the link drains it; what enters one latency after the bursts began (the
    ACKs of the other direction's data, gloo's notices) waits for the rest of them: their
    bursts (a window, or a message smaller than it) over the link's rate, less that
    latency, at most the FIFO's depth."""
    flows = link.fifo_flows.values()
    burst = min(sum(flow.fifo_burst for flow in flows), link.fifo)
    return max(0.0, burst / link.capacity - min(flow.rtt for flow in flows) / 2)
