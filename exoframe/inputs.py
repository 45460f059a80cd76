"""The user's input, read strictly: typed YAML into dataclasses, text files named when they
cannot be read. The ground floor with errors.py: it imports nothing else of exoframe (the
network model reads its YAML with these).

Every file a command reads (config and network files, a run's config.yaml, summary.json,
metrics.jsonl, a replay's and a checkpoint's JSON, trace.json, a transformers config.json)
goes through the readers here: no YAML aliases, at most MAX_DEPTH levels of nesting, at
most YAML_LIMIT or JSON_LIMIT bytes (checked before the contents are held in memory), each
refused in one line naming the file; check_types names a field of the wrong type."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import types
import typing
from pathlib import Path

import yaml

from .errors import ExoframeError, did_you_mean, shorten


def type_name(tp, separator: str = " or ") -> str:
    """'float', 'str or list', 'float or str or None' (typing's names would say 'Union'); the
    arms of a union joined by `separator` (the reference pages join them with " | ")."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return separator.join(type_name(arm, separator) for arm in typing.get_args(tp))
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
                f"{where}: {noun} '{key}' must be {type_name(hints[key])}, "
                f"got {shorten(repr(value))}."
            ) from None
        if isinstance(value, float) and not math.isfinite(value) and (finite or math.isnan(value)):
            raise ExoframeError(f"{where}: {noun} '{key}' must be a finite number, got {value}.")
    return cls(**kwargs)


# Nesting deeper than any of exoframe's files goes (a network file's links: 4 levels); a file
# nested hundreds deep would exhaust Python's recursion in the parser.
MAX_DEPTH = 64
MiB = 1 << 20
YAML_LIMIT = 64 * MiB    # a network file of 10^5 links is ~5 MB
JSON_LIMIT = 1024 * MiB  # metrics.jsonl and trace.json of long runs


class _NoAliasLoader(yaml.SafeLoader):
    """YAML without anchors and aliases: nothing here needs them, and nested aliases expand
    a few hundred bytes into gigabytes (a "billion laughs"); nested at most MAX_DEPTH deep."""

    _depth = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise yaml.composer.ComposerError(
                None, None, "aliases (*name) are not allowed; write the value out",
                event.start_mark)
        if self._depth >= MAX_DEPTH:
            raise yaml.composer.ComposerError(
                None, None, f"nested deeper than {MAX_DEPTH} levels; flatten it",
                event.start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


# YAML 1.1 reads a float only with a dot (1.0e-12); 1e-12 and 1E5 would stay text and be
# refused as "must be float". Read them as YAML 1.2 does.
_NoAliasLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9]+(?:\.[0-9]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def safe_load(text: str):
    """yaml.safe_load without aliases; every YAML file and value goes through this."""
    return yaml.load(text, Loader=_NoAliasLoader)


def _too_large(path, what, limit, size=None) -> ExoframeError:
    size = f" ({size / MiB:.0f} MiB)" if size is not None else ""
    return ExoframeError(f"{what} {path}: larger than the {limit / MiB:g} MiB exoframe reads"
                         f"{size}; give the file it wrote, or a smaller one.")


def read_text(path, what: str = "file", limit: int | None = None) -> str:
    """A text file's contents, or one line naming the file when it cannot be read; one
    larger than `limit` bytes is refused before it is read (a FIFO or device once `limit`
    bytes have come)."""
    path = Path(path)
    try:
        if limit is None:
            return path.read_text(encoding="utf-8")
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > limit:
                raise _too_large(path, what, limit, size)
            data = f.read(limit + 1)
        if len(data) > limit:
            raise _too_large(path, what, limit)
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ExoframeError(f"{what} {path}: not a UTF-8 text file (binary?); give a text "
                            "file.") from None
    except IsADirectoryError:
        raise ExoframeError(f"{what} {path}: is a folder; give a file.") from None
    except OSError as e:
        raise ExoframeError(f"cannot read {what} {path}: {e.strerror}.") from None


def read_yaml(path, what: str = "config file"):
    """A YAML file's contents (any type; None when empty), read strictly: one line naming
    the file (and the line) for malformed YAML, aliases, deep nesting or a size over the
    limit."""
    path = Path(path)
    text = read_text(path, what, YAML_LIMIT)
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
    return data


def load_yaml(path, what: str = "config file") -> dict:
    """A YAML file holding a mapping ({} when empty), read as read_yaml reads it."""
    path = Path(path)
    data = read_yaml(path, what)
    if data is None:
        return {}
    if not isinstance(data, dict):
        fields = "RunConfig fields" if what == "config file" else "keys"
        raise ExoframeError(f"{path}: expected a mapping of {fields} at the top level.")
    return data


def check_depth(value, where: str):
    """Refuse a value nested deeper than MAX_DEPTH (level by level, without recursion)."""
    level, depth = [value], 0
    while level:
        depth += 1
        if depth > MAX_DEPTH:
            raise ExoframeError(f"{where}: nested deeper than {MAX_DEPTH} levels; the file "
                                "is not one exoframe wrote.")
        below = []
        for item in level:
            if isinstance(item, dict):
                item = item.values()
            elif not isinstance(item, list):
                continue
            below.extend([child for child in item if isinstance(child, (dict, list))])
        level = below


def parse_json(text: str, where: str, corrupt: str, lines: bool = True):
    """JSON text from `where` (a file, or a file and its line), checked for depth; malformed
    JSON is one line ending with `corrupt` (what to do about it)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        line = f": line {e.lineno}" if lines else ""
        raise ExoframeError(f"{where}{line}: malformed JSON ({e.msg}); {corrupt}") from None
    except RecursionError:
        raise ExoframeError(f"{where}: nested deeper than {MAX_DEPTH} levels; the file is not "
                            "one exoframe wrote.") from None
    check_depth(value, where)
    return value


def load_json(path, what: str = "file",
              corrupt: str = "the file is truncated or corrupt: run again to remake it."):
    """A JSON file's contents, read strictly (size, depth, one line naming the file)."""
    return parse_json(read_text(path, what, JSON_LIMIT), f"{what} {path}", corrupt)


def load_json_lines(path, what: str = "file") -> list:
    """A JSON-lines file: one object per line, each checked, the whole within JSON_LIMIT."""
    rows = []
    for number, line in enumerate(read_text(path, what, JSON_LIMIT).splitlines(), 1):
        row = parse_json(line, f"{what} {path}: line {number}",
                         "the line is truncated or corrupt: remove it or run again.", False)
        if not isinstance(row, dict):
            raise ExoframeError(f"{what} {path}: line {number}: expected a JSON object.")
        rows.append(row)
    return rows


def check_types(values: dict, types: dict, where: str) -> dict:
    """`values` (a file's mapping), each field of `types` it holds of that type (an int is a
    float), or one line naming the file (`where`) and the field."""
    for key, tp in types.items():
        if key in values:
            try:
                _check_type(values[key], tp)
            except TypeError:
                raise ExoframeError(
                    f"{where}: field '{key}' must be {type_name(tp)}, got "
                    f"{shorten(repr(values[key]))}; the file is corrupt or from another tool: "
                    "run it again.") from None
    return values
