"""The run's rows: each rank's step records in, one row per step out in step order (to
on_row and into the run's checkpoints), each evaluation step's once the evaluator validated
it (the ranks send it their models themselves: engine/node/model_state.py)."""
from __future__ import annotations

from ...errors import ExoframeError
from ..ipc.messages import StepDone, Validated
from ..ipc.processes import RankFailed
from ..ipc.stop_signals import signals_held
from ..node.replicas import ReplicaCheck
from ..plan.job import Job
from ..plan.target import check_within_a_year
from .step_rows import StepRows


class RowOutput:
    def __init__(self, job: Job, on_row, commits, sim_log: list, stop_step):
        """commits: the run's checkpoint commits (None: it does not checkpoint); sim_log: the
        simulator's inputs so far, per rank (sim.feed.Feed.log), which a checkpoint keeps;
        stop_step(): the step the run stops after, once known."""
        self.job, self.on_row = job, on_row
        self.commits, self.sim_log = commits, sim_log
        self.rows = StepRows(job.nodes, job.validations_at, stop_step)
        self.replicas = ReplicaCheck(job.nodes, job.strategy_name)
        resumed = job.resume_from  # a Checkpoint: its rows kept
        self.emitted = list(resumed.rows) if resumed else []  # every row, in step order
        self.rows.next_step = len(self.emitted) + 1

    def add(self, message: StepDone):
        """The step's row once every rank has reported it, else None."""
        try:
            self.replicas.add(message.rank, message.step, message.checksum)
        except ExoframeError as e:
            raise RankFailed("divergence check", str(e)) from None
        row = self.rows.add(message.rank, message.step, message.record)
        if row is not None:  # every rank finished `step`
            check_within_a_year(self.job.steps, self.job.time_budget, message.step,
                                row["sim_time"])
        return row

    def add_val(self, message: Validated):
        self.rows.add_val(message.step, message.loss, message.metrics, message.replicas_loss)

    def emit(self, unvalidated=False):
        if self.rows.any_ready(unvalidated):
            with signals_held():  # (a row taken is a row in every record)
                for row in self.rows.ready(unvalidated):
                    if self.on_row is not None:
                        self.on_row(row)
                    self.emitted.append(row)
        if self.commits is not None and not unvalidated:
            self.commits.commit_ready(len(self.emitted), self.emitted, self.sim_log)

    def flush(self) -> list:
        """The run stops: emit the rows every rank finished, validated or not; return every
        row emitted."""
        try:
            self.emit(unvalidated=True)
        except Exception:
            pass  # a failing sink must not hide the failure that stopped the run
        return self.emitted
