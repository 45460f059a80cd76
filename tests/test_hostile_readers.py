"""Hostile input to the readers (issue 61): every file a command reads goes through the
strict readers of exoframe/inputs.py, and each refuses the same bombs in one line naming
the file: nested YAML aliases (a "billion laughs"), nesting 600 deep, a file over the size
limit (sparse: it costs no disk). Then the clear lines of issue 61 item 8.
"""
import json
import os

import pytest

from exoframe import inputs
from exoframe.config import resolve_config
from exoframe.experiments.trace_events import timeline
from exoframe.errors import ExoframeError
from exoframe.report import strict_json
from exoframe.report.groups import read_config
from exoframe.sim.network.netconfig import load_file

# Nine levels of ten: a few hundred bytes that expand to 10^9 strings. Each reader must
# refuse it before expanding anything.
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n"
    for i in range(8))
DEEP = "[" * 600 + "]" * 600  # YAML and JSON alike
DEEP_MAPPING = '{"a": ' * 600 + "1" + "}" * 600


def _write(path, bomb):
    if bomb == "oversized":
        with open(path, "wb") as f:  # sparse: over the limit without the disk it names
            f.truncate(max(inputs.YAML_LIMIT, inputs.JSON_LIMIT) + 1)
    else:
        path.write_text({"aliases": ALIAS_BOMB, "deep": DEEP, "deep-mapping": DEEP_MAPPING}[bomb])
    return path


def _run_folder(folder, **files):
    """A run folder as `exoframe run` leaves it (what report and timeline read), with
    `files` in place of the run's own."""
    folder.mkdir(parents=True, exist_ok=True)
    made = {"summary.json": json.dumps({
        "strategy": "ddp", "seed": 0, "final_loss": 1.0, "final_val_loss": None, "net": "ideal",
        "simulated_seconds": 1.0, "compute_utilization": 1.0, "bytes_sent_per_node": 0}),
        "metrics.jsonl": json.dumps({"step": 1, "loss": 1.0, "sim_time": 1.0}) + "\n",
        "config.yaml": "strategy: ddp\nseed: 0\n"}
    for name, text in {**made, **files}.items():
        (folder / name).write_text(text)
    return folder


# Each reader: (the file it reads, how a command calls it on that file).
READERS = {
    "config file": ("config.yaml", lambda path: resolve_config(path)),
    "network file": ("net.yaml", lambda path: load_file(path, "net")),
    "run's config.yaml (report)": ("config.yaml", lambda path: read_config(path.parent)),
    "summary.json": ("summary.json", lambda path: strict_json.load(path, "summary")),
    "launcher.json": ("launcher.json", lambda path: strict_json.load(path, "checkpoint")),
    "metrics.jsonl": ("metrics.jsonl", lambda path: strict_json.load_lines(path, "metrics")),
    "trace.json (timeline)": ("trace.json", lambda path: timeline(path.parent)),
    "config.json (hf-lm)": ("config.json", lambda path: inputs.load_json(path, "config")),
}


@pytest.mark.parametrize("bomb", ["aliases", "deep", "deep-mapping", "oversized"])
@pytest.mark.parametrize("reader", READERS)
def test_every_reader_refuses_each_bomb_in_one_line(tmp_path, reader, bomb):
    name, read = READERS[reader]
    path = _write(tmp_path / name, bomb)
    with pytest.raises(ExoframeError) as refused:
        read(path)
    message = str(refused.value)
    assert "\n" not in message and str(path) in message, message
    if bomb == "aliases" and name.endswith(".yaml"):
        assert "aliases" in message, message
    if bomb.startswith("deep"):
        assert "nested deeper" in message, message
    if bomb == "oversized":
        assert "MiB" in message, message


def test_report_refuses_an_alias_bomb_in_a_runs_config_yaml(tmp_path, capsys):
    """`exoframe report` read a run's config.yaml with yaml.safe_load: aliases expanded
    without limit (6 GB in 78 s)."""
    from exoframe.cli import main

    run = _run_folder(tmp_path / "runs" / "r1", **{"config.yaml": ALIAS_BOMB})
    with pytest.raises(SystemExit) as exit_info:
        main(["report", str(run), "--out", str(tmp_path / "report"),
              "--no-plots"])
    err = capsys.readouterr().err
    assert exit_info.value.code != 0
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert str(run / "config.yaml") in err and "aliases" in err, err
    assert not (tmp_path / "report").exists()


def test_a_config_file_nested_600_deep_is_one_line_naming_it(tmp_path, capsys):
    """Was "unexpected RecursionError" (exit 1)."""
    from conftest import one_line_error

    path = tmp_path / "deep.yaml"
    path.write_text("workload_params:\n  x: " + DEEP + "\n")
    err = one_line_error(capsys, "run", "--config", path, "--steps", "2")
    assert str(path) in err and "nested deeper" in err, err
    assert "RecursionError" not in err


def test_a_value_nested_deep_on_the_command_line_is_refused_not_a_crash(capsys):
    from conftest import one_line_error

    err = one_line_error(capsys, "run", "--workload", "mlp", "-w", f"hidden={DEEP}",
                         "--steps", "2")
    assert "RecursionError" not in err and "hidden" in err, err


def test_a_fifo_is_read_no_further_than_the_limit(tmp_path, monkeypatch):
    """A file whose size the file system does not know (a FIFO, /dev/zero) is refused once
    the limit has come, not read to the end."""
    monkeypatch.setattr(inputs, "YAML_LIMIT", 1 << 16)
    with pytest.raises(ExoframeError, match="larger than"):
        inputs.read_yaml("/dev/zero", "config file")


def test_strict_readers_still_read_what_exoframe_writes(tmp_path):
    run = _run_folder(tmp_path / "r1")
    assert read_config(run) == {"strategy": "ddp"}
    assert strict_json.load_lines(run / "metrics.jsonl", "metrics")[0]["step"] == 1
    nested = {"a": [{"b": [[1.0]]}]}
    (run / "x.json").write_text(json.dumps(nested))
    assert strict_json.load(run / "x.json") == nested
    assert os.path.getsize(run / "x.json") < inputs.JSON_LIMIT


@pytest.mark.invalid_records  # (it writes wrong-typed summaries on purpose)
@pytest.mark.parametrize("field,value", [
    ("simulated_seconds", "fast"), ("final_loss", [1]), ("strategy", 3), ("failures", 0),
    ("seed", 1.5),
    # (a second battery: these read as nothing at all, before every field the record
    # declares was checked as it declares it)
    ("steps", "four"), ("per_rank", "x"), ("strategy_params", [1]), ("validation", "v"),
    ("net_defaults", 5), ("stopped_by", 7), ("time_to_target", "x"),
    ("bytes_sent_per_rank", "x"), ("traffic_by_kind_rank0", [1]), ("schema_version", "1")])
def test_report_names_the_file_and_the_field_of_a_wrong_typed_summary(tmp_path, capsys, field,
                                                                       value):
    """Was "unexpected TypeError", naming neither."""
    from exoframe.cli import main

    summary = {"strategy": "ddp", "seed": 0, "final_loss": 1.0, "final_val_loss": None,
               "net": "ideal", "simulated_seconds": 1.0, "compute_utilization": 1.0,
               "bytes_sent_per_node": 0, "failures": [], field: value}
    run = _run_folder(tmp_path / "r1", **{"summary.json": json.dumps(summary)})
    with pytest.raises(SystemExit) as exit_info:
        main(["report", str(run), "--out", str(tmp_path / "report"), "--no-plots"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    assert str(run / "summary.json") in err and f"'{field}'" in err, err
    assert not (tmp_path / "report").exists()
