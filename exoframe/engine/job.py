"""A Job: everything the ranks need, resolved and validated in the launcher before any fork."""
from __future__ import annotations

import importlib
import os
import sys
import traceback
from dataclasses import dataclass
from typing import Optional

import torch

from ..config import RunConfig
from ..errors import ExoframeError, shorten
from ..plugins import PluginManager, get_plugin_manager
from ..sim import SimSetup, resolve_sim
from ..strategies.base import OptimizerSpec, Strategy
from ..workloads.base import DatasetFactory, Workload, call_with_params


@dataclass
class Job:
    model: torch.nn.Module
    dataset: DatasetFactory
    strategy_cls: type
    strategy_name: str
    strategy_params: object
    optimizer: OptimizerSpec
    nodes: int
    steps: int
    batch_size: int
    sim: SimSetup
    seed: int = 0
    eval_every: int = 50
    eval_batches: int = 8
    threads: int = 1
    workload_name: str = "custom"
    best_loss: Optional[float] = None
    sinks: tuple = ()  # metrics sink factories, each called with the run folder
    target_loss: Optional[float] = None  # validate every step; stop once reached
    hang_timeout: float = 300.0  # real seconds without progress before the watchdog stops it
    on_nonfinite: str = "stop"  # or "continue": what a NaN or infinite loss does


def resolve_strategy(strategy, params: dict | None, pm: PluginManager):
    """(class, registered name, typed params) for a name or a Strategy subclass."""
    if isinstance(strategy, type) and issubclass(strategy, Strategy):
        cls, name = strategy, getattr(strategy, "name", None) or strategy.__name__.lower()
    else:
        entry = pm.strategies.get(strategy)
        cls, name = entry.obj, entry.name
    return cls, name, cls.parse_params(params, name)


def load_workload(spec: str, params: dict, pm: PluginManager) -> Workload:
    """A registered workload name, or `package.module:function` returning a Workload."""
    if ":" in spec:
        module_name, _, attr = spec.partition(":")
        # Let users name modules next to where they run, but after everything installed:
        # a stray file there (sympy.py, ...) must not shadow a module torch imports.
        if os.getcwd() not in sys.path:
            sys.path.append(os.getcwd())
        try:
            module = importlib.import_module(module_name)
        except Exception as e:
            raise ExoframeError(f"cannot import workload module '{module_name}': {e}") from None
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


def build_job(config: RunConfig, workload: Workload, model: torch.nn.Module, strategy=None,
              pm: PluginManager | None = None, sim: SimSetup | None = None) -> Job:
    """The Job for a validated config; `strategy` (a name or a Strategy subclass) overrides
    config.strategy, and the workload supplies the defaults config leaves as None."""
    pm = pm or get_plugin_manager()
    strategy_cls, strategy_name, strategy_params = resolve_strategy(
        strategy or config.strategy, config.strategy_params, pm)
    return Job(
        model=model, dataset=workload.dataset, strategy_cls=strategy_cls,
        strategy_name=strategy_name, strategy_params=strategy_params,
        optimizer=OptimizerSpec(config.optimizer, config.lr or workload.lr, config.weight_decay,
                                config.momentum),
        nodes=config.nodes, steps=config.steps, batch_size=config.batch_size or workload.batch_size,
        sim=sim or resolve_sim(config.net, config.compute, config.stragglers, config.nodes, pm),
        seed=config.seed, target_loss=config.target_loss,
        # A target is judged at every step, so the time to reach it is resolved to one step.
        eval_every=1 if config.target_loss is not None else
        config.eval_every or max(1, config.steps // 10),
        eval_batches=config.eval_batches, threads=config.threads, workload_name=workload.name,
        hang_timeout=config.hang_timeout, on_nonfinite=config.on_nonfinite,
        best_loss=workload.best_loss, sinks=tuple(pm.sinks.get(name).obj for name in config.sinks))


def job_from_config(config: RunConfig, pm: PluginManager | None = None,
                    sim: SimSetup | None = None) -> Job:
    """sim: the config's network already resolved (a sweep resolves each network once)."""
    pm = pm or get_plugin_manager()
    sim = sim or resolve_sim(config.net, config.compute, config.stragglers, config.nodes, pm)
    workload = load_workload(config.workload, config.workload_params, pm)
    torch.manual_seed(config.seed)
    model = _user_code(workload.build_model, f"workload '{config.workload}': building the model",
                       config.workload_params)
    return build_job(config, workload, model, pm=pm, sim=sim)


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
        error = ExoframeError(f"{what} failed: {type(e).__name__}: {shorten(str(e))}.{hint}")
        error.details = traceback.format_exc()
        raise error from None
