"""Typed configuration of a run. YAML keys and CLI flags map one to one onto RunConfig fields."""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .errors import ExoframeError, did_you_mean


@dataclass
class RunConfig:
    """One training run. `None` means "the workload's default"."""

    workload: str = "gpt"
    workload_params: dict = field(default_factory=dict)
    strategy: str = "ddp"
    strategy_params: dict = field(default_factory=dict)
    nodes: int = 2
    steps: int = 300
    batch_size: typing.Optional[int] = None
    optimizer: str = "adamw"
    lr: typing.Optional[float] = None
    weight_decay: float = 0.0
    momentum: float = 0.0
    seed: int = 0
    eval_every: typing.Optional[int] = None
    eval_batches: int = 8
    # Validate every step and stop once the averaged model's validation loss is at most this.
    target_loss: typing.Optional[float] = None
    threads: int = 1
    out: str = "runs"
    net: str = "ideal"  # a preset name (exoframe nets) or a YAML file
    compute: str = "measured"  # measured | fixed:<time per step> | flops:<device>[:<efficiency>]
    stragglers: str = ""  # e.g. "3:4" (rank 3 is 4x slower), "lognormal:0.3", both: "3:4,lognormal:0.3"
    sinks: list = field(default_factory=lambda: ["jsonl"])  # metrics sinks (exoframe plugins)

    def validate(self):
        positive = {"nodes": self.nodes, "steps": self.steps, "threads": self.threads,
                    "eval_batches": self.eval_batches}
        if self.batch_size is not None:
            positive["batch_size"] = self.batch_size
        if self.eval_every is not None:
            positive["eval_every"] = self.eval_every
        for name, value in positive.items():
            if value < 1:
                raise ExoframeError(f"{name} must be at least 1, got {value}.")
        if self.target_loss is not None and not math.isfinite(self.target_loss):
            raise ExoframeError(f"target_loss must be a finite number, got {self.target_loss}.")
        if self.lr is not None and self.lr <= 0:
            raise ExoframeError(f"lr must be positive, got {self.lr}.")
        if not all(isinstance(name, str) for name in self.sinks):
            raise ExoframeError(f"sinks must be a list of sink names, got {self.sinks!r}.")
        return self


def _type_name(tp) -> str:
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def _check_type(value, tp):
    """Return value converted to tp when that is lossless (int -> float), else raise TypeError."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arm in typing.get_args(tp):
            try:
                return _check_type(value, arm)
            except TypeError:
                pass
        raise TypeError
    if tp is type(None):
        if value is None:
            return None
        raise TypeError
    if tp is typing.Any:
        return value
    if origin is not None:
        tp = origin
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is int and isinstance(value, bool):
        raise TypeError
    if isinstance(value, tp):
        return value
    raise TypeError


def build_dataclass(cls, values: dict, where: str, noun: str = "field"):
    """Instantiate dataclass `cls` from a mapping, checking names and types.

    `where` names the source for messages, e.g. "config.yaml" or "strategy 'diloco'".
    """
    if not isinstance(values, dict):
        raise ExoframeError(f"{where}: expected a mapping of field names to values, got {values!r}.")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in values.items():
        if key not in fields:
            raise ExoframeError(
                f"{where}: unknown {noun} '{key}'.{did_you_mean(key, fields)} "
                f"Valid {noun}s: {', '.join(fields) or '(none)'}."
            )
        try:
            kwargs[key] = _check_type(value, hints[key])
        except TypeError:
            raise ExoframeError(
                f"{where}: {noun} '{key}' must be {_type_name(hints[key])}, got {value!r}."
            ) from None
    return cls(**kwargs)


def parse_scalar(text: str):
    """Parse a command-line value the way YAML would ("0.7" -> 0.7, "true" -> True)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def parse_assignments(pairs, flag: str) -> dict:
    """["H=50", "outer_lr=0.7"] -> {"H": 50, "outer_lr": 0.7}."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ExoframeError(f"{flag} expects KEY=VALUE, got '{pair}'.")
        out[key.strip()] = parse_scalar(value.strip())
    return out


def load_yaml(path) -> dict:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ExoframeError(f"cannot read config file {path}: {e.strerror}.") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        # An unclosed bracket is reported at the end of the file; its context mark says
        # where the construct began, which is the line a user needs.
        mark = getattr(e, "context_mark", None) or getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        if getattr(e, "context", None):
            problem = f"{e.context}: {problem}"
        raise ExoframeError(f"{path}{line}: malformed YAML: {problem}.") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ExoframeError(f"{path}: expected a mapping of RunConfig fields at the top level.")
    return data


def resolve_config(config_file=None, overrides: dict | None = None) -> RunConfig:
    """Defaults < YAML file < overrides (flags). Strategy and workload params merge key by key."""
    values: dict = {}
    where = "config"
    if config_file:
        values = load_yaml(config_file)
        where = str(config_file)
    config = build_dataclass(RunConfig, values, where)
    for key, value in (overrides or {}).items():
        if key in ("strategy_params", "workload_params"):
            merged = dict(getattr(config, key))
            merged.update(value)
            value = merged
        config = dataclasses.replace(config, **{key: value})
    return config.validate()


def config_to_dict(config: RunConfig) -> dict:
    return dataclasses.asdict(config)
