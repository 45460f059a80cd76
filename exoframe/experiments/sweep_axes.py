"""A sweep's axes and the runs they make.

An axis is a RunConfig field with its values ({"partition": ["iid", "dirichlet:0.1"]}) or one
key of a parameter field ({("strategy_params", "diloco.H"): [5, 50]}); every combination of
the axes is a point. A strategy parameter's axis varies only the strategies it goes to (the
one it is scoped to, else those that have it): `--strategy ddp,diloco -p diloco.H=5,50`
trains ddp once. A value given twice, or two points that resolve to the same run, are
refused before anything trains.
"""
from __future__ import annotations

import dataclasses
import itertools

from ..config import RunConfig
from ..errors import ExoframeError, shorten
from ..fields import long_flag, option_of, sweep_flag
from ..sim.clocks.compute import parse_compute

FIELDS = {f.name: f for f in dataclasses.fields(RunConfig)}
# What a point's config shows of itself in an error, beside the fields that are not the
# sweep's base config's.
NAMED = ("strategy", "seed")


def axis_flag(axis) -> str:
    """How the command line gives the axis: '--seeds', '--partition', '-p diloco.H'."""
    if isinstance(axis, tuple):
        f = FIELDS[axis[0]]
        return f"{option_of(f).short or long_flag(f)} {axis[1]}"
    return sweep_flag(FIELDS[axis])


def check_distinct(axis, values):
    """Each value of an axis once: a repeat would be run, and reported, as another point.
    A compute model is compared as it reads (fixed:10ms is fixed:0.01s)."""
    same = (lambda value: repr(parse_compute(value))) if axis == "compute" else (
        lambda value: value)
    keys = [same(value) for value in values]
    for i, value in enumerate(values):
        if keys[i] in keys[:i]:
            first = values[keys.index(keys[i])]
            also = f" (as {shorten(repr(first))})" if first != value else ""
            raise ExoframeError(f"{axis_flag(axis)}: {shorten(repr(value))} is given twice"
                                f"{also}; give each value once.")


def strategy_axes(axes: dict, strategy: str, parameters: set) -> dict:
    """The axes that vary `strategy`'s runs (`parameters`: the names of its parameters)."""
    def varies(axis):
        if not (isinstance(axis, tuple) and axis[0] == "strategy_params"):
            return True
        scope, dot, name = axis[1].rpartition(".")
        return scope == strategy if dot else name in parameters
    return {axis: values for axis, values in axes.items() if varies(axis)}


def combinations(axes: dict) -> list[dict]:
    """{"a": [1, 2], "b": [3]} -> [{"a": 1, "b": 3}, {"a": 2, "b": 3}]; {} -> [{}]."""
    return [dict(zip(axes, values)) for values in itertools.product(*axes.values())]


def apply(config: RunConfig, point: dict) -> RunConfig:
    """`config` with one combination of the axes: a field's value replaces the config's, a
    parameter's is merged into its field (a strategy parameter by its unscoped name)."""
    fields = {axis: value for axis, value in point.items() if not isinstance(axis, tuple)}
    for (name, key), value in ((a, v) for a, v in point.items() if isinstance(a, tuple)):
        key = key.rpartition(".")[2] if name == "strategy_params" else key
        fields[name] = {**fields.get(name, getattr(config, name)), key: value}
    return dataclasses.replace(config, **fields)


# Two configs that differ only before they are resolved (steps beside epochs, a strategy
# parameter given at its default, 1h beside 3600s) are one run: a run is its config.yaml record
# (Job.config_record: the strategy's parameters, batch size, lr and eval_every resolved) with
# these of the Job's values.
RESOLVED = ("steps", "time_budget")


# RunConfig fields that change where and how a run is written or packed, not what it
# computes: two points that differ only in these are one run (a report would refuse them as
# one setting and seed: report/groups.py).
NOT_A_RUN = ("out", "sinks", "hang_timeout", "connect_timeout", "checkpoint_every",
             "nodes_per_process")


class SamePoints:
    """Refuses a run that another point of the sweep already is: `add` each run's config
    with its Job (engine/plan/job.py)."""

    def __init__(self, base: RunConfig):
        self.base, self.seen = base, {}

    def add(self, config: RunConfig, job):
        record = {**job.config_record(), **{n: getattr(job, n) for n in RESOLVED}}
        for name in NOT_A_RUN:
            record.pop(name)
        key = repr(sorted(record.items()))
        if key in self.seen:
            raise ExoframeError(f"sweep: two points are the same run "
                                f"({self.describe(self.seen[key])}; {self.describe(config)}); "
                                "drop a value that gives it again.")
        self.seen[key] = config

    def describe(self, config: RunConfig) -> str:
        names = [n for n in FIELDS if n in NAMED or (n != "out" and getattr(config, n)
                                                     != getattr(self.base, n))]
        return ", ".join(f"{n} {shorten(getattr(config, n))}" for n in names)
