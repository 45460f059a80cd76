"""exoframe-tensorboard: registered by its package; a run's event files, read back with
TensorBoard's own reader, hold every metric of metrics.jsonl, the config and the status."""
import json
import subprocess
import sys
import threading

import numpy as np
import pytest
import yaml
from tensorboard.backend.event_processing import event_accumulator as ea
from tensorboard.plugins.hparams import api_pb2, metadata
from tensorboard.util import tensor_util

import exoframe
from exoframe.plugins import PluginManager
from exoframe.sinks import RunInfo
from exoframe_tensorboard import TensorBoardSink, flatten


def read_events(folder):
    """TensorBoard's reader over one run's folder: (accumulator, hparams, session status)."""
    acc = ea.EventAccumulator(str(folder), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    content = acc.PluginTagToContent("hparams")
    start = metadata.parse_session_start_info_plugin_data(
        content[metadata.SESSION_START_INFO_TAG])
    end = metadata.parse_session_end_info_plugin_data(content[metadata.SESSION_END_INFO_TAG])
    hparams = {name: getattr(value, value.WhichOneof("kind"))
               for name, value in start.hparams.items()}
    return acc, hparams, end.status


def f32(value):
    """What a TensorBoard scalar (a float32) holds for value."""
    return float(np.float32(value))


def exoframe_run(out, *args):
    return subprocess.run(
        [sys.executable, "-m", "exoframe", "run", "--workload", "mlp", "--steps", "6",
         "--nodes", "2", "--eval-every", "3", "--out", str(out), *args],
        capture_output=True, text=True, timeout=120)


def test_sink_is_registered_by_its_package():
    entry = PluginManager().sinks.get("tensorboard")
    assert entry.source == "exoframe-tensorboard"
    assert entry.obj is TensorBoardSink


def test_a_run_writes_its_metrics_config_and_status(tmp_path):
    run = exoframe_run(tmp_path, "--sink", "jsonl",
                       "--sink", "tensorboard:logdir=tb,flush_secs=1")
    assert run.returncode == 0, run.stderr
    (folder,) = tmp_path.iterdir()
    logdir = folder / "tb"  # the run folder holds one run: no folder of its name inside
    assert [p.name.startswith("events.out.tfevents.") for p in logdir.iterdir()] == [True]
    acc, hparams, status = read_events(logdir)

    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    expected = {(row["step"], name, f32(value)) for row in rows
                for name, value in row.items() if name != "step" and value is not None}
    metric_tags = [tag for tag in acc.Tags()["scalars"] if not tag.startswith("summary/")]
    stored = {(e.step, tag, e.value) for tag in metric_tags for e in acc.Scalars(tag)}
    assert stored == expected
    assert {"loss", "val_loss", "sim_time"} <= set(metric_tags)

    # Wall time is the start plus simulated time: its steps are the sim_time steps.
    sim_time = {row["step"]: row["sim_time"] for row in rows}
    losses = acc.Scalars("loss")
    for e in losses:
        assert e.wall_time - losses[0].wall_time == pytest.approx(
            sim_time[e.step] - sim_time[losses[0].step], abs=1e-6)

    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "completed"
    numbers = {name: value for name, value in summary.items()
               if type(value) in (int, float)}
    assert {"final_loss", "simulated_seconds"} <= set(numbers)
    for name, value in numbers.items():
        (event,) = acc.Scalars(f"summary/{name}")
        assert (event.step, event.value) == (6, f32(value))
    (text,) = acc.Tensors("summary/text_summary")
    assert json.loads(tensor_util.make_ndarray(text.tensor_proto).item()) == summary

    config = yaml.safe_load((folder / "config.yaml").read_text())
    assert hparams["status"] == "completed"
    assert status == api_pb2.STATUS_SUCCESS
    for name, value in config.items():
        if isinstance(value, list):
            assert json.loads(hparams[name]) == value
        elif value is None or value == {}:
            assert not any(key.split(".")[0] == name for key in hparams)
        else:
            assert hparams[name] == value, name
    assert set(hparams) == {name for name, value in config.items()
                            if value is not None and value != {}} | {"status"}
    assert (hparams["workload"], hparams["nodes"], hparams["eval_every"]) == ("mlp", 2, 3)


@pytest.mark.parametrize("value", ["soon", "-1"])
def test_a_bad_flush_secs_is_one_line_naming_it(tmp_path, value):
    run = exoframe_run(tmp_path, "--sink", f"tensorboard:flush_secs={value}")
    assert run.returncode != 0
    assert "Traceback" not in run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert "flush_secs" in line and value in line
    assert not list(tmp_path.rglob("events.out.tfevents.*"))


def make_run(folder, name, config):
    return RunInfo(dir=folder, name=name, strategy="ddp", workload="mlp", nodes=2, steps=2,
                   seed=0, net="ideal", config=config)


def test_runs_share_an_absolute_logdir_and_a_failure_is_recorded(tmp_path):
    shared = tmp_path / "shared"
    threads = set(threading.enumerate())
    config = {"lr": 0.1, "clip_grad_norm": None, "workload_params": {"hidden": 32, "act": "relu"},
              "sinks": [{"tensorboard": {"logdir": str(shared)}}]}
    for name, status in (("a", "completed"), ("b", "failed")):
        sink = TensorBoardSink(make_run(tmp_path / name, name, config), logdir=str(shared),
                               flush_secs=0.5)
        sink.write({"step": 1, "loss": 2.5, "val_loss": None, "sim_time": 1.0})
        sink.write({"step": 2, "loss": 2.0, "val_loss": 2.25, "sim_time": 4.0})
        sink.finish({"status": status, "final_loss": 2.0})
        sink.close()
    assert set(threading.enumerate()) == threads  # close() stopped the writer's thread
    assert sorted(p.name for p in shared.iterdir()) == ["a", "b"]
    assert not (tmp_path / "a").exists()

    for name, status, session in (("a", "completed", api_pb2.STATUS_SUCCESS),
                                  ("b", "failed", api_pb2.STATUS_FAILURE)):
        acc, hparams, end = read_events(shared / name)
        assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(1, 2.5), (2, 2.0)]
        assert [(e.step, e.value) for e in acc.Scalars("val_loss")] == [(2, 2.25)]
        assert [e.wall_time - acc.Scalars("loss")[0].wall_time
                for e in acc.Scalars("loss")] == pytest.approx([0.0, 3.0], abs=1e-6)
        assert [(e.step, e.value) for e in acc.Scalars("summary/final_loss")] == [(2, 2.0)]
        assert hparams == {"lr": 0.1, "workload_params.hidden": 32,
                           "workload_params.act": "relu",
                           "sinks": json.dumps(config["sinks"]), "status": status}
        assert end == session


def test_flatten_joins_nested_keys_and_leaves_out_none():
    assert flatten({"a": {"b": {"c": 1}, "d": [1, "x"]}, "e": None, "f": True, "g": {}}) == {
        "a.b.c": 1, "a.d": '[1, "x"]', "f": True}


@pytest.mark.parametrize("value", ["0", "-2", "ten", "nan", "inf", True, None, [1]])
def test_flush_secs_must_be_a_positive_number(tmp_path, value):
    with pytest.raises(exoframe.ExoframeError, match="flush_secs must be a positive number"):
        TensorBoardSink(make_run(tmp_path, "run", {}), flush_secs=value)
    assert not (tmp_path / "tensorboard").exists()


def test_a_run_without_rows_writes_nothing_until_it_finishes(tmp_path):
    sink = TensorBoardSink(make_run(tmp_path, "run", {}), flush_secs="2.5")
    sink.close()
    assert list((tmp_path / "tensorboard").iterdir()) == []
