"""One to_json / from_json for every run record (exoframe/schema/run_records.py).

A record is a keyword-only dataclass whose fields are the JSON keys, in the file's order.
Two kinds of field change how a field maps to keys:
- `absent_when_none()`: the key is written only when it has a value (a key the file has
  only in some runs, e.g. `resumed_from_step`); None otherwise.
- `flattened(prefix)`: a dict whose items are written in its place as keys of their own
  (the workload's `final_val_<metric>`, a strategy's own row numbers); it takes the keys
  no other field declares that start with `prefix` ("" for any).
Reading checks each value's type (an int is a float; a nested record is read as one; of a
plain list or dict, such as a trace's events, only that it is one: the JSON Schemas check
them whole) and says in one line which file and key are wrong."""
from __future__ import annotations

import dataclasses
import functools
import types
import typing

from ..errors import ExoframeError
from ..inputs import check_types

# The version of the records this exoframe writes: raise it when a record's fields change,
# and read the older version's files by upgrading their mappings (readable_version).
SCHEMA_VERSION = 1
ABSENT_WHEN_NONE = "absent_when_none"
FLATTENED = "flattened_prefix"


def absent_when_none():
    return dataclasses.field(default=None, metadata={ABSENT_WHEN_NONE: True})


def flattened(prefix: str = ""):
    return dataclasses.field(default_factory=dict, metadata={FLATTENED: prefix})


class Record:
    """The base of a run record: to_json() gives the file's mapping, from_json() reads one."""

    def to_json(self) -> dict:
        out = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if FLATTENED in field.metadata:
                out.update((key, _to_json(item)) for key, item in value.items())
            elif not (field.metadata.get(ABSENT_WHEN_NONE) and value is None):
                out[field.name] = _to_json(value)
        return out

    @classmethod
    def from_json(cls, data, where: str = ""):
        """The record of mapping `data`; `where` names its file for the one-line errors."""
        where = where or cls.__name__
        if not isinstance(data, dict):
            raise ExoframeError(f"{where}: expected a JSON object, got {type(data).__name__}.")
        plan = _plan(cls)
        if plan.versioned:
            data = {**data, "schema_version": readable_version(data, where)}
        values: dict = {name: {} for _, name in plan.prefixes}
        for key, value in data.items():
            if key in plan.declared:
                values[key] = _from_json(value, plan.declared[key], where, key)
                continue
            name = next((name for prefix, name in plan.prefixes if key.startswith(prefix)),
                        None)
            if name is None:
                raise ExoframeError(f"{where}: unknown field '{key}'; the file is not one this "
                                    "exoframe wrote (or it was edited).")
            values[name][key] = _from_json(value, plan.items[name], where, key)
        missing = [name for name in plan.required if name not in values]
        if missing:
            raise ExoframeError(f"{where}: no field '{missing[0]}'; the file is truncated or "
                                "not one this exoframe wrote.")
        return cls(**values)


def check_fields(cls, data: dict, where: str) -> dict:
    """`data` (a mapping read from a file of record `cls`) when each key of it that `cls`
    declares holds a value of its type, checked as from_json checks it; else one line
    naming the file and the key. Keys it lacks or does not declare are let be: a report
    reads summaries that scripts wrote, too (of a nested record, or a list or dict of them,
    only that it is a JSON object, list or object)."""
    plan = _plan(cls)
    if plan.versioned and "schema_version" in data:
        readable_version(data, where)
    for key, value in data.items():
        if key in plan.declared and key != "schema_version":
            _from_json(value, _shallow(plan.declared[key]), where, key)
    return data


def _shallow(tp):
    """`tp` with a record in it read as a plain dict (Failure | None: dict | None;
    list[Failure]: list)."""
    union = typing.get_origin(tp) in (typing.Union, types.UnionType)
    arms = typing.get_args(tp) if union else (tp,)
    shallow = []
    for arm in arms:
        origin = typing.get_origin(arm)
        if _record_type(arm) is not None:
            shallow.append(dict)
        elif origin in (list, dict) and any(_record_type(a) for a in typing.get_args(arm)):
            shallow.append(origin)
        else:
            shallow.append(arm)
    return functools.reduce(lambda a, b: a | b, shallow) if union else shallow[0]


@dataclasses.dataclass(frozen=True)
class _Plan:
    """How from_json reads a record class: its keys' types, flattened fields, required keys."""
    declared: dict  # key: its type
    prefixes: list  # (prefix, flattened field), the longest prefix first
    items: dict  # flattened field: its items' type
    required: list
    versioned: bool


@functools.cache
def _plan(cls) -> _Plan:
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    flat = [f for f in fields if FLATTENED in f.metadata]
    return _Plan(
        declared={f.name: hints[f.name] for f in fields if FLATTENED not in f.metadata},
        prefixes=sorted(((f.metadata[FLATTENED], f.name) for f in flat), reverse=True),
        items={f.name: typing.get_args(hints[f.name])[1] for f in flat},
        required=[f.name for f in fields if f.default is dataclasses.MISSING
                  and f.default_factory is dataclasses.MISSING],
        versioned=any(f.name == "schema_version" for f in fields))


def readable_version(data: dict, where: str) -> int:
    """The schema version of mapping `data` (none: 1, as in the files written before the key
    was added), or one line saying this exoframe cannot read it. Version 1 is the only one
    written so far: there is nothing to upgrade yet."""
    version = data.get("schema_version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ExoframeError(f"{where}: field 'schema_version' must be a whole number from 1, got "
                            f"{version!r}; the file is not one exoframe wrote.")
    if version > SCHEMA_VERSION:
        raise ExoframeError(f"{where}: schema_version {version} is newer than this exoframe "
                            f"reads (up to {SCHEMA_VERSION}): upgrade exoframe to read it.")
    return version


def with_version(mapping: dict) -> dict:
    """`mapping` (a summary's) with schema_version, after its status, as to_json() places
    it: for a mapping too large to read as its record only to write it."""
    if "schema_version" in mapping:
        return mapping
    items = list(mapping.items())
    at = 1 if items and items[0][0] == "status" else 0
    return dict([*items[:at], ("schema_version", SCHEMA_VERSION), *items[at:]])


def _to_json(value):
    if isinstance(value, Record):
        return value.to_json()
    if isinstance(value, list):
        return [_to_json(item) for item in value]
    if isinstance(value, dict):
        return {key: _to_json(item) for key, item in value.items()}
    return value


def _record_type(tp):
    """The Record class `tp` names, alone or with None (`Validation | None`), else None."""
    union = typing.get_origin(tp) in (typing.Union, types.UnionType)
    arms = [arm for arm in typing.get_args(tp) if arm is not type(None)] if union else [tp]
    record = [arm for arm in arms if isinstance(arm, type) and issubclass(arm, Record)]
    return record[0] if record and len(arms) == 1 else None


@functools.cache
def _plain_types(tp) -> tuple:
    """The Python types that are of `tp` as they are, where `tp` is plain (float, str,
    int | None, ...); else ()."""
    arms = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union,
                                                             types.UnionType) else (tp,)
    plain = {float: (float, int), int: (int,), str: (str,), bool: (bool,),
             type(None): (type(None),)}
    if not all(arm in plain for arm in arms):
        return ()
    return tuple(t for arm in arms for t in plain[arm])


def _from_json(value, tp, where: str, key: str):
    """`value` of `where`'s field `key`, of type `tp` (records, and lists and dicts of
    them, read as records)."""
    if type(value) in _plain_types(tp):  # (most values: a number, a text)
        return value
    if value is None and type(None) in typing.get_args(tp):
        return None
    arms = [arm for arm in typing.get_args(tp) if arm is not type(None)]
    if len(arms) == 1 and typing.get_origin(tp) in (typing.Union, types.UnionType):
        tp = arms[0]  # X | None, and value is not None: X
    record = _record_type(tp)
    if record is not None:
        return record.from_json(value, f"{where}: field '{key}'")
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        if value not in args:
            raise ExoframeError(f"{where}: field '{key}' must be one of "
                                f"{', '.join(map(repr, args))}, got {value!r}; the file is not "
                                "one this exoframe wrote.")
        return value
    check_types({key: value}, {key: tp}, where)
    if origin is list and args and _record_type(args[0]):
        return [_from_json(item, args[0], where, f"{key}[{i}]") for i, item in enumerate(value)]
    if origin is dict and len(args) == 2 and _record_type(args[1]):
        return {name: _from_json(item, args[1], where, f"{key}.{name}")
                for name, item in value.items()}
    return value
