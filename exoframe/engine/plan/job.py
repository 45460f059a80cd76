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


@dataclass(frozen=True)
class Job:
    """The RunConfig and what was resolved from it: each text option (network, compute,
    stragglers, faults, time budget, partition) parsed once, by engine/plan/resolve.py, into
    the typed value here (sim, faults, time_budget, partition, dataset). A config field
    that needs no resolving is read from the config: the ones the ranks read are declared
    below as properties (job.seed is job.config.seed), any other as job.config.<field>.
    Frozen: what is learnt later (the FLOP count of a step, the run folder, the checkpoint
    resumed from) makes a new Job (dataclasses.replace)."""

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
    faults: FaultSpec = FaultSpec()  # simulated node failures (comm/rank_failures.py)
    # How the training set was split (exoframe/partition.py): each node's size and label
    # histogram, for summary.json; None for a workload that makes each rank's data itself.
    partition: Optional[dict] = None

    @property
    def device(self) -> str:
        """The device the nodes train on, resolved (config.device may say auto)."""
        return self.placement.device

    # The config fields the ranks and the launcher read, as the Job's own (read-only; the
    # config's value). Any other is read as job.config.<field>; an option the Job resolves
    # (net, compute, stragglers, faults, time_budget, partition, steps, batch_size, lr, ...)
    # is read only as its resolved value above, never as its text.
    @property
    def nodes(self) -> int:
        return self.config.nodes

    @property
    def seed(self) -> int:
        return self.config.seed

    @property
    def schedule(self) -> str:
        return self.config.schedule

    @property
    def warmup_steps(self) -> int:
        return self.config.warmup_steps

    @property
    def min_lr_ratio(self) -> float:
        return self.config.min_lr_ratio

    @property
    def clip_grad_norm(self) -> Optional[float]:
        return self.config.clip_grad_norm

    @property
    def accumulate(self) -> int:
        return self.config.accumulate

    @property
    def precision(self) -> str:
        return self.config.precision

    @property
    def shuffle(self) -> bool:
        return self.config.shuffle

    @property
    def drop_last(self) -> bool:
        return self.config.drop_last

    @property
    def val_examples(self) -> Optional[int]:
        return self.config.val_examples

    @property
    def val_replicas(self) -> str:
        return self.config.val_replicas

    @property
    def target_loss(self) -> Optional[float]:
        return self.config.target_loss

    @property
    def threads(self) -> int:
        return self.config.threads

    @property
    def hang_timeout(self) -> float:
        return self.config.hang_timeout

    @property
    def connect_timeout(self) -> float:
        return self.config.connect_timeout

    @property
    def on_nonfinite(self) -> str:
        return self.config.on_nonfinite

    @property
    def checkpoint_every(self) -> Optional[int]:
        return self.config.checkpoint_every

    def config_record(self) -> dict:
        """The run's configuration as config.yaml records it (engine/run.py writes it, the
        checkpoints and a torchrun cluster's ranks compare it, `exoframe resume` and the
        reports read it back): the config, with what the Job resolved of it (the strategy's
        registered name and its parameters with their defaults, the batch size, learning
        rate and validation interval the workload and the steps give). One record for
        `exoframe run`, Trainer.fit, a sweep's runs and a resume."""
        record = dataclasses.asdict(self.config)
        record.update(strategy=self.strategy_name, batch_size=self.batch_size,
                      lr=self.optimizer.lr, eval_every=self.eval_every,
                      strategy_params=dict(vars(self.strategy_params)))
        return record

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

