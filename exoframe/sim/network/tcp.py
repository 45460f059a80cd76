"""How TCP uses the links (a network YAML's `protocol:` section): what the flow model needs
to move payload bytes as a TCP connection does, beyond the exact alpha-beta model.

- Wire overhead: a segment of `mss` = mtu - ip_tcp_header payload bytes travels in a frame
  of mtu + link_header bytes; a link of bandwidth B carries B / data_factor payload.
- ACKs: every `segments_per_ack` segments the receiver sends a pure ACK (link_header +
  ip_tcp_header bytes) the other way, over the reverse path, which the flows going that
  way share.
- Several flows through one link: a link that carries two or more data flows at once
  gives them `shared_efficiency` of its bandwidth. TCP flows do not split a bottleneck
  evenly over short times; the exchanges of a collective wait for their slowest flow, so
  the link is used less than max-min's full share (docs/guides/network-fidelity.md, "How
  close is the simulated clock to a real network?", has the measurements).
- The window: a flow sends at most `window` bytes per round trip (2 × the path's one-way
  latency), so its rate is at most window / RTT.
- Random loss (a network's `loss:`): every lost packet is sent again; a message whose
  last window lost one ends a round trip later, as expected over the draws
  (recovery_delay); from a connection's first expected loss on (after 1 / loss packets),
  a loss-based congestion control (cubic, reno) holds its flows to the rate its response
  function allows (loss_cap: Padhye et al.'s, with its timeouts).
- A FIFO in front of a link between sites (a link's `queue: fifo`, a router's port) under
  a loss-based congestion control (cubic, reno): the queue, not the kernel, decides the
  window. A message starts as a burst of its window at the rate of the links before the port
  (a rank's NIC); a burst larger than the queue absorbs, depth / (1 - rate / feed),
  overflows it, as does a window larger than the path's bandwidth x RTT plus the depth
  (fifo_limit). From the connection's first such loss on (a message at least as large as
  that, burst whole), the window saws between that and `backoff` of it, (1 + backoff) / 2 of
  it on average (sawing); before it, the window grows up to it. A message smaller than the
  window bursts only its own bytes. Every round trip each flow sends its window as a burst,
  and what enters the port one latency later waits behind the rest: the ACKs of the other
  direction's data (their flow's window holds it over the longer round trip) and messages of
  no payload (gloo's notices) — connections.burst_wait. BBR paces and sends no such bursts;
  a fair queue (fq_codel, a host's own) puts ACKs and sparse packets first; a rank's uplink
  is its host's own queue, which TCP small queues keep from filling, so `queue: fifo` on an
  uplink changes no time.
- Slow start: a connection's window starts at `initial_window` segments and doubles every
  round trip until the flow is held by the window above or by the links. A connection keeps
  the window it reached for its next message, except after an idle time longer than its
  retransmission timeout (RTT + min_rto) under a loss-based congestion control (cubic,
  reno): with `slow_start_after_idle` (Linux's default), the window is halved for every
  timeout it idled, down to the initial window. BBR is exempt: it paces at 2.885 times
  the bandwidth it measured (the largest delivery rate of a burst of messages, over its
  duration and a round trip), which small messages with pauses between them keep low,
  and doubles that rate every round trip while a message lasts.

The defaults are Linux's (MTU 1500, timestamps on) and the measurements on tc-shaped veth
links in docs/guides/network-fidelity.md. Bandwidths are as tc counts them (Ethernet
header, no preamble or FCS): for a physical Ethernet link add 24 bytes to link_header.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

from ...errors import ExoframeError

_SIZES = {"b": 1, "kb": 1e3, "mb": 1e6, "kib": 2 ** 10, "mib": 2 ** 20}
CONGESTION_CONTROLS = ("cubic", "bbr", "reno")
# the window a loss leaves, a fraction of the one before: CUBIC's beta (RFC 9438), Reno's
BACKOFF = {"cubic": 0.7, "reno": 0.5}
BBR_GAIN = 2 / math.log(2)  # BBR's start-up pacing gain (2.885)


@dataclass(frozen=True)
class Connection:
    """What a TCP connection carries from one message to the next (TcpModel.after)."""
    window: float  # bytes: the congestion window it reached
    last_sent: float  # s: when its last message sent its last byte
    bandwidth: float  # bytes/s: BBR's estimate, the largest delivery rate it measured
    burst_start: float  # s: since when it has been sending without a pause
    burst: float  # bytes sent since then


@dataclass(frozen=True)
class TcpModel:
    mtu: int = 1500  # bytes of an IP packet at most
    ip_tcp_header: int = 52  # IPv4 20 + TCP 20 + timestamps 12
    link_header: int = 14  # Ethernet, as tc counts a frame
    segments_per_ack: float = 2.5  # delayed ACKs, merged further by GRO (fitted: the guide)
    window: float = 4 * 2 ** 20  # bytes in flight per flow (Linux's tcp_wmem maximum)
    shared_efficiency: float = 0.92  # a link's share two or more flows get (fitted: the guide)
    initial_window: int = 10  # segments a new connection sends in its first round trip
    congestion: str = "cubic"  # congestion control: cubic (Linux's default), bbr or reno
    slow_start_after_idle: bool = True  # net.ipv4.tcp_slow_start_after_idle
    min_rto: float = 0.2  # s: the retransmission timeout is the round trip + this (Linux)

    @property
    def mss(self) -> int:
        return self.mtu - self.ip_tcp_header

    @property
    def data_factor(self) -> float:
        """Bytes on the link per payload byte."""
        return (self.mtu + self.link_header) / self.mss

    @property
    def ack_factor(self) -> float:
        """ACK bytes on the reverse path per payload byte."""
        return (self.link_header + self.ip_tcp_header) / (self.segments_per_ack * self.mss)

    def rate_cap(self, one_way_latency: float) -> float:
        """A flow's payload rate at most (bytes/s): window / round trip."""
        return self.window / (2 * one_way_latency) if one_way_latency > 0 else float("inf")

    def loss_cap(self, rtt: float, loss: float) -> float:
        """A flow's payload rate at most (bytes/s) where packets are lost at random with
        rate `loss`: Padhye et al.'s response function of a loss-based flow (SIGCOMM 1998),
        timeouts included: one packet per RTT / W + T0 min(1, 3 sqrt(3p / 8)) p (1 + 32 p^2)
        seconds, with W Reno's mean window sqrt(3 / (2p)) segments (Linux grows its window
        by every segment acknowledged: b = 1) or, under CUBIC, the larger of that and its
        cubic window (C (3 + b) / (4 (1 - b)))^(1/4) (RTT / p)^(3/4), C = 0.4, b = 0.7
        (RFC 9438), and T0 the retransmission timeout, RTT + min_rto. BBR does not slow
        down for random loss."""
        if loss <= 0 or rtt <= 0 or self.congestion == "bbr":
            return math.inf
        window = math.sqrt(3 / (2 * loss))
        if self.congestion == "cubic":
            b = BACKOFF["cubic"]
            window = max(window, (0.4 * (3 + b) / (4 * (1 - b))) ** 0.25 * (rtt / loss) ** 0.75)
        timeouts = (rtt + self.min_rto) * min(1.0, 3 * math.sqrt(3 * loss / 8)) * loss * (
            1 + 32 * loss ** 2)
        return self.mss / (rtt / window + timeouts)

    def fifo_limit(self, depth: float, rate: float, feed: float, pipe: float,
                   flows: int) -> float:
        """The window (bytes on the wire) at which a loss-based flow, one of `flows` sending
        through a FIFO of `depth` bytes in front of a link of `rate` bytes/s fed at `feed`
        bytes/s, whose path holds `pipe` bytes in flight (its bandwidth x round trip),
        loses a packet; inf under BBR. A burst of the window overflows the queue past
        depth / (1 - rate / feed), and the window itself past pipe + depth, whichever is
        smaller, shared by the flows."""
        if self.congestion not in BACKOFF:
            return math.inf
        burst = depth / (1 - rate / feed) if feed > rate else math.inf
        return min(burst, pipe + depth) / max(1, flows)

    def sawing(self, limit: float) -> float:
        """The mean window of a flow that loses a packet whenever its window reaches `limit`
        and then falls to `backoff` of it: (1 + backoff) / 2 of it."""
        return (1 + BACKOFF[self.congestion]) / 2 * limit

    def recovery_delay(self, size: float, rtt: float, loss: float, bdp: float) -> float:
        """The expected time a message's end waits for a lost packet to be sent again: a
        loss among its last window of packets (the path's bandwidth x RTT, or the whole
        message) is repaired a round trip later (fast retransmit, or RACK's probe at the
        tail); a loss before that is repaired while the rest is still sent."""
        if loss <= 0 or rtt <= 0:
            return 0.0
        return (1 - (1 - loss) ** (min(size, bdp) / self.mss)) * rtt

    def start_rate(self, state: "Connection | None", now: float, rtt: float) -> float:
        """The payload rate (bytes/s) a message starts at on a connection in `state` (None:
        new): a loss-based congestion control's window over the round trip; BBR paces at
        BBR_GAIN times the bandwidth it has measured (its start-up pace, which it keeps
        while the application sends less than the path could carry), one window of
        initial_window segments per round trip at first."""
        initial = self.initial_window * self.mss / rtt
        if state is None:
            return initial
        if self.congestion == "bbr":
            return max(initial, BBR_GAIN * state.bandwidth)
        return self.start_window(state.window, now - state.last_sent, rtt) / rtt

    def after(self, state: "Connection | None", began: float, now: float, size: float,
              start_rate: float, reached_rate: float, rtt: float) -> "Connection":
        """The connection once a message of `size` bytes that began at `began` at
        `start_rate` and reached `reached_rate` has sent its last byte at `now`. Slow start
        grew the window by every byte acknowledged (or the rate reached held it); BBR's
        bandwidth sample is what the connection delivered since it last was idle, over that
        time and one round trip (the first sent byte's acknowledgement)."""
        window = min(self.window, max(start_rate * rtt + size, reached_rate * rtt))
        burst_start, burst = began, size
        if state is not None and began <= state.last_sent:  # sent right behind the last
            burst_start, burst = state.burst_start, state.burst + size
        sample = burst / (now - burst_start + rtt)
        bandwidth = max(sample, state.bandwidth if state is not None else 0.0)
        return Connection(window, now, bandwidth, burst_start, burst)

    def start_window(self, previous: float | None, idle: float, rtt: float) -> float:
        """The window (payload bytes) a message starts with on a connection that reached
        `previous` (None: a new connection) and then idled `idle` seconds."""
        initial = self.initial_window * self.mss
        if previous is None:
            return initial
        if self.slow_start_after_idle and self.congestion != "bbr":
            timeouts = int(idle // (rtt + self.min_rto))
            if timeouts:
                return max(initial, previous / 2 ** min(timeouts, 64))
        return previous

    def ramp(self, start: float, rtt: float, ceiling: float) -> list[float]:
        """The payload rates (bytes/s) a flow may reach in successive round trips from
        `start` (bytes/s), below `ceiling` (where it stops: the links or the window hold it
        from then on); [] where it starts there already. Slow start doubles the window
        every round trip; BBR's start-up multiplies its pace by BBR_GAIN."""
        rates, rate = [], start
        while rate < ceiling:
            rates.append(rate)
            rate *= 2
        return rates

    def describe(self) -> str:
        return (f"TCP, MTU {self.mtu}: {self.data_factor:.4f} bytes per payload byte "
                f"+ {self.ack_factor:.4f} of ACKs back; window {self.window / 2 ** 10:g} KiB")


def parse_protocol(value, where: str) -> TcpModel | None:
    """`protocol:` as written: none (the exact alpha-beta model), tcp (NetKeys' default), or
    a dict of TcpModel's fields."""
    if value == "none":
        return None
    if value == "tcp":
        return TcpModel()
    if not isinstance(value, dict):
        raise ExoframeError(f"{where}: protocol: expected none, tcp or a dict like "
                            f"{{window: 64KiB}}, got {value!r}.")
    known = {f.name for f in fields(TcpModel)}
    values = {}
    for key, raw in value.items():
        if key not in known:
            raise ExoframeError(f"{where}: protocol.{key}: unknown key; keys: "
                                f"{', '.join(sorted(known))}.")
        if key == "congestion":
            if raw not in CONGESTION_CONTROLS:
                raise ExoframeError(f"{where}: protocol.congestion: expected one of "
                                    f"{', '.join(CONGESTION_CONTROLS)}, got {raw!r}.")
            values[key] = raw
            continue
        if key == "slow_start_after_idle":
            if not isinstance(raw, bool):
                raise ExoframeError(f"{where}: protocol.slow_start_after_idle: expected true "
                                    f"or false, got {raw!r}.")
            values[key] = raw
            continue
        number = _size(raw) if key == "window" else raw
        if isinstance(number, bool) or not isinstance(number, (int, float)) or not number > 0:
            raise ExoframeError(f"{where}: protocol.{key}: expected a positive number, "
                                f"got {raw!r}.")
        values[key] = number
    model = TcpModel(**values)
    if model.mss <= 0:
        raise ExoframeError(f"{where}: protocol.mtu: {model.mtu} leaves no payload after "
                            f"{model.ip_tcp_header} header bytes.")
    if model.shared_efficiency > 1:
        raise ExoframeError(f"{where}: protocol.shared_efficiency: at most 1, got "
                            f"{model.shared_efficiency}.")
    return model


def _size(value):
    """A window as written: bytes (65536) or a string like '64KiB', '4MiB', '100kB'; the
    value unchanged if it reads as neither (the caller's check names it)."""
    if not isinstance(value, str):
        return value
    text = value.strip().lower()
    for unit in sorted(_SIZES, key=len, reverse=True):
        if text.endswith(unit):
            try:
                return float(text[:-len(unit)]) * _SIZES[unit]
            except ValueError:
                return value
    return value
