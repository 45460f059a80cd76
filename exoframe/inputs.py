"""The user's input, read strictly: typed YAML into dataclasses, text files named when they
cannot be read. The ground floor with errors.py: it imports nothing else of exoframe (the
network model reads its YAML with these)."""
from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from pathlib import Path

import yaml

from .errors import ExoframeError, did_you_mean, shorten


def _type_name(tp) -> str:
    """'float', 'str or list', 'float or str or None' (typing's names would say 'Union')."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(arm) for arm in typing.get_args(tp))
    if tp is type(None):
        return "None"
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


def build_dataclass(cls, values: dict, where: str, noun: str = "field", finite: bool = True):
    """Instantiate dataclass `cls` from a mapping, checking names and types.

    `where` names the source for messages, e.g. "config.yaml" or "strategy 'diloco'".
    finite: refuse NaN and infinite floats (a network file allows .inf: 'unlimited').
    """
    if not isinstance(values, dict):
        raise ExoframeError(f"{where}: expected a mapping of field names to values, "
                            f"got {shorten(repr(values))}.")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in values.items():
        if key not in fields:
            key = shorten(str(key))
            raise ExoframeError(
                f"{where}: unknown {noun} '{key}'.{did_you_mean(key, fields)} "
                f"Valid {noun}s: {', '.join(fields) or '(none)'}."
            )
        try:
            kwargs[key] = _check_type(value, hints[key])
        except TypeError:
            raise ExoframeError(
                f"{where}: {noun} '{key}' must be {_type_name(hints[key])}, "
                f"got {shorten(repr(value))}."
            ) from None
        if isinstance(value, float) and not math.isfinite(value) and (finite or math.isnan(value)):
            raise ExoframeError(f"{where}: {noun} '{key}' must be a finite number, got {value}.")
    return cls(**kwargs)


class _NoAliasLoader(yaml.SafeLoader):
    """YAML without anchors and aliases: nothing here needs them, and nested aliases expand
    a few hundred bytes into gigabytes (a "billion laughs")."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, "aliases (*name) are not allowed; write the value out",
                event.start_mark)
        return super().compose_node(parent, index)


# YAML 1.1 reads a float only with a dot (1.0e-12); 1e-12 and 1E5 would stay text and be
# refused as "must be float". Read them as YAML 1.2 does.
_NoAliasLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9]+(?:\.[0-9]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def safe_load(text: str):
    """yaml.safe_load without aliases; every YAML file and value goes through this."""
    return yaml.load(text, Loader=_NoAliasLoader)


def read_text(path, what: str = "file") -> str:
    """A text file's contents, or one line naming the file when it cannot be read."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ExoframeError(f"{what} {path}: not a UTF-8 text file (binary?); give a text "
                            "file.") from None
    except IsADirectoryError:
        raise ExoframeError(f"{what} {path}: is a folder; give a file.") from None
    except OSError as e:
        raise ExoframeError(f"cannot read {what} {path}: {e.strerror}.") from None


def load_yaml(path, what: str = "config file") -> dict:
    path = Path(path)
    text = read_text(path, what)
    try:
        data = safe_load(text)
    except yaml.YAMLError as e:
        # An unclosed bracket is reported at the end of the file; its context mark says
        # where the construct began, which is the line a user needs.
        mark = getattr(e, "context_mark", None) or getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        if getattr(e, "context", None):
            problem = f"{e.context}: {problem}"
        raise ExoframeError(f"{path}{line}: malformed YAML: {shorten(problem)}.") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        fields = "RunConfig fields" if what == "config file" else "keys"
        raise ExoframeError(f"{path}: expected a mapping of {fields} at the top level.")
    return data
