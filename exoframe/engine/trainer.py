"""The Python API: train your own model and data under a strategy, from a script or notebook.

    trainer = exoframe.Trainer(model, train_data, val_data, batch_size=32)
    result = trainer.fit(strategy="diloco", num_nodes=4, steps=500, strategy_params={"H": 50})
    result.model     # the averaged model
    result.summary   # the same fields as summary.json

`model.forward(batch)` must return a scalar loss. Data is a Dataset (split into equal shards,
one per rank) or a factory `(rank, num_nodes, split) -> Dataset` with split "train"/"val".
"""
from __future__ import annotations

from typing import Optional

import torch

from ..config import RunConfig
from ..plugins import get_plugin_manager
from ..strategies.base import OptimizerSpec
from ..workloads.base import shard_factory
from .job import Job, default_eval_every, resolve_strategy
from .run import RunResult, execute


class Trainer:
    def __init__(self, model: torch.nn.Module, train_data, val_data=None, batch_size: int = 32,
                 best_loss: Optional[float] = None):
        self.model = model
        self.dataset = train_data if callable(train_data) and not hasattr(train_data, "__len__") \
            else shard_factory(train_data, val_data)
        self.batch_size = batch_size
        self.best_loss = best_loss

    def fit(self, strategy="ddp", num_nodes: int = 2, steps: int = 100,
            strategy_params: dict | None = None, optimizer: str = "adamw", lr: float = 1e-3,
            weight_decay: float = 0.0, momentum: float = 0.0, seed: int = 0,
            eval_every: int | None = None, eval_batches: int = 8, threads: int = 1,
            out: str | None = None, progress: bool = False) -> RunResult:
        RunConfig(nodes=num_nodes, steps=steps, lr=lr, threads=threads, batch_size=self.batch_size,
                  eval_every=eval_every, eval_batches=eval_batches).validate()
        cls, name, params = resolve_strategy(strategy, strategy_params, get_plugin_manager())
        job = Job(model=self.model, dataset=self.dataset, strategy_cls=cls, strategy_name=name,
                  strategy_params=params,
                  optimizer=OptimizerSpec(optimizer, lr, weight_decay, momentum),
                  nodes=num_nodes, steps=steps, batch_size=self.batch_size, seed=seed,
                  eval_every=eval_every or default_eval_every(steps), eval_batches=eval_batches,
                  threads=threads, best_loss=self.best_loss)
        return execute(job, out=out, progress=progress)
