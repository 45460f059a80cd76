"""Metrics sinks: where each step's metrics row goes. The built-ins write into the run folder.

A sink's lifetime in one run (documented for plugin authors in docs/plugins.md):
1. opened once, before any rank starts: `factory(run, **options)` with `run` a RunInfo
   (the run folder, its name, the config as logged in config.yaml, the strategy, ...) and
   the options given as `--sink NAME:KEY=VALUE,KEY=VALUE` or in YAML as
   `sinks: [{NAME: {KEY: VALUE}}]` (strings from the command line, YAML's types from a file);
2. `write(row)` for every step as it finishes, in step order, rows with finite numbers or
   None;
3. `finish(summary)`, if the sink defines it, once at the end: summary.json's content,
   whose "status" is "completed", "failed" or "interrupted";
4. `close()`, once, whether the run completed or not.
A sink that raises while opening stops the run before it starts, with the sink's name.

`jsonl` (the default) writes metrics.jsonl, one JSON object per line; `csv` writes
metrics.csv. Plugins add sinks through `exoframe_register_sinks`.
"""
from __future__ import annotations

import csv
import inspect
import io
import numbers
from typing import Optional
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ExoframeError, did_you_mean, shorten
from .files import FULL_DISK, AppendOnly, write_atomic
from .hookspecs import hookimpl
from .report.strict_json import dumps, finite


@dataclass(frozen=True)
class RunInfo:
    """What a sink is told about its run when it is opened."""
    dir: Path  # the run folder: sinks that write files write them here
    name: str  # the run folder's name, unique under --out: a good run name for a tracker
    strategy: str
    workload: str
    nodes: int
    steps: int
    seed: int
    net: str
    config: dict = field(default_factory=dict)  # the run's config, as in config.yaml
    # A resumed run: the step of its checkpoint and the rows up to it. Rows after it may
    # have been written before the run stopped; they come again, the same.
    resumed_at: Optional[int] = None
    resumed_rows: tuple = ()

    # Sinks written for plugin API 1 took the run folder itself: Path(run) and run / "x"
    # still work.
    def __fspath__(self) -> str:
        return str(self.dir)

    def __truediv__(self, other) -> Path:
        return self.dir / other


@dataclass(frozen=True)
class SinkSpec:
    """A sink chosen for a run: its name, factory and options, checked before the run."""
    name: str
    factory: object
    options: dict

    def open(self, run: RunInfo):
        try:
            return self.factory(run, **self.options)
        except Exception as e:
            raise sink_error(self.name, "could not start", e) from None


def sink_error(name: str, what: str, error: Exception) -> ExoframeError:
    """One line naming the sink; a full disk says so."""
    if isinstance(error, ExoframeError):  # the sink's own line: named once
        said = str(error)
        return error if said.startswith(f"sink '{name}'") else ExoframeError(
            f"sink '{name}' {what}: {said}")
    if isinstance(error, OSError) and error.strerror:
        fix = (" Free some space, or give --out on another disk."
               if error.errno in FULL_DISK else "")
        return ExoframeError(f"sink '{name}' {what}: cannot write "
                             f"{error.filename or 'its file'}: {error.strerror}.{fix}")
    return ExoframeError(f"sink '{name}' {what}: {type(error).__name__}: "
                         f"{shorten(str(error), 300)}")


class OpenSinks:
    """A run's sinks through their lifetime (see the module docstring); errors name the sink."""

    def __init__(self, specs, run: RunInfo, failed_summary):
        """failed_summary(error_text): the summary to finish earlier sinks with when a later
        one cannot start."""
        self.sinks: list[tuple[str, object]] = []
        for spec in specs:
            try:
                self.sinks.append((spec.name, spec.open(run)))
            except ExoframeError as e:
                self.close(failed_summary(str(e)), raise_errors=False)
                raise

    def write(self, row: dict):
        for name, sink in self.sinks:
            try:
                sink.write(row)
            except Exception as e:
                raise sink_error(name, f"failed at step {row.get('step')}", e) from None

    def close(self, summary: dict | None, raise_errors: bool):
        """finish(summary) where a sink has it, then close(), for every sink; with
        raise_errors the first error is raised once all were closed."""
        first = None
        for name, sink in self.sinks:
            try:
                if summary is not None and hasattr(sink, "finish"):
                    sink.finish(summary)
            except Exception as e:
                first = first or sink_error(name, "could not finish", e)
            try:
                sink.close()
            except Exception as e:
                first = first or sink_error(name, "could not close", e)
        self.sinks = []
        if first is not None and raise_errors:
            raise first


def parse_sink(item) -> tuple[str, dict]:
    """A `sinks:` entry as (name, options): "name", "name:key=value,key=value", or a
    mapping with one key, {name: {key: value}}."""
    if isinstance(item, str):
        name, _, text = item.partition(":")
        options = {}
        for pair in filter(None, (p.strip() for p in text.split(","))):
            key, equals, value = pair.partition("=")
            if not equals or not key.strip():
                raise ExoframeError(f"sinks: '{shorten(item)}': options follow the name as "
                                    "KEY=VALUE pairs, e.g. tensorboard:logdir=tb,flush_secs=5.")
            options[key.strip()] = value.strip()
    elif isinstance(item, dict) and len(item) == 1:
        (name, options), = item.items()
        options = {} if options is None else options
        if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
            raise ExoframeError(f"sinks: the options of '{shorten(name)}' must be a mapping "
                                f"of names to values, got {shorten(options)}.")
    else:
        raise ExoframeError(f"sinks: each entry is a name, 'name:key=value,...' or "
                            f"{{name: {{key: value}}}}, got {shorten(item)}.")
    if not isinstance(name, str) or not name.strip():
        raise ExoframeError(f"sinks: an entry has no sink name: {shorten(item)}.")
    if "," in name:
        raise ExoframeError(f"sinks: '{shorten(name)}' is several names: give each sink as an "
                            "entry of its own.")
    return name.strip(), dict(options)


def sink_spec(item, registry) -> SinkSpec:
    """The SinkSpec for a `sinks:` entry, its options checked against the factory's."""
    name, options = parse_sink(item)
    factory = registry.get(name).obj
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin or extension type: nothing to check
        return SinkSpec(name, factory, options)
    named = [p for p in list(signature.parameters.values())[1:]
             if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    takes_any = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    accepted = [p.name for p in named]
    unknown = [key for key in options if key not in accepted]
    if unknown and not takes_any:
        raise ExoframeError(
            f"sink '{name}' has no option '{shorten(unknown[0])}'."
            f"{did_you_mean(unknown[0], accepted)} "
            f"{'Its options: ' + ', '.join(accepted) if accepted else 'It takes no options'}.")
    missing = [p.name for p in named if p.default is p.empty and p.name not in options]
    if missing:
        raise ExoframeError(f"sink '{name}' needs the option '{missing[0]}': "
                            f"--sink {name}:{missing[0]}=VALUE.")
    return SinkSpec(name, factory, options)


def check_row(row: dict) -> dict:
    """The row with non-finite values as None (strict JSON: no bare NaN); a value that is not
    a number (a strategy's metrics() returning a tensor or a string) is refused by name."""
    out = {}
    for key, value in row.items():
        if value is not None and (isinstance(value, bool)
                                  or not isinstance(value, numbers.Real)):
            raise ExoframeError(
                f"metric '{shorten(str(key))}' is {shorten(value)} ({type(value).__name__}), "
                "not a number: a strategy's metrics() must return numbers, e.g. float(x).")
        out[key] = value if value is None or isinstance(value, int) else float(value)
    return finite(out)


class JsonlSink:
    """metrics.jsonl: one JSON object per step, written as the step finishes.

    A write that fails (a full disk) is undone, so every line in the file is a whole row. A
    resumed run leaves the file as it is until its first row: then the checkpoint's rows and
    that row replace it at once (a resume that fails before its first step changes nothing)."""

    def __init__(self, run: RunInfo):
        self.path = Path(run.dir) / "metrics.jsonl"
        self._file = None
        self._resumed_rows = run.resumed_rows if run.resumed_at is not None else None
        if self._resumed_rows is None:
            self._file = AppendOnly(self.path)

    def write(self, row: dict):
        if self._file is None:  # a resume's first row
            write_atomic(self.path, "".join(map(_line, [*self._resumed_rows, row])))
            self._file = AppendOnly(self.path)
        else:
            self._file.append(_line(row).encode())

    def close(self):
        if self._file is not None:
            self._file.close()


def _line(row: dict) -> str:
    return dumps(check_row(row)) + "\n"


class CsvSink:
    """metrics.csv: one line per step; a column for every metric seen so far.

    Rows are appended whole (a full disk cuts a failed one back off); when a metric first
    appears mid-run the file is replaced whole under the wider header. A resumed run leaves
    the file as it is until its first row, as JsonlSink does."""

    def __init__(self, run: RunInfo):
        self.path = Path(run.dir) / "metrics.csv"
        self._file = None
        self.rows: list[dict] = []
        if run.resumed_at is not None:  # the checkpoint's rows, whatever the file holds
            self.rows = [check_row(row) for row in run.resumed_rows]
        else:
            self._file = AppendOnly(self.path)
        self.columns = list(dict.fromkeys(key for row in self.rows for key in row))

    def write(self, row: dict):
        row = check_row(row)
        new = [key for key in row if key not in self.columns]
        if new or self._file is None:
            # Some metrics first appear mid-run (val_loss, a strategy's outer-step metrics):
            # the file is rewritten under the wider header, a few times per run.
            self._replace(self.columns + new, [*self.rows, row])
        else:
            self._file.append(self._text([row], header=False).encode())
        self.rows.append(row)

    def _replace(self, columns: list, rows: list):
        if self._file is not None:
            self._file.close()
            self._file = None
        self.columns = columns
        write_atomic(self.path, self._text(rows, header=True))
        self._file = AppendOnly(self.path)

    def _text(self, rows, header: bool) -> str:
        buffer = io.StringIO(newline="")
        writer = csv.DictWriter(buffer, fieldnames=self.columns, restval="")
        if header:
            writer.writeheader()
        writer.writerows(rows)
        return buffer.getvalue()

    def close(self):
        if self._file is not None:
            self._file.close()


@hookimpl
def exoframe_register_sinks(register):
    register("jsonl", JsonlSink)
    register("csv", CsvSink)
