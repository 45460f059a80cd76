"""The Python API: train your own model and data under a strategy, from a script or notebook.

    trainer = exoframe.Trainer(model, train_data, val_data, batch_size=32)
    result = trainer.fit(strategy="diloco", num_nodes=4, steps=500, strategy_params={"H": 50})
    result = trainer.fit(strategy=exoframe.strategies.DiLoCo(H=50), num_nodes=4, steps=500)
    result.model     # the held model: a copy of `model`, trained; `model` is left as given
    result.summary   # the same fields as summary.json

`model.forward(batch)` must return a scalar loss. Data is a Dataset (split into equal shards,
one per rank) or a factory `(rank, num_nodes, split) -> Dataset` with split "train"/"val".
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Optional

import torch

from ..errors import ExoframeError
from ..workloads.base import Workload, shard_factory
from .plan.fit_keywords import fit_config, fit_signature
from .plan.resolve import build_job
from .resume import resume_job
from .run import RunResult, execute


class Trainer:
    def __init__(self, model: torch.nn.Module, train_data, val_data=None, batch_size: int = 32,
                 best_loss: Optional[float] = None, metrics=None):
        """metrics(model, batch) -> {name: number}: validation metrics beside the loss."""
        self.model = model  # as given: every fit trains a copy of it
        self._last = None  # the last fit's trained model, for fit(warm_start=True)
        self.dataset = train_data if callable(train_data) and not hasattr(train_data, "__len__") \
            else shard_factory(train_data, val_data)
        self.batch_size = batch_size
        self.best_loss = best_loss
        self.metrics = metrics

    def fit(self, strategy="ddp", *, resume: str | None = None, warm_start: bool = False,
            progress: bool = False, **options) -> RunResult:
        """Train under `strategy`: a name, a Strategy class, or one called with its
        parameters (exoframe.strategies.DiLoCo(H=50)). options: any RunConfig field by name,
        with the field's default, as `exoframe run --help` describes it (num_nodes stands
        for nodes; out, a folder for the run folder, defaults to none: nothing is written);
        batch_size defaults to the Trainer's. resume: a run folder whose latest checkpoint
        to go on from, with the same arguments and more steps. progress: a progress bar.

        Each fit starts from a copy of the model as it was given (weights and buffers), so
        fits with the same arguments give the same records; warm_start=True starts from
        the last fit's trained model instead (the given one before any fit)."""
        config, strategy_cls, out = fit_config(strategy, options, self.batch_size)
        # The model and data come from Python: config.yaml says so (`exoframe resume` refuses
        # such a run folder; fit(resume=...) goes on with it).
        config = dataclasses.replace(config, workload="custom")
        if warm_start and resume is not None:
            raise ExoframeError("Trainer.fit: resume= goes on from the run folder's checkpoint "
                                "and warm_start=True from the last fit's model; give one.")
        model = copy.deepcopy(self._last if warm_start and self._last is not None
                              else self.model)
        workload = Workload(build_model=lambda: model, dataset=self.dataset,
                            batch_size=self.batch_size, best_loss=self.best_loss,
                            metrics=self.metrics)
        job = build_job(config, workload, model, strategy=strategy_cls)
        record = job.config_record()
        if resume is not None:
            result = resume_job(job, record, resume, progress=progress)
        else:
            result = execute(job, out=out, config_record=record, progress=progress)
        self._last = result.model
        return result


Trainer.fit.__signature__ = fit_signature(Trainer.fit)
