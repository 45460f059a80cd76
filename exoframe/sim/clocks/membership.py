"""Who takes part in a synchronization under simulated failures (the quorum's rule)."""
from __future__ import annotations

from .protocol import Quorum, Quorumed


def meet(joined: dict[int, Quorum]) -> tuple[float, tuple, tuple]:
    """(when the synchronization happens, the live ranks, the ranks that rejoin), from every
    rank's Quorum. The live members meet at the latest of their times; a node whose failure
    is over by then comes back (it takes a live member's state after the synchronization).
    With no live member, the cluster waits for the first node back, which goes on with its
    own state."""
    up = [r for r, q in joined.items() if q.down_until is None]
    if up:
        at = max(joined[r].t for r in up)
        back = [r for r, q in joined.items() if q.down_until is not None
                and q.down_until <= at]
        return at, tuple(sorted(up)), tuple(sorted(back))
    at = min(max(q.t, q.down_until) for q in joined.values())
    return at, tuple(sorted(r for r, q in joined.items() if max(q.t, q.down_until) <= at)), ()


def join_quorum(sim, rank: int, message: Quorum):
    """`rank` joins the quorum of `sim` (a Simulator); once every rank has, each is answered
    who takes part. A down rank is outside until its next Quorum; a joining one, once its
    receive of the state is in, until that receive is answered (see simulator.py)."""
    joined = sim.quorums.setdefault(message.seq, {})
    joined[rank] = message
    if len(joined) < sim.topology.size:
        return
    del sim.quorums[message.seq]
    at, live, joining = meet(joined)
    for r in sorted(joined):
        end = max(joined[r].t, at)
        sim.wake(r, end, Quorumed(end, live, joining))
        if r in joining:
            sim.recovering.add(r)
        elif r not in live:
            sim.outside.add(r)
