"""Nothing a run recorded is lost: a run folder is written by one process at a time, a
resume changes nothing until it can resume, and a full disk leaves whole files and a
checkpoint to go on from (real processes, a real lock, a real full tmpfs)."""
import csv
import io
import json
import os
import pickle
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from exoframe.cli import cli as exoframe_cli

from exoframe.engine.plan.cluster_env import ClusterEnv
from exoframe.engine.records.checkpoint import CheckpointFolder
from exoframe.experiments.run_replays import load_trace
from exoframe.engine.ipc.processes import RankFailed
from exoframe.errors import ExoframeError, RunInterrupted, RunStopped
from exoframe.sinks import CsvSink, JsonlSink, RunInfo

from conftest import HANG_GUARD, HANGING_WORKLOAD, metric_lines, one_line_error, only_run, wait_for

SMALL = ["--workload", "mlp", "--nodes", "2", "--compute", "fixed:10ms", "--no-progress"]
RECORDS = ("config.yaml", "metrics.jsonl", "metrics.csv", "summary.json")


def steps_of(run) -> list[int]:
    return [json.loads(line)["step"] for line in metric_lines(run)]


def records(run) -> dict:
    return {name: (run / name).read_bytes() for name in RECORDS}


def with_hanging_workload(cli):
    (cli.cwd / "hanging.py").write_text(HANGING_WORKLOAD)
    return ["--workload", "hanging:workload", "--nodes", "2", "--compute", "fixed:10ms",
            "--no-progress"]


def test_a_resume_on_a_live_run_is_refused_and_the_run_keeps_every_row(cli):
    args = with_hanging_workload(cli)
    gate = cli.cwd / "gate"  # the run waits at its step 7 while this file exists
    gate.touch()
    proc = cli.popen("run", *args, "--steps", "400", "--checkpoint-every", "5", "--out", "runs",
                     env={"EXOFRAME_TEST_GATE": str(gate), "EXOFRAME_TEST_GATE_AFTER": "6"})
    try:
        wait_for(lambda: any((cli.cwd / "runs").glob("*/checkpoints/step-*")), "a checkpoint")
        run = only_run(cli.cwd / "runs")
        resume = cli("resume", run)
        assert resume.returncode == 2, resume.stderr_text
        assert resume.stderr_text.count("\n") == 1 and "in use by process" in resume.stderr_text
        assert str(proc.pid) in resume.stderr_text  # it names who holds the folder
    finally:
        gate.unlink()
    _, err = proc.communicate(timeout=HANG_GUARD)
    assert proc.returncode == 0, err
    assert steps_of(run) == list(range(1, 401))
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
    assert not (run / ".lock").exists()


def stopped_at_step_20(cli) -> Path:
    """A 40-step run killed outright after its checkpoint at step 20 (rows 1..24 written)."""
    args = with_hanging_workload(cli)
    cut = cli.popen("run", *args, "--steps", "40", "--checkpoint-every", "10", "--sink",
                    "jsonl,csv", "--out", "runs", env={"EXOFRAME_TEST_HANG_AFTER": "25"})
    run_dir = cli.cwd / "runs"
    wait_for(lambda: any(run_dir.glob("*/checkpoints/step-20")) and
             len(metric_lines(only_run(run_dir))) >= 24, "the checkpoint at step 20")
    cut.kill()
    cut.communicate(timeout=HANG_GUARD)
    wait_for(lambda: not cli.leftovers(), "the ranks to die with the launcher")
    return only_run(run_dir)


def test_a_resume_stopped_before_its_first_step_changes_nothing(cli):
    """Held at its first step, a resume has replaced no record; stopped there, it leaves
    them byte for byte; the next resume goes on and replaces them."""
    run = stopped_at_step_20(cli)
    before = records(run)
    gate = cli.cwd / "gate"
    gate.touch()
    held = cli.popen("resume", run, env={"EXOFRAME_TEST_GATE": str(gate)})
    try:
        wait_for(lambda: (run / ".lock").exists(), "the resume to hold the folder")
        wait_for(lambda: len(cli.leftovers()) >= 3, "the resume's ranks")
        assert records(run) == before
        # The first Ctrl-C asks for a checkpoint no rank can reach; a second one stops at
        # once (signals sent back to back can arrive as one: sent until it stops).
        deadline = time.monotonic() + HANG_GUARD
        while held.poll() is None and time.monotonic() < deadline:
            held.send_signal(signal.SIGINT)
            time.sleep(2.0)
        _, err = held.communicate(timeout=HANG_GUARD)
    finally:
        gate.unlink()
    # (a Ctrl-C that comes while the interpreter exits ends it by the signal)
    assert held.returncode in (130, -signal.SIGINT) and "interrupted" in err, err
    assert records(run) == before
    wait_for(lambda: not cli.leftovers(), "the ranks to stop with the launcher")

    resumed = cli("resume", run)
    assert resumed.returncode == 0, resumed.stderr_text
    assert steps_of(run) == list(range(1, 41))
    assert yaml.safe_load((run / "config.yaml").read_text())["steps"] == 40
    assert json.loads((run / "summary.json").read_text())["resumed_from_step"] == 20


def test_a_refused_process_waits_for_the_holder_to_write_its_name(tmp_path):
    """A holder that has taken the lock but not yet written its name (the gap a loaded
    machine widens) is still named in the refusal; one that never writes it is "another
    process"."""
    import fcntl
    import threading

    from exoframe.engine.records.run_lock import LOCK_FILE, RunLock

    fd = os.open(tmp_path / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(ExoframeError, match=r"in use by another process; "):
            RunLock.take(tmp_path)
        name = {"pid": 4242, "host": "h", "command": "exoframe run", "since": "then"}
        late = threading.Timer(0.1, os.pwrite, (fd, json.dumps(name).encode(), 0))
        late.start()
        with pytest.raises(ExoframeError, match=r"in use by process 4242 on h \('exoframe run'"):
            RunLock.take(tmp_path)
        late.join()
    finally:
        os.close(fd)


def test_two_resumes_started_together_one_goes_on_and_the_folder_keeps_every_row(cli):
    run = stopped_at_step_20(cli)
    gate = cli.cwd / "gate"  # the resume that goes on waits at its first step meanwhile
    gate.touch()
    resumes = [cli.popen("resume", run, env={"EXOFRAME_TEST_GATE": str(gate)})
               for _ in range(2)]
    try:
        wait_for(lambda: any(p.poll() is not None for p in resumes), "one resume to be refused")
    finally:
        gate.unlink()
    outcomes = []
    for p in resumes:
        _, err = p.communicate(timeout=HANG_GUARD)
        outcomes.append((p.returncode, err))
    outcomes.sort()
    (done, _), (refused, err) = outcomes
    assert (done, refused) == (0, 2), outcomes
    assert err.count("\n") == 1 and "in use by process" in err
    assert steps_of(run) == list(range(1, 41))
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["status"], summary["resumed_from_step"]) == ("completed", 20)


@pytest.fixture(scope="module")
def stopped_runs(tmp_path_factory):
    """Two runs of 8 steps with a checkpoint at 8: hidden=128, and the same with hidden=32."""
    out = tmp_path_factory.mktemp("runs")
    folders = {}
    for hidden in (128, 32):
        result = CliRunner().invoke(exoframe_cli, [
            "run", *SMALL, "--steps", "8", "--checkpoint-every", "4", "-w", f"hidden={hidden}",
            "--sink", "jsonl", "--sink", "csv", "--out", str(out / str(hidden))])
        assert result.exit_code == 0, result.output
        folders[hidden] = only_run(out / str(hidden))
    return folders


def _missing_rank_file(run, foreign):
    (run / "checkpoints" / "step-8" / "rank-1.pt").unlink()
    return "checkpoint file .*rank-1.pt is missing"


def _corrupt_rank_file(run, foreign):
    path = run / "checkpoints" / "step-8" / "rank-0.pt"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte inside the tensors
    path.write_bytes(bytes(data))
    return "checkpoint file .*rank-0.pt is corrupt"


def _optimizer_edited(run, foreign):
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["optimizer"] == "adamw"
    config["optimizer"] = "sgd"
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return "optimizer is 'sgd' now but was 'adamw'"


def _foreign_checkpoint(run, foreign):
    shutil.rmtree(run / "checkpoints")
    shutil.copytree(foreign / "checkpoints", run / "checkpoints")
    return "workload_params is {.*hidden=128.*} now but was {.*hidden=32.*}"


@pytest.mark.parametrize("damage", [_missing_rank_file, _corrupt_rank_file, _optimizer_edited,
                                    _foreign_checkpoint])
def test_a_failed_resume_is_one_line_and_changes_no_record(tmp_path, capsys, stopped_runs,
                                                          damage):
    run = tmp_path / "run"
    shutil.copytree(stopped_runs[128], run)
    expected = damage(run, stopped_runs[32])
    before = records(run)
    err = one_line_error(capsys, "resume", run, "--steps", "12")
    assert re.search(expected, err), err
    assert "Traceback" not in err
    assert records(run) == before  # byte for byte
    assert not any((run / "checkpoints").glob(".partial-*"))


def test_a_resume_replaces_the_records_at_its_first_step(tmp_path, stopped_runs):
    run = tmp_path / "run"
    shutil.copytree(stopped_runs[128], run)
    result = CliRunner().invoke(exoframe_cli, ["resume", str(run), "--steps", "12"])
    assert result.exit_code == 0, result.output
    assert steps_of(run) == list(range(1, 13))
    with open(run / "metrics.csv", newline="") as f:
        assert [int(row["step"]) for row in csv.DictReader(f)] == list(range(1, 13))
    assert yaml.safe_load((run / "config.yaml").read_text())["steps"] == 12


@pytest.fixture
def tmpfs(tmp_path):
    """A small tmpfs of our own (root only), unmounted at the end: `mount(size)` mounts or
    resizes it."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = []

    def mount(size: int):
        options = f"size={size}" if not mounted else f"remount,size={size}"
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(disk)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(size)
        return disk

    yield mount
    if mounted:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def test_a_full_disk_during_a_checkpoint_is_one_line_and_the_previous_checkpoint_resumes(
        cli, tmpfs):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    args = [*SMALL, "-w", "hidden=256", "--sink", "jsonl", "--sink", "csv"]
    sized = cli("run", *args, "--steps", "4", "--checkpoint-every", "4", "--out", "sizing")
    assert sized.returncode == 0, sized.stderr_text
    checkpoint = folder_bytes(only_run(cli.cwd / "sizing") / "checkpoints")
    # One checkpoint fits with its run's files; a second, built beside it, does not.
    disk = tmpfs(int(checkpoint * 1.5) + 256 * 1024)
    proc = cli("run", *args, "--steps", "12", "--checkpoint-every", "4", "--out",
               disk / "runs")
    assert proc.returncode == 2, proc.stderr_text
    err = proc.stderr_text
    assert err.count("\n") == 1 and "no space left on device" in err.lower(), err
    assert ".partial-step-8/rank-" in err and "could not be written" in err
    assert "Free some space" in err and "exoframe resume" in err
    run = only_run(disk / "runs")
    assert not any((run / "checkpoints").glob(".partial-*"))
    assert CheckpointFolder(run).latest().step == 4
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and "no space left on device" in summary["error"].lower()

    tmpfs(64 * 1024 * 1024)  # space freed
    resumed = cli("resume", run)
    assert resumed.returncode == 0, resumed.stderr_text
    assert steps_of(run) == list(range(1, 13))
    with open(run / "metrics.csv", newline="") as f:
        assert [int(row["step"]) for row in csv.DictReader(f)] == list(range(1, 13))
    assert not cli.leftovers()


ROW = {"step": 1, "loss": 2.302585092994046, "lr": 0.001, "bytes_sent": 123456,
       "sim_time": 0.123456789, "samples": 64, "val_loss": 2.0}


@pytest.mark.parametrize("sink", [CsvSink, JsonlSink])
def test_a_full_disk_leaves_no_half_row_in_20_runs(tmpfs, sink):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmpfs(64 * 1024)
    for run_number in range(20):
        for entry in disk.iterdir():
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        # A filler leaves one or two pages; rows of another length each run end the room
        # at another place in a row, past the header's first write (appends from then on).
        free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
        (disk / "filler").write_bytes(b"\0" * (free - 4096 * (1 + run_number % 2)))
        run = disk / "run"
        run.mkdir()
        opened = sink(RunInfo(dir=run, name="run", strategy="ddp", workload="mlp", nodes=2,
                              steps=1000, seed=0, net="ideal"))
        written = 0
        with pytest.raises(OSError):
            for step in range(1, 1000):
                opened.write({**ROW, "step": step, "bytes_sent": 7 ** (run_number + step % 5)})
                written = step
        opened.close()
        text = (run / opened.path.name).read_text()
        assert written > 10 and text.endswith("\n")
        if sink is CsvSink:
            rows = list(csv.DictReader(io.StringIO(text)))
            assert all(None not in row.values() and len(row) == len(ROW) for row in rows)
        else:
            rows = [json.loads(line) for line in text.splitlines()]
        assert [int(row["step"]) for row in rows] == list(range(1, written + 1)), run_number


def test_a_sink_named_twice_is_refused_before_any_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = one_line_error(capsys, "run", *SMALL, "--steps", "2", "--sink", "jsonl", "--sink",
                         "jsonl", "--out", "runs")
    assert "sinks: 'jsonl' is named twice with the same options" in err
    assert not (tmp_path / "runs").exists()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_a_dead_ray_address_is_one_line_naming_it(cli, scheme):
    pytest.importorskip("ray")
    address = f"{scheme}127.0.0.1:{free_port()}"
    proc = cli("sweep", "--executor", "ray", "--ray-address", address, "--connect-timeout", "5",
               "--strategy", "ddp", "--net", "ideal", "--workload", "mlp", "--steps", "2",
               "--no-plots", "--no-progress", timeout=HANG_GUARD)
    assert proc.returncode == 2, proc.stderr_text
    assert proc.stderr_text.count("\n") == 1 and address in proc.stderr_text
    assert not (cli.cwd / "sweeps").exists() or not any((cli.cwd / "sweeps").iterdir())


@pytest.mark.parametrize("name, expected", [
    ("ddp", "a strategy 'ddp' is installed already"),
    ("demo", "a strategy 'demo' is installed already"),  # a plugin's (exoframe-demo)
    ("wandb", "the package exoframe-wandb"),  # a plugin that registers no strategy
])
def test_new_plugin_refuses_an_installed_name(tmp_path, capsys, name, expected):
    import importlib.metadata

    if name != "ddp":
        try:
            importlib.metadata.version(f"exoframe-{name}")
        except importlib.metadata.PackageNotFoundError:
            pytest.skip(f"exoframe-{name} is not installed")
    err = one_line_error(capsys, "new-plugin", name, "--dir", tmp_path)
    assert expected in err
    assert not any(tmp_path.iterdir())


def test_a_short_token_is_refused(monkeypatch):
    from exoframe.config import RunConfig

    env = ClusterEnv(0, 2, 0, "127.0.0.1", 29500, "none", 0, False, 2)
    monkeypatch.setenv("EXOFRAME_TOKEN", "x" * 15)
    with pytest.raises(ExoframeError, match="EXOFRAME_TOKEN: 15 characters is too short"):
        env.check_config(RunConfig())
    monkeypatch.setenv("EXOFRAME_TOKEN", "x" * 16)
    env.check_config(RunConfig())


def test_a_network_too_slow_for_a_year_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("crawl.yaml").write_text("bandwidth: 1e-300bit\nlatency: 1ms\n")
    err = one_line_error(capsys, "run", *SMALL, "--net", "crawl.yaml", "--out", "runs")
    assert "moves less than a byte a year" in err and not Path("runs").exists()
    # Slow but not absurd: a year is out of reach from the first step on (ddp moves the
    # model, 4 × 22,026 bytes, twice per step through 10 bit/s: ~1.4e5 s a step).
    Path("slow.yaml").write_text("bandwidth: 10bit\nlatency: 1ms\n")
    err = one_line_error(capsys, "run", *SMALL, "--steps", "1000", "--net", "slow.yaml",
                         "--out", "runs")
    assert "over a year" in err and "years" in err


def test_a_second_stop_signal_names_the_checkpoint_to_resume(cli):
    args = with_hanging_workload(cli)
    proc = cli.popen("run", *args, "--steps", "400", "--checkpoint-every", "2", "--out", "runs",
                     env={"EXOFRAME_TEST_SLOW": "0.05"})
    wait_for(lambda: any((cli.cwd / "runs").glob("*/checkpoints/step-*")), "a checkpoint")
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=HANG_GUARD)
    assert proc.returncode == 130, err
    run = only_run(cli.cwd / "runs")
    step = CheckpointFolder(run).latest().step
    assert f"checkpoint at step {step}" in err and "exoframe resume" in err, err
    wait_for(lambda: not cli.leftovers(), "the ranks to stop with the launcher")


def test_replaying_a_failed_run_says_it_failed(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps(
        {"status": "failed", "steps_completed": 3, "error": "rank 1: boom"}))
    with pytest.raises(ExoframeError, match="the run failed after 3 steps .rank 1: boom."):
        load_trace(tmp_path)


NOT_SCALAR = '''
import dataclasses
from exoframe.workloads.mlp import mlp


class Vector(__import__("torch").nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, batch):
        return self.inner(batch).expand(3)


def workload(**params):
    inner = mlp(**params)
    return dataclasses.replace(inner, build_model=lambda: Vector(inner.build_model()))
'''


@pytest.mark.parametrize("args, expected", [
    (["--workload", "vector:workload"], "scalar"),
    (["--workload", "mlp", "-w", "train_examples=3", "--nodes", "4"], "node"),
])
def test_bad_models_and_data_are_refused_before_any_run_folder(tmp_path, capsys, monkeypatch,
                                                               args, expected):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = f"vector_{uuid.uuid4().hex[:8]}"
    Path(f"{module}.py").write_text(NOT_SCALAR)
    args = [a.replace("vector:", f"{module}:") for a in args]
    err = one_line_error(capsys, "run", "--nodes", "2", "--compute", "fixed:10ms", "--steps", "2",
                         *args, "--out", "runs")
    assert expected in err
    assert not Path("runs").exists()


def test_a_stopped_run_is_an_error_that_declares_its_fields_and_pickles_whole():
    """A run's errors are made with their fields (exoframe/errors.py), and come back whole
    from another process (a sweep's run on Ray)."""
    cause = RankFailed(2, "boom", details="its traceback", user_error=False, host="b")
    stopped = RunStopped.of(cause, "failed", [{"step": 1}])
    for error in (stopped, pickle.loads(pickle.dumps(stopped))):
        assert (str(error), error.status, error.rows, error.details, error.user_error) == \
            ("rank 2 on b: boom", "failed", [{"step": 1}], "its traceback", False)
        assert not error.interrupted and not error.names_checkpoint
    again = pickle.loads(pickle.dumps(cause))
    assert (str(again), again.who, again.details, again.user_error) == \
        ("rank 2 on b: boom", 2, "its traceback", False)
    interrupted = RunStopped.of(RunInterrupted("interrupted.", names_checkpoint=True),
                                "interrupted", [])
    assert interrupted.interrupted and interrupted.names_checkpoint and interrupted.user_error
