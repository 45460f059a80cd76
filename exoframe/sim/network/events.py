"""The one place exoframe touches simpy's internals: an event processed at an absolute
simulated time.

simpy schedules at `now + delay`, which rounds; events at one instant must compare equal, or
two of them could swap order. So call_at pushes onto simpy's event queue itself, an event
already triggered (its `_ok` and `_value` set as `succeed()` would, without scheduling it
now). What is private here (`_queue`, `_eid`, `_ok`, `_value`) is checked against each
simpy major version before its pin in pyproject.toml is lifted.
"""
from __future__ import annotations

import heapq

import simpy

URGENT, NORMAL = simpy.core.URGENT, simpy.core.NORMAL


class Environment(simpy.Environment):
    """simpy's environment, plus callbacks at an absolute time."""

    def call_at(self, when: float, callback, priority=NORMAL) -> simpy.Event:
        """An event that runs callback(event) at simulated time `when` (URGENT: before the
        NORMAL events of that time)."""
        event = self.event()
        event._ok, event._value = True, None
        event.callbacks.append(callback)
        heapq.heappush(self._queue, (when, priority, next(self._eid), event))
        return event
