"""Run a Job end to end: launch the ranks, stream metrics, write the summary.

summary.json says how the run ended: "status" is "completed", "failed" or "interrupted";
a run that did not complete has the error line and every step it finished. While the run
goes it says "failed" with the steps finished so far (Provisional), so that even a launcher
killed outright leaves a summary."""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from ..errors import ExoframeError, RunInterrupted, RunStopped
from ..files import describe_os_error, disk_full
from ..report import build_run_summary
from ..report.results import dataframe, run_repr, run_table
from ..schema import Row, RunSummary, StoppedSummary, Trace
from ..sim.clocks.measured import split_measured
from ..sinks import OpenSinks, RunInfo
from .ipc.stop_signals import run_starting
from .launch.launcher import launch, prepare
from .launch.progress import progress_display
from .node.model_state import load
from .node.node_globals import CallerState
from .plan.job import Job
from .records import rank_state
from .records.checkpoint import CheckpointFolder
from .records.run_folder import RunFolder
from .records.run_lock import RunLock


@dataclass(repr=False)
class RunResult:
    model: torch.nn.Module  # the ranks' final weights and buffers, averaged (see model_state)
    summary: dict  # summary.json's mapping (record's)
    metrics: list
    run_dir: Optional[Path] = None
    trace: Optional[dict] = None  # what each rank's clock saw; see exoframe.sim.traces.replay
    record: Optional[RunSummary | StoppedSummary] = None  # the summary's typed record

    def table(self) -> str:
        """The summary table `exoframe run` prints for this run."""
        return run_table(self.summary, self.run_dir)

    def dataframe(self):
        """The metrics, one row per step, as a pandas DataFrame (pandas must be installed)."""
        return dataframe(self.metrics)

    def __repr__(self) -> str:  # a few lines, not the model, metrics and trace
        return run_repr(self.summary, self.run_dir)


def execute(job: Job, out: str | None = None, config_record: dict | None = None,
            progress="off", progress_every: float = 30.0, on_row=None,
            resume_dir=None, cluster=None) -> RunResult:
    """Run `job`; with `out`, in a new run folder under it, which it holds (run_lock.py);
    with `resume_dir`, on from job.resume_from, the latest checkpoint of that run folder,
    whose lock the caller holds (engine/resume.py). on_row(row): after each step. progress:
    "bar" (or True), "lines" (one every `progress_every` seconds) or "off". cluster: under
    torchrun, what it told rank 0's process (engine/launch/cluster.py: `exoframe run` passes
    it)."""
    # The run's folder is written by its absolute path, resolved once, before any of the
    # run's code (a model's forward, a strategy's steps) could change the working directory;
    # the result names it as it was given. In the caller's own process, what the run changes
    # of it is given back at its end.
    caller = CallerState() if job.placement.in_process else None
    try:
        result = _start(job, _absolute(out), config_record, progress, progress_every, on_row,
                        _absolute(resume_dir), cluster)
    finally:
        if caller is not None:
            caller.give_back()
    if result.run_dir is not None:
        result.run_dir = Path(resume_dir) if resume_dir is not None else \
            Path(out) / result.run_dir.name
    return result


def _absolute(path):
    return os.path.abspath(path) if path else path


def _start(job, out, config_record, progress, progress_every, on_row, resume_dir,
           cluster) -> RunResult:
    """execute(), with the run folder's paths absolute."""
    if job.checkpoint_every is not None and out is None and resume_dir is None:
        raise ExoframeError("checkpoint_every: checkpoints are saved in the run folder; "
                            "give a folder for runs (out).")
    job, *prepared = prepare(job)  # the model and data, checked before any folder is made
    # From here until the ranks are up, a stop signal waits (stop_signals.py); then the run
    # stops as one stopped later does, its summary in its folder.
    with run_starting():
        if resume_dir is not None:  # (its lock is the caller's)
            folder, held = RunFolder(Path(resume_dir)), contextlib.nullcontext()
        else:
            folder = RunFolder.create(out, f"{job.strategy_name}-n{job.nodes}") if out else None
            held = RunLock.take(folder.path) if folder else contextlib.nullcontext()
        with held:
            return _execute(job, folder, config_record, progress, progress_every, on_row,
                            cluster, prepared)


def _execute(job, folder, config_record, progress, progress_every, on_row, cluster,
             prepared) -> RunResult:
    resuming = job.resume_from is not None
    if job.checkpoint_every is not None:
        job = dataclasses.replace(job, run_dir=str(folder.path))
    if folder and config_record is not None and not resuming:
        folder.write_config(config_record)
    try:
        sinks = open_sinks(job, folder, config_record)
    except ExoframeError as e:  # the folder exists: say in it why nothing ran
        unwritten = "" if resuming else \
            _write_failed_summary(folder, partial_summary(job, [], "failed", str(e)))
        if unwritten:  # the error line, amended: a new error, from the same cause
            raise ExoframeError(f"{e}{unwritten}", details=e.details,
                                user_error=e.user_error) from e
        raise
    rows = list(job.resume_from.rows) if resuming else []
    provisional = Provisional(folder, job, rows)
    # A resume leaves the folder's records as they are until its first step has ended: one
    # that fails before then changes nothing.
    records_replaced = not resuming
    if records_replaced:
        provisional.refresh()
    bar = progress_display(progress, job.steps, f"{job.strategy_name} ×{job.nodes}",
                           progress_every, measured=job.sim.real)

    def handle_row(row):
        nonlocal records_replaced
        rows.append(row)
        if on_row is not None:
            on_row(row)
        sinks.write(row)  # (a resume's first row: the sinks replace their files whole)
        if not records_replaced:
            records_replaced = True
            if config_record is not None:
                folder.write_config(config_record)
        provisional.refresh()
        bar.update(1, row)

    summary, completed = None, False
    try:
        result = launch(job, handle_row, config_record, cluster, prepared)
        bar.close()
        load(job.model, result.final_state)
        if folder and job.checkpoint_every is not None:  # the run's final (averaged) model
            rank_state.save(folder.path / "model.pt", job.model.state_dict())
        if job.sim.real:  # wall-clock waits split into transfers and waits for peers
            split_measured(result.rank_results)
        record = build_run_summary(job, rows, result)
        if resuming:  # the steps up to it ran in an earlier process
            record = dataclasses.replace(record, resumed_from_step=job.resume_from.step)
        summary = record.to_json()
        # (after the summary, which reads the ranks' traces: build_trace takes them)
        trace = build_trace(job, [r.pop("trace") for r in result.rank_results], result.steps)
        if folder and records_replaced:  # (a resume that had no step to go: nothing changes)
            folder.write_trace(trace)
            folder.write_summary(record)
        completed = True
    except BaseException as e:
        # Once the ranks were started, the launcher raises a RunStopped: how the run
        # stopped, and its rows.
        stopped = e if isinstance(e, RunStopped) else None
        status = stopped.status if stopped else \
            "interrupted" if isinstance(e, KeyboardInterrupt) else "failed"
        finished = stopped.rows if stopped else rows
        named = None  # the error line that names the checkpoint to go on from
        if folder and job.checkpoint_every is not None:
            CheckpointFolder(folder.path).remove_partial()  # (no rank is left to finish one)
            named = _name_the_checkpoint(e, folder)
        said = named or (describe_os_error(e) if disk_full(e) is e
                         else str(e) or type(e).__name__)
        stopped_record = partial_summary(job, row_records(finished), status, said)
        summary = stopped_record.to_json()
        unwritten = _write_failed_summary(folder, stopped_record) \
            if folder and records_replaced else ""
        if isinstance(e, ExoframeError) and (named or unwritten):
            # the error line, amended: a new error, from the same cause
            raise RunStopped(f"{named or e}{unwritten}", status=status, rows=finished,
                             details=e.details, user_error=e.user_error,
                             names_checkpoint=named is not None or _names_checkpoint(e)) \
                from (stopped.__cause__ if stopped else e)
        raise
    finally:
        bar.close()
        # A sink failing as it closes must not hide the error that stopped the run.
        sinks.close(summary if records_replaced else None, raise_errors=completed)
    return RunResult(model=job.model, summary=summary, metrics=rows,
                     run_dir=folder.path if folder else None, trace=trace.to_json(),
                     record=record)


def _names_checkpoint(error: BaseException) -> bool:
    """Whether the error's line already says which checkpoint `exoframe resume` goes on
    from."""
    return isinstance(error, (RunInterrupted, RunStopped)) and error.names_checkpoint


def _name_the_checkpoint(error: BaseException, folder: RunFolder) -> str | None:
    """A run that checkpoints and stopped: its error line, saying where it can go on from
    (None: it says so already, or there is no whole checkpoint)."""
    if not isinstance(error, ExoframeError) or _names_checkpoint(error):
        return None
    try:
        latest = CheckpointFolder(folder.path).latest()
    except ExoframeError:
        return None
    if latest is None:
        return None
    return (f"{error} Its checkpoint at step {latest.step} is whole: `exoframe resume "
            f"{folder.path}` goes on from it.")


class Provisional:
    """summary.json while the run goes: "failed", with the steps finished so far, so that a
    launcher killed outright (SIGKILL, a machine that stops) leaves a summary that says so.
    Written at the first refresh(), rewritten at most every `every` seconds after, and
    replaced when the run ends."""

    def __init__(self, folder: RunFolder | None, job: Job, rows: list, every: float = 10.0):
        self.folder, self.job, self.rows, self.every = folder, job, rows, every
        self.records: list[Row] = []  # self.rows, read as records so far
        self.written_at = -math.inf

    def refresh(self):
        if self.folder is None or time.monotonic() - self.written_at < self.every:
            return
        self.written_at = time.monotonic()
        self.records += row_records(self.rows[len(self.records):])  # (each row read once)
        try:
            write_summary_or_its_head(self.folder, partial_summary(
                self.job, self.records, "failed", "the run stopped before its launcher could "
                "end it (killed with SIGKILL, or the machine stopped); the steps below had "
                "finished."))
        except OSError:
            pass  # a full disk: the metrics sinks say so; the last summary written stays whole


def open_sinks(job: Job, folder: RunFolder | None, config_record: dict | None) -> OpenSinks:
    """The run's sinks, opened in its folder (none without a folder)."""
    if folder is None:
        return OpenSinks((), None, None)
    run = RunInfo(dir=folder.path, name=folder.path.name, strategy=job.strategy_name,
                  workload=job.workload_name, nodes=job.nodes, steps=job.steps, seed=job.seed,
                  net=job.sim.net, config=dict(config_record or {}),
                  resumed_at=job.resume_from.step if job.resume_from is not None else None,
                  resumed_rows=tuple(job.resume_from.rows) if job.resume_from is not None else ())
    return OpenSinks(job.sinks, run,
                     lambda error: partial_summary(job, [], "failed", error).to_json())


def _write_failed_summary(folder: RunFolder, summary: StoppedSummary) -> str:
    """Best effort: on a full disk the summary cannot be written either; what the error
    line then adds to say so ("" when it was written), instead of the write's own error
    replacing it."""
    try:
        write_summary_or_its_head(folder, summary)
    except OSError as e:
        return f" (and summary.json could not be written: {e.strerror or e})"
    return ""


def write_summary_or_its_head(folder: RunFolder, summary: StoppedSummary):
    """A failed run's summary; where a full disk has no room for its rows (a summary holds
    every one), without them ("rows": null): steps_completed and the error still say how the
    run ended, and the rows are in the metrics sinks' files."""
    try:
        folder.write_summary(summary)
    except OSError as e:
        if disk_full(e) is None or summary.rows is None:
            raise
        folder.write_summary(dataclasses.replace(summary, rows=None))


def row_records(rows: list) -> list[Row]:
    """Metrics rows as records, up to the first that is not one: a value that is not a
    number stopped the run at that step (the sinks refuse it: no file has its line)."""
    records = []
    for row in rows:
        try:
            records.append(Row.from_json(row, "a metrics row"))
        except ExoframeError:
            break
    return records


def partial_summary(job: Job, rows: list[Row], status: str, error: str) -> StoppedSummary:
    """The summary of a run that did not complete: what it was, why it stopped, and the
    steps every rank finished (without val_loss where the validation had not come)."""
    val_rows = [r for r in rows if r.val_loss is not None]
    return StoppedSummary(
        status=status,
        error=error,
        strategy=job.strategy_name,
        workload=job.workload_name,
        num_nodes=job.nodes,
        steps=job.steps,
        steps_completed=len(rows),
        final_loss=rows[-1].loss if rows else None,
        final_val_loss=val_rows[-1].val_loss if val_rows else None,
        seed=job.seed,
        net=job.sim.net,
        rows=rows,
    )


def build_trace(job: Job, rank_traces: list, steps: int) -> Trace:
    """trace.json's record: the run, and each rank's events (its clock's trace)."""
    return Trace(
        version=1,
        strategy=job.strategy_name,
        timing_dependent=job.strategy_cls.traits.timing_dependent,
        bucketed_gradients=job.strategy_cls.traits.gradient_all_reduce_after_backward,
        overlapped_outer_sync=job.strategy_cls.traits.outer_sync_overlaps_backward,
        nodes=job.nodes,
        steps=steps,
        seed=job.seed,
        net=job.sim.net,
        real_network=job.sim.real,
        compute_model=job.sim.compute.describe(),
        overlap_rate=job.sim.compute.overlap_rate,
        faults=job.faults.describe(),
        model_parameters=sum(p.numel() for p in job.model.parameters()),
        ranks=rank_traces,
    )
