"""Typed configuration of a run. YAML keys and CLI flags map one to one onto RunConfig fields."""
from __future__ import annotations

import dataclasses
import math
import os
import typing
from dataclasses import dataclass

import yaml

from .errors import ExoframeError, did_you_mean, shorten
from .fields import Sweep, option
from .inputs import build_dataclass, load_yaml, safe_load
from .optimizer_values import check_optimizer_values
from .sinks import parse_sink

# The simulator's collectives are planned for at most MAX_NODES ranks; past a few nodes per
# core, nodes share worker processes (engine/node/packing.py), so memory is not the limit.
MAX_NODES = 1024


ON_NONFINITE = ("stop", "continue")
SCHEDULES = ("constant", "linear", "cosine", "wsd")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
VAL_REPLICAS = ("last", "every")
# What `exoframe sweep` runs where neither its flags nor its config file say.
SWEEP_STRATEGIES, SWEEP_NETS, SWEEP_OUT = ("ddp", "diloco"), ("wan-100mbps",), "sweeps"
EXECUTORS = ("local", "ray")  # where a sweep's runs happen (experiments/executors.py)


@dataclass
class RunConfig:
    """One training run. `None` means "the workload's default". Each field is also a YAML key,
    an `exoframe run` flag and a Trainer.fit keyword, made from its option() (fields.py)."""

    workload: str = option("gpt", help="Built-in workload name or package.module:function.")
    workload_params: dict = option(
        default_factory=dict, flag="--workload-param", short="-w", metavar="KEY=VALUE",
        help="Workload parameter, repeatable (e.g. -w n_layer=4).")
    strategy: str = option("ddp", help="Strategy name (see `exoframe strategies`).", sweep=Sweep(
        "Strategies, comma-separated.",
        default=f"the config's strategy, else {','.join(SWEEP_STRATEGIES)}"))
    strategy_params: dict = option(
        default_factory=dict, flag="--param", short="-p", metavar="KEY=VALUE",
        help="Strategy parameter, repeatable (e.g. -p H=50).",
        sweep_metavar="[STRATEGY.]KEY=VALUE", sweep_help=(
            "Strategy parameter, repeatable; unscoped keys go to every swept strategy that has "
            "them (e.g. -p diloco.H=50), as do the config's strategy_params, which these "
            "override; several values sweep it (-p diloco.H=5,50)."))
    nodes: int = option(2, help="Number of simulated nodes.")
    nodes_per_process: typing.Optional[int] = option(
        None, help="Nodes sharing a worker process, stepping in turn and exchanging in memory, "
        "on the CPU or their GPU (engine/node/packing.py).",
        unset="CPU: a process per node up to 4 per core and 32 in all, else a worker per core; "
              "GPU: a worker per GPU where nodes outnumber the GPUs")
    in_process: bool = option(
        False, help="Run every node, the simulator and the evaluator in this process (the nodes "
        "as one worker in a thread, as under --nodes-per-process): a breakpoint in a strategy "
        "stops there, and nothing is forked. Same results as a forked run.")
    offload: bool = option(
        False, help="Keep each packed node's state (weights, gradients, optimizer state, "
        "DiLoCo's global model and outer momentum) in pinned host memory between its turns "
        "on the GPU, so that more nodes share a GPU than its memory holds "
        "(engine/node/offload.py); nodes packed on a CUDA GPU only.")
    stack_replicas: bool = option(
        False, help="Train each worker's packed nodes as one stacked model (torch.func.vmap): "
        "one forward and backward pass for all of them, each node still its own optimizer and "
        "strategy (engine/node/stacked.py); for strategies that declare it safe (ddp, "
        "localsgd, diloco, hier-diloco). Records equal the unstacked run's to float tolerance.")
    steps: int = option(300, help="Training steps per rank.")
    batch_size: typing.Optional[int] = option(None, help="Per-rank batch size.",
                                              unset="workload's")
    optimizer: str = option("adamw", help="Local (inner) optimizer: any torch.optim class by "
                            "name (adamw, sgd, rmsprop, ...) or a plugin's (see `exoframe "
                            "optimizers`).")
    optimizer_params: dict = option(
        default_factory=dict, flag="--optimizer-param", short="-o", metavar="KEY=VALUE",
        help="Optimizer keyword argument, repeatable (e.g. -o betas=[0.9,0.95]).")
    lr: typing.Optional[float] = option(None, help="Local optimizer learning rate.",
                                        unset="workload's")
    weight_decay: float = option(0.0, help="Local optimizer weight decay.")
    momentum: float = option(0.0, help="Momentum, for sgd.")
    seed: int = option(0, help="Seed for model init, data order, partition and strategy masks.",
                       sweep=Sweep("Seeds, comma-separated.", flag="--seeds",
                                   default="the config's seed, else 0"))
    # The training loop (engine/node/loop.py).
    schedule: str = option("constant", choices=SCHEDULES,
                           help="Learning-rate schedule after --warmup-steps.")
    warmup_steps: int = option(0, help="Linear warm-up steps.")
    min_lr_ratio: float = option(0.0, help="Where linear, cosine and wsd decay to, as a "
                                 "fraction of lr.")
    clip_grad_norm: typing.Optional[float] = option(
        None, unset="off", help="Clip each rank's local gradient norm before the strategy's "
        "step.")
    accumulate: int = option(1, help="Micro-batches of --batch-size per step.")
    precision: str = option("fp32", choices=PRECISIONS,
                            help="Autocast precision (fp16 with a loss scaler); tf32: fp32, "
                            "with a CUDA GPU's matmuls in TF32.")
    device: str = option("cpu", help="auto, cpu, cuda (ranks round-robin over the GPUs), "
                         "cuda:N or mps.")
    epochs: typing.Optional[int] = option(None, help="Passes over each rank's shard; replaces "
                                          "--steps.")
    shuffle: bool = option(True, help="Reshuffle every epoch.")
    drop_last: bool = option(True, flag="--drop-last/--keep-last",
                             help="Drop each epoch's last short batch.")
    partition: str = option(
        "iid", help="How the training set is split over the nodes, seeded: iid, dirichlet:ALPHA "
        "(label skew), shards:K (K label shards per node) or quantity:ALPHA (power-law sizes).")
    time_budget: typing.Optional[typing.Union[float, str]] = option(
        None, help="Stop at the first step whose simulated end reaches this time (2h, 90min, "
        "600s; a number: seconds).")
    eval_every: typing.Optional[int] = option(None, unset="steps/10",
                                              help="Validate the held model every N steps.")
    val_examples: typing.Optional[int] = option(
        None, unset="256, or all the validation data where it holds fewer",
        help="Validation examples, drawn evenly across the validation data: the same for any "
        "number of nodes.")
    val_replicas: str = option("last", choices=VAL_REPLICAS, help="Where the held model is "
                               "not the replicas' average (DiLoCo, local SGD): validate that "
                               "average too at the last step, or at every evaluation.")
    target_loss: typing.Optional[float] = option(
        None, help="Validate every step, report the simulated time to reach this validation "
        "loss of the held model, and stop there.", sweep_axis=False)
    threads: int = option(1, help="CPU threads per rank.")
    out: str = option("runs", help="Parent folder of run folders.", api_default=None,
                      sweep_help="Parent folder of sweep folders.",
                      sweep_default=f"the config's out, else {SWEEP_OUT}", sweep_axis=False)
    net: str = option("ideal", help="Network: a preset (see `exoframe nets`), a YAML file, or "
                      "real (no simulator: measured wall-clock and compute time).", sweep=Sweep(
                          "Networks, comma-separated (presets or YAML files); with --bandwidth, "
                          "the one base network of the grid.",
                          default=f"the config's net, else {','.join(SWEEP_NETS)}"))
    compute: str = option("measured", help="Compute model: measured, fixed:<time per step> "
                          "(fixed:250ms) or flops:<device>[:<efficiency>] (flops:h100); "
                          "',overlap=<bandwidth>' slows exchanges in flight while their rank "
                          "computes (fixed:250ms,overlap=5mbit).", commas=True)
    stragglers: str = option("", help="Slow ranks, comma-separated: RANK:FACTOR (3:4), "
                             "lognormal:SIGMA, exponential:MEAN, bernoulli:P:FACTOR.", commas=True)
    faults: typing.Union[str, list] = option(
        "", help="Simulated node failures, comma-separated: NODE@TIME:DOWN (1@90s:60s: node 1 "
        "fails at 90 s simulated, back 60 s later) or rate:PER_HOUR:DOWN (rate:4:5min: 4 "
        "failures an hour over the cluster).", sweep=Sweep(
            "Simulated failures, repeatable: each is a point of the sweep (see `exoframe run "
            "--help`; 'none' for a run without).", metavar="SPEC",
            default="the config's faults"), commas=True)
    sinks: list = option(
        default_factory=lambda: ["jsonl"], flag="--sink", metavar="NAME[:KEY=VALUE,...]",
        help="Metrics sink, repeatable: jsonl, csv or a plugin's (see `exoframe sinks`), with "
        "its options after a colon (tensorboard:logdir=tb); in YAML a list of those or of "
        "{name: {key: value}}.")
    hang_timeout: float = option(300.0, help="Real seconds without progress from any rank "
                                 "before the watchdog stops the run and names the stuck process.")
    connect_timeout: float = option(
        60.0, help="Under torchrun: real seconds to reach the rendezvous and for every rank to "
        "join.", sweep_help="Real seconds for the Ray cluster at --ray-address to answer.",
        sweep_axis=False)
    on_nonfinite: str = option("stop", choices=ON_NONFINITE, help="A NaN or infinite "
                               "training loss stops the run (naming step and rank), or "
                               "training continues.")
    checkpoint_every: typing.Optional[int] = option(
        None, unset="off", help="Save every rank's state every N steps into the run folder; "
        "`exoframe resume RUN_DIR` goes on from the latest.")

    def validate(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ExoframeError(f"{f.name} must be a finite number, got {value}.")
        positive = {"nodes": self.nodes, "steps": self.steps, "threads": self.threads,
                    "accumulate": self.accumulate}
        if self.epochs is not None:
            positive["epochs"] = self.epochs
        if self.batch_size is not None:
            positive["batch_size"] = self.batch_size
        if self.nodes_per_process is not None:
            positive["nodes_per_process"] = self.nodes_per_process
        for name in ("eval_every", "checkpoint_every", "val_examples"):
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
        for name, choices in (("schedule", SCHEDULES), ("precision", PRECISIONS),
                              ("val_replicas", VAL_REPLICAS)):
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
        from .sim.network.faults import parse_faults

        parse_partition(self.partition)
        parse_faults(self.faults).check_ranks(self.nodes)
        return self


def budget_seconds(value) -> float:
    """A time budget in seconds: a number, or a time with a unit ('2h', '90min', '600s')."""
    from .sim.network.units import parse_seconds

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


def resolve_config(config_file=None, overrides: dict | None = None,
                   where: str = "flags") -> RunConfig:
    """Defaults < YAML file < overrides (flags, or Trainer.fit's keywords: `where` names them
    in errors). Both are checked field by field; dict fields (strategy, workload and optimizer
    params) merge key by key."""
    values: dict = {}
    source = "config"
    if config_file:
        values = load_yaml(config_file)
        source = str(config_file)
    values = _optimizer_mapping(values, source)
    config = build_dataclass(RunConfig, values, source)
    # Types checked here; a float that is not finite is left to validate(), which names it.
    typed = {k: v for k, v in (overrides or {}).items()
             if not (isinstance(v, float) and not math.isfinite(v))}
    checked = build_dataclass(RunConfig, typed, where)
    for key, value in (overrides or {}).items():
        if key in typed:
            value = getattr(checked, key)
        if isinstance(value, dict):
            value = {**getattr(config, key), **value}
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
