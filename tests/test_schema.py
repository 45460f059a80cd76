"""The run records' one schema (exoframe/schema): the JSON Schemas shipped with the package
and in docs/schemas are what the records' dataclasses make; the files of real runs (a
completed one, one with failures, one that failed, a resumed one, one on a real network)
validate against them, and a broken record does not (exoframe.schema.validate_run_folder
names the file and the field, and the suite's own check in tests/conftest.py fails a test
that leaves such a run folder); exoframe.load_run reads a run folder written before the
records had a schema_version and refuses, in one line, one of a newer version."""
import importlib.resources
import json
import os
import shutil
import subprocess
import sys
import textwrap

import jsonschema
import pytest

import exoframe
from exoframe import Trainer
from exoframe.config import resolve_config
from exoframe.engine import execute, job_from_config
from exoframe.errors import ExoframeError
from exoframe.schema import (SCHEMA_VERSION, Row, RunSummary, StoppedSummary, Trace,
                             load_run, schemas, validate_run_folder)
from exoframe.testing import tiny_data, tiny_model

from conftest import REPO, check_run_folders


def shipped(name: str) -> dict:
    return json.loads((importlib.resources.files("exoframe.schema") / name).read_text())


VALIDATORS = {name: jsonschema.Draft202012Validator(shipped(name))
              for name in ("summary.schema.json", "metrics-row.schema.json",
                           "trace.schema.json")}


def run(out, strategy, faults="", nodes=2, steps=4, **extra):
    config = resolve_config(None, {
        "workload": "mlp", "strategy": strategy, "nodes": nodes, "steps": steps,
        "eval_every": 2, "compute": "fixed:10ms", "net": "wan-100mbps", "faults": faults,
        "out": str(out), **extra})
    return execute(job_from_config(config), out=config.out)


def fit(**options):
    options = {"compute": "fixed:10ms", **options}
    return Trainer(tiny_model(), tiny_data(), batch_size=4).fit(
        strategy="diloco", num_nodes=2, strategy_params={"H": 2}, **options)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """{name: run folder}: ddp, completed; diloco with a node failing and coming back;
    gossip, which cannot go on without a node: failed; diloco resumed from a checkpoint;
    diloco on a real network (its times measured)."""
    tmp = tmp_path_factory.mktemp("records")
    made = {"ddp": run(tmp / "ddp", "ddp").run_dir,
            "faults": run(tmp / "faults", "diloco", "1@0.02s:0.02s",
                          strategy_params={"H": 2}).run_dir}
    with pytest.raises(ExoframeError, match="cannot go on without it"):
        run(tmp / "failed", "gossip", "1@0.01s:1s", steps=6)
    (made["failed"],) = (tmp / "failed").iterdir()
    first = fit(steps=4, out=str(tmp / "resumed"), checkpoint_every=2)
    made["resumed"] = fit(steps=6, resume=str(first.run_dir), checkpoint_every=2).run_dir
    made["real"] = fit(steps=3, out=str(tmp / "real"), net="real", compute="measured").run_dir
    return made


def records_of(folder):
    summary = json.loads((folder / "summary.json").read_text())
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    trace = (json.loads((folder / "trace.json").read_text())
             if (folder / "trace.json").exists() else None)
    return summary, rows, trace


def test_the_shipped_schemas_are_what_the_records_make(capsys):
    assert schemas.main(["--check"]) == 0, capsys.readouterr().err
    for validator in VALIDATORS.values():
        jsonschema.Draft202012Validator.check_schema(validator.schema)


def test_the_schemas_module_checks_writes_and_refuses_in_one_line(tmp_path, capsys):
    assert schemas.main([str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(schemas.SCHEMAS)
    assert schemas.main(["--check", str(tmp_path)]) == 0
    (tmp_path / "trace.schema.json").write_text("{}\n")
    capsys.readouterr()
    assert schemas.main(["--check", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "trace.schema.json differ" in err and err.count("\n") == 1, err
    assert (REPO / "docs" / "schemas" / "summary.schema.json").read_text() == \
        (importlib.resources.files("exoframe.schema") / "summary.schema.json").read_text()


@pytest.mark.parametrize("name", ["ddp", "faults", "failed", "resumed", "real"])
def test_every_record_of_a_real_run_validates_and_reads_back_as_written(folders, name):
    summary, rows, trace = records_of(folders[name])
    assert summary["schema_version"] == SCHEMA_VERSION
    VALIDATORS["summary.schema.json"].validate(summary)
    for row in rows:
        VALIDATORS["metrics-row.schema.json"].validate(row)
    assert (trace is None) == (name == "failed")
    if trace is not None:
        VALIDATORS["trace.schema.json"].validate(trace)
    records = load_run(folders[name])
    assert isinstance(records.summary, StoppedSummary if name == "failed" else RunSummary)
    # to_json gives back each file's mapping, every key in its order
    written = records.summary.to_json()
    assert written == summary and list(written) == list(summary)
    assert [list(r.to_json().items()) for r in records.rows] == [list(r.items()) for r in rows]
    if trace is not None:
        assert records.trace.to_json() == trace
    assert list(records.dataframe["step"]) == [r["step"] for r in rows]


def test_the_records_say_what_the_run_did(folders):
    assert load_run(folders["resumed"]).summary.resumed_from_step == 4
    assert load_run(folders["real"]).summary.per_rank[0].transfer_seconds is not None
    done = load_run(folders["faults"])
    (failure,) = done.summary.failures
    assert failure.rank == 1 and failure.steps_down == done.summary.per_rank[1].steps_down
    assert sum(row.nodes_down or 0 for row in done.rows) == failure.steps_down
    assert done.trace.nodes == done.summary.num_nodes == 2
    assert [row.step for row in done.rows] == list(range(1, 5))
    # the workload's validation metric, in the rows and the summary by its own key
    accuracy = done.rows[-1].val_metrics["val_accuracy"]
    assert done.summary.final_val_metrics["final_val_accuracy"] == accuracy
    assert done.summary.to_json()["final_val_accuracy"] == accuracy
    failed = load_run(folders["failed"])
    assert failed.summary.status == "failed" and "gossip" in failed.summary.error
    assert all(isinstance(row, Row) for row in failed.summary.rows)
    assert failed.trace is None


@pytest.mark.invalid_records
@pytest.mark.parametrize("file, field, value", [
    ("summary.json", "num_nodes", "two"),
    ("summary.json", "failures", {}),
    ("summary.json", "per_rank", [{"rank": 0}]),
    ("summary.json", "an_unknown_key", 1),
    ("summary.json", "schema_version", SCHEMA_VERSION + 1),
    ("metrics.jsonl", "loss", "low"),
    ("metrics.jsonl", "step", 1.5),
    ("trace.json", "nodes", "2"),
])
def test_a_broken_record_fails_its_schema_and_load_run_says_where(folders, tmp_path, file,
                                                                   field, value):
    folder = tmp_path / "run"
    shutil.copytree(folders["ddp"], folder)
    summary, rows, trace = records_of(folder)
    record = {"summary.json": summary, "metrics.jsonl": rows[0], "trace.json": trace}[file]
    record[field] = value
    schema = {"summary.json": "summary.schema.json", "metrics.jsonl": "metrics-row.schema.json",
              "trace.json": "trace.schema.json"}[file]
    with pytest.raises(jsonschema.ValidationError):
        VALIDATORS[schema].validate(record)
    if file == "metrics.jsonl":
        text = "".join(json.dumps(row) + "\n" for row in rows)
    else:
        text = json.dumps(record)
    (folder / file).write_text(text)
    with pytest.raises(ExoframeError) as refused:
        load_run(folder)
    message = str(refused.value)
    assert str(folder / file) in message and "\n" not in message, message


def test_load_run_reads_a_run_folder_written_before_the_schema_version(folders, tmp_path):
    """Version 1's files from before the key was added: the same fields, no schema_version."""
    folder = tmp_path / "before"
    shutil.copytree(folders["ddp"], folder)
    summary, rows, trace = records_of(folder)
    for name, record in (("summary.json", summary), ("trace.json", trace)):
        del record["schema_version"]
        (folder / name).write_text(json.dumps(record, indent=2))
    records = exoframe.load_run(folder)
    assert records.summary.schema_version == records.trace.schema_version == 1
    assert records.summary.to_json() == {"schema_version": 1, **summary}
    assert [r.to_json() for r in records.rows] == rows
    assert isinstance(records.trace, Trace)


def test_load_run_refuses_a_newer_schema_version_in_one_line(folders, tmp_path):
    folder = tmp_path / "newer"
    shutil.copytree(folders["ddp"], folder)
    for name in ("summary.json", "trace.json"):
        record = json.loads((folder / name).read_text())
        (folder / name).write_text(json.dumps({**record, "schema_version": 99}))
        with pytest.raises(ExoframeError) as refused:
            load_run(folder)
        message = str(refused.value)
        assert message == (f"{folder / name}: schema_version 99 is newer than this exoframe "
                           f"reads (up to {SCHEMA_VERSION}): upgrade exoframe to read it.")
        (folder / name).write_text(json.dumps(record))
    with pytest.raises(ExoframeError, match="not a run folder"):
        load_run(tmp_path)


def test_the_records_import_no_torch():
    """A script that only reads run folders (exoframe.load_run) does not pay for torch."""
    code = ("import sys, exoframe; exoframe.load_run; import exoframe.schema.schemas; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("name", ["ddp", "faults", "failed", "resumed", "real"])
def test_a_real_run_folder_validates_against_the_shipped_schemas(folders, name):
    assert validate_run_folder(folders[name]) == []


def broken_copy(folders, tmp_path, file, change):
    """A copy of the ddp run folder with `change` made to one record of `file` (summary.json,
    the first line of metrics.jsonl or trace.json), written back as `change` returns it."""
    folder = tmp_path / "run"
    shutil.copytree(folders["ddp"], folder)
    summary, rows, trace = records_of(folder)
    if file == "metrics.jsonl":
        rows[0] = change(rows[0])
        text = "".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows)
    else:
        record = change(summary if file == "summary.json" else trace)
        text = record if isinstance(record, str) else json.dumps(record)
    (folder / file).write_text(text)
    return folder


def changed(**values):
    return lambda record: {**record, **values}


def without(key):
    return lambda record: {k: v for k, v in record.items() if k != key}


@pytest.mark.invalid_records
@pytest.mark.parametrize("file, change, where, says", [
    ("summary.json", changed(num_nodes="two"), "summary.json", "field 'num_nodes'"),
    ("summary.json", without("per_rank"), "summary.json", "field 'per_rank'"),
    ("summary.json", changed(an_unknown_key=1), "summary.json", "field 'an_unknown_key'"),
    ("summary.json", changed(status="finished"), "summary.json", "field 'status'"),
    ("summary.json", lambda r: json.dumps({**r, "final_loss": float("nan")}), "summary.json",
     "NaN"),
    ("metrics.jsonl", without("step"), "metrics.jsonl: line 1", "field 'step'"),
    ("metrics.jsonl", changed(loss="low"), "metrics.jsonl: line 1", "field 'loss'"),
    ("metrics.jsonl", lambda r: json.dumps(r)[:-5], "metrics.jsonl: line 1", "not strict JSON"),
    ("trace.json", changed(nodes="2"), "trace.json", "field 'nodes'"),
])
def test_a_broken_record_is_one_problem_line_naming_its_file_and_field(folders, tmp_path, file,
                                                                       change, where, says):
    folder = broken_copy(folders, tmp_path, file, change)
    problems = validate_run_folder(folder)
    assert problems, f"{file} broken, yet it validates"
    assert all("\n" not in line for line in problems), problems
    assert problems[0].startswith(f"{folder}/{where}") and says in problems[0], problems
    # the other files are not blamed
    assert all(f"{folder}/{file}" in line for line in problems), problems


@pytest.mark.invalid_records
def test_without_jsonschema_the_records_are_read_as_their_dataclasses(folders, tmp_path,
                                                                      monkeypatch):
    """jsonschema is the dev extra's: without it, validate_run_folder reads each record with
    its from_json (the same fields and types), one line naming the file and the field."""
    assert validate_run_folder(folders["faults"]) == []
    folder = broken_copy(folders, tmp_path, "summary.json", changed(num_nodes="two"))
    monkeypatch.setitem(sys.modules, "jsonschema", None)  # (import jsonschema: ImportError)
    (problem,) = validate_run_folder(folder)
    assert problem.startswith(f"{folder / 'summary.json'}: field 'num_nodes'"), problem
    assert validate_run_folder(folders["failed"]) == []


def test_a_folder_without_a_summary_is_not_a_run_folder(tmp_path):
    assert validate_run_folder(tmp_path) == [f"{tmp_path}: not a run folder (no summary.json)."]


@pytest.mark.invalid_records
def test_the_suites_check_fails_on_a_broken_run_folder_and_passes_a_sound_one(folders, tmp_path):
    sound = tmp_path / "sound"
    shutil.copytree(folders["faults"], sound / "a-run")
    check_run_folders([sound])  # (passes)
    folder = broken_copy(folders, tmp_path / "broken", "summary.json", changed(num_nodes="two"))
    with pytest.raises(pytest.fail.Exception) as failed:
        check_run_folders([tmp_path])
    assert f"{folder / 'summary.json'}: field 'num_nodes'" in str(failed.value)


INNER_CONFTEST = """
import importlib.util
import sys

spec = importlib.util.spec_from_file_location("exoframe_tests_conftest", {conftest!r})
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)
pytest_configure = module.pytest_configure
pytest_runtest_setup = module.pytest_runtest_setup
pytest_runtest_call = module.pytest_runtest_call
"""

INNER_TESTS = """
import json
import shutil

import pytest

SOURCE = {source!r}


def write(folder, broken):
    shutil.copytree(SOURCE, folder)
    summary = json.loads((folder / "summary.json").read_text())
    if broken:
        summary["num_nodes"] = "two"
    (folder / "summary.json").write_text(json.dumps(summary))


def test_leaves_a_broken_run_folder(tmp_path):
    write(tmp_path / "out" / "run", broken=True)


@pytest.mark.invalid_records
def test_leaves_one_on_purpose(tmp_path):
    write(tmp_path / "run", broken=True)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shared") / "run"
    write(folder, broken=True)
    return folder


def test_uses_a_fixture_that_made_a_broken_one(shared):
    pass


def test_leaves_a_sound_one(tmp_path):
    write(tmp_path / "run", broken=False)
"""


@pytest.mark.invalid_records  # (the inner session's folders are under tmp_path)
def test_the_suites_check_fails_a_test_that_leaves_a_broken_run_folder(folders, tmp_path):
    """tests/conftest.py's hooks in a session of their own: a test that leaves a broken run
    folder in its tmp_path, or uses a fixture that wrote one with tmp_path_factory, fails
    naming the file and field; one marked invalid_records and one leaving a sound folder
    pass."""
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "conftest.py").write_text(INNER_CONFTEST.format(
        conftest=str(REPO / "tests" / "conftest.py")))
    (inner / "test_inner.py").write_text(INNER_TESTS.format(source=str(folders["ddp"])))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp",
         str(tmp_path / "base"), "test_inner.py"], cwd=inner, capture_output=True, text=True,
        env={**os.environ, "EXOFRAME_TEST_CHECK_RECORDS": "1"})
    out = done.stdout + done.stderr
    assert done.returncode == 1 and "2 failed, 2 passed" in out, out
    assert "FAILED test_inner.py::test_leaves_a_broken_run_folder" in out, out
    assert "FAILED test_inner.py::test_uses_a_fixture_that_made_a_broken_one" in out, out
    assert "summary.json: field 'num_nodes': 'two' is not of type 'integer'" in out, out
