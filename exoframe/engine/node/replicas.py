"""The divergence check: ranks that their strategy says hold equal parameters after a
synchronization (Strategy.traits.replicas_equal_after_sync) send a checksum of them at the end of
each step that synchronized, and the launcher compares them. Ranks that drift apart
silently (a nondeterministic kernel, a strategy that changes one rank's parameters after
synchronizing) would make every later number wrong; the check stops the run at the first
such step, naming the ranks."""
from __future__ import annotations

import torch

from ...errors import ExoframeError


INTEGER_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def checksum(model: torch.nn.Module) -> int:
    """The sum of the parameters' bit patterns read as integers: exact (the same on any
    machine, whatever the order of summation) and equal for equal weights, NaNs included."""
    with torch.no_grad():
        sums = [p.detach().view(INTEGER_OF_SIZE[p.element_size()]).sum(dtype=torch.int64)
                for p in model.parameters()]
    return int(torch.stack(sums).sum()) if sums else 0


class ReplicaCheck:
    def __init__(self, nodes: int, strategy: str):
        self.nodes, self.strategy = nodes, strategy
        self.pending: dict[int, dict[int, int]] = {}  # step -> rank -> checksum

    def add(self, rank: int, step: int, value: int | None):
        """Rank `rank` synchronized at `step` (value: its checksum) or did not (None)."""
        if value is None:
            return
        seen = self.pending.setdefault(step, {})
        seen[rank] = value
        if len(seen) < self.nodes:
            return
        del self.pending[step]
        apart = [r for r in sorted(seen) if seen[r] != seen[0]]
        if apart:
            raise ExoframeError(
                f"ranks diverged: after the synchronization of step {step}, rank(s) "
                f"{', '.join(map(str, apart))} hold parameters that differ from rank 0's, "
                f"where {self.strategy} leaves every rank equal (their checksums differ): a "
                "rank computed differently (a nondeterministic operation), or the strategy "
                "changes a rank's parameters after synchronizing.")
