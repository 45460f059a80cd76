"""The Python API: train your own model and data under a strategy, from a script or notebook.

    trainer = exoframe.Trainer(model, train_data, val_data, batch_size=32)
    result = trainer.fit(strategy="diloco", num_nodes=4, steps=500, strategy_params={"H": 50})
    result.model     # the held model
    result.summary   # the same fields as summary.json

`model.forward(batch)` must return a scalar loss. Data is a Dataset (split into equal shards,
one per rank) or a factory `(rank, num_nodes, split) -> Dataset` with split "train"/"val".
"""
from __future__ import annotations

from typing import Optional

import torch

from ..config import RunConfig, config_to_dict
from ..workloads.base import Workload, shard_factory
from .job import build_job
from .resume import resume_job
from .run import RunResult, execute


class Trainer:
    def __init__(self, model: torch.nn.Module, train_data, val_data=None, batch_size: int = 32,
                 best_loss: Optional[float] = None, metrics=None):
        """metrics(model, batch) -> {name: number}: validation metrics beside the loss."""
        self.model = model
        self.dataset = train_data if callable(train_data) and not hasattr(train_data, "__len__") \
            else shard_factory(train_data, val_data)
        self.batch_size = batch_size
        self.best_loss = best_loss
        self.metrics = metrics

    def fit(self, strategy="ddp", num_nodes: int = 2, steps: int = 100,
            strategy_params: dict | None = None, optimizer: str = "adamw", lr: float = 1e-3,
            weight_decay: float = 0.0, momentum: float = 0.0, seed: int = 0,
            eval_every: int | None = None, eval_batches: int = 8,
            target_loss: float | None = None, threads: int = 1,
            net: str = "ideal", compute: str = "measured", stragglers: str = "",
            out: str | None = None, sinks=("jsonl",), progress: bool = False,
            hang_timeout: float = 300.0, on_nonfinite: str = "stop",
            optimizer_params: dict | None = None, schedule: str = "constant",
            warmup_steps: int = 0, min_lr_ratio: float = 0.0,
            clip_grad_norm: float | None = None, accumulate: int = 1,
            precision: str = "fp32", device: str = "cpu", epochs: int | None = None,
            shuffle: bool = True, drop_last: bool = True,
            time_budget: float | str | None = None, checkpoint_every: int | None = None,
            resume: str | None = None, faults: str = "",
            nodes_per_process: int | None = None, partition: str = "iid") -> RunResult:
        """Arguments as the RunConfig fields of `exoframe run` (net: a preset name or a YAML
        file; compute: measured, fixed:<time per step> or flops:<device>; sinks: metrics
        sinks writing into the run folder under `out`; target_loss: validate every step and
        stop once the held model's validation loss is at most this; checkpoint_every:
        save every rank's state every N steps in the run folder; resume: a run folder whose
        latest checkpoint to go on from, with the same arguments and more steps; faults:
        simulated node failures, as `exoframe run --faults`; nodes_per_process: nodes sharing
        a worker process, engine/packing.py; partition: how the training set is split over
        the nodes, iid, dirichlet:ALPHA, shards:K or quantity:ALPHA, exoframe/partition.py)."""
        config = RunConfig(
            strategy_params=dict(strategy_params or {}), nodes=num_nodes, steps=steps,
            batch_size=self.batch_size, optimizer=optimizer, lr=lr, weight_decay=weight_decay,
            momentum=momentum, seed=seed, eval_every=eval_every, eval_batches=eval_batches,
            target_loss=target_loss, threads=threads, net=net, compute=compute,
            stragglers=stragglers, sinks=list(sinks), hang_timeout=hang_timeout,
            on_nonfinite=on_nonfinite, optimizer_params=dict(optimizer_params or {}),
            schedule=schedule, warmup_steps=warmup_steps, min_lr_ratio=min_lr_ratio,
            clip_grad_norm=clip_grad_norm, accumulate=accumulate, precision=precision,
            device=device, epochs=epochs, shuffle=shuffle, drop_last=drop_last,
            time_budget=time_budget, checkpoint_every=checkpoint_every,
            faults=faults, nodes_per_process=nodes_per_process, partition=partition).validate()
        workload = Workload(build_model=lambda: self.model, dataset=self.dataset,
                            batch_size=self.batch_size, lr=lr, best_loss=self.best_loss,
                            metrics=self.metrics)
        job = build_job(config, workload, self.model, strategy=strategy)
        # The model and data came from Python: `exoframe resume` cannot rebuild them.
        record = {**config_to_dict(config), "workload": "custom"}
        if resume is not None:
            return resume_job(job, record, resume, progress=progress)
        return execute(job, out=out, config_record=record, progress=progress)
