"""From a RunConfig to a Job: the strategy, workload and user modules by name, the data's
partition and epochs, the network, the placement, and every refusal that must come before
anything starts."""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
import zlib
from dataclasses import dataclass
import math
from pathlib import Path

import torch
from torch.utils.data import IterableDataset

from ...config import RunConfig, budget_seconds
from ...errors import ExoframeError, shorten
from ...partition import describe, parse_partition, partition_indices
from ...plugins import PluginManager, get_plugin_manager
from ...sim import SimSetup, resolve_sim
from ...sim.network.faults import FaultSpec, parse_faults
from ...sinks import sink_spec
from ...strategies.base import Strategy
from ...strategies.optimizers import OptimizerSpec
from ...workloads.base import DatasetFactory, Shards, Workload, call_with_params
from . import devices
from .node_memory import check_host_memory, node_memory
from .placement import place

from .job import Job

MAX_STEPS = 10 ** 8


def resolve_strategy(strategy, params: dict | None, pm: PluginManager):
    """(class, registered name, typed params) for a name or a Strategy subclass."""
    if isinstance(strategy, type) and issubclass(strategy, Strategy):
        cls, name = strategy, getattr(strategy, "name", None) or strategy.__name__.lower()
    else:
        entry = pm.strategies.get(strategy)
        cls, name = entry.obj, entry.name
    return cls, name, cls.parse_params(params, name)


def load_workload(spec: str, params: dict, pm: PluginManager) -> Workload:
    """A registered workload name, `package.module:function` (installed, or a module in the
    current folder) or `path/to/file.py:function`, returning a Workload."""
    if ":" in spec:
        module_name, _, attr = spec.rpartition(":")
        module = (module_from_file(module_name) if module_name.endswith(".py")
                  else import_user_module(module_name))
        factory = getattr(module, attr, None)
        if factory is None:
            raise ExoframeError(f"workload module '{module_name}' has no attribute '{attr}'.")
    else:
        factory = pm.workloads.get(spec).obj
    if not callable(factory):
        raise ExoframeError(f"workload '{spec}' is a {type(factory).__name__}, not a function "
                            "returning an exoframe.Workload.")
    workload = _user_code(lambda: call_with_params(factory, params, f"workload '{spec}'"),
                          f"workload '{spec}'", params)
    if not isinstance(workload, Workload):
        raise ExoframeError(
            f"workload '{spec}' returned {type(workload).__name__}, expected exoframe.Workload.")
    return workload


@dataclass(frozen=True)
class Resolved:
    """What a config names, resolved through the plugins and checked, before any workload
    or model exists: a sweep checks every point with it before anything runs."""
    strategy_cls: type
    strategy_name: str
    strategy_params: object
    optimizer: object  # the registry entry
    sim: SimSetup
    device: str
    sinks: tuple
    faults: FaultSpec


def resolve_names(config: RunConfig, strategy=None, pm: PluginManager | None = None,
                  sim: SimSetup | None = None) -> Resolved:
    """Strategy and parameters, optimizer, network, compute model, stragglers, device,
    sinks, faults and checkpoints of `config`, each a one-line error naming the field."""
    pm = pm or get_plugin_manager()
    strategy_cls, strategy_name, strategy_params = resolve_strategy(
        strategy or config.strategy, config.strategy_params, pm)
    optimizer = pm.optimizers.get(config.optimizer)
    sim = sim or resolve_network(config, pm)
    faults = resolve_faults(config)
    if sim.real:
        check_real_network(config, strategy_cls, strategy_name, faults)
    checked_checkpoints(config, strategy_cls, strategy_name, strategy_params)
    if config.stack_replicas:
        check_stacking(config, strategy_cls, strategy_name, faults)
    device = devices.resolve(config.device)
    if config.precision == "tf32" and not device.startswith("cuda"):
        raise ExoframeError(f"precision: tf32 is how a CUDA GPU multiplies fp32 matrices, and "
                            f"these nodes train on {config.device}"
                            f"{'' if device == config.device else f' ({device})'}; use "
                            "--precision fp32 there, or --device cuda.")
    return Resolved(strategy_cls, strategy_name, strategy_params, optimizer, sim, device,
                    tuple(sink_spec(item, pm.sinks) for item in config.sinks), faults)


def resolve_network(config: RunConfig, pm: PluginManager) -> SimSetup:
    """The run's network, compute model and stragglers (config.net, .compute, .stragglers),
    parsed: the Job's sim. Each run has a setup of its own (the launcher writes a step's FLOP
    count into its compute model)."""
    return resolve_sim(config.net, config.compute, config.stragglers, config.nodes, pm)


def resolve_faults(config: RunConfig) -> FaultSpec:
    """config.faults parsed (the one parse on a run's path; RunConfig.validate checks it
    early) and checked against the run's nodes: the Job's faults."""
    faults = parse_faults(config.faults)
    faults.check_ranks(config.nodes)
    return faults


def resolve_time_budget(config: RunConfig) -> float | None:
    """config.time_budget in simulated seconds (RunConfig.validate checks it early), or
    None: the Job's time_budget."""
    return None if config.time_budget is None else budget_seconds(config.time_budget)


def import_user_module(name: str):
    # Let users name modules next to where they run, but after everything installed:
    # a stray file there (sympy.py, ...) must not shadow a module torch imports.
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        return importlib.import_module(name)
    except Exception as e:
        raise ExoframeError(f"cannot import workload module '{name}': {e} (looked among the "
                            f"installed packages and in the current folder, {os.getcwd()}; a "
                            "file elsewhere: --workload path/to/file.py:function).") from None


def module_from_file(path: str):
    """A workload's .py file, imported under a name of its own (its folder is put on sys.path
    for the modules beside it); the ranks, forked, have it too."""
    file = Path(path).resolve()
    if not file.is_file():
        raise ExoframeError(f"workload: no such file '{path}'; give path/to/file.py:function.")
    name = f"exoframe_user_workload_{file.stem}_{zlib.crc32(str(file).encode()):x}"
    if name in sys.modules:
        return sys.modules[name]
    if str(file.parent) not in sys.path:
        sys.path.append(str(file.parent))
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise ExoframeError(f"cannot import workload file '{path}': {type(e).__name__}: "
                            f"{e}") from None
    return module


def build_job(config: RunConfig, workload: Workload, model: torch.nn.Module, strategy=None,
              pm: PluginManager | None = None, sim: SimSetup | None = None) -> Job:
    """The Job for a validated config; `strategy` (a name or a Strategy subclass) overrides
    config.strategy, and the workload supplies the defaults config leaves as None."""
    pm = pm or get_plugin_manager()
    names = resolve_names(config, strategy, pm, sim)
    strategy_cls, strategy_name, strategy_params = (names.strategy_cls, names.strategy_name,
                                                    names.strategy_params)
    batch_size = config.batch_size or workload.batch_size
    dataset, partition = partition_data(workload.dataset, config.partition, config.seed,
                                        config.nodes)
    steps = config.steps if config.epochs is None else epoch_steps(config, dataset, batch_size)
    if steps > MAX_STEPS:
        given = (f"steps: {steps} steps are" if config.epochs is None
                 else f"epochs: {config.epochs:g} epochs are {steps} steps,")
        raise ExoframeError(f"{given} more than a run can take (each step is a row the run "
                            f"keeps and writes); give at most {MAX_STEPS} steps.")
    problem = strategy_cls.params_problem(strategy_params, config.nodes, model)
    if problem:
        raise ExoframeError(f"strategy '{strategy_name}': {problem}.")
    if config.warmup_steps >= steps:
        raise ExoframeError(f"warmup_steps ({config.warmup_steps}) must be fewer than the "
                            f"run's steps ({steps}): the learning rate would never reach its "
                            "peak and decay.")
    optimizer, sim, device = names.optimizer, names.sim, names.device
    return Job(
        config=config, model=model, dataset=dataset, partition=partition,
        strategy_cls=strategy_cls, strategy_name=strategy_name, strategy_params=strategy_params,
        optimizer=OptimizerSpec(optimizer.name, config.lr or workload.lr, config.weight_decay,
                                config.momentum, dict(config.optimizer_params), optimizer.obj),
        steps=steps, batch_size=batch_size,
        placement=place(config.nodes, config.nodes_per_process, device, sim.real, config.device,
                        memory=node_memory(model, optimizer.name)
                        if device.startswith("cuda") else None, in_process=config.in_process,
                        offload=config.offload, stacked=config.stack_replicas),
        sim=sim,
        # A target is judged at every step, so the time to reach it is resolved to one step.
        eval_every=1 if config.target_loss is not None else
        config.eval_every or max(1, steps // 10),
        workload_name=workload.name,
        time_budget=resolve_time_budget(config),
        metrics=workload.metrics, tokens_per_sample=workload.tokens_per_sample,
        best_loss=workload.best_loss, sinks=names.sinks, faults=names.faults)


def check_real_network(config: RunConfig, strategy_cls: type, strategy_name: str,
                       faults: FaultSpec):
    """What needs the simulated network, refused with --net real."""
    if faults.active:
        raise ExoframeError("faults: simulated failures need the simulated network; drop "
                            "--faults with --net real.")
    if strategy_cls.traits.remote_calls:
        raise ExoframeError(f"net: strategy '{strategy_name}' makes remote calls, which travel "
                            "through the simulated network; pick a network other than real.")
    if strategy_cls.traits.timing_dependent:
        # gloo's point-to-point handles say "done" only once waited for: an asynchronous
        # strategy would never see an exchange arrive.
        raise ExoframeError(f"net: strategy '{strategy_name}' depends on when exchanges "
                            "complete, which the real network does not report yet; pick a "
                            "simulated network.")
    if config.checkpoint_every is not None:
        raise ExoframeError("checkpoint_every: a run on the real network cannot be "
                            "checkpointed yet; drop one of them.")


def check_stacking(config: RunConfig, strategy_cls: type, strategy_name: str,
                   faults: FaultSpec):
    """What stacked replicas (engine/node/stacked.py) cannot train; where nodes run is
    checked with the placement (placement.check_stacked)."""
    if not strategy_cls.traits.stacks:
        raise ExoframeError(f"stack_replicas: strategy '{strategy_name}' does not declare that "
                            "its nodes may share one stacked model (its traits' `stacks`, "
                            "which ddp, localsgd, diloco and hier-diloco declare); drop "
                            "--stack-replicas.")
    if faults.active:
        raise ExoframeError("stack_replicas: stacked nodes compute every step together, and a "
                            "simulated failure keeps a node from computing; drop --faults or "
                            "--stack-replicas.")
    if config.precision == "fp16":
        raise ExoframeError("stack_replicas: fp16's loss scale is each node's own, and stacked "
                            "nodes take one backward pass; use --precision bf16, or drop "
                            "--stack-replicas.")


def checked_checkpoints(config: RunConfig, strategy_cls: type, strategy_name: str,
                        strategy_params):
    """config.checkpoint_every, where the run can be checkpointed."""
    every = config.checkpoint_every
    if every is None:
        return None
    if not strategy_cls.traits.checkpointable:
        raise ExoframeError(f"checkpoint_every: strategy '{strategy_name}' cannot be "
                            "checkpointed (its exchanges stay in flight across steps and what "
                            "it does depends on their timing); drop checkpoint_every.")
    if strategy_cls.traits.remote_calls:
        raise ExoframeError(f"checkpoint_every: strategy '{strategy_name}' makes remote calls, "
                            "which cannot be checkpointed yet (a call may be in flight at any "
                            "step end); drop checkpoint_every.")
    problem = strategy_cls.checkpoint_problem(strategy_params)
    if problem:
        raise ExoframeError(f"checkpoint_every: strategy '{strategy_name}' cannot be "
                            f"checkpointed: {problem}.")
    for field, value in (("target_loss", config.target_loss),
                         ("time_budget", config.time_budget)):
        if value is not None:
            raise ExoframeError(f"checkpoint_every: a run with {field} cannot be checkpointed "
                                f"yet; drop one of them.")
    return every


def partition_data(dataset: DatasetFactory, text: str, seed: int, nodes: int):
    """(the dataset factory with its training set split as `text` says, what summary.json
    records of the split). Only whole datasets (Shards) can be split another way."""
    partition = parse_partition(text)
    if not isinstance(dataset, Shards) or isinstance(dataset.train, IterableDataset):
        if partition.kind != "iid":
            raise ExoframeError(
                f"partition: {partition} splits a whole training set, and this workload gives "
                "each rank its data itself (a dataset factory or a stream); give whole "
                "datasets (Workload.from_datasets) or use iid.")
        return dataset, None
    labels = dataset.labels()
    parts = partition_indices(partition, len(dataset.train), nodes, labels, seed)
    if partition.kind != "iid":  # iid: the equal contiguous shards Shards makes itself
        dataset = dataset.partitioned(parts)
    return dataset, describe(partition, seed, parts, labels)


def epoch_steps(config: RunConfig, dataset: DatasetFactory, batch_size: int) -> int:
    """Steps for `config.epochs` passes over rank 0's training shard, each step taking
    `accumulate` batches."""
    shard = dataset(0, config.nodes, "train")
    try:
        size = len(shard)
    except TypeError:
        raise ExoframeError("epochs: the training data is a stream (an IterableDataset) "
                            "with no length; give --steps instead.") from None
    per_epoch = size // batch_size if config.drop_last else math.ceil(size / batch_size)
    if per_epoch == 0:
        raise ExoframeError(f"epochs: rank 0's shard has {size} examples, fewer than one "
                            f"batch of {batch_size}; use a smaller batch or keep the last "
                            "short batch (drop_last: false).")
    return max(1, math.ceil(config.epochs * per_epoch / config.accumulate))


def job_from_config(config: RunConfig, pm: PluginManager | None = None) -> Job:
    """The Job of a validated config, with a network setup of its own."""
    pm = pm or get_plugin_manager()
    sim = resolve_network(config, pm)  # (before the model is built: a bad network is told first)
    return build_job(config, *workload_and_model(config, pm), pm=pm, sim=sim)


def workload_and_model(config: RunConfig, pm: PluginManager) -> tuple[Workload, torch.nn.Module]:
    """The config's workload and the model it builds (seeded by config.seed)."""
    workload = load_workload(config.workload, config.workload_params, pm)
    check_model_memory(config, workload)
    torch.manual_seed(config.seed)
    model = _user_code(workload.build_model, f"workload '{config.workload}': building the model",
                       config.workload_params)
    return workload, model


def check_model_memory(config: RunConfig, workload: Workload):
    """The model, built on the meta device (no memory), and what the run keeps of it on this
    machine, refused before the real build when beyond the free memory."""
    try:
        with torch.device("meta"):
            model = workload.build_model()
    except Exception:  # a model that needs real tensors to be built: built as it is
        return
    # (else GPU admission; offloaded nodes keep their state in this machine's memory)
    cuda = devices.resolve(config.device).startswith("cuda")
    check_host_memory(model, config.optimizer, config.nodes, config.offload or not cuda,
                      workload.sized_by or f"workload '{config.workload}'",
                      pinned=config.offload and cuda)


def _user_code(call, what: str, params: dict):
    """call(), with what a workload's own code raises (a parameter of the wrong type reaching
    torch, a bug in a factory) as one line; --debug shows the traceback."""
    try:
        return call()
    except ExoframeError:
        raise
    except Exception as e:
        hint = (f" Check its parameters (-w): {shorten(params)}." if params
                else " Run with --debug for the traceback.")
        raise ExoframeError(f"{what} failed: {type(e).__name__}: {shorten(str(e))}.{hint}",
                            details=traceback.format_exc()) from None
