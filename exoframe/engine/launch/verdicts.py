"""The launcher's side of the stopping rules (target loss, time budget; engine/plan/target.py):
finished steps, validation losses and the ranks' questions in, StopAnswers out."""
from __future__ import annotations

from ..ipc.messages import StopAnswer
from ..plan.job import Job
from ..plan.target import StopVerdicts


class Verdicts:
    def __init__(self, job: Job, send):
        """send(rank, message): to a rank, ignoring a rank that died."""
        self.job, self.send = job, send
        early = job.target_loss is not None or job.time_budget is not None
        self.rules = StopVerdicts(job.target_loss, job.time_budget) if early else None

    @property
    def waiting(self) -> dict:
        """rank -> the step it finished and waits to know whether to stop after."""
        return self.rules.waiting if self.rules is not None else {}

    @property
    def stop_step(self):
        """The step the run stops after, once a rule is met (it may still move earlier until
        a rank is told to stop: engine/plan/target.py)."""
        return self.rules.stop_step if self.rules is not None else None

    def answer(self, answers):
        for rank, stop in answers:
            self.send(rank, StopAnswer(stop))

    def ask(self, rank: int, step: int):
        self.answer(self.rules.ask(rank, step))

    def step_finished(self, step: int, sim_time: float) -> bool:
        """Every rank finished `step`, the last at `sim_time`: whether the run stops there."""
        if self.rules is None:
            return False
        self.answer(self.rules.add_finished(step, sim_time))
        return self.rules.stop_step == step

    def validated(self, step: int, loss):
        if self.rules is not None:
            self.answer(self.rules.add_val(step, loss))

    def release(self):
        """Let every waiting rank run one more step (or stop, at the stop step)."""
        self.answer(self.rules.release())

    def asked(self) -> bool:
        """Some rank waits for a verdict."""
        return self.rules is not None and bool(self.rules.waiting)

    def stopped_by(self) -> str:
        rules = self.rules
        if rules is None or rules.stop_step is None or rules.stop_step >= self.job.steps:
            return "steps"
        return rules.stopped_by

    def last_step(self) -> int:
        stop = self.rules.stop_step if self.rules is not None else None
        return self.job.steps if stop is None else min(stop, self.job.steps)
