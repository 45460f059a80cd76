"""Run a Job end to end: launch the ranks, stream metrics, write the summary."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from tqdm import tqdm

from ..comm import unflatten_into
from ..report import build_summary
from .job import Job
from .launcher import launch
from .run_folder import RunFolder


@dataclass
class RunResult:
    model: torch.nn.Module  # holds the average of the ranks' final weights
    summary: dict
    metrics: list
    run_dir: Optional[Path] = None


def execute(job: Job, out: str | None = None, config_record: dict | None = None,
            progress: bool = False) -> RunResult:
    folder = RunFolder.create(out, f"{job.strategy_name}-n{job.nodes}") if out else None
    if folder and config_record is not None:
        folder.write_config(config_record)
    rows = []
    bar = tqdm(total=job.steps, desc=f"{job.strategy_name} ×{job.nodes}", unit="step",
               disable=not progress, dynamic_ncols=True)

    def on_row(row):
        rows.append(row)
        if folder:
            folder.append_metrics(row)
        bar.update(1)
        postfix = {"loss": f"{row['loss']:.4f}"}
        if "val_loss" in row:
            postfix["val"] = f"{row['val_loss']:.4f}"
        bar.set_postfix(postfix, refresh=False)

    try:
        result = launch(job, on_row)
    finally:
        bar.close()
        if folder:
            folder.close()
    unflatten_into(result.final_parameters, list(job.model.parameters()))
    summary = build_summary(job, rows, result)
    if folder:
        folder.write_summary(summary)
    return RunResult(model=job.model, summary=summary, metrics=rows,
                     run_dir=folder.path if folder else None)
