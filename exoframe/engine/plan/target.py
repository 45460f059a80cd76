"""Stopping early, at a target validation loss or a simulated time budget: every rank stops
after the same step.

Time budget: every rank asks at the end of every step k and is answered once all ranks have
finished k; the run stops after the first step whose simulated end (its last rank's) is at
or past the budget. Target loss:

With a target, the held model is validated at every step. A rank runs steps 1..LAG+1
freely; at the end of each later step k it asks the launcher whether to go on and waits for
the answer, which normally comes once step k − LAG is validated: training runs LAG steps
ahead of validation, so the two overlap. Once some step j is at or below the target, the
run stops after step S = max(j + LAG, the furthest step any rank was allowed to run);
every rank is answered "continue" before S and "stop" at S, so all stop after the same step
and their collectives stay matched.

With both rules, the run stops at the earlier of their steps (the target, where they tie);
"continue" after step k waits for both step k − LAG's validation and step k's end, whichever
the launcher hears first, since either could still stop the run there.

A rank waiting for the answer waits outside the simulated network, and the simulator cannot
move past that rank's clock. If another rank cannot finish step k − LAG until it does (it
waits for a transfer that a straggler or a slow link delays past that clock), neither could
go on. The launcher recognizes that state (every rank is done or waits for the simulator,
an answer or, with --stack-replicas, its worker's other nodes, its clock paused; and no
validation is running) and lets the waiting ranks run one more step; first, though, it
resumes the paused nodes one at a time (the lowest clock first, as the simulator does), which
an unstacked run would not have held there, so that a stacked run stops after the unstacked
run's step. A rank leaves each of those waits only when the launcher answers it (a paused
rank: when a peer that the launcher answered computes for it, and says so before anything
else), so no rank moves once that state is seen, and whether and where it arises is decided
by the simulated events alone, not by the OS's scheduling: S is the same for the same config
and seed (with compute `measured` simulated times vary from run to run, and so may such an
S). The time to target does not depend on S: it is read from the per-step validation losses.
"""
from __future__ import annotations

from ...errors import ExoframeError
from ...sim.network.units import YEAR, format_duration

LAG = 1  # at the end of step k, a rank waits for step k − LAG to be validated


def check_within_a_year(steps: int, time_budget, step: int, sim_time: float):
    """A run whose first `step` steps took `sim_time` and that would go on past a year of
    simulated time at that pace (a network given in bit/s where Mbit/s was meant, ...)
    stops here, in one line, unless a time budget stops it earlier."""
    if time_budget is not None and time_budget <= YEAR:
        return
    projected = sim_time / step * steps
    if projected > YEAR:
        raise ExoframeError(
            f"net: step {step} ended at {format_duration(sim_time)} of simulated time, so "
            f"{steps} steps would take {format_duration(projected)}, over a year: the network "
            "is too slow for this run (a unit off, such as kbit for Mbit?). Give a faster "
            "network or fewer steps, or --time-budget to stop it earlier.")


class StopVerdicts:
    """The launcher's side: questions, finished steps and validation losses in, (rank, stop)
    answers out. target: a validation loss; budget: simulated seconds (either may be None)."""

    def __init__(self, target: float | None, budget: float | None = None):
        self.target, self.budget = target, budget
        self.validated = 0  # steps are validated in order: every step up to this one
        self.finished = 0  # steps every rank has finished, in order
        # The furthest step any rank may run so far: asking starts after LAG + 1 steps with
        # a target alone, at once with a budget.
        self.allowed = LAG + 1 if budget is None else 1
        self.waiting: dict[int, int] = {}  # rank -> the step it has just finished
        self.stop_step = None  # the last step every rank runs, once a rule is met
        self.stopped_by = None  # "target_loss" or "time_budget"

    def ask(self, rank: int, step: int) -> list[tuple[int, bool]]:
        """`rank` finished `step` and waits to know whether to run the next."""
        self.waiting[rank] = step
        return self._answers()

    def add_val(self, step: int, val_loss) -> list[tuple[int, bool]]:
        self.validated = max(self.validated, step)
        if (self.target is not None and val_loss is not None and val_loss <= self.target):
            # No rank was allowed past `allowed`: every rank can still stop there.
            self._stop(step + LAG, "target_loss")
        return self._answers()

    def add_finished(self, step: int, sim_time: float) -> list[tuple[int, bool]]:
        """Every rank has finished `step`, the last of them at simulated time `sim_time`."""
        self.finished = max(self.finished, step)
        if self.budget is not None and sim_time >= self.budget:
            self._stop(step, "time_budget")
        return self._answers()

    def _stop(self, step: int, rule: str):
        step = max(step, self.allowed)
        # (at a tie the target wins, whichever of the two was seen first)
        if (self.stop_step is None or step < self.stop_step or
                (step == self.stop_step and rule == "target_loss")):
            self.stop_step, self.stopped_by = step, rule

    def release(self) -> list[tuple[int, bool]]:
        """Let every waiting rank run one more step (or stop, at the stop step)."""
        answers = []
        for rank, step in sorted(self.waiting.items()):
            answers.append((rank, self._answer(step)))
        self.waiting.clear()
        return answers

    def _answerable(self, step: int) -> bool:
        """Whether the answer after `step` is settled: no validation loss or finished step
        still to come can move the stop step to `step` or before it. (A stop step is never
        moved before a step some rank was let run: `allowed`.)"""
        stop = self.stop_step
        if stop is not None and (step >= stop or self.allowed >= stop):
            return True
        if self.target is not None and step - LAG > self.validated:
            return False
        return self.budget is None or step <= self.finished

    def _answers(self):
        answers = []
        for rank, step in sorted(self.waiting.items()):
            if self._answerable(step):
                answers.append((rank, self._answer(step)))
                del self.waiting[rank]
        return answers

    def _answer(self, step: int) -> bool:
        if self.stop_step is not None and step >= self.stop_step:
            return True
        self.allowed = max(self.allowed, step + 1)
        return False
