"""The flags of RunConfig's fields, made from their option() metadata (exoframe/fields.py).

`run` has a flag per field. `sweep` has the same flags for what every one of its runs takes,
except that a field which varies across the runs (metadata `sweep`) takes several values: a
comma-separated list, or one value per flag where values hold commas. The values a command
receives become RunConfig overrides (overrides) and, for a sweep, its axes (sweep_values).
"""
from __future__ import annotations

import dataclasses
import typing

import click

from ..config import RunConfig, parse_assignments, parse_scalar
from ..errors import ExoframeError
from ..sim.inputs import build_dataclass
from ..fields import (declared_flag, default_text, long_flag, option_of, sweep_flag, value_type,
                      with_default)

FIELDS = {f.name: f for f in dataclasses.fields(RunConfig)}
HINTS = typing.get_type_hints(RunConfig)
CLICK_TYPES = {int: click.INT, float: click.FLOAT}


def field_option(name: str, sweep: bool = False, **overrides):
    """The click option of field `name`: its `run` flag, or with `sweep` its `sweep` flag.
    overrides: click.option arguments that differ for one command (another help, required)."""
    f = FIELDS[name]
    opt, kind = option_of(f), value_type(f, HINTS)
    axis = opt.sweep if sweep else None
    help_text, default = opt.help, default_text(f)
    if axis:
        help_text, default = axis.help, axis.default
    elif sweep:  # the same flag, meaning more in a sweep
        help_text = opt.sweep_help or help_text
        default = default if opt.sweep_default is None else opt.sweep_default
    kwargs = dict(default=None, help=with_default(help_text, default))
    if axis:
        decls = [sweep_flag(f), name]
        kwargs.update(multiple=axis.repeat, metavar=axis.metavar)
    else:
        decls = [*([opt.short] if opt.short else []), declared_flag(f), name]
        if kind in (dict, list):
            kwargs.update(multiple=True,
                          metavar=(opt.sweep_metavar if sweep else None) or opt.metavar)
        elif kind is not bool:
            kwargs.update(type=click.Choice(opt.choices) if opt.choices else CLICK_TYPES.get(kind),
                          metavar=opt.metavar)
    kwargs.update(overrides)
    return click.option(*decls, **{k: v for k, v in kwargs.items()
                                   if v is not None or k == "default"})


def run_options(command):
    """A flag for every RunConfig field, in the fields' order."""
    for name in reversed(FIELDS):
        command = field_option(name)(command)
    return command


def sweep_options(command):
    """run_options as `sweep` has them: a field that varies across the runs takes several."""
    for name in reversed(FIELDS):
        command = field_option(name, sweep=True)(command)
    return command


def overrides(values: dict) -> dict:
    """RunConfig overrides from the values click parsed for run_options' flags (unset: left
    out). A repeatable KEY=VALUE flag makes a dict; a repeatable list flag a list, each flag
    naming one or more items: "csv,jsonl", or "csv,tensorboard:logdir=tb,flush_secs=5",
    where the options after the colon are the last item's."""
    out = {}
    for name, value in values.items():
        if value is None or value == ():
            continue
        kind = value_type(FIELDS[name], HINTS)
        if kind is dict:
            value = parse_assignments(value, long_flag(FIELDS[name]))
        elif kind is list:
            value = [item for text in value for item in list_items(text, long_flag(FIELDS[name]))]
        out[name] = value
    return out


def sweep_values(values: dict) -> tuple[dict, dict]:
    """(overrides for every run, {field: its values} for each field given several), from what
    click parsed for sweep_options' flags."""
    axes = {}
    for name in [n for n in values if option_of(FIELDS[n]).sweep]:
        given = values.pop(name)
        if given is None or given == ():
            continue
        f = FIELDS[name]
        texts = list(given) if option_of(f).sweep.repeat else split_names(given, sweep_flag(f))
        axes[name] = [one_value(f, text) for text in texts]
    return overrides(values), axes


def one_value(f: dataclasses.Field, text: str):
    """One value of a swept field as its flag gives it, read as YAML would where the field is
    not text ("1" -> 1), and checked as the field."""
    value = text if value_type(f, HINTS) is str else parse_scalar(text, sweep_flag(f))
    return getattr(build_dataclass(RunConfig, {f.name: value}, sweep_flag(f)), f.name)


def list_items(text: str, flag: str) -> list[str]:
    names, colon, options = text.partition(":")
    items = split_names(names, flag)
    if colon:
        items[-1] += colon + options
    return items


def split_names(text, flag):
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    if not names:
        raise ExoframeError(f"{flag}: give at least one name (comma-separated).")
    return names
