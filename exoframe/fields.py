"""How a run option is declared: a RunConfig field (exoframe/config.py) made with `option()`,
whose metadata carries its flag, help and choices.

From that one declaration come the field's YAML key (its name), its `exoframe run` flag and
`exoframe sweep` flag (cli/config_flags.py) and its Trainer.fit keyword
(engine/plan/fit_keywords.py). The help shows the field's default, so no help text restates it.
Imports neither click nor torch.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import MISSING, dataclass


AS_FIELD = object()  # Option.api_default: Trainer.fit's default is the field's


@dataclass(frozen=True)
class Sweep:
    """A field that always varies across a sweep's runs (a sweep of one strategy still
    names it): its sweep flag's own help and spelling."""

    help: str
    flag: str | None = None  # the sweep's spelling, when not the run flag's ("--seeds")
    metavar: str | None = None
    default: str = ""  # what the sweep takes when the flag is not given, in words


@dataclass(frozen=True)
class Option:
    help: str
    flag: str | None = None  # "--name" unless given; "--on/--off" names a switch's two flags
    short: str | None = None  # "-p"
    choices: tuple | None = None
    metavar: str | None = None
    # What an unset value (None, "" or {}) means, shown as the default: "workload's".
    unset: str | None = None
    # Under `exoframe sweep`, where the flag sets every run: its help and default there.
    sweep_help: str | None = None
    sweep_metavar: str | None = None
    sweep_default: str | None = None
    sweep: Sweep | None = None  # the field varies across a sweep's runs
    # Whether the sweep flag may give several values, each a point of the sweep (every
    # field but a switch, a list, and one the sweep reads once: out, target_loss).
    sweep_axis: bool = True
    commas: bool = False  # one value holds commas: a sweep takes one value per flag
    # Trainer.fit's default where the Python API differs (out: no run folder unless given).
    api_default: object = AS_FIELD


def option(default=MISSING, *, default_factory=MISSING, **metadata) -> dataclasses.Field:
    """A RunConfig field with its option metadata (see Option)."""
    return dataclasses.field(default=default, default_factory=default_factory,
                             metadata={"option": Option(**metadata)})


def option_of(f: dataclasses.Field) -> Option:
    return f.metadata["option"]


def field_default(f: dataclasses.Field):
    return f.default_factory() if f.default_factory is not MISSING else f.default


def api_default(f: dataclasses.Field):
    """The field's default as a Trainer.fit keyword."""
    given = option_of(f).api_default
    return field_default(f) if given is AS_FIELD else given


def long_flag(f: dataclasses.Field) -> str:
    """The run flag: '--nodes-per-process'; a switch's first spelling ('--drop-last')."""
    flag = option_of(f).flag or "--" + f.name.replace("_", "-")
    return flag.split("/")[0]


def declared_flag(f: dataclasses.Field) -> str:
    """The flag as click declares it: a bool field is a switch, '--x/--no-x' unless named."""
    opt = option_of(f)
    if opt.flag:
        return opt.flag
    dashed = f.name.replace("_", "-")
    return f"--{dashed}/--no-{dashed}" if isinstance(field_default(f), bool) else f"--{dashed}"


def sweep_flag(f: dataclasses.Field) -> str:
    opt = option_of(f)
    return (opt.sweep and opt.sweep.flag) or long_flag(f)


def default_text(f: dataclasses.Field) -> str | None:
    """The default as help shows it: '2', 'on', 'jsonl', "workload's"; None: no default."""
    value, unset = field_default(f), option_of(f).unset
    if value in (None, "", {}, []):
        return unset if unset is not None else ("none" if value == "" else None)
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


def with_default(help_text: str, default: str | None) -> str:
    return f"{help_text} [{default}]" if default else help_text


def value_type(f: dataclasses.Field, hints: dict) -> type:
    """int, float or str: the type of one value of the field, as a flag reads it (a field
    that may be text, such as a time budget of '2h', reads text)."""
    tp = hints[f.name]
    arms = (typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType)
            else (tp,))
    arms = [typing.get_origin(a) or a for a in arms if a is not type(None)]
    if len(arms) == 1 and arms[0] in (int, float, bool, dict, list):
        return arms[0]
    return str
