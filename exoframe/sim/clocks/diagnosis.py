"""Why a simulation cannot go on: every rank waits, and nothing can happen any more."""
from __future__ import annotations


def why_stuck(sim) -> str | None:
    """If every rank of `sim` (a Simulator) waits and nothing can happen any more, say who
    waits for what; else None."""
    if sim.inbox or sim.network.busy():
        return None
    if any(not (b or f) for b, f in zip(sim.blocked, sim.finished)):
        return None
    for joined in sim.quorums.values():
        missing = [r for r in range(sim.topology.size) if r not in joined]
        return (f"deadlock: rank(s) {', '.join(map(str, sorted(joined)))} wait in a "
                f"membership quorum that rank(s) {', '.join(map(str, missing))} never "
                "joined: every rank must synchronize at the same steps")
    if sim.network.stalled():
        return ("a transfer waits on a link that is down for good: its "
                "bandwidth_trace ends with 'down' (or 0); end it with a bandwidth")
    for rank, (_, op_id) in sorted(sim.mail.listeners.items()):
        if op_id is None:
            return (f"deadlock: rank {rank} waits for the answer to a remote call that "
                    "never comes: its target has finished, waits where it serves no call "
                    "(a rank serves only while it waits in exoframe.distributed: a call's "
                    "wait(), barrier(), serve(); at its step ends and after its last "
                    "step), or keeps answering NotYet")
    for (op, index), (rank, _, _) in sorted(sim.waiters.items(), key=lambda w: w[1][0]):
        missing = [op.participants[i] for i, j in enumerate(op.joined_at) if j is None]
        return (f"deadlock: rank {rank} waits for {op.describe()}, which rank(s) "
                f"{', '.join(map(str, missing))} never started")
    return None
