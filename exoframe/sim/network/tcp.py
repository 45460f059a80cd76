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
  the link is used less than max-min's full share (see README, "How close is the
  simulated clock to a real network?", for the measurements).
- The window: a flow sends at most `window` bytes per round trip (2 × the path's one-way
  latency), so its rate is at most window / RTT.

The defaults are Linux's (MTU 1500, timestamps on) and the measurements on tc-shaped veth
links in README. Bandwidths are as tc counts them (Ethernet header, no preamble or
FCS): for a physical Ethernet link add 24 bytes to link_header.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from ...errors import ExoframeError

_SIZES = {"b": 1, "kb": 1e3, "mb": 1e6, "kib": 2 ** 10, "mib": 2 ** 20}


@dataclass(frozen=True)
class TcpModel:
    mtu: int = 1500  # bytes of an IP packet at most
    ip_tcp_header: int = 52  # IPv4 20 + TCP 20 + timestamps 12
    link_header: int = 14  # Ethernet, as tc counts a frame
    segments_per_ack: float = 2.5  # delayed ACKs, merged further by GRO (fitted: README)
    window: float = 4 * 2 ** 20  # bytes in flight per flow (Linux's tcp_wmem maximum)
    shared_efficiency: float = 0.92  # share of a link two or more flows get (fitted: README)

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
