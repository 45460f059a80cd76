"""Simulated node failures: when each node goes down, and when it is back.

Spec (`--faults`, YAML `faults:`), comma-separated terms ("none" or "": no failures):
  R@T:D        node R fails at simulated time T and is down for D (1@90s:60s, 2@1h:10min)
  rate:F:D     failures arrive at F per simulated hour over the whole cluster (a Poisson
               process), each on a node drawn at random and down for D (rate:4:5min)
A failure that falls on a node already down is absorbed by that failure. Random draws come
from a generator seeded by the run's seed: same seed, same failures. What a failure does to
a run (a quorum of the live nodes at each synchronization, a returning node fetching the
state from a live one) is in exoframe/comm/rank_failures.py.
"""
from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass

from ...errors import ExoframeError, shorten
from .units import parse_seconds

_EXPLICIT = re.compile(r"^(\d+)@([^:]+):(.+)$")
EXAMPLE = "e.g. 1@90s:60s (node 1 fails at 90 s, down 60 s) or rate:4:5min (4 per hour)"


@dataclass(frozen=True)
class Failure:
    rank: int
    at: float  # simulated seconds
    back: float  # when the node is up again


@dataclass(frozen=True)
class FaultSpec:
    failures: tuple = ()  # Failure, given one by one
    per_hour: float = 0.0  # random failures over the whole cluster
    down: float = 0.0  # how long each random failure lasts

    @property
    def active(self) -> bool:
        return bool(self.failures) or self.per_hour > 0

    def describe(self) -> str:
        terms = [f"{f.rank}@{f.at:g}s:{f.back - f.at:g}s" for f in self.failures]
        if self.per_hour > 0:
            terms.append(f"rate:{self.per_hour:g}:{self.down:g}s")
        return ",".join(terms) or "none"

    def check_ranks(self, nodes: int):
        for f in self.failures:
            if not 0 <= f.rank < nodes:
                raise ExoframeError(f"faults: node {f.rank} does not exist in a run of {nodes} "
                                    f"nodes (they are 0..{nodes - 1}).")

    def plan(self, nodes: int, seed: int) -> "FaultPlan":
        return FaultPlan(self, nodes, seed)


def parse_faults(spec) -> FaultSpec:
    """A spec string (or a YAML list of terms) -> FaultSpec; one clear line on bad input."""
    if isinstance(spec, str) and spec.strip() == "none":
        return FaultSpec()
    terms = spec if isinstance(spec, (list, tuple)) else str(spec or "").split(",")
    failures, per_hour, down = [], 0.0, 0.0
    for term in filter(None, (str(t).strip() for t in terms)):
        if term.startswith("rate:"):
            if per_hour:
                raise ExoframeError("faults: give at most one rate: term.")
            _, rate, *rest = term.split(":")
            per_hour = _number(rate.removesuffix("/h"), term, "the rate (failures per hour)")
            if len(rest) != 1 or not 0 < per_hour <= 1e6:
                raise ExoframeError(f"faults: '{shorten(term)}' should be rate:F:D, F failures "
                                    "per simulated hour (positive) each down for D, e.g. "
                                    "rate:4:5min.")
            down = _seconds(rest[0], term, "the time down")
            continue
        match = _EXPLICIT.match(term)
        if not match:
            raise ExoframeError(f"faults: cannot read '{shorten(term)}'; give NODE@TIME:DOWN or "
                                f"rate:PER_HOUR:DOWN, {EXAMPLE}.")
        at = parse_seconds(match.group(2), "faults", "config")
        if not at > 0:
            raise ExoframeError(f"faults: '{shorten(term)}': the failure time must be after the "
                                "start (positive), e.g. 1@90s:60s.")
        failures.append(Failure(int(match.group(1)), at,
                                at + _seconds(match.group(3), term, "the time down")))
    return FaultSpec(tuple(sorted(failures, key=lambda f: (f.at, f.rank))), per_hour, down)


def _number(text: str, term: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ExoframeError(f"faults: '{shorten(term)}': {what} must be a number, got "
                            f"'{shorten(text)}'.")
    return value


def _seconds(text: str, term: str, what: str) -> float:
    seconds = parse_seconds(text, "faults", "config")
    if not 0 < seconds < math.inf:
        raise ExoframeError(f"faults: '{shorten(term)}': {what} must be a positive time like "
                            f"60s or 5min, got '{shorten(text)}'.")
    return seconds


class FaultPlan:
    """Every node's failures, in time order: the given ones, and the random ones drawn as
    far as they are asked for. Every rank builds the same plan from the same seed."""

    def __init__(self, spec: FaultSpec, nodes: int, seed: int):
        self.spec, self.nodes = spec, nodes
        self._rng = random.Random(seed * 1_000_003 + 0xFA17)
        self._drawn_until = 0.0
        self._failures = [[f for f in spec.failures if f.rank == r] for r in range(nodes)]

    def next_failure(self, rank: int, after: float, until: float) -> Failure | None:
        """The earliest failure of `rank` that starts in [after, until], or None."""
        self._draw(until)
        due = [f for f in self._failures[rank] if after <= f.at <= until]
        return min(due, key=lambda f: f.at) if due else None

    def _draw(self, until: float):
        spec = self.spec
        while spec.per_hour > 0 and self._drawn_until <= until:
            self._drawn_until += self._rng.expovariate(spec.per_hour / 3600.0)
            rank = self._rng.randrange(self.nodes)
            at = self._drawn_until
            self._failures[rank].append(Failure(rank, at, at + spec.down))
