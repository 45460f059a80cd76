"""The launcher's metrics rows: per-rank step records in, one row per step out, in order."""
from __future__ import annotations

from .model_state import combine


class StepRows:
    """Turns per-rank step records into one row per step, in step order.

    A row is ready once every rank reported the step and, at evaluation steps, once the
    evaluator validated the ranks' held model. Values are averaged over ranks, except
    the simulated time, where a step ends when its last rank ends it, and `nodes_down`
    (simulated failures), a count. A down rank has no loss, and its weights are left out of
    the held model while any rank is up.
    """

    def __init__(self, nodes: int, held_from: str = "average"):
        """held_from: the strategy's `held_model_from`."""
        self.nodes, self.held_from = nodes, held_from
        self.records: dict[int, list] = {}
        self.states: dict[int, list] = {}
        self.rows: dict[int, dict] = {}
        self.awaiting_val: set[int] = set()
        self.down: dict[int, list] = {}  # step -> which ranks were down, once all reported
        self.next_step = 1

    def add(self, rank: int, step: int, record: dict, state):
        """Returns the held model state of `step` when it is complete, else None."""
        records = self.records.setdefault(step, [None] * self.nodes)
        records[rank] = record
        if state is not None:
            self.states.setdefault(step, [None] * self.nodes)[rank] = state
        if any(r is None for r in records):
            return None
        del self.records[step]
        self.rows[step] = self._row(step, records)
        self.down[step] = [bool(r.get("nodes_down")) for r in records]
        if step not in self.states:
            return None
        self.awaiting_val.add(step)  # its states came (with the records or apart, add_state)
        return self._averaged(step)

    def hold(self, step: int):
        """Keep `step`'s row until its states (add_state) come and are validated."""
        self.awaiting_val.add(step)

    def add_state(self, rank: int, step: int, state):
        """A state sent apart from its record (a rank told to stop after a step that was
        not an evaluation step). Returns the averaged state once every rank's is in."""
        self.states.setdefault(step, [None] * self.nodes)[rank] = state
        return self._averaged(step)

    def _averaged(self, step: int):
        """`step`'s model over the ranks that were up (engine/model_state.combine), once
        every rank's state and record are in (states may come before the last record)."""
        states = self.states.get(step)
        if step not in self.down or any(s is None for s in states):
            return None
        del self.states[step]
        live = [s for s, down in zip(states, self.down[step]) if not down]
        return combine(live or states, self.held_from, exact=states[0].exact)

    def add_val(self, step: int, val_loss, metrics: dict, replicas_loss=None):
        """replicas_loss: the validation loss of the replicas' average, where the held model
        is another (val_loss_replicas_average)."""
        self.awaiting_val.discard(step)
        if val_loss is not None:  # None: no validation data
            self.rows[step]["val_loss"] = val_loss
            self.rows[step].update((f"val_{name}", value) for name, value in metrics.items())
        if replicas_loss is not None:
            self.rows[step]["val_loss_replicas_average"] = replicas_loss

    def ready(self, unvalidated=False):
        """Rows that can be emitted now, in order; with `unvalidated`, also the rows whose
        validation has not come (when the run stops: they are kept without val_loss)."""
        while self.next_step in self.rows and (unvalidated
                                               or self.next_step not in self.awaiting_val):
            self.down.pop(self.next_step, None)
            yield self.rows.pop(self.next_step)
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
