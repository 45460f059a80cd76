"""Trainer.fit's keywords, made from RunConfig's fields: each field by name with the field's
default (fields.py), resolved as a YAML file and flags are (config.resolve_config).

The strategy may be a registered name, a Strategy class, or a class called with its
parameters (`DiLoCo(H=100)`, strategies/spec.py); a registered class runs under its name, so
every form of one strategy runs the same. The keywords EXO Gym's Trainer.fit takes are taken
where they mean what one of ours does (`num_nodes`, `max_steps`, ...) and otherwise refused
in one line naming exoframe's spelling.
"""
from __future__ import annotations

import dataclasses
import inspect

from ...config import RunConfig, resolve_config
from ...errors import ExoframeError, did_you_mean, shorten
from ...fields import api_default, field_default
from ...plugins import Lazy, get_plugin_manager
from ...strategies.base import Strategy
from ...strategies.spec import StrategySpec

FIELDS = {f.name: f for f in dataclasses.fields(RunConfig)}
# Another spelling -> the field it stands for (EXO Gym's, and the API's own num_nodes).
ALIASES = {"num_nodes": "nodes", "max_steps": "steps", "num_epochs": "epochs",
           "val_interval": "eval_every", "checkpoint_interval": "checkpoint_every",
           "inner_optim": "optimizer"}
# Keywords that mean something exoframe says otherwise, and what to give instead.
REFUSED = {
    "minibatch_size": "not taken; give batch_size=MINIBATCH with accumulate=BATCH // "
                      "MINIBATCH (batch_size is the micro-batch, accumulate the micro-batches "
                      "per step)",
    "autocast": "not taken; give precision='bf16' (or 'fp16')",
    "val_size": "not taken; give val_examples=N (validation examples)",
    "devices": "not taken; give device='cuda' (ranks round-robin over the GPUs) or "
               "device='cuda:N'",
    "save_dir": "not taken; give out=FOLDER (a run folder under it; checkpoint_every=N saves "
                "checkpoints there)",
    # RunConfig fields the Trainer itself supplies
    "workload": "a Trainer trains the model and data it was given; `exoframe run --workload "
                "NAME` trains a named workload",
    "workload_params": "a Trainer trains the model and data it was given; `exoframe run "
                       "--workload NAME -w KEY=VALUE` trains a named workload with parameters",
}
# Trainer.fit's own keywords, beside the fields.
EXTRA = {"resume": None, "warm_start": False, "progress": False}


def fit_config(strategy, options: dict, batch_size: int, pm=None):
    """(the RunConfig of Trainer.fit(strategy, **options), the Strategy class to run where it
    has no registered name (else None), the folder for run folders or None). batch_size: the
    Trainer's, for a fit that gives none."""
    values, given_as = {}, {}
    for key, value in options.items():
        name = ALIASES.get(key, key)
        if key in REFUSED:
            raise ExoframeError(f"Trainer.fit: {key}: {REFUSED[key]}.")
        if name not in FIELDS:
            known = [k for k in [*FIELDS, *ALIASES, *EXTRA] if k not in REFUSED]
            raise ExoframeError(f"Trainer.fit: unknown argument '{shorten(str(key))}'."
                                f"{did_you_mean(key, known)} It takes the fields of `exoframe "
                                "run` by name (see its --help), strategy, resume, warm_start and "
                                "progress.")
        if name in values:
            raise ExoframeError(f"Trainer.fit: {given_as[name]} and {key} both give {name}; "
                                "give one.")
        values[name], given_as[name] = _taken(key, value), key
    if given_as.get("epochs") == "num_epochs" and "steps" in values:
        raise ExoframeError(f"Trainer.fit: num_epochs and {given_as['steps']}: EXO Gym stops at "
                            "whichever ends first; exoframe trains for epochs=N or for steps=N: "
                            "give one.")
    # None stands for the field's default (strategy_params=None: no parameters).
    values = {k: v for k, v in values.items() if v is not None or FIELDS[k].default is None}
    out = values.get("out", api_default(FIELDS["out"]))
    values.setdefault("batch_size", batch_size)
    strategy_cls = None
    if isinstance(strategy, StrategySpec):
        if values.get("strategy_params"):
            raise ExoframeError(f"Trainer.fit: strategy {strategy!r} carries its parameters; "
                                "give them there or in strategy_params, not both.")
        strategy, values["strategy_params"] = strategy.cls, dict(strategy.params)
    if isinstance(strategy, type) and issubclass(strategy, Strategy):
        name = registered_name(strategy, pm)
        strategy_cls = None if name else strategy
        strategy = name or getattr(strategy, "name", None) or strategy.__name__.lower()
    if not isinstance(strategy, str):
        raise ExoframeError(f"Trainer.fit: strategy must be a name ('diloco'), a Strategy "
                            f"class, or one called with its parameters (exoframe.strategies."
                            f"DiLoCo(H=100)); got {shorten(repr(strategy))}.")
    values["strategy"] = strategy
    return resolve_config(None, values, where="Trainer.fit"), strategy_cls, out


def _taken(key: str, value):
    """A keyword's value as its field takes it: a tuple as a list; inner_optim's optimizer
    class as its name (torch.optim.AdamW -> 'adamw')."""
    if key == "inner_optim" and not isinstance(value, str):
        if isinstance(value, type):
            return value.__name__.lower()
        raise ExoframeError("Trainer.fit: inner_optim: give the optimizer by name, "
                            "optimizer='adamw' (any torch.optim class), with lr=... and "
                            "optimizer_params={...} for its other arguments.")
    return list(value) if isinstance(value, tuple) else value


def registered_name(cls: type, pm=None) -> str | None:
    """The name `cls` is registered under as a strategy, or None (a class of the user's)."""
    for entry in (pm or get_plugin_manager()).strategies:
        target = entry.target
        if target is cls or (isinstance(target, Lazy) and (target.module, target.attribute)
                             == (cls.__module__, cls.__qualname__)):
            return entry.name
    return None


def fit_signature(method) -> inspect.Signature:
    """fit(self, strategy='ddp', *, <every field but strategy and the workload's>=<its
    default>, resume=None, progress=False): what help() and inspect show of Trainer.fit."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
              inspect.Parameter("strategy", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                default=field_default(FIELDS["strategy"]))]
    params += [inspect.Parameter(f.name, keyword, default=api_default(f))
               for f in FIELDS.values() if f.name != "strategy" and f.name not in REFUSED]
    params += [inspect.Parameter(name, keyword, default=value) for name, value in EXTRA.items()]
    return inspect.Signature(params, return_annotation=inspect.signature(method)
                             .return_annotation)
