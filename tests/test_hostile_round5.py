"""Hostile round 5 (issue 61), beyond the readers (test_hostile_readers.py): valid seeds in
every mode, and the clear lines that were missing."""
import json

import pytest
from conftest import HANG_GUARD, only_run

TOP_SEED = 2 ** 63 - 1  # the largest valid seed (config.py: [0, 2^63))
TINY = ["--workload", "mlp", "--steps", "2", "--compute", "fixed:10ms"]


@pytest.mark.parametrize("mode", [
    ["--nodes", "2"],                                                   # forked ranks
    ["--nodes", "2", "--in-process"],
    ["--nodes", "4", "--nodes-per-process", "2", "--stack-replicas"],  # stacked
], ids=["forked", "in-process", "stacked"])
def test_the_largest_valid_seed_runs_in_every_mode(cli, tmp_path, mode):
    """Seeds from about 1.8e13 (stacked: 1.85e7) overflowed the generator's seed in a rank:
    `ValueError: Overflow when unpacking long long`."""
    proc = cli("run", *TINY, "--strategy", "diloco", "-p", "H=1", "--seed", TOP_SEED, *mode,
               "--out", tmp_path / "runs", timeout=HANG_GUARD)
    assert proc.returncode == 0, proc.stderr_text
    summary = json.loads((only_run(tmp_path / "runs") / "summary.json").read_text())
    assert summary["seed"] == TOP_SEED


def test_derived_seeds_keep_earlier_streams_and_fit_a_generator():
    from exoframe.strategies.seeds import derive

    assert derive(7, 3) == 7 * 1_000_003 + 3  # the streams of seeds that worked are kept
    assert derive(7, 3, 5) == (7 * 1_000_003 + 3) * 1_000_003 + 5
    for parts in [(TOP_SEED, 0), (TOP_SEED, 1), (2 * 10 ** 7, 3, 9), (TOP_SEED, 2 ** 40, 7)]:
        assert 0 <= derive(*parts) < 2 ** 63
        assert derive(*parts) == derive(*parts)
    assert derive(TOP_SEED, 0) != derive(TOP_SEED, 1)


@pytest.mark.parametrize("args,names", [
    # a sweep given one value twice trained the same run twice
    (["sweep", "--compute", "fixed:10ms", "--compute", "fixed:0.01s"],
     ["--compute", "fixed:10ms", "fixed:0.01s", "given twice"]),
    # an empty value was dropped silently (-p diloco.H=5,,50 was refused)
    (["sweep", "--lr", "0.1,"], ["--lr", "empty value"]),
    (["sweep", "--lr", "0.1,,0.2"], ["--lr", "empty value"]),
])
def test_a_sweep_value_given_twice_or_an_empty_value_is_one_line(tmp_path, monkeypatch,
                                                                 capsys, args, names):
    from conftest import one_line_error

    monkeypatch.chdir(tmp_path)
    err = one_line_error(capsys, *args, "--workload", "mlp", "--steps", "2")
    for name in names:
        assert name in err, err
    assert not any(tmp_path.iterdir())  # refused before anything started


def test_a_sweep_of_a_million_runs_is_refused_in_one_line_before_it_expands(tmp_path,
                                                                           monkeypatch, capsys):
    """Was still checking after 240 s at 2.2 GB, with no output: 100 seeds x 100 learning
    rates x 100 batch sizes. The product is counted from the axes' lengths first."""
    from conftest import one_line_error

    monkeypatch.chdir(tmp_path)
    hundred = lambda fmt: ",".join(fmt(i) for i in range(1, 101))  # noqa: E731
    err = one_line_error(capsys, "sweep", "--seeds", hundred(str), "--lr",
                         hundred(lambda i: f"{i / 1000:g}"), "--batch-size", hundred(str),
                         "--workload", "mlp", "--steps", "2")
    assert "2,000,000 runs and replays" in err and "100 (--seeds)" in err, err  # 2 strategies
    assert "100 (--lr)" in err and "100 (--batch-size)" in err and "10,000" in err, err
    assert not any(tmp_path.iterdir())  # refused before anything started
    from exoframe.experiments.sweep import check_size

    check_size({"--seeds": list(range(100)), "--lr": list(range(100))})  # 10,000: accepted


def test_values_of_one_axis_are_compared_as_they_read():
    from exoframe.experiments.sweep_axes import check_distinct
    from exoframe.errors import ExoframeError

    with pytest.raises(ExoframeError, match=r"'fixed:0.01s' is given twice \(as 'fixed:10ms'\)"):
        check_distinct("compute", ["fixed:10ms", "fixed:0.01s"])
    check_distinct("compute", ["fixed:10ms", "fixed:10ms,overlap=5mbit", "fixed:20ms"])
    check_distinct("seed", [0, 1])


def test_a_checkpoint_tensor_of_another_shape_is_one_line_naming_it(tmp_path, capsys):
    """Was a 20-line rank traceback (load_state_dict's size mismatch) ending in advice to
    resume from the same checkpoint."""
    import torch
    from click.testing import CliRunner
    from conftest import one_line_error

    from exoframe.cli import cli as exoframe_cli

    result = CliRunner().invoke(exoframe_cli, [
        "run", "--workload", "mlp", "--compute", "fixed:10ms", "--nodes", "2", "--steps", "4",
        "--checkpoint-every", "2",
        "--no-progress", "--out", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    run = only_run(tmp_path / "runs")
    path = run / "checkpoints" / "step-4" / "rank-1.pt"
    state = torch.load(path, weights_only=True)
    name, tensor = next(iter(state["model"].items()))
    state["model"][name] = torch.zeros(tensor.shape[0] + 1, *tensor.shape[1:])
    torch.save(state, path)  # a whole archive: only the shape is wrong
    err = one_line_error(capsys, "resume", run, "--steps", "6")
    wrong = [tensor.shape[0] + 1, *tensor.shape[1:]]
    for part in (str(path), f"'{name}'", str(wrong), str(list(tensor.shape))):
        assert part in err, err
    assert "exoframe resume" not in err and "Traceback" not in err


# A workload whose loss is a scalar or, with mode=nonscalar, a vector (refused by `exoframe
# run` before its ranks start).
MODES = '''
import torch
from torch.utils.data import TensorDataset

import exoframe


class Model(torch.nn.Module):
    def __init__(self, mode):
        super().__init__()
        self.lin, self.mode = torch.nn.Linear(3, 1), mode

    def forward(self, batch):
        x, y = batch
        loss = (self.lin(x).squeeze(1) - y) ** 2
        return loss if self.mode == "nonscalar" else loss.mean()


def data(n):
    return TensorDataset(torch.randn(n, 3), torch.randn(n))


def workload(mode="ok"):
    return exoframe.Workload.from_datasets(lambda: Model(mode), data(64), data(8))
'''
SWEEP = ["sweep", "--strategy", "ddp", "--nodes", "2", "--steps", "2", "--compute",
         "fixed:10ms", "--net", "ideal", "--no-progress", "--no-plots"]


@pytest.mark.parametrize("argv,names", [
    (["--workload", "mlp", "-w", "train_examples=256", "--val-examples", "16,5000,32"],
     ["val_examples", "5000"]),
    (["--workload", "modes:workload", "-w", "mode=ok,nonscalar"], ["scalar loss"]),
    (["--workload", "mlp", "--nodes", "4", "--nodes-per-process", "1,2"],
     ["two points are the same run", "nodes_per_process"]),
], ids=["validation-set", "loss-shape", "packing"])
def test_every_sweep_point_is_checked_as_a_run_before_any_trains(tmp_path, monkeypatch, capsys,
                                                                 argv, names):
    """Each trained its first point(s), then was refused: a folder left, and no sweep.csv."""
    from conftest import one_line_error

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "modes.py").write_text(MODES)
    err = one_line_error(capsys, *SWEEP, *argv, "--out", tmp_path / "sweeps")
    for name in names:
        assert name in err, err
    assert not (tmp_path / "sweeps").exists()


# `exoframe sweep` in a fresh interpreter, stopped where the sweep would make its folder (the
# check is over): prints how far the process's peak memory rose during the check, in bytes.
CHECK_PEAK = '''
import os, resource, sys
import exoframe.experiments.sweep as sweep
from exoframe.cli import main

def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # (Linux: KiB)

class Stop:
    @staticmethod
    def create(*args, **kwargs):
        print("rose", peak() - before, flush=True)
        os._exit(0)

sweep.RunFolder = Stop
before = peak()
main(sys.argv[1:])
'''


def test_a_sweeps_check_holds_one_points_model_at_a_time(tmp_path):
    """`-w hidden=8000,...,8023` (24 points of 257 MB) held every point's model at once: 6 GB
    in 14 s before any folder. Here 8 points of 144 MB each must stay under 3 points' worth."""
    import subprocess
    import sys

    hidden = 6000
    model_bytes = 4 * (32 * hidden + hidden + hidden * hidden + hidden + hidden * 10 + 10)
    values = ",".join(str(hidden + i) for i in range(8))
    proc = subprocess.run(
        [sys.executable, "-c", CHECK_PEAK, *SWEEP, "--workload", "mlp", "-w",
         "train_examples=256", "-w", "val_examples=32", "-w", f"hidden={values}",
         "--out", str(tmp_path / "sweeps")],
        capture_output=True, text=True, timeout=HANG_GUARD, cwd=tmp_path)
    assert proc.returncode == 0 and "rose" in proc.stdout, proc.stdout + proc.stderr
    rose = int(proc.stdout.split("rose")[1].split()[0])
    assert rose < 3 * model_bytes, f"{rose / 1e6:.0f} MB for models of {model_bytes / 1e6:.0f} MB"


# Plugin strategies that leave something behind in the process of an --in-process run: a
# thread that never ends (not a daemon), or another working directory.
LEAVING = '''
import os
import threading
import time

import exoframe
from exoframe.strategies import DDP


class Lingering(DDP):
    """Starts, at its first step, a thread that sleeps for ever (not a daemon, as the
    worker thread it starts in is)."""
    def step(self):
        if self.rank == 0 and self.step_num == 1:
            threading.Thread(target=lambda: time.sleep(10 ** 6), name="lingerer",
                             daemon=False).start()
        super().step()


class Wandering(DDP):
    """Moves the process to another folder at its first step."""
    def step(self):
        if self.rank == 0 and self.step_num == 1:
            os.chdir(os.environ["EXOFRAME_TEST_ELSEWHERE"])
        super().step()


@exoframe.hookimpl
def exoframe_register_strategies(register):
    register("lingering", Lingering)
    register("wandering", Wandering)
'''


def test_an_in_process_run_ends_though_a_strategy_leaves_a_thread(cli, tmp_path):
    """The strategy's non-daemon thread kept the command from ever exiting after its table."""
    from conftest import write_plugin

    write_plugin(tmp_path, "leaving-plugin", "leaving", LEAVING)
    proc = cli("run", *TINY, "--nodes", "2", "--strategy", "lingering", "--in-process",
               "--out", "runs", timeout=HANG_GUARD)
    assert proc.returncode == 0, proc.stderr_text
    warnings = [line for line in proc.stderr_text.splitlines() if "lingerer" in line]
    assert len(warnings) == 1 and "warning" in warnings[0], proc.stderr_text
    summary = json.loads((only_run(tmp_path / "runs") / "summary.json").read_text())
    assert summary["status"] == "completed"


def test_an_in_process_run_whose_strategy_changes_folder_completes(cli, tmp_path):
    """Was a failure (`.trace.json.*.tmp: No such file or directory`) with a provisional
    summary.json saying "killed with SIGKILL", though every row was in metrics.jsonl."""
    from conftest import write_plugin

    write_plugin(tmp_path, "leaving-plugin", "leaving", LEAVING)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = cli("run", *TINY, "--nodes", "2", "--strategy", "wandering", "--in-process",
               "--out", "runs", env={"EXOFRAME_TEST_ELSEWHERE": str(elsewhere)},
               timeout=HANG_GUARD)
    assert proc.returncode == 0, proc.stderr_text
    summary = json.loads((only_run(tmp_path / "runs") / "summary.json").read_text())
    assert summary["status"] == "completed" and "error" not in summary, summary
    assert not any(elsewhere.iterdir())


def test_an_in_process_fit_gives_back_the_working_directory(tmp_path, monkeypatch):
    """The Python API's in-process fit, likewise: and the caller's folder is given back."""
    import os

    from exoframe.strategies import DDP
    from exoframe.testing import run

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    class Wandering(DDP):
        def step(self):
            if self.rank == 0 and self.step_num == 1:
                os.chdir(elsewhere)
            super().step()

    monkeypatch.chdir(tmp_path)
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):  # (exoframe sets them for a run)
        monkeypatch.delenv(name, raising=False)
    result = run(Wandering, steps=3, out="runs")
    assert os.getcwd() == str(tmp_path)
    assert "GLOO_SOCKET_IFNAME" not in os.environ and "NCCL_SOCKET_IFNAME" not in os.environ
    assert result.summary["status"] == "completed"
    summary = json.loads((only_run(tmp_path / "runs") / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert not any(elsewhere.iterdir())


# A stop signal while a run starts (issue 61, 1): held from the run's start until its ranks
# are up (forks included), then acted on. It was lost (`Exception ignored in: <function
# _releaseLock>`, raised in logging's fork handler; the run went on and exited 0), or ended
# the run with no summary.json in its folder.
STOP_DELAYS = (0.0, 0.02, 0.05, 0.1, 0.2)
STARTING = ["--workload", "mlp", "--steps", "2000", "--nodes", "2", "--strategy", "diloco",
            "-p", "H=5", "--compute", "fixed:10ms", "--no-progress", "--out", "runs"]
STARTS = {"run": ["run", *STARTING],
          "sweep": ["sweep", *STARTING, "--seeds", "0,1", "--net", "ideal", "--no-plots"]}


def _run_folders(cwd, kind):
    return [p for p in (cwd / "runs").glob("*" if kind == "run" else "*/runs/*") if p.is_dir()]


def _stopped_while_starting(cli, kind, signum, delay, anchor="folder"):
    """`exoframe run` or `sweep`, sent `signum` `delay` s after its (first) run folder
    appears (anchor="folder") or after the process started ("process"); what went wrong, or
    "" when it ended as it should: exit 130, one line that says interrupted, and in every run
    folder a strict summary.json that says the run was interrupted."""
    import shutil
    import signal
    import time

    from test_hostile import finish, strict_json

    for old in _run_folders(cli.cwd, kind):  # (the tries share one folder)
        shutil.rmtree(old)
    proc = cli.popen(*STARTS[kind])
    if anchor == "folder":
        deadline = time.monotonic() + HANG_GUARD
        while not _run_folders(cli.cwd, kind) and proc.poll() is None:
            assert time.monotonic() < deadline, "hang guard: no run folder"
            time.sleep(0.001)
    time.sleep(delay)
    proc.send_signal(signum)
    finish(proc)
    said = f"{kind} {signal.Signals(signum).name} at {delay} s after the {anchor}"
    lines = proc.stderr_text.splitlines()  # (a blank one too: click's, before the fix)
    if anchor == "process" and proc.returncode == -signum and not lines:
        return ""  # before Python could set any handler: nothing had started
    if proc.returncode != 130 or len(lines) != 1 or "interrupted" not in lines[0]:
        return f"{said}: exit {proc.returncode}, stderr {proc.stderr_text[-600:]!r}"
    if cli.leftovers():
        return f"{said}: processes left {cli.leftovers()}"
    for run in _run_folders(cli.cwd, kind):
        try:
            status = strict_json(run / "summary.json")["status"]
        except (OSError, ValueError) as e:
            return f"{said}: {run.name}: {e}"
        if status != "interrupted":
            return f"{said}: {run.name}: status {status}"
    return ""


@pytest.mark.parametrize("kind", ["run", "sweep"])
def test_a_stop_signal_while_the_ranks_start_ends_the_run_with_its_summary(cli, kind):
    import signal

    wrong = [_stopped_while_starting(cli, kind, signal.SIGTERM, delay) for delay in STOP_DELAYS]
    wrong.append(_stopped_while_starting(cli, kind, signal.SIGINT, 0.02))
    assert not [w for w in wrong if w], "\n".join(w for w in wrong if w)


def test_a_stop_signal_while_the_command_starts_is_one_line(cli):
    """Counted from the process's start, a signal lands in Python's start-up (before any
    handler: the signal's default ends the process, and nothing started) or in the imports
    of exoframe and torch, where it was lost (exit 0) or broke torch's import (exit 1,
    "cannot load module more than once per process"; or an abort)."""
    import signal

    wrong = [_stopped_while_starting(cli, "run", signal.SIGTERM, delay, anchor="process")
             for delay in (*STOP_DELAYS, 0.3, 0.4, 0.5, 0.6, 0.8)]
    assert not [w for w in wrong if w], "\n".join(w for w in wrong if w)
