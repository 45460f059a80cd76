"""validate_run_folder: each record file of a run folder (summary.json, each line of
metrics.jsonl, trace.json) checked against the JSON Schemas the package ships (beside this
module; docs/schemas holds the same files), read strictly: UTF-8, no NaN or Infinity, no key
twice. One problem line per invalid record, naming the file (and line) and the field.

The schemas are checked with jsonschema (exoframe's dev extra). Where jsonschema is not
installed, each record is read as its dataclass instead (from_json: the same fields and
types, but a plain list or dict in a record, such as a trace's events, only as a list or
dict), so that the check still runs."""
from __future__ import annotations

import functools
import importlib.resources
import json
import re
from pathlib import Path

from ..errors import ExoframeError
from ..inputs import JSON_LIMIT, read_text

# Each record file of a run folder: (its JSON Schema, one record per line?).
RECORD_FILES = {
    "summary.json": ("summary.schema.json", False),
    "metrics.jsonl": ("metrics-row.schema.json", True),
    "trace.json": ("trace.schema.json", False),
}
MAX_PROBLEMS_PER_FILE = 10


def validate_run_folder(path) -> list[str]:
    """One line per invalid record file or record of the run folder at `path` (the folder
    holding summary.json), naming the file (and line) and the field; [] when every record
    validates against the shipped JSON Schemas. A folder without summary.json is one line."""
    folder = Path(path)
    if not (folder / "summary.json").is_file():
        return [f"{folder}: not a run folder (no summary.json)."]
    problems = []
    for name, (schema, lines) in RECORD_FILES.items():
        file = folder / name
        if name != "summary.json" and not file.exists():
            continue  # (a failed run has no trace.json; a run may write no rows)
        found = []
        try:
            records = _read_strictly(file, lines)
        except ExoframeError as e:
            problems.append(str(e))
            continue
        for where, record in records:
            found.extend(_check(schema, record, where))
        if len(found) > MAX_PROBLEMS_PER_FILE:
            found[MAX_PROBLEMS_PER_FILE:] = [
                f"{file}: and {len(found) - MAX_PROBLEMS_PER_FILE} more problems."]
        problems.extend(found)
    return problems


def _read_strictly(file: Path, lines: bool) -> list[tuple[str, object]]:
    """[(where, record)] of `file`: its one JSON value, or each line's (a JSON object)."""
    text = read_text(file, "run record", JSON_LIMIT)
    if not lines:
        return [(str(file), _parse(text, str(file)))]
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        where = f"{file}: line {number}"
        records.append((where, _parse(line, where)))
    return records


def _parse(text: str, where: str):
    try:
        return json.loads(text, parse_constant=_no_constant, object_pairs_hook=_no_twice)
    except ValueError as e:  # (json.JSONDecodeError too)
        raise ExoframeError(f"{where}: not strict JSON ({e}).") from None
    except RecursionError:
        raise ExoframeError(f"{where}: nested too deeply to be a run record.") from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _no_twice(pairs: list) -> dict:
    mapping = dict(pairs)
    if len(mapping) != len(pairs):
        seen = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise ValueError(f"key {twice!r} given twice")
    return mapping


def _check(schema_name: str, record, where: str) -> list[str]:
    try:
        import jsonschema  # noqa: F401  (the dev extra's; see the module's doc)
    except ImportError:
        return _check_by_records(schema_name, record, where)
    validator = _validator(schema_name, _branch(schema_name, record))
    problems = []
    errors = sorted(validator.iter_errors(record), key=lambda e: [str(p) for p in e.absolute_path])
    for error in errors:
        problems.append(f"{where}: field '{_field(error)}': {error.message}")
    return problems


def _branch(schema_name: str, record) -> str | None:
    """Of summary.json's two records (its schema's anyOf), the one its status names: a
    completed run's RunSummary, else StoppedSummary; so that an error names the field, not
    only that neither record fits."""
    if schema_name != "summary.schema.json":
        return None
    stopped = isinstance(record, dict) and record.get("status") in ("failed", "interrupted")
    return "StoppedSummary" if stopped else "RunSummary"


@functools.cache
def shipped_schema(name: str) -> dict:
    """The JSON Schema `name` as the package ships it (exoframe/schema/*.schema.json)."""
    return json.loads((importlib.resources.files(__package__) / name).read_text("utf-8"))


@functools.cache
def _validator(name: str, branch: str | None):
    import jsonschema

    schema = shipped_schema(name)
    if branch is not None:
        schema = {key: value for key, value in schema.items() if key != "anyOf"}
        schema["$ref"] = f"#/$defs/{branch}"
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=None)


def _field(error) -> str:
    """The field an error is about: its path (per_rank[0].rank), and for a missing one,
    its name."""
    path = ""
    for part in error.absolute_path:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        declared, patterns = error.schema.get("properties", {}), error.schema.get(
            "patternProperties", {})
        unknown = [key for key in error.instance if key not in declared
                   and not any(re.search(pattern, key) for pattern in patterns)]
        if unknown:
            path = ", ".join(f"{path}.{key}" if path else key for key in unknown)
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = next((name for name in error.validator_value
                        if name not in error.instance and repr(name) in error.message), None)
        if missing is not None:
            path = f"{path}.{missing}" if path else missing
    return path or "(the record)"


def _check_by_records(schema_name: str, record, where: str) -> list[str]:
    """Without jsonschema: the record read as its dataclass (its from_json)."""
    from .run_records import Row, Trace, summary_from_json

    read = {"summary.schema.json": summary_from_json, "metrics-row.schema.json": Row.from_json,
            "trace.schema.json": Trace.from_json}[schema_name]
    try:
        read(record, where)
    except ExoframeError as e:
        return [str(e)]
    return []
