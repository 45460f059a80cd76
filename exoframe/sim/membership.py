"""Who takes part in a synchronization under simulated failures (the quorum's rule)."""
from __future__ import annotations

from .protocol import Quorum


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
