"""Run a Job end to end: launch the ranks, stream metrics, write the summary.

summary.json says how the run ended: "status" is "completed", "failed" or "interrupted";
a run that did not complete has the error line and every step it finished."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from tqdm import tqdm

from ..errors import ExoframeError
from ..report import build_summary
from .job import Job
from .launcher import launch
from .model_state import load
from .run_folder import RunFolder


@dataclass
class RunResult:
    model: torch.nn.Module  # the ranks' final weights and buffers, averaged (see model_state)
    summary: dict
    metrics: list
    run_dir: Optional[Path] = None
    trace: Optional[dict] = None  # what each rank's clock saw; see exoframe.sim.replay


def execute(job: Job, out: str | None = None, config_record: dict | None = None,
            progress: bool = False, on_row=None) -> RunResult:
    """Run `job`; with `out`, in a new run folder under it. on_row(row): after each step."""
    folder = RunFolder.create(out, f"{job.strategy_name}-n{job.nodes}") if out else None
    if folder and config_record is not None:
        folder.write_config(config_record)
    sinks = [factory(folder.path) for factory in job.sinks] if folder else []
    rows = []
    bar = tqdm(total=job.steps, desc=f"{job.strategy_name} ×{job.nodes}", unit="step",
               disable=not progress, dynamic_ncols=True)

    def handle_row(row):
        rows.append(row)
        if on_row is not None:
            on_row(row)
        for sink in sinks:
            try:
                sink.write(row)
            except OSError as e:
                raise ExoframeError(f"cannot write {e.filename or folder.path}: "
                                    f"{e.strerror or e}. Free some space, or give --out on "
                                    "another disk.") from None
        bar.update(1)
        postfix = {"loss": f"{row['loss']:.4f}"}
        if "val_loss" in row:
            postfix["val"] = f"{row['val_loss']:.4f}"
        bar.set_postfix(postfix, refresh=False)

    completed = False
    try:
        result = launch(job, handle_row)
        completed = True
    except ExoframeError as e:
        if folder and hasattr(e, "status"):  # set by the launcher once ranks were started
            _write_failed_summary(folder, partial_summary(job, e.rows, e.status, str(e)), e)
        raise
    finally:
        bar.close()
        for sink in sinks:
            try:
                sink.close()
            except OSError:
                if completed:
                    raise  # else the error in flight says what went wrong first
    load(job.model, result.final_state)
    trace = build_trace(job, [r.pop("trace") for r in result.rank_results], result.steps)
    summary = {"status": "completed", **build_summary(job, rows, result)}
    if folder:
        folder.write_trace(trace)
        folder.write_summary(summary)
    return RunResult(model=job.model, summary=summary, metrics=rows,
                     run_dir=folder.path if folder else None, trace=trace)


def _write_failed_summary(folder: RunFolder, summary: dict, error: ExoframeError):
    """Best effort: on a full disk the summary cannot be written either; the error says so
    instead of being replaced by the write's own error."""
    try:
        folder.write_summary(summary)
    except OSError as e:
        error.args = (f"{error.args[0]} (and summary.json could not be written: "
                      f"{e.strerror or e})",)


def partial_summary(job: Job, rows: list, status: str, error: str) -> dict:
    """The summary of a run that did not complete: what it was, why it stopped, and the
    steps every rank finished (without val_loss where the validation had not come)."""
    val_rows = [r for r in rows if r.get("val_loss") is not None]
    return {
        "status": status,
        "error": error,
        "strategy": job.strategy_name,
        "workload": job.workload_name,
        "num_nodes": job.nodes,
        "steps": job.steps,
        "steps_completed": len(rows),
        "final_loss": rows[-1]["loss"] if rows else None,
        "final_val_loss": val_rows[-1]["val_loss"] if val_rows else None,
        "seed": job.seed,
        "net": job.sim.net,
        "rows": rows,
    }


def build_trace(job: Job, rank_traces: list, steps: int) -> dict:
    return {
        "version": 1,
        "strategy": job.strategy_name,
        "timing_dependent": job.strategy_cls.timing_dependent,
        "bucketed_gradients": job.strategy_cls.gradient_all_reduce_after_backward,
        "overlapped_outer_sync": job.strategy_cls.outer_sync_overlaps_backward,
        "nodes": job.nodes,
        "steps": steps,
        "seed": job.seed,
        "net": job.sim.net,
        "compute_model": job.sim.compute.describe(),
        "model_parameters": sum(p.numel() for p in job.model.parameters()),
        "ranks": rank_traces,
    }
