"""Typed configuration of a run. YAML keys and CLI flags map one to one onto RunConfig fields."""
from __future__ import annotations

import dataclasses
import math
import os
import typing
from dataclasses import dataclass, field

import yaml

from .errors import ExoframeError, did_you_mean, shorten
from .optimizer_values import check_optimizer_values
from .sim.inputs import build_dataclass, load_yaml, read_text, safe_load
from .sinks import parse_sink

# The simulator's collectives are planned for at most MAX_NODES ranks; past a few nodes per
# core, nodes share worker processes (engine/packing.py), so memory is not the limit.
MAX_NODES = 1024


ON_NONFINITE = ("stop", "continue")
SCHEDULES = ("constant", "linear", "cosine", "wsd")
PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass
class RunConfig:
    """One training run. `None` means "the workload's default"."""

    workload: str = "gpt"
    workload_params: dict = field(default_factory=dict)
    strategy: str = "ddp"
    strategy_params: dict = field(default_factory=dict)
    nodes: int = 2
    # Nodes sharing a worker process (engine/packing.py); unset: a process per node up to 4
    # per core and 32 in all, else one worker per core.
    nodes_per_process: typing.Optional[int] = None
    steps: int = 300
    batch_size: typing.Optional[int] = None
    optimizer: str = "adamw"  # any torch.optim class by name, or a plugin's (exoframe optimizers)
    optimizer_params: dict = field(default_factory=dict)  # its keyword arguments (-o KEY=VALUE)
    lr: typing.Optional[float] = None
    weight_decay: float = 0.0
    momentum: float = 0.0
    seed: int = 0
    # The training loop (engine/loop.py): learning-rate schedule, clipping, micro-batches, precision.
    schedule: str = "constant"  # constant | linear | cosine | wsd, after warmup_steps
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0  # where linear, cosine and wsd decay to, as a fraction of lr
    clip_grad_norm: typing.Optional[float] = None  # clip the local gradients' total norm
    accumulate: int = 1  # micro-batches of batch_size per step
    precision: str = "fp32"  # fp32 | bf16 | fp16 (autocast; fp16 with a loss scaler)
    device: str = "cpu"  # auto | cpu | cuda | cuda:N | mps
    # Data: epochs replaces steps when given; shuffle each epoch; drop the last short batch.
    epochs: typing.Optional[int] = None
    shuffle: bool = True
    drop_last: bool = True
    # How the training set is split over the nodes (exoframe/partition.py), seeded by seed:
    # iid | dirichlet:ALPHA | shards:K | quantity:ALPHA
    partition: str = "iid"
    # Stop at the first step whose simulated end passes this ("2h", "90min", seconds).
    time_budget: typing.Optional[typing.Union[float, str]] = None
    eval_every: typing.Optional[int] = None
    eval_batches: int = 8
    # Validate every step and stop once the held model's validation loss is at most this.
    target_loss: typing.Optional[float] = None
    threads: int = 1
    out: str = "runs"
    net: str = "ideal"  # a preset name (exoframe nets) or a YAML file
    compute: str = "measured"  # measured | fixed:<time per step> | flops:<device>[:<efficiency>]
    stragglers: str = ""  # e.g. "3:4" (rank 3 is 4x slower), "lognormal:0.3", both: "3:4,lognormal:0.3"
    # Simulated node failures (exoframe/sim/faults.py): "1@90s:60s" (node 1 fails at 90 s,
    # down 60 s), "rate:4:5min" (4 per hour over the cluster, each down 5 min), comma-separated.
    faults: typing.Union[str, list] = ""
    # Metrics sinks (exoframe plugins), each "name" or "name:key=value,..." or {name: {key: value}}
    sinks: list = field(default_factory=lambda: ["jsonl"])
    # Real seconds without a message from any rank before the watchdog stops the run and
    # names the stuck or stopped process.
    hang_timeout: float = 300.0
    # Under torchrun: real seconds to reach the rendezvous and for every rank to join.
    connect_timeout: float = 60.0
    on_nonfinite: str = "stop"  # a NaN or infinite training loss: "stop" the run or "continue"
    # Save every rank's state every N steps into the run folder (exoframe resume continues it).
    checkpoint_every: typing.Optional[int] = None

    def validate(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ExoframeError(f"{f.name} must be a finite number, got {value}.")
        positive = {"nodes": self.nodes, "steps": self.steps, "threads": self.threads,
                    "eval_batches": self.eval_batches, "accumulate": self.accumulate}
        if self.epochs is not None:
            positive["epochs"] = self.epochs
        if self.batch_size is not None:
            positive["batch_size"] = self.batch_size
        if self.nodes_per_process is not None:
            positive["nodes_per_process"] = self.nodes_per_process
        for name in ("eval_every", "checkpoint_every"):
            if getattr(self, name) is not None:
                positive[name] = getattr(self, name)
        for name, value in positive.items():
            if value < 1:
                raise ExoframeError(f"{name} must be at least 1, got {value}.")
        if self.nodes > MAX_NODES:
            raise ExoframeError(f"nodes: {self.nodes} is more than the simulator plans "
                                f"collectives for; give at most {MAX_NODES}.")
        cores = os.cpu_count() or 1
        if self.threads > cores:
            raise ExoframeError(f"threads: {self.threads} threads per rank, but this machine "
                                f"has {cores} CPU cores; give at most {cores}.")
        if not 0 <= self.seed < 2 ** 63:
            raise ExoframeError(f"seed must be in [0, 2**63), got {shorten(self.seed)}.")
        if self.lr is not None and self.lr <= 0:
            raise ExoframeError(f"lr must be positive, got {self.lr}.")
        check_optimizer_values(weight_decay=self.weight_decay, momentum=self.momentum)
        for name in ("hang_timeout", "connect_timeout"):
            if not getattr(self, name) > 0:
                raise ExoframeError(f"{name} must be a positive number of seconds, got "
                                    f"{getattr(self, name)}.")
        for name, choices in (("schedule", SCHEDULES), ("precision", PRECISIONS)):
            value = getattr(self, name)
            if value not in choices:
                raise ExoframeError(f"{name}: unknown choice '{shorten(value)}'."
                                    f"{did_you_mean(value, choices)} Use {', '.join(choices)}.")
        if self.warmup_steps < 0:
            raise ExoframeError(f"warmup_steps must be at least 0, got {self.warmup_steps}.")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ExoframeError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}.")
        if self.clip_grad_norm is not None and not self.clip_grad_norm > 0:
            raise ExoframeError(f"clip_grad_norm must be positive, got {self.clip_grad_norm}.")
        check_device(self.device)
        if self.time_budget is not None:
            budget_seconds(self.time_budget)
        if self.on_nonfinite not in ON_NONFINITE:
            raise ExoframeError(f"on_nonfinite: unknown choice '{shorten(self.on_nonfinite)}'."
                                f"{did_you_mean(self.on_nonfinite, ON_NONFINITE)} Use "
                                f"{' or '.join(ON_NONFINITE)}.")
        if not isinstance(self.sinks, (list, tuple)):
            raise ExoframeError(f"sinks must be a list of sinks, got {shorten(self.sinks)}.")
        sinks = [parse_sink(item) for item in self.sinks]
        twice = next((name for name, options in sinks if sinks.count((name, options)) > 1), None)
        if twice is not None:
            raise ExoframeError(f"sinks: '{shorten(twice)}' is named twice with the same "
                                "options; it would write every row twice: name it once.")
        from .partition import parse_partition
        from .sim.faults import parse_faults

        parse_partition(self.partition)
        parse_faults(self.faults).check_ranks(self.nodes)
        return self


def budget_seconds(value) -> float:
    """A time budget in seconds: a number, or a time with a unit ('2h', '90min', '600s')."""
    from .sim.units import parse_seconds

    try:
        seconds = parse_seconds(value, "time_budget", "config")
    except ExoframeError:
        seconds = math.nan
    if not seconds > 0:
        raise ExoframeError(f"time_budget: expected a positive simulated time like '2h', "
                            f"'90min' or '600s', got '{shorten(value)}'.")
    return seconds


def check_device(device: str):
    kind, _, index = device.partition(":")
    if kind not in ("auto", "cpu", "cuda", "mps") or (index and not (kind == "cuda"
                                                                      and index.isdigit())):
        raise ExoframeError(f"device: unknown device '{shorten(device)}'."
                            f"{did_you_mean(kind, ['auto', 'cpu', 'cuda', 'mps'])} Use auto, "
                            "cpu, cuda, cuda:N or mps.")


def parse_scalar(text: str, what: str = "value"):
    """Parse a command-line value the way YAML would ("0.7" -> 0.7, "true" -> True)."""
    try:
        return safe_load(text)
    except yaml.composer.ComposerError as e:
        if "aliases" in str(e.problem):
            raise ExoframeError(f"{what}: YAML aliases (*name) are not allowed in values; "
                                "write the value out.") from None
        return text
    except yaml.YAMLError:
        return text


def parse_assignments(pairs, flag: str) -> dict:
    """["H=50", "outer_lr=0.7"] -> {"H": 50, "outer_lr": 0.7}."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ExoframeError(f"{flag} expects KEY=VALUE, got '{shorten(pair)}'.")
        out[key.strip()] = parse_scalar(value.strip(), f"{flag} {shorten(key.strip())}")
    return out


def resolve_config(config_file=None, overrides: dict | None = None) -> RunConfig:
    """Defaults < YAML file < overrides (flags). Strategy and workload params merge key by key."""
    values: dict = {}
    where = "config"
    if config_file:
        values = load_yaml(config_file)
        where = str(config_file)
    values = _optimizer_mapping(values, where)
    config = build_dataclass(RunConfig, values, where)
    for key, value in (overrides or {}).items():
        if key in ("strategy_params", "workload_params", "optimizer_params"):
            merged = dict(getattr(config, key))
            merged.update(value)
            value = merged
        config = dataclasses.replace(config, **{key: value})
    return config.validate()


def _optimizer_mapping(values: dict, where: str) -> dict:
    """YAML may give the optimizer as a mapping, `optimizer: {name: adamw, betas: [0.9,
    0.95]}`: its name goes to `optimizer`, the rest to `optimizer_params`."""
    optimizer = values.get("optimizer") if isinstance(values, dict) else None
    if not isinstance(optimizer, dict):
        return values
    params = dict(optimizer)
    name = params.pop("name", None)
    if not isinstance(name, str):
        raise ExoframeError(f"{where}: optimizer: a mapping needs 'name', e.g. "
                            "{name: adamw, betas: [0.9, 0.95]}.")
    return {**values, "optimizer": name,
            "optimizer_params": {**values.get("optimizer_params", {}), **params}}


def config_to_dict(config: RunConfig) -> dict:
    return dataclasses.asdict(config)
