"""TCP connections in the flow model (a network's `protocol:`, tcp.py): each message from
one rank to another goes on their connection, a byte stream, after what was written before
it; its frames and ACKs weigh on the links; its window, from slow start on, caps it."""
from __future__ import annotations

import collections

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
                self._deliver_after_latency(flow, now)

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
            flow.window, flow.rtt = Link(next(self._link_ids), cap), 2 * latency
            window.append(flow.window)
        flow.links = (*flow.links, *reverse, *window)

    def _payload_rate(self, flow: Flow) -> float:
        """The most payload bytes/s the flow's data links could carry it at."""
        return min(link.capacity / link.weights.get(flow.id, 1.0)
                   for link in flow.links[:flow.data])

    def _slow_start(self, flow: Flow, now: float):
        """The flow's pace from what its connection reached (tcp.py), growing every round
        trip until the window or its links hold it."""
        tcp, link = self.protocol, flow.window
        start = flow.start_rate = tcp.start_rate(self._reached.get(flow.connection), now,
                                                 flow.rtt)
        flow.began = now
        final = link.capacity
        rates = tcp.ramp(start, flow.rtt, min(final, self._payload_rate(flow)))
        if rates:
            link.capacity = rates[0]
            self._at_time(now + flow.rtt, self._ramp_step, (flow, [*rates[1:], final]))

    def _ramp_step(self, arg):
        """A round trip of the flow's ramp has passed: its window's next rate, while it is
        still sending (nothing is left behind once it is through)."""
        flow, rates = arg
        if flow.id not in flow.window.flows:
            return
        self._set_capacity((flow.window, rates[0]))
        if len(rates) > 1:
            self._at_time(self.env.now + flow.rtt, self._ramp_step, (flow, rates[1:]))

    def _sent(self, flow: Flow, now: float):
        """The flow's last byte is sent: what its connection carries to the next message."""
        self._reached[flow.connection] = self.protocol.after(
            self._reached.get(flow.connection), flow.began, now, flow.size, flow.start_rate,
            flow.window.capacity, flow.rtt)

    def _next_on(self, connection: tuple[int, int], now: float):
        """The connection's last flow has sent its last byte: what waits next goes on the
        wire (messages of no payload at once, delivered one latency later)."""
        waiting = self._streams[connection]
        while waiting and waiting[0].remaining == 0:
            self._deliver_after_latency(waiting.popleft(), now)
        if waiting:
            self._attach(waiting.popleft(), now)
        else:
            del self._streams[connection]
