"""Collective algorithms: how an operation among n participants becomes flows.

A Plan lists flows between participant indices (0..n-1), each carrying a fraction of the
operation's payload S (all_gather: the gathered output; reduce_scatter: the full input),
and the flows each one waits for. A flow also waits until both its ends have joined the
operation. A participant is done with the operation when every flow it sends or receives
has been delivered.

Built-ins (S bytes, n participants, link bandwidth B, latency a, uniform links):
- ring: all_reduce = reduce-scatter + all-gather around the ring, 2(n-1) rounds of S/n:
  2(n-1)(a + S/(nB)); all_gather, reduce_scatter: (n-1)(a + S/(nB)); broadcast: a chain
  from the root, (n-1)(a + S/B).
- tree: binomial broadcast from the root, ceil(log2 n) rounds of S; all_reduce =
  binomial reduce to participant 0, then binomial broadcast.
- direct: every pair at once. all_reduce = direct reduce-scatter then direct all-gather
  (the "butterfly" of Hivemind/Moshpit), 2(n-1)S/n bytes per participant; broadcast: the
  root sends S to each participant.
- ps: a parameter server (participant 0, or the root of a broadcast) receives from every
  participant and sends back: all_reduce = push S, pull S.

A plan function is `function(kind, n, root)`. One that also accepts a `topology` keyword
(a parameter of that name, or **kwargs) is called `function(kind, n, root, topology=view)`
with the participants' Sites (topology.py): where each participant is, in the plan's
indices. Which of the two a function is, is read from its signature once, where a network's
algorithms are resolved (Plans), never by trying a call.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import inspect
from collections.abc import Iterable

from ...errors import ExoframeError
from .gloo import gloo, gloo_segments_per_rank
from .plan import Plan
from .topology import Sites, Topology

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


def _ring_rounds(plan: Plan, rounds: int, fraction: float, previous=None):
    """`rounds` rounds in which participant i sends `fraction` to i+1. Round r's send from i
    waits for i's send and i's receive of round r-1. Returns the last round's flow ids."""
    n = plan.n
    ring_dst = [(i + 1) % n for i in range(n)]
    for _ in range(rounds):
        first = len(plan.src)
        plan.src.extend(range(n))
        plan.dst.extend(ring_dst)
        plan.fraction.extend([fraction] * n)
        if previous is None:
            plan.deps.extend([] for _ in range(n))
        else:
            plan.deps.extend([previous[i - 1], previous[i]] for i in range(n))  # (i-1: -1 wraps)
        previous = range(first, first + n)
    return previous


def ring(kind: str, n: int, root: int = 0) -> Plan:
    plan = Plan(n)
    if n == 1:
        return plan
    if kind == "all_reduce":
        _ring_rounds(plan, 2 * (n - 1), 1 / n)
    elif kind in ("all_gather", "reduce_scatter"):
        _ring_rounds(plan, n - 1, 1 / n)
    elif kind == "broadcast":
        previous = ()
        for hop in range(n - 1):
            src, dst = (root + hop) % n, (root + hop + 1) % n
            previous = (plan.add(src, dst, 1.0, previous),)
    else:
        raise ValueError(f"ring does not implement {kind}")
    return plan


def _binomial_broadcast(plan: Plan, root: int, root_deps=()):
    """Round k: every holder v < 2^k sends to v + 2^k; a holder's sends go one after the
    other, the first once it has the data."""
    n = plan.n
    after = {0: tuple(root_deps)}  # relative rank -> what its next send waits for
    mask = 1
    while mask < n:
        for v in range(mask):
            if v + mask < n:
                f = plan.add((v + root) % n, (v + mask + root) % n, 1.0, after[v])
                after[v] = after[v + mask] = (f,)
        mask <<= 1


def tree(kind: str, n: int, root: int = 0) -> Plan:
    plan = Plan(n)
    if n == 1:
        return plan
    if kind == "broadcast":
        _binomial_broadcast(plan, root)
    elif kind == "all_reduce":
        incoming = {v: [] for v in range(n)}  # binomial reduce towards participant 0
        mask = 1
        while mask < n:
            for v in range(mask, n, 2 * mask):
                incoming[v - mask].append(plan.add(v, v - mask, 1.0, incoming[v]))
            mask <<= 1
        _binomial_broadcast(plan, 0, incoming[0])
    else:
        raise ValueError(f"tree does not implement {kind}")
    return plan


def direct(kind: str, n: int, root: int = 0) -> Plan:
    plan = Plan(n)
    if n == 1:
        return plan
    pairs = [(i, j) for i in range(n) for j in range(n) if i != j]
    if kind in ("all_gather", "reduce_scatter"):
        for i, j in pairs:
            plan.add(i, j, 1 / n)
    elif kind == "all_reduce":
        into = {j: [] for j in range(n)}
        for i, j in pairs:
            into[j].append(plan.add(i, j, 1 / n))
        for i, j in pairs:
            plan.add(i, j, 1 / n, into[i])
    elif kind == "broadcast":
        for j in range(n):
            if j != root:
                plan.add(root, j, 1.0)
    else:
        raise ValueError(f"direct does not implement {kind}")
    return plan


def ps(kind: str, n: int, root: int = 0) -> Plan:
    plan = Plan(n)
    if n == 1:
        return plan
    server = root if kind == "broadcast" else 0
    workers = [i for i in range(n) if i != server]
    push, pull = {"all_reduce": (1.0, 1.0), "reduce_scatter": (1.0, 1 / n),
                  "all_gather": (1 / n, (n - 1) / n), "broadcast": (0.0, 1.0)}.get(kind, (None, None))
    if push is None:
        raise ValueError(f"ps does not implement {kind}")
    pushed = [plan.add(w, server, push) for w in workers] if push else []
    for w in workers:
        plan.add(server, w, pull, pushed)
    return plan


BUILTIN = {"ring": ring, "tree": tree, "direct": direct, "ps": ps, "gloo": gloo}


def point_to_point() -> Plan:
    plan = Plan(2)
    plan.add(0, 1, 1.0)
    return plan


_P2P = point_to_point()


@functools.lru_cache(maxsize=None)
def takes(function, keyword: str) -> bool:
    """Whether plan function `function` accepts `keyword` (topology, nbytes): a parameter
    of that name that can be passed by keyword (not **kwargs: a plan of many sizes is built
    once per size)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # no signature to read (some builtins): the 3 arguments
        return False
    return any((p.kind is p.VAR_KEYWORD and keyword == "topology")
               or (p.name == keyword and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
               for p in parameters)


def takes_topology(function) -> bool:
    """Whether plan function `function` accepts the `topology` keyword: a parameter of that
    name that can be passed by keyword, or **kwargs."""
    return takes(function, "topology")


@contextlib.contextmanager
def _without_cycle_collection():
    """A plan is millions of small lists without cycles (a ring among 1024: 2M flows): the
    cyclic collector, which their allocation keeps triggering, would only halve the speed
    of making it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@functools.lru_cache(maxsize=4096)  # a gossip over pairs has many groups
def _cached_plan(function, kind: str, n: int, root: int, topology: Sites | None,
                 nbytes: float | None = None) -> Plan:
    """topology None, nbytes None: `function` does not take them."""
    keywords = {} if topology is None else {"topology": topology}
    if nbytes is not None:
        keywords["nbytes"] = nbytes
    with _without_cycle_collection():
        plan = function(kind, n, root, **keywords)
        plan.compiled  # noqa: B018 - compile once, here
    return plan


def plan_for(function, kind: str, n: int, root: int = 0, topology: Sites | None = None,
             nbytes: float = 0.0) -> Plan:
    """The (cached, compiled) plan of `kind` under algorithm `function`; send/recv: one flow.
    topology: the participants' Sites, for a function that takes it (None: one site holding
    participants 0..n-1); nbytes: the payload, for a function that takes it."""
    if kind in ("send", "recv"):
        return _P2P
    if not takes_topology(function):
        topology = None
    elif topology is None:
        topology = Sites.single(n)
    return _cached_plan(function, kind, n, root, topology, _plan_bytes(function, n, nbytes))


def _plan_bytes(function, n: int, nbytes: float) -> float | None:
    """What a plan function that takes `nbytes` is given: the payload, or one that stands
    for every payload of the same plan (its `plan_bytes`); None where it does not take it."""
    if not takes(function, "nbytes"):
        return None
    canonical = getattr(function, "plan_bytes", None)
    return float(nbytes) if canonical is None else canonical(n, nbytes)


@functools.lru_cache(maxsize=256)  # (each rank asks it at every operation)
def _repeated(fraction: float, times: int) -> float:
    """`fraction` added `times` times in turn: the float a plan's flows sum to."""
    total = 0.0
    for _ in range(times):
        total += fraction
    return total


def _tree_sends(v: int, n: int, reduce: bool) -> int:
    """Binomial rounds: how often relative participant v sends (broadcast) or receives
    (the reduce towards 0)."""
    count, mask = 0, 1
    while mask < n:
        if (v % (2 * mask) == 0 if reduce else v < mask) and v + mask < n:
            count += 1
        mask <<= 1
    return count


def closed_form(function, kind: str, n: int, root: int, i: int,
                nbytes: float = 0.0) -> tuple[float, float] | None:
    """(sent, received): the fractions of the payload participant i moves under a built-in
    algorithm, equal to its plan's (a ring among 1024 is 2M flows; this is a few sums);
    None where there is no closed form here (the plan counts them). nbytes: the payload
    (gloo's segments depend on it)."""
    if kind in ("send", "recv"):
        return (1.0, 0.0) if i == 0 else (0.0, 1.0)
    if n == 1:
        return (0.0, 0.0) if function in BUILTIN.values() else None
    if function is gloo and kind == "all_reduce":
        per_rank = gloo_segments_per_rank(n, nbytes)
        share = _repeated(1 / (n * per_rank), 2 * (n - 1) * per_rank)
        return share, share
    if function is ring or function is direct:
        if kind in ("all_gather", "reduce_scatter"):
            share = _repeated(1 / n, n - 1)
            return share, share
        if kind == "all_reduce":
            share = _repeated(1 / n, 2 * (n - 1))
            return share, share
        if kind == "broadcast" and function is ring:
            hop = (i - root) % n
            return float(hop < n - 1), float(hop > 0)
        if kind == "broadcast":
            return (float(n - 1), 0.0) if i == root else (0.0, 1.0)
        return None
    if function is tree and kind in ("broadcast", "all_reduce"):
        if kind == "broadcast":
            v = (i - root) % n
            return float(_tree_sends(v, n, False)), float(v > 0)
        children = _tree_sends(i, n, True)
        return float(i > 0) + _tree_sends(i, n, False), float(children + (i > 0))
    if function is ps:
        server = root if kind == "broadcast" else 0
        push, pull = {"all_reduce": (1.0, 1.0), "reduce_scatter": (1.0, 1 / n),
                      "all_gather": (1 / n, (n - 1) / n), "broadcast": (0.0, 1.0)}.get(
                          kind, (None, None))
        if push is None:
            return None
        if i == server:
            return _repeated(pull, n - 1), _repeated(push, n - 1) if push else 0.0
        return push, pull
    return None


class Plans:
    """The plan of every operation under a network's choice of algorithm per collective."""

    def __init__(self, chosen: dict[str, str], algorithms: dict,
                 topology: Topology | None = None):
        """chosen: collective kind -> algorithm name (Topology.algorithms); algorithms:
        name -> plan function; topology: the network, whose Sites are given to the plan
        functions that take them (None: one site holding every participant)."""
        self.functions = {kind: algorithms[name] for kind, name in chosen.items()}
        self.names = dict(chosen)
        self.aware = {kind for kind, function in self.functions.items()
                      if takes_topology(function)}
        self.topology = topology
        self._views: dict[tuple, Sites] = {}  # participants -> their Sites

    def of(self, kind: str, n: int, root: int = 0,
           participants: Iterable[int] | None = None, nbytes: float = 0.0) -> Plan:
        """participants: the group's global ranks (None: 0..n-1); nbytes: the payload (for
        an algorithm whose plan depends on it)."""
        if kind in ("send", "recv"):
            return _P2P
        view = None
        if kind in self.aware:
            view = self.sites(range(n) if participants is None else participants)
        function = self.functions.get(kind)
        try:
            return _cached_plan(function, kind, n, root, view, _plan_bytes(function, n, nbytes))
        except ValueError as e:  # checked at resolve time on two ranks only
            group = "" if view is None else f" (ranks {list(view.ranks)})"
            raise ExoframeError(f"collective algorithm '{self.names.get(kind)}' cannot plan "
                                f"{kind} among {n} participants{group}: {e}") from None

    def bytes_moved(self, kind: str, participants: tuple, root: int, rank: int,
                    nbytes: float) -> tuple[int, int]:
        """(sent, received): the bytes `rank` moves in the operation, by its plan (from
        the closed form where the algorithm has one, without building the plan)."""
        index = participants.index(rank)
        fractions = None
        if kind not in self.aware:
            fractions = closed_form(self.functions.get(kind), kind, len(participants), root,
                                    index, nbytes)
        if fractions is None:
            compiled = self.of(kind, len(participants), root, participants, nbytes).compiled
            fractions = compiled.sent[index], compiled.received[index]
        return round(fractions[0] * nbytes), round(fractions[1] * nbytes)

    def sites(self, participants: Iterable[int]) -> Sites:
        """The Sites of a group of ranks (memoized per group)."""
        key = tuple(participants)
        view = self._views.get(key)
        if view is None:
            view = (Sites.of(self.topology, key) if self.topology is not None
                    else Sites(ranks=key, site_of=(0,) * len(key)))
            self._views[key] = view
        return view
