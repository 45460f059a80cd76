"""Where an exchange's time went: round trips (latency) or bytes (bandwidth), read off the
chain of flows that made each participant finish when it did.

A participant is done with an operation when the last flow it sends or receives arrives.
That flow was released by whatever it waited for last: a participant joining, the arrival
of the flow before it in the plan, or a receiver's notice that it is ready. Following those
links back gives the operation's critical path for that participant, a chain of legs that
covers, without gaps, the time from a join to the participant's end. Each leg is split as
the network spent it:

- bandwidth: from its release until its last byte was sent, less the time below: waiting
  behind the bytes written before it on its TCP connection, and moving its own bytes at the
  rate the links gave it;
- latency: the seconds its TCP window held its rate rather than a link (slow start: round
  trips), then from its last byte to its arrival (the path's latency, jitter and a loss's
  repair). A message of no payload (a notice) is latency alone.

A wait's communication (the part after every participant had joined) is the stretch of
this chain that ends the wait; its latency is that stretch's latency legs, and the rest of
it is bandwidth. On a ring of n with latency a, bandwidth B and S bytes, an all-reduce's
2(n-1)(a + S/(nB)) splits into 2(n-1)a of latency and 2(n-1)S/(nB) of bandwidth.

Legs refer only to the leg before them: those of flows that were not on a critical path
are freed once what they released has started.
"""
from __future__ import annotations


class Leg:
    """A flow of an operation (or a notice) that has arrived, on the chain that released
    the flows after it."""

    __slots__ = ("released", "before", "latency_from", "arrived", "latency", "origin")

    def __init__(self, released: float, before: Leg | None, flow, arrived: float):
        """flow: the network's Flow (its `sent` and `round_trips`); before: the leg whose
        arrival released it (None: a participant's join)."""
        self.released, self.before, self.arrived = released, before, arrived
        # (comparisons, not min and max: this runs once per flow)
        start = released if flow.sent is None else flow.sent - flow.round_trips
        start = released if start < released else arrived if start > arrived else start
        self.latency_from = start
        if before is None:
            self.latency, self.origin = arrived - start, released
        else:  # the chain's latency so far, and where it began
            self.latency, self.origin = before.latency + arrived - start, before.origin


def latency_since(leg: Leg | None, start: float) -> float:
    """The latency seconds of the chain that ends with `leg`, after `start`."""
    total = 0.0
    while leg is not None:
        if leg.origin >= start:  # the whole chain is after start
            return total + leg.latency
        total += max(0.0, leg.arrived - max(leg.latency_from, start))
        if leg.released <= start:
            return total
        leg = leg.before
    return total


def wait_latency(leg: Leg | None, comm: float, start: float) -> float:
    """Of a wait's `comm` seconds of communication from `start` on, those the chain that
    ends with `leg` spent on round trips."""
    return min(comm, latency_since(leg, start)) if comm > 0 else 0.0


class Paths:
    """An operation's legs as they go (the Simulator keeps one per operation): the flows on
    the wire, by plan index (a notice for flow f: -1 - f), as (released, the leg that
    released it, the network's Flow); and the leg whose arrival ended each participant's
    part (None: no flow ended it)."""

    __slots__ = ("in_flight", "end_leg")

    def __init__(self, participants: int):
        self.in_flight = {}
        self.end_leg = [None] * participants

    def started(self, k: int, now: float, before: Leg | None, flow):
        self.in_flight[k] = (now, before, flow)

    def arrived(self, k: int, now: float) -> Leg:
        released, before, flow = self.in_flight.pop(k)
        return Leg(released, before, flow, now)

