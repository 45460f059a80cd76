"""The launcher's metrics rows: per-rank step records in, one row per step out, in order."""
from __future__ import annotations

from typing import Callable


class StepRows:
    """Turns per-rank step records into one row per step, in step order.

    A row is ready once every rank reported the step and the evaluator gave every answer the
    step waits for (`validations_at`: the held model at evaluation steps; at a stop, what the
    final model still needed). Values are averaged over ranks, except the simulated time,
    where a step ends when its last rank ends it, and `nodes_down` (simulated failures), a
    count. A down rank has no loss.
    """

    def __init__(self, nodes: int, validations_at: Callable[[int, bool], int],
                 stop_step: Callable[[], int | None] = lambda: None):
        """validations_at(step, stops): the evaluator's answers `step`'s row waits for (stops:
        the run stops after it; engine/plan/job.py); stop_step(): the step the run stops after,
        once a stopping rule is met (engine/launch/verdicts.py)."""
        self.nodes, self.validations_at, self.stop_step = nodes, validations_at, stop_step
        self.records: dict[int, list] = {}
        self.rows: dict[int, dict] = {}
        self.validated: dict[int, dict] = {}  # step -> the evaluator's values for its row
        self.answers: dict[int, int] = {}  # step -> how many answers came
        self.next_step = 1

    def add(self, rank: int, step: int, record: dict) -> dict | None:
        """The step's row once every rank has reported it, else None."""
        records = self.records.setdefault(step, [None] * self.nodes)
        records[rank] = record
        if any(r is None for r in records):
            return None
        del self.records[step]
        self.rows[step] = self._row(step, records)
        return self.rows[step]

    def add_val(self, step: int, val_loss, metrics: dict, replicas_loss=None):
        """An answer of the evaluator. replicas_loss: the validation loss of the replicas'
        average, where the held model is another (val_loss_replicas_average)."""
        self.answers[step] = self.answers.get(step, 0) + 1
        values = self.validated.setdefault(step, {})
        if val_loss is not None:  # None: no validation data, or a replicas-only answer
            values["val_loss"] = val_loss
            values.update((f"val_{name}", value) for name, value in metrics.items())
        if replicas_loss is not None:
            values["val_loss_replicas_average"] = replicas_loss

    def awaiting(self, step: int) -> bool:
        """Whether `step`'s row still waits for the evaluator."""
        wanted = self.validations_at(step, step == self.stop_step())
        return self.answers.get(step, 0) < wanted

    def awaiting_steps(self) -> list:
        """The finished steps whose rows wait for the evaluator."""
        return [step for step in self.rows if self.awaiting(step)]

    def any_ready(self, unvalidated=False) -> bool:
        return self.next_step in self.rows and (unvalidated
                                                or not self.awaiting(self.next_step))

    def ready(self, unvalidated=False):
        """Rows that can be emitted now, in order; with `unvalidated`, also the rows whose
        validation has not come (when the run stops: they are kept without val_loss)."""
        while self.any_ready(unvalidated):
            step = self.next_step
            row = self.rows.pop(step)
            row.update(self.validated.pop(step, {}))
            self.answers.pop(step, None)
            yield row
            self.next_step += 1

    @staticmethod
    def _row(step: int, records: list) -> dict:
        row = {"step": step}
        for key in dict.fromkeys(k for r in records for k in r):  # every key, in first-seen order
            values = [r[key] for r in records if r.get(key) is not None]
            if values:
                row[key] = (max(values) if key == "sim_time" else sum(values)
                            if key == "nodes_down" else sum(values) / len(values))
        row["bytes_sent_per_node"] = row.pop("bytes_sent")
        return row
