"""The flags of RunConfig's fields, made from their option() metadata (exoframe/fields.py).

`run` has a flag per field. `sweep` has the same flags, each of which may take several
values (a comma-separated list, or one value per flag where values hold commas): a field
given several is an axis of the sweep, each value a point, as is one KEY=V1,V2 of a
parameter flag (-p, -w, -o). A field declared to vary (metadata `sweep`: strategy, seed, net,
faults) is an axis whatever it is given. The values a command receives become RunConfig
overrides (overrides) and, for a sweep, its axes (sweep_values).
"""
from __future__ import annotations

import dataclasses
import typing

import click

from ..config import RunConfig, parse_assignments, parse_scalar
from ..errors import ExoframeError, did_you_mean, shorten
from ..inputs import build_dataclass
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
    declared = opt.sweep if sweep else None
    help_text, default = opt.help, default_text(f)
    if declared:
        help_text, default = declared.help, declared.default
    elif sweep:  # the same flag, meaning more in a sweep
        help_text = opt.sweep_help or help_text
        default = default if opt.sweep_default is None else opt.sweep_default
    kwargs = dict(default=None, help=with_default(help_text, default))
    decls = ([sweep_flag(f), name] if declared
             else [*([opt.short] if opt.short else []), declared_flag(f), name])
    if kind in (dict, list):
        kwargs.update(multiple=True, metavar=(opt.sweep_metavar if sweep else None) or opt.metavar)
    elif sweep and is_axis(f):  # text: sweep_values reads and checks each value
        one = (opt.metavar or ("|".join(opt.choices) if opt.choices else None)
               or CLICK_TYPES.get(kind, click.STRING).name.upper())
        kwargs.update(multiple=opt.commas, metavar=(declared and declared.metavar) or (
            one if opt.commas else f"{one}[,...]"))
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


def is_axis(f: dataclasses.Field) -> bool:
    """Whether the field's sweep flag may give several values, each a point of the sweep."""
    return option_of(f).sweep_axis and value_type(f, HINTS) not in (bool, dict, list)


def sweep_values(values: dict) -> tuple[dict, dict]:
    """(overrides for every run, axes), from what click parsed for sweep_options' flags. The
    axes: {field: its values} for a field given several values or declared to vary, and
    {(field, KEY): its values} for a parameter flag's KEY=V1,V2 (-p diloco.H=5,50)."""
    values, axes, single = dict(values), {}, {}
    for name in list(values):
        f, given = FIELDS[name], values[name]
        if given is None or given == ():
            continue
        if value_type(f, HINTS) is dict:
            values[name] = tuple(pair for pair in given if not _parameter_axis(f, pair, axes))
        elif is_axis(f):
            del values[name]
            texts = list(given) if option_of(f).commas else split_names(given, sweep_flag(f))
            parsed = [one_value(f, text) for text in texts]
            if option_of(f).sweep or len(parsed) > 1:
                axes[name] = parsed
            else:
                single[name] = parsed[0]
    return {**overrides(values), **single}, axes


def _parameter_axis(f: dataclasses.Field, pair: str, axes: dict) -> bool:
    """Whether KEY=VALUE gives several values (V1,V2; a bracketed list is one value): if so
    they become the axis (field, KEY) of `axes`."""
    key, sep, text = pair.partition("=")
    texts = top_level_items(text)
    if not sep or not key.strip() or len(texts) < 2:
        return False
    flag = f"{option_of(f).short or long_flag(f)} {shorten(key.strip())}"
    axes[f.name, key.strip()] = [parse_scalar(t.strip(), flag) for t in texts]
    return True


def top_level_items(text: str) -> list[str]:
    """'5,50' -> ['5', '50']; '[0.9,0.95]' -> ['[0.9,0.95]']: commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += (char in "[{(") - (char in "]})")
        if char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    return items + [text[start:]]


def one_value(f: dataclasses.Field, text: str):
    """One value of a swept field as its flag gives it, read as YAML would where the field is
    not text ("1" -> 1), and checked as the field."""
    flag, choices = sweep_flag(f), option_of(f).choices
    if choices and text not in choices:
        raise ExoframeError(f"{flag}: unknown choice '{shorten(text)}'."
                            f"{did_you_mean(text, choices)} Use {', '.join(choices)}.")
    value = text if value_type(f, HINTS) is str else parse_scalar(text, flag)
    return getattr(build_dataclass(RunConfig, {f.name: value}, flag), f.name)


def list_items(text: str, flag: str) -> list[str]:
    names, colon, options = text.partition(":")
    items = split_names(names, flag)
    if colon:
        items[-1] += colon + options
    return items


def split_names(text, flag):
    names = [n.strip() for n in (text or "").split(",")]
    if not any(names):
        raise ExoframeError(f"{flag}: give at least one name (comma-separated).")
    if not all(names):  # "0.1," or "a,,b": a value left out, as -p H=5,,50 is refused
        raise ExoframeError(f"{flag}: an empty value in '{shorten(text)}'; remove the extra "
                            "comma or give the value.")
    return names
