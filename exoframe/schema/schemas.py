"""The JSON Schemas (draft 2020-12) of a run folder's records, made from their dataclasses
(run_records.py) by pydantic: summary.json, a metrics.jsonl line and trace.json.

`python -m exoframe.schema.schemas [FOLDER]` writes them into FOLDER; without it, into
docs/schemas of the source checkout this module is in and beside this module (the copies the
package ships). `--check` writes nothing and fails, naming them, when the schemas there
differ from what the dataclasses make now (tests/test_schema.py runs it). pydantic is needed
to make them (pip install exoframe[dev]), not to run exoframe.
"""
from __future__ import annotations

import dataclasses
import json
import re
import sys
import typing
from pathlib import Path

from .generated_files import generator_main
from .codec import FLATTENED, SCHEMA_VERSION
from .run_records import Row, RunSummary, StoppedSummary, Trace

PACKAGED = Path(__file__).resolve().parent  # the copies the package ships
SUFFIX = ".schema.json"
SCHEMAS = {  # file name: (the record type, the file it describes)
    "summary" + SUFFIX: (RunSummary | StoppedSummary, "summary.json"),
    "metrics-row" + SUFFIX: (Row, "a line of metrics.jsonl"),
    "trace" + SUFFIX: (Trace, "trace.json"),
}


def records_in(tp) -> dict[str, type]:
    """{name: class} of the dataclasses in type `tp`, nested ones included."""
    found, stack = {}, [tp]
    while stack:
        tp = stack.pop()
        if dataclasses.is_dataclass(tp) and tp.__name__ not in found:
            found[tp.__name__] = tp
            stack.extend(typing.get_type_hints(tp).values())
        stack.extend(typing.get_args(tp))
    return found


def shape_as_written(schema: dict, cls) -> None:
    """Make a dataclass's schema say what its to_json() writes: a flattened field's items
    are keys of their own; no other key is allowed; schema_version is this version."""
    properties = schema["properties"]
    for field in dataclasses.fields(cls):
        if FLATTENED not in field.metadata:
            continue
        item = properties.pop(field.name)["additionalProperties"]
        prefix = field.metadata[FLATTENED]
        if prefix:
            schema.setdefault("patternProperties", {})["^" + re.escape(prefix)] = item
        else:
            schema["additionalProperties"] = item
    schema.setdefault("additionalProperties", False)
    if "schema_version" in properties:
        properties["schema_version"]["const"] = SCHEMA_VERSION


def make(tp, describes: str) -> dict:
    from pydantic import TypeAdapter  # (a dev and docs dependency: see the module's doc)

    schema = TypeAdapter(tp).json_schema()
    classes = records_in(tp)
    definitions = schema.get("$defs", {})
    for name, cls in classes.items():
        shape_as_written(definitions[name] if name in definitions else schema, cls)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$comment": f"{describes}, schema_version {SCHEMA_VERSION}: made by `python -m "
                        "exoframe.schema.schemas` from exoframe/schema/run_records.py; edit "
                        "that, not this file.",
            **schema}


def texts() -> dict[str, str]:
    """{file name: its JSON text} of every schema."""
    return {name: json.dumps(make(tp, describes), indent=2) + "\n"
            for name, (tp, describes) in SCHEMAS.items()}


def main(argv=None) -> int:
    return generator_main(
        argv, prog="python -m exoframe.schema.schemas",
        description="Write the JSON Schemas of summary.json, metrics.jsonl's lines and "
                    "trace.json, made from the records' dataclasses.",
        what="schemas", source="the records' dataclasses", made=texts,
        pattern="*" + SUFFIX, default_folders=lambda docs: [docs / "schemas", PACKAGED],
        missing=_without_pydantic)


def _without_pydantic() -> str | None:
    try:
        import pydantic  # noqa: F401
    except ImportError:
        return "the schemas are made by pydantic: pip install pydantic (or exoframe's dev extra)"
    return None


if __name__ == "__main__":
    sys.exit(main())
