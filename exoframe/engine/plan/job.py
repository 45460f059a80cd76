"""A Job: everything the ranks need, resolved and validated in the launcher before any fork
(engine/plan/resolve.py makes it from a RunConfig)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ...config import RunConfig
from ...sim import SimSetup
from ...sim.network.faults import FaultSpec
from ...strategies.optimizers import OptimizerSpec
from ...workloads.base import DatasetFactory
from .placement import Placement
from .target import LAG

CONFIG_FIELDS = frozenset(f.name for f in dataclasses.fields(RunConfig))


@dataclass(frozen=True)
class Job:
    """The RunConfig and what was resolved from it. A config field that needs no resolving
    is read from the config (job.seed is job.config.seed), so a new RunConfig field reaches
    every rank with no edit here. Frozen: what is learnt later (the FLOP count of a step,
    the run folder, the checkpoint resumed from) makes a new Job (dataclasses.replace)."""

    config: RunConfig
    model: torch.nn.Module
    dataset: DatasetFactory
    strategy_cls: type
    strategy_name: str
    strategy_params: object
    optimizer: OptimizerSpec
    steps: int  # config.steps, or epochs' worth of steps
    batch_size: int  # config.batch_size, or the workload's
    sim: SimSetup
    placement: Placement  # each node's device, the backend, the processes (plan/placement.py)
    eval_every: int  # 1 with a target, else config.eval_every or a tenth of the steps
    workload_name: str = "custom"
    best_loss: Optional[float] = None
    sinks: tuple = ()  # exoframe.sinks.SinkSpec: opened in the run folder (engine/run.py)
    time_budget: Optional[float] = None  # simulated seconds; stop at the step that passes it
    metrics: Optional[Callable] = None  # the workload's metrics(model, batch) -> dict
    tokens_per_sample: Optional[int] = None
    run_dir: Optional[str] = None  # set by engine/run.py: the run folder, for checkpoints
    resume_from: Optional[object] = None  # an engine.records.checkpoint.Checkpoint, when resumed
    faults: FaultSpec = FaultSpec()  # simulated node failures (comm/faults.py)
    # How the training set was split (exoframe/partition.py): each node's size and label
    # histogram, for summary.json; None for a workload that makes each rank's data itself.
    partition: Optional[dict] = None

    def __post_init__(self):
        """The config's fields that need no resolving become the Job's attributes, read at
        the speed of its own fields (a rank reads several every step)."""
        for name in COPIED_FIELDS:
            self.__dict__[name] = getattr(self.config, name)

    @property
    def device(self) -> str:
        return self.placement.device

    # What is validated when: the ranks send, and the launcher waits for, the same.
    def evaluates(self, step: int) -> bool:
        """Whether the ranks send their models to the evaluator at the end of `step`."""
        return step % self.eval_every == 0 or step == self.steps

    def replicas_at(self, step: int) -> bool:
        """Whether the replicas' average is validated at evaluation step `step`: where it is
        not the held model, at the last step, or at every evaluation with val_replicas=every."""
        return (not self.strategy_cls.held_model_is_replicas_average()
                and (self.val_replicas == "every" or step == self.steps))

    def at_stop(self, step: int) -> tuple[bool, bool]:
        """What the ranks send when the run stops after `step`, before its last: (the held
        model, the current weights), that the final model and its validation need."""
        replicas = not self.strategy_cls.held_model_is_replicas_average()
        if not self.evaluates(step):
            return True, replicas
        return False, replicas and not self.replicas_at(step)

    def validations_at(self, step: int, stops: bool) -> int:
        """How many answers of the evaluator `step`'s row waits for (stops: the run stops
        after it)."""
        return int(self.evaluates(step)) + int(stops and step < self.steps
                                               and any(self.at_stop(step)))

    def asks_to_stop(self, step: int) -> bool:
        """Whether a rank asks the launcher, at the end of `step`, whether to stop there."""
        if step >= self.steps:
            return False
        return self.time_budget is not None or (self.target_loss is not None and step > LAG)


# The config fields a Job does not resolve: copied from its config when it is made.
COPIED_FIELDS = CONFIG_FIELDS - frozenset(f.name for f in dataclasses.fields(Job))
