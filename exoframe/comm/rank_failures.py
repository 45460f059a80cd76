"""A rank's side of simulated failures (exoframe/sim/network/faults.py says when nodes fail).

A node fails at the first step start at or after its failure time on its own simulated
clock. From then on it is down: its process keeps stepping with the others, so that every
real collective stays matched, but it computes nothing (no forward or backward pass, nothing
charged to its clock) and what it contributes to a reduction is zero. The work it did since
its last synchronization is lost.

Membership changes only at synchronizations (`Strategy.sync()`, like torchft's quorum):
every rank joins a quorum in the simulator; the live members meet there; a node whose
failure is over by then is joining: once the synchronization is done it receives the
model, optimizer and strategy state from the lowest live rank (a point-to-point transfer
the network model times, while that rank goes on), and it takes part from the next
synchronization on.
"""
from __future__ import annotations

from ..errors import ExoframeError
from ..sim.clocks.protocol import Quorumed
from ..sim.network.faults import FaultPlan


class RankFaults:
    def __init__(self, rank: int, plan: FaultPlan, strategy_name: str, survives: bool):
        """survives: whether the strategy synchronizes through Strategy.sync(); a failure
        in a run of any other stops the run."""
        self.rank, self.plan = rank, plan
        self.strategy_name, self.survives = strategy_name, survives
        self.down_until = None  # while down: when the failure is over
        self.after = 0.0  # failures that start before this are absorbed by an earlier one
        self.step = 0
        self.records: list[dict] = []  # one per failure, for the run's summary
        self._last_sync = (0, 0.0)  # (step, compute seconds) at this rank's last sync

    @property
    def down(self) -> bool:
        return self.down_until is not None

    def at_step_start(self, step: int, clock) -> bool:
        """Whether this rank is down for `step` (a failure that is due starts here)."""
        self.step = step
        if not self.down:
            failure = self.plan.next_failure(self.rank, self.after, clock.now)
            if failure is not None:
                self._fail(failure, clock)
        if self.down:
            self.records[-1]["steps_down"] += 1
        return self.down

    def _fail(self, failure, clock):
        if not self.survives:
            raise ExoframeError(
                f"node {self.rank} failed at simulated time {failure.at:g} s (faults), and "
                f"strategy '{self.strategy_name}' cannot go on without it: it does not "
                "synchronize through Strategy.sync(). Use ddp, localsgd or diloco, or drop "
                "faults.")
        self.down_until = self.after = failure.back
        clock.down = True
        last_step, last_compute = self._last_sync
        self.records.append({
            "rank": self.rank, "failed_at": failure.at, "noticed_at": clock.now,
            "back_at": failure.back, "step": self.step,
            "steps_lost": self.step - 1 - last_step,  # trained since its last sync: discarded
            "compute_lost_seconds": clock.compute_seconds - last_compute,
            "steps_down": 0, "rejoined_at": None, "recovered_from": None,
            "recovery_bytes": 0, "recovery_seconds": 0.0})

    def quorum(self, clock) -> Quorumed:
        reply = clock.quorum(self.down_until)
        if self.down and self.rank in reply.live:  # no live peer: back with its own state
            self.back(clock, None, 0, 0.0)
        return reply

    def synced(self, clock):
        """A synchronization this rank took part in is done: its work so far counts."""
        if not self.down:
            self._last_sync = (self.step, clock.compute_seconds)

    def state_dict(self) -> dict:
        """For checkpoints (the plan is rebuilt from the seed: the same draws)."""
        return {"down_until": self.down_until, "after": self.after, "step": self.step,
                "records": [dict(r) for r in self.records], "last_sync": list(self._last_sync)}

    def load_state_dict(self, state: dict):
        self.down_until, self.after = state["down_until"], state["after"]
        self.step, self.records = state["step"], [dict(r) for r in state["records"]]
        self._last_sync = tuple(state["last_sync"])

    def back(self, clock, source: int | None, nbytes: int, seconds: float):
        """The rank is live again, with `source`'s state (None: its own)."""
        self.down_until = None
        self.after = max(self.after, clock.now)  # what fell while it was still away is absorbed
        clock.down = False
        self.records[-1].update(rejoined_at=clock.now, recovered_from=source,
                                recovery_bytes=nbytes, recovery_seconds=seconds)
        self.synced(clock)
