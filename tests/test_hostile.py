"""Hostile input and hostile machines (issue 11), one battery. The classes, each with its
cases below:

- hangs: non-finite timing input (refused at once), a SIGSTOPped rank and a rank stuck in
  user code (named by the watchdog);
- an open rendezvous: no listening socket off loopback, garbage from a local client;
- tracebacks instead of messages: bad --out, binary files, workload code that raises,
  corrupt trace.json and metrics.jsonl, non-numeric metrics, a full disk;
- silent NaN: NaN/inf in optimizer and strategy values, a loss that becomes NaN;
- unbounded input: YAML alias bombs, huge values, --points, a trace claiming 1e9 nodes,
  grid labels that collide;
- lost data: SIGTERM/SIGHUP, a failed run's summary and rows, no folder from refused input;
- import shadowing: a stray module where the user runs.

Each asserts the exit code, one line naming the field or file (no traceback), a finite time
(every run has a hang guard), no process left, earlier run folders untouched and strict
JSON in what was written. Refusals that happen before a fork run in-process through
exoframe.cli.main (same entry point as `python -m exoframe`, without a torch import per
case); the cases that need ranks run `python -m exoframe` (the cli fixture).
"""
import json
import os
import re
import resource
import shutil
import signal
import socket
import stat
import textwrap
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import REPO, write_crashy_plugin, write_plugin
from conftest import metric_lines, only_run

from exoframe.cli import cli as exoframe_cli
from exoframe.cli import main
from exoframe.experiments.sweep import _bandwidth_texts, grid_networks, parse_grid
from exoframe.plugins import get_plugin_manager


def strict_loads(text):
    def refuse(constant):
        raise ValueError(f"non-strict JSON constant {constant}")
    return json.loads(text, parse_constant=refuse)


def strict_json(path: Path):
    return strict_loads(path.read_text())


def run_main(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def assert_one_line(err, *names):
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err and lines[0].startswith("error: ")
    assert len(lines[0]) <= 1100, f"{len(lines[0])} characters"
    for name in names:
        assert name in lines[0], lines[0]


@pytest.fixture
def here(tmp_path, monkeypatch):
    """tmp_path as the current folder, with one earlier run folder under runs/."""
    monkeypatch.chdir(tmp_path)
    earlier = tmp_path / "runs" / "20000101-000000-ddp-n2"
    earlier.mkdir(parents=True)
    (earlier / "summary.json").write_text("{}\n")
    return tmp_path


def folders(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


BINARY = bytes(range(256)) * 4
NAN_NET = "bandwidth: .nan\n"
HUGE_LATENCY = "latency: 1e999ms\n"
NAN_CONFIG = "lr: .nan\n"
# 400 bytes that expand to 10^9 list items when aliases are followed.
ALIAS_BOMB = "[" + ",".join(["&a [x,x,x,x,x,x,x,x,x,x]"] + [
    f"&{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 10) + "]" for i in range(8)]) + "]"

# (argv, files to write first, the names the one line must contain)
REFUSED = [
    # non-finite or out-of-range numbers: each once hung or failed after the fork
    (["run", "--compute", "fixed:nan"], {}, ["compute", "finite"]),
    (["run", "--compute", "fixed:inf"], {}, ["compute"]),
    # a time without its unit: 100 ms or 100 s? (it used to be 100 s, silently)
    (["run", "--compute", "fixed:100"], {}, ["compute", "fixed:100ms", "fixed:100s"]),
    (["sweep", "--compute", "fixed:100"], {}, ["compute", "fixed:100ms", "fixed:100s"]),
    (["run", "--compute", "flops:inf"], {}, ["compute", "peak"]),
    (["run", "--stragglers", "1:nan"], {}, ["stragglers", "rank 1"]),
    (["run", "--stragglers", "lognormal:nan"], {}, ["stragglers", "lognormal"]),
    (["run", "--stragglers", "lognormal:1000"], {}, ["stragglers", "lognormal"]),
    (["run", "--stragglers", "bernoulli:0.5:inf"], {}, ["stragglers", "bernoulli"]),
    (["run", "--lr", "nan"], {}, ["lr"]),
    (["run", "--lr", "inf"], {}, ["lr"]),
    (["run", "--optimizer", "sgd", "--momentum", "-1"], {}, ["momentum"]),
    (["run", "--weight-decay", "nan"], {}, ["weight_decay"]),
    (["run", "--weight-decay", "-1"], {}, ["weight_decay"]),
    (["run", "--threads", "100000"], {}, ["threads", "cores"]),
    (["run", "--nodes", "100000"], {}, ["nodes"]),
    (["run", "--target-loss", "inf"], {}, ["target_loss"]),
    (["run", "--hang-timeout", "0"], {}, ["hang_timeout"]),
    (["run", "--time-budget", "soon"], {}, ["time_budget", "'soon'"]),
    (["run", "--time-budget", "-1h"], {}, ["time_budget"]),
    (["run", "--accumulate", "0"], {}, ["accumulate"]),
    (["run", "--warmup-steps", "300"], {}, ["warmup_steps", "300"]),
    (["run", "-o", "lr=0.1"], {}, ["optimizer 'adamw'", "--lr"]),
    (["run", "--warmup-steps", "-1"], {}, ["warmup_steps"]),
    (["run", "--min-lr-ratio", "2"], {}, ["min_lr_ratio"]),
    (["run", "--clip-grad-norm", "0"], {}, ["clip_grad_norm"]),
    (["run", "--clip-grad-norm", "nan"], {}, ["clip_grad_norm"]),
    (["run", "--device", "tpu"], {}, ["device", "'tpu'"]),
    (["run", "--device", "cuda:x"], {}, ["device"]),
    (["run", "--optimizer", "adamv"], {}, ["optimizer", "'adamv'", "Did you mean"]),
    (["run", "--strategy", "diloco", "-p", "outer_optimizer=adamx"], {},
     ["diloco: outer_optimizer", "'adamx'"]),
    (["run", "-o", "betas=3"], {}, ["optimizer 'adamw'", "betas"]),
    (["run", "--optimizer", "adam", "--momentum", "0.9"], {}, ["optimizer 'adam'", "momentum"]),
    (["run", "--config", "opt.yaml"], {"opt.yaml": "optimizer: {betas: [0.9, 0.95]}\n"},
     ["opt.yaml", "optimizer", "name"]),
    (["run", "--config", "odd.yaml"], {"odd.yaml": "on_nonfinite: ignore\n"},
     ["on_nonfinite", "'ignore'"]),
    (["run", "--strategy", "diloco", "-p", "outer_lr=.nan"], {}, ["outer_lr", "finite"]),
    (["run", "--strategy", "diloco", "-p", "outer_lr=.inf"], {}, ["outer_lr", "finite"]),
    (["run", "--net", "nan.yaml"], {"nan.yaml": NAN_NET}, ["nan.yaml", "bandwidth"]),
    (["run", "--net", "far.yaml"], {"far.yaml": HUGE_LATENCY}, ["far.yaml", "latency"]),
    (["run", "--config", "nan.yaml"], {"nan.yaml": NAN_CONFIG}, ["nan.yaml", "lr"]),
    (["sweep", "--project-params", "1e9", "--step-time", "nan", "--no-plots"], {},
     ["--step-time"]),
    # what used to be a traceback
    (["run", "--out", "afile"], {"afile": "x"}, ["--out", "afile", "is a file"]),
    (["run", "--out", "afile/sub"], {"afile": "x"}, ["--out", "afile/sub", "under afile"]),
    (["sweep", "--out", "afile/sub", "--no-plots"], {"afile": "x"}, ["--out", "afile/sub"]),
    (["run", "--config", "bin.yaml"], {"bin.yaml": BINARY}, ["bin.yaml", "UTF-8"]),
    (["run", "--net", "bin.yaml"], {"bin.yaml": BINARY}, ["bin.yaml", "UTF-8"]),
    (["run", "--workload", "mlp", "-w", "hidden=abc"], {}, ["workload 'mlp'", "hidden"]),
    (["run", "--workload", "hostile_wl_a:boom"], {"hostile_wl_a.py": (
        "def boom():\n    raise RuntimeError('factory exploded')\n")},
     ["hostile_wl_a:boom", "factory exploded"]),
    (["run", "--workload", "hostile_wl_b:three"], {"hostile_wl_b.py": "three = 3\n"},
     ["hostile_wl_b:three", "not a function"]),
    # unbounded input
    (["run", "--strategy", "diloco", "-p", f"H={ALIAS_BOMB}"], {}, ["--param H", "aliases"]),
    (["run", "--config", "bomb.yaml"], {"bomb.yaml": f"strategy_params: {{H: {ALIAS_BOMB}}}\n"},
     ["bomb.yaml", "aliases"]),
    (["run", "--strategy", "diloco", "-p", "H=" + "x" * 100_000], {}, ["'H'"]),
    (["sweep", "--bandwidth", "1mbit..2mbit", "--points", "100000000", "--no-plots"], {},
     ["--points", "1000"]),
]


def test_refused_before_anything_runs(here, capsys):
    before = folders(here)
    for argv, files, names in REFUSED:
        for name, content in files.items():
            path = here / name
            path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
        code, out, err = run_main(argv, capsys)
        assert code == 2, (argv, err)
        assert_one_line(err, *names)
        for name in files:
            (here / name).unlink()
        new = [p for p in folders(here) if p not in before and "__pycache__" not in p]
        assert new == [], (argv, new)  # no run or sweep folder; runs/ as it was


def test_a_nan_step_time_fails_at_once_as_a_user_meets_it(cli, tmp_path):
    """`--compute fixed:nan` used to leave the launcher and ranks waiting forever."""
    result = cli("run", "--compute", "fixed:nan", "--out", "runs", timeout=60)
    assert result.returncode == 2
    assert_one_line(result.stderr_text, "compute")
    assert not (tmp_path / "runs").exists()
    debug = cli("--debug", "run", "--workload", "mlp", "-w", "hidden=abc", timeout=60)
    assert debug.returncode == 2 and "Traceback" in debug.stderr_text
    assert debug.stderr_text.splitlines()[-1].startswith("error: workload 'mlp'")


def test_grid_labels_are_unique():
    grid = parse_grid("10mbit..10.5mbit", 40)
    labels = _bandwidth_texts(grid)
    assert len(set(labels)) == 40
    assert _bandwidth_texts(parse_grid("10mbit..10gbit", 4)) == [
        "10mbit", "100mbit", "1gbit", "10gbit"]


def test_grid_networks_one_file_per_point(tmp_path):
    paths = grid_networks("wan-100mbps", parse_grid("10mbit..10.5mbit", 40), tmp_path,
                          get_plugin_manager())
    assert len(set(paths)) == 40 and len(list(tmp_path.iterdir())) == 40


METRIC_PLUGIN = textwrap.dedent('''
    import math
    from exoframe import hookimpl
    from exoframe.strategies.ddp import DDP

    class NanMetric(DDP):
        """Logs non-finite metrics."""
        def metrics(self):
            return {"odd": math.nan, "big": math.inf}

    class TextMetric(DDP):
        """Logs a string as a metric."""
        def metrics(self):
            return {"odd": "abc"}

    @hookimpl
    def exoframe_register_strategies(register):
        register("nan-metric", NanMetric)
        register("text-metric", TextMetric)
''')

RUN = ["--workload", "mlp", "--steps", "3", "--compute", "fixed:10ms", "--out", "runs"]


@pytest.mark.invalid_records  # (it damages copies of its records on purpose)
def test_written_files_are_strict_json_and_bad_files_are_named(cli, tmp_path):
    write_plugin(tmp_path, "exoframe-hostile", "hostile_plugin", METRIC_PLUGIN)
    run = cli("run", "--strategy", "nan-metric", *RUN)
    assert run.returncode == 0, run.stderr_text
    (folder,) = (tmp_path / "runs").iterdir()
    rows = [strict_loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["odd"] is None and rows[-1]["big"] is None
    report = cli("report", str(folder), "--out", "report", "--no-plots")
    assert report.returncode == 0, report.stderr_text
    strict_loads((tmp_path / "report" / "sweep.json").read_text())
    replay = cli("replay", str(folder), "--net", "wan-100mbps")
    assert replay.returncode == 0, replay.stderr_text
    for path in (folder / "replays").iterdir():
        strict_loads(path.read_text())

    text = cli("run", "--strategy", "text-metric", *RUN)
    assert text.returncode != 0 and "Traceback" not in text.stderr_text
    assert_one_line(text.stderr_text, "metric 'odd'", "TextMetric")
    assert cli.leftovers() == []

    # Damaged copies of the good run: each refused in one line naming the file.
    trace = json.loads((folder / "trace.json").read_text())
    damaged = {
        "truncated": lambda d: (d / "trace.json").write_text(json.dumps(trace)[:80]),
        "no-seed": lambda d: (d / "trace.json").write_text(
            json.dumps({k: v for k, v in trace.items() if k != "seed"})),
        "billion-nodes": lambda d: (d / "trace.json").write_text(
            json.dumps({**trace, "nodes": 10 ** 9})),
        "many-steps": lambda d: (d / "trace.json").write_text(
            json.dumps({**trace, "steps": 10 ** 9})),
        "bad-event": lambda d: (d / "trace.json").write_text(
            json.dumps({**trace, "ranks": [[["c", "NaN"]], []]})),
    }
    for name, damage in damaged.items():
        copy = tmp_path / "damaged" / name
        copy.mkdir(parents=True)
        (copy / "summary.json").write_text((folder / "summary.json").read_text())
        damage(copy)
        result = cli("replay", str(copy), "--net", "ideal", timeout=60)
        assert result.returncode == 2, (name, result.stderr_text)
        assert_one_line(result.stderr_text, "trace.json")
        assert not (copy / "replays").exists()

    metrics = tmp_path / "damaged" / "metrics"
    metrics.mkdir()
    (metrics / "summary.json").write_text((folder / "summary.json").read_text())
    (metrics / "metrics.jsonl").write_text((folder / "metrics.jsonl").read_text()[:-20])
    result = cli("report", str(metrics), "--out", "report2", "--no-plots", timeout=60)
    assert result.returncode == 2
    assert_one_line(result.stderr_text, "metrics.jsonl", "line 3")
    assert not (tmp_path / "report2").exists()


# -- runs with real ranks ------------------------------------------------------------------

MLP = ["--workload", "mlp", "--no-progress", "--out", "runs"]
LONG = ["--steps", "100000"]
HANG_GUARD = 120  # seconds; a guard against hangs, never a speed requirement


def run_folder(cli) -> Path:
    (folder,) = (cli.cwd / "runs").iterdir()
    return folder


def summary(cli) -> dict:
    return strict_json(run_folder(cli) / "summary.json")


def last_line(proc) -> str:
    return proc.stderr_text.strip().splitlines()[-1]


def finish(proc, timeout=HANG_GUARD):
    proc.stdout_text, proc.stderr_text = proc.communicate(timeout=timeout)
    return proc


def wait_for_steps(cli, steps=3):
    """Wait until the run has emitted `steps` rows: every rank is up and training."""
    deadline = time.monotonic() + HANG_GUARD
    while time.monotonic() < deadline:
        metrics = list((cli.cwd / "runs").glob("*/metrics.jsonl"))
        if metrics and len(metrics[0].read_text().splitlines()) >= steps:
            return
        time.sleep(0.1)
    raise AssertionError("the run never started training")


def named(cli, name: str) -> int:
    """The pid of the run's process called `name` (exo-rank-N, exo-evaluator)."""
    for pid in cli.leftovers():
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == name:
                return pid
        except OSError:
            pass
    raise AssertionError(f"no process named {name}")


def listening(pid: int) -> list[tuple[str, int]]:
    """(address in hex as /proc shows it, port) of every TCP socket `pid` listens on."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A: LISTEN
                address, port = local.split(":")
                found.append((address, int(port, 16)))
    return found


def is_loopback(hex_address: str) -> bool:
    """/proc writes addresses as little-endian 32-bit words: 127.x.x.x ends in 7F."""
    if len(hex_address) == 8:
        return hex_address.endswith("7F")
    ipv4_mapped = hex_address.startswith("0000000000000000FFFF0000")  # ::ffff:127.x.x.x
    return hex_address == "00000000000000000000000001000000" or (  # ::1
        ipv4_mapped and hex_address.endswith("7F"))


def test_no_open_rendezvous_port_and_every_socket_on_loopback(cli):
    tmp = cli.cwd / "tmp"
    tmp.mkdir()
    proc = cli.popen("run", "--nodes", "3", *LONG, *MLP, env={"TMPDIR": str(tmp)})
    try:
        wait_for_steps(cli)
        launcher, *children = [proc.pid, *(p for p in cli.leftovers() if p != proc.pid)]
        assert len(children) == 4  # 3 ranks and the evaluator
        assert listening(launcher) == []  # no store port: nothing for a foreign client
        sockets = [s for pid in children for s in listening(pid)]
        assert sockets  # gloo's: the check below checks something
        assert all(is_loopback(address) for address, _ in sockets), sockets
        (rendezvous,) = tmp.glob("exoframe-rendezvous-*")
        assert stat.S_IMODE(rendezvous.stat().st_mode) == 0o700
    finally:
        proc.send_signal(signal.SIGINT)
        finish(proc)
    assert proc.returncode == 130, proc.stderr_text
    assert list(tmp.glob("exoframe-*")) == []  # the rendezvous folder is gone
    assert cli.leftovers() == []


def test_garbage_from_a_local_client_does_not_disturb_a_run(cli):
    """Write garbage to every port the run listens on, from start-up to the end."""
    proc = cli.popen("run", "--nodes", "3", "--steps", "40", *MLP)
    hits = []

    def attack():
        while proc.poll() is None:
            for pid in cli.leftovers():
                try:
                    ports = [port for _, port in listening(pid)]
                except OSError:
                    continue
                for port in ports:
                    try:
                        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                            s.sendall(os.urandom(64) + b"\xff" * 64)
                            hits.append(port)
                    except OSError:
                        pass
            time.sleep(0.01)

    attacker = threading.Thread(target=attack, daemon=True)
    attacker.start()
    finish(proc)
    attacker.join(timeout=10)
    assert proc.returncode == 0, proc.stderr_text
    assert hits  # the garbage reached the run
    assert summary(cli)["status"] == "completed"
    assert cli.leftovers() == []


def test_a_stopped_rank_is_named_by_the_watchdog(cli):
    proc = cli.popen("run", "--nodes", "3", *LONG, *MLP, "--hang-timeout", "3")
    wait_for_steps(cli)
    stopped = named(cli, "exo-rank-1")
    os.kill(stopped, signal.SIGSTOP)
    finish(proc)
    assert proc.returncode == 1, proc.stderr_text
    assert "Traceback" not in proc.stderr_text
    line = last_line(proc)
    assert line.startswith("error: watchdog: no progress for 3 s: rank 1 stopped"), line
    assert "rank 0" not in line.split("made no progress")[0]
    assert cli.leftovers() == []
    result = summary(cli)
    assert result["status"] == "failed" and result["error"] == line[len("error: "):]
    assert result["rows"] and [r["step"] for r in result["rows"]] == list(
        range(1, len(result["rows"]) + 1))


STUCK = textwrap.dedent('''
    import time
    import exoframe
    from exoframe.strategies import DDP

    class Stuck(DDP):
        """Rank 2 hangs at step 3, outside the simulated network."""
        def step(self):
            if self.rank == 2 and self.step_num == 3:
                time.sleep(3600)
            super().step()

    @exoframe.hookimpl
    def exoframe_register_strategies(register):
        register("stuck", Stuck)
''')


def stall_line(idle_ranks: list, awaiting_validation: list) -> str:
    """The watchdog's line for three threads of ranks (0-2) and the evaluator (3), where
    `idle_ranks` made no progress and the others wait in the simulator."""
    from types import SimpleNamespace
    from exoframe.engine.launch.watchdog import describe_stall
    sim = SimpleNamespace(blocked=[rank not in idle_ranks for rank in range(3)], paused={},
                          handles={})
    monitor = SimpleNamespace(
        sim=sim, job=SimpleNamespace(nodes=3, target_loss=None),
        verdicts=SimpleNamespace(waiting={}), who=[0, 1, 2, "evaluator"],
        processes=[None] * 4, hosts={}, results=[None] * 4,
        rows=SimpleNamespace(awaiting_steps=lambda: awaiting_validation))
    return describe_stall(monitor, 2)[0]


def test_the_watchdog_blames_a_stuck_rank_before_an_evaluator_that_waits_for_its_model():
    """A validation that waits while a rank made no progress most likely waits for that
    rank's model (the CI run where the evaluator of an --in-process run was named beside the
    stuck rank); an evaluator that made no progress while every rank waits is the culprit."""
    waits = "waits for the simulated network, held back by the late rank(s)"
    line = stall_line([2], [1, 2])
    assert line.startswith(f"no progress for 2 s: rank 2 made no progress; rank 0 {waits}; "
                           f"rank 1 {waits}; evaluator waits to validate step 1."), line
    line = stall_line([], [4])
    assert line.startswith("no progress for 2 s: evaluator (validating step 4) made no "
                           f"progress; rank 0 {waits}; rank 1 {waits}; rank 2 {waits}."), line


@pytest.mark.parametrize("hosting", ["forked", "packed", "in-process"])
def test_a_stuck_rank_is_named_by_the_watchdog(cli, hosting):
    write_plugin(cli.cwd, "stuck-plugin", "stuck", STUCK)
    packed = hosting != "forked"
    proc = cli("run", "--strategy", "stuck", "--nodes", "3", "--steps", "10", *MLP,
               "--hang-timeout", "2", *{"forked": [], "packed": ["--nodes-per-process", "3"],
                                        "in-process": ["--in-process"]}[hosting])
    assert proc.returncode == 1, proc.stderr_text
    assert "Traceback" not in proc.stderr_text
    line = last_line(proc)
    # A node that never gives way holds up the nodes of its worker, whose requests wait
    # for the end of the worker's round: all made no progress.
    stalled = "rank 0, rank 1, rank 2 made no progress." if packed else \
        "rank 2 made no progress; rank 0 waits for "
    assert line.startswith(f"error: watchdog: no progress for 2 s: {stalled}"), line
    # The stuck rank's Python stack, where it sleeps: the line of stuck.py that hangs.
    if hosting == "in-process":  # the worker thread's: the node it runs
        stack = proc.stderr_text.split("Python stack of the worker of ranks 0-2 (a thread of "
                                       "this process):\n")[1]
        assert 'stuck.py", line 10, in step' in stack, proc.stderr_text
        assert "did not stop within 5 s of its end" in proc.stderr_text  # (it sleeps on)
    elif packed:  # the worker's: each node's stack, and which one runs
        stack = proc.stderr_text.split("Python stack of the worker of ranks 0-2 "
                                       "(faulthandler):\n")[1]
        stuck = stack.split("rank 2 (running):\n")[1]
        assert 'stuck.py", line 10, in step' in stuck, proc.stderr_text
        assert "rank 0 (waiting):" in stack
    else:
        stack = proc.stderr_text.split("Python stack of rank 2 (faulthandler):\n")[1]
        # (its main thread's: a rank also has the thread that sends its models for validation)
        main = stack.split("Current thread")[1].split("\n\n")[0]
        assert 'stuck.py", line 10 in step' in main, proc.stderr_text
        assert "Python stack of rank 0" not in proc.stderr_text  # it waits, it is not stuck
    assert cli.leftovers() == []
    assert summary(cli)["status"] == "failed"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_stop_the_run_like_ctrl_c_and_keep_the_rows(cli, signum):
    proc = cli.popen("run", "--nodes", "2", *LONG, *MLP)
    wait_for_steps(cli)
    proc.send_signal(signum)
    finish(proc)
    assert proc.returncode == 130, proc.stderr_text
    name = signal.Signals(signum).name
    assert last_line(proc) == f"error: interrupted by {name}: every rank was stopped."
    assert "Traceback" not in proc.stderr_text
    assert cli.leftovers() == []
    result = summary(cli)
    assert result["status"] == "interrupted"
    metrics = (run_folder(cli) / "metrics.jsonl").read_text().splitlines()
    assert len(result["rows"]) == result["steps_completed"] >= 3
    assert [r["step"] for r in result["rows"]] == [json.loads(m)["step"] for m in metrics]



def test_a_stop_signal_while_a_row_is_written_keeps_the_row_in_every_record():
    """A signal that lands between a row's records (the CI race: the summary's rows had step
    9, metrics.jsonl ended at 8) is acted on once the row is in all of them; a second one
    acts at once, and the row is then in none."""
    from types import SimpleNamespace

    from exoframe.engine.ipc.stop_signals import catch_stop_signals, restore_signals
    from exoframe.engine.launch.row_output import RowOutput

    def output_with_a_row(signals: int):
        written = []

        def sink(row):
            for _ in range(signals):
                os.kill(os.getpid(), signal.SIGTERM)  # (its handler runs at the next bytecode)
                time.sleep(0.01)
            written.append(row["step"])

        job = SimpleNamespace(nodes=1, validations_at=lambda step, last: False,
                              strategy_name="ddp", resume_from=None)
        output = RowOutput(job, sink, None, [], lambda: 3)
        output.rows.add(0, 1, {"loss": 1.0, "sim_time": 1.0, "bytes_sent": 0})
        return output, written

    previous = catch_stop_signals()
    try:
        for signals, kept in ((1, [1]), (2, [])):
            output, written = output_with_a_row(signals)
            with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
                output.emit()
            assert written == [row["step"] for row in output.emitted] == kept
    finally:
        restore_signals(previous)


def test_a_stop_signal_after_a_failure_does_not_take_its_place():
    """Once a run fails, the ranks it stops may have the launcher signalled (torchrun's agent
    stops rank 0 when a rank beside it has lost the launcher: the CI race printed
    "interrupted by SIGTERM" instead of the failed rank's error). The first stop signal
    after the failure is let pass; a second acts; the next command starts afresh."""
    from exoframe.engine.ipc.stop_signals import (catch_stop_signals, restore_signals,
                                                  stopping_for_a_failure)

    def signalled():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)  # (its handler runs at the next bytecode)

    previous = catch_stop_signals()
    try:
        stopping_for_a_failure()
        signalled()  # let pass
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            signalled()
        stopping_for_a_failure()
        catch_stop_signals()  # a new command or run: a stop signal is one again
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            signalled()
    finally:
        restore_signals(previous)


def test_a_failed_run_writes_a_failed_summary_with_every_finished_row(cli):
    write_crashy_plugin(cli.cwd, step=4)
    # Every step is validated: rows finished by every rank may still wait for validation.
    proc = cli("run", "--strategy", "crashy", "--nodes", "3", "--steps", "10",
               "--eval-every", "1", *MLP)
    assert proc.returncode == 1
    assert proc.stderr_text.count("Traceback") == 1  # the rank's own
    assert last_line(proc) == "error: rank 1: RuntimeError: boom on rank one"
    assert cli.leftovers() == []
    result = summary(cli)
    assert result["status"] == "failed"
    assert result["error"] == "rank 1: RuntimeError: boom on rank one"
    steps = [r["step"] for r in result["rows"]]
    assert steps == list(range(1, len(steps) + 1)) and 1 <= len(steps) <= 3
    assert not (run_folder(cli) / "trace.json").exists()


def test_a_completed_run_says_so_in_strict_json(cli):
    proc = cli("run", "--nodes", "2", "--steps", "3", *MLP)
    assert proc.returncode == 0, proc.stderr_text
    assert summary(cli)["status"] == "completed"
    strict_json(run_folder(cli) / "trace.json")
    assert not list(run_folder(cli).glob(".*"))  # no temporary file left behind


DIVERGING = textwrap.dedent('''
    import torch
    from torch.utils.data import TensorDataset
    import exoframe

    class Diverging(torch.nn.Module):
        """Its training loss becomes NaN at the third step."""
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 1)
            self.calls = 0
        def forward(self, batch):
            x, y = batch
            loss = ((self.lin(x).squeeze(1) - y) ** 2).mean()
            if self.training:
                self.calls += 1
                if self.calls >= 3:
                    loss = loss * float("nan")
            return loss

    def data(n):
        return TensorDataset(torch.randn(n, 3), torch.randn(n))

    def make():
        return exoframe.Workload.from_datasets(Diverging, data(256), data(32), batch_size=8)
''')


def test_a_nan_loss_stops_the_run_and_names_step_and_rank(cli):
    (cli.cwd / "diverging.py").write_text(DIVERGING)
    proc = cli("run", "--nodes", "2", "--steps", "6", "--workload", "diverging:make",
               "--no-progress", "--out", "runs")
    assert proc.returncode == 2, proc.stderr_text
    assert "Traceback" not in proc.stderr_text
    line = last_line(proc)
    assert "loss became NaN at step 3 on rank " in line and "--on-nonfinite continue" in line
    assert cli.leftovers() == []
    result = summary(cli)
    assert result["status"] == "failed"
    # Step 2 finished on every rank before the NaN; its row may not have been read yet when
    # the error was (another rank's pipe), step 1's was.
    assert [r["step"] for r in result["rows"]] in ([1], [1, 2])


def test_a_nan_loss_may_be_allowed_and_the_files_stay_strict_json(cli):
    (cli.cwd / "diverging.py").write_text(DIVERGING)
    proc = cli("run", "--nodes", "2", "--steps", "6", "--workload", "diverging:make",
               "--no-progress", "--out", "runs", "--on-nonfinite", "continue")
    assert proc.returncode == 0, proc.stderr_text
    result = summary(cli)
    assert result["status"] == "completed" and result["final_loss"] is None
    strict_json(run_folder(cli) / "trace.json")
    assert cli.leftovers() == []


def test_a_full_disk_is_one_line_and_leaves_whole_rows(cli):
    """A file-size limit stands in for a full disk: writes past it fail (EFBIG) as they
    would with ENOSPC. The run stops with one line naming the file; every line of
    metrics.jsonl is a whole row; nothing half-written is left."""
    limit = 6000  # bytes: config.yaml fits, metrics.jsonl fills up after a few dozen rows

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = finish(cli.popen("run", "--nodes", "2", "--steps", "400", *MLP,
                            preexec_fn=small_files))
    assert proc.returncode == 2, proc.stderr_text
    assert "Traceback" not in proc.stderr_text
    line = last_line(proc)
    assert line.startswith("error: sink 'jsonl' failed at step ") and "cannot write " in line
    assert "metrics.jsonl: File too large. Free some space" in line
    assert cli.leftovers() == []
    folder = run_folder(cli)
    rows = [strict_loads(row) for row in (folder / "metrics.jsonl").read_text().splitlines()]
    assert rows and [r["step"] for r in rows] == list(range(1, len(rows) + 1))
    assert not (folder / "trace.json").exists()
    assert not list(folder.glob(".*.tmp"))  # no temporary file left
    if (folder / "summary.json").exists():  # written if it fits under the limit
        assert strict_json(folder / "summary.json")["status"] == "failed"


def test_a_stray_module_in_the_current_folder_is_not_imported(cli):
    """torch imports sympy at start-up; a sympy.py where the user runs must not be it."""
    (cli.cwd / "sympy.py").write_text('raise RuntimeError("the stray sympy.py was imported")\n')
    (cli.cwd / "diverging.py").write_text(DIVERGING)
    # Only the repository on PYTHONPATH: the current folder gets on sys.path as a user's would.
    proc = cli("run", "--nodes", "2", "--steps", "2", "--workload", "diverging:make",
               "--no-progress", env={"PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr_text
    assert "stray sympy" not in proc.stderr_text
    assert cli.leftovers() == []


def test_sigkill_of_the_launcher_leaves_no_rank_and_a_failed_summary(cli):
    proc = cli.popen("run", "--nodes", "2", *LONG, *MLP)
    wait_for_steps(cli)
    proc.kill()  # SIGKILL: the launcher can do nothing more
    finish(proc)
    deadline = time.monotonic() + HANG_GUARD  # a guard: the ranks die with their parent
    while cli.leftovers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert cli.leftovers() == []
    folder = run_folder(cli)
    rows = [strict_loads(row) for row in (folder / "metrics.jsonl").read_text().splitlines()]
    assert rows and [r["step"] for r in rows] == list(range(1, len(rows) + 1))
    result = strict_json(folder / "summary.json")
    assert result["status"] == "failed" and "killed with SIGKILL" in result["error"]
    assert result["steps_completed"] <= len(rows)  # written at most every 10 s
    assert [r["step"] for r in result["rows"]] == [r["step"] for r in rows][:len(result["rows"])]


# Round 4 (issue 40): the lock, whole files, signals in a sweep

from conftest import wait_for  # noqa: E402 - (this section's own)


def hostile_lock(run: Path, outside: Path, kind: str):
    """<run>/.lock made into `kind`: anything but the plain file the lock is."""
    lock = run / ".lock"
    if kind == "link to metrics.jsonl":
        lock.symlink_to("metrics.jsonl")
    elif kind == "link outside":
        lock.symlink_to(outside)
    elif kind == "dangling link":
        lock.symlink_to(outside.parent / "made-by-the-lock")
    elif kind == "hard link to metrics.jsonl":
        os.link(run / "metrics.jsonl", lock)
    elif kind == "fifo":
        os.mkfifo(lock)
    elif kind == "folder":
        lock.mkdir()
    return lock


@pytest.mark.parametrize("kind", ["link to metrics.jsonl", "link outside", "dangling link",
                                  "hard link to metrics.jsonl", "fifo", "folder"])
def test_a_lock_that_is_not_a_plain_file_is_refused_and_nothing_changes(tmp_path, capsys,
                                                                         kind):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("workload: mlp\nsteps: 40\n")
    (run / "metrics.jsonl").write_text("".join(f'{{"step": {s}}}\n' for s in range(1, 41)))
    outside = tmp_path / "outside.txt"
    outside.write_text("not the run's\n")
    lock = hostile_lock(run, outside, kind)

    def state():
        return {p.name: (stat.S_IFMT(p.lstat().st_mode), os.readlink(p) if p.is_symlink()
                         else p.read_text() if p.is_file() else None)
                for p in [*run.iterdir(), *tmp_path.iterdir()]}

    before = state()
    code, _, err = run_main(["resume", run], capsys)
    assert code == 2
    assert_one_line(err, str(lock), "nothing was changed")
    assert state() == before


def files_up_to(limit: int):
    """A preexec_fn: files past `limit` bytes cannot be written (EFBIG), a full disk for what
    exoframe writes (see test_a_full_disk_is_one_line_and_leaves_whole_rows)."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def test_a_full_disk_at_the_end_of_a_run_says_so_in_the_summary_with_every_step(cli):
    """80 steps: metrics.jsonl fits under the limit; trace.json, written at the end, and a
    summary holding every row do not. The summary says why the run failed and how many
    steps it finished (its rows are in metrics.jsonl)."""
    proc = finish(cli.popen("run", "--nodes", "2", "--steps", "80", *MLP,
                            preexec_fn=files_up_to(13000)))
    assert proc.returncode == 2, proc.stderr_text
    folder = run_folder(cli)
    assert_one_line(proc.stderr_text, f"{folder.relative_to(cli.cwd)}/trace.json: File too large",
                    "free some space")
    rows = [strict_loads(row) for row in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 81))
    result = strict_json(folder / "summary.json")
    assert result["status"] == "failed" and result["steps_completed"] == 80
    assert "trace.json: File too large" in result["error"]
    assert not (folder / "trace.json").exists() and not list(folder.glob(".*.tmp"))
    assert cli.leftovers() == []


def test_a_full_disk_in_a_sweep_leaves_whole_tables_and_names_the_file(cli):
    """The runs' files fit under the limit; the sweep's tables (a row per grid point) do
    not: one line naming the table, and no table cut short."""
    proc = finish(cli.popen("sweep", "--strategy", "ddp", "--nodes", "2", "--steps", "3",
                            "--bandwidth", "10mbit..10gbit", "--points", "60", "--no-plots",
                            *MLP, preexec_fn=files_up_to(20000)))
    assert proc.returncode == 2, proc.stderr_text
    (folder,) = (cli.cwd / "runs").iterdir()
    assert_one_line(proc.stderr_text, f"{folder.relative_to(cli.cwd)}/sweep.json: File too "
                    "large; free some space")
    assert not (folder / "sweep.json").exists() and not list(folder.rglob(".*.tmp"))
    assert (folder / "sweep.csv").read_text().count("\n") == 61  # whole, as it fitted
    assert cli.leftovers() == []


# The mlp workload, whose making (in the sweep's own process, before a run starts its ranks)
# waits while the file "gate" exists, once it has said so in the file "making".
GATED_MAKING = textwrap.dedent('''
    import os
    import time

    from exoframe.workloads.mlp import mlp

    def workload(**params):
        open("making", "w").close()
        while os.path.exists("gate"):
            time.sleep(0.01)
        return mlp(**params)
''')


@pytest.mark.parametrize("phase", ["start", "replays"])
def test_sigterm_ends_a_sweep_in_every_phase_with_one_line(cli, phase):
    """Signalled while it makes a run's workload (right after its start, or between runs)
    or while it replays a trace through a grid's networks, a sweep ends as in a training
    run: one line, exit 130, nothing left running, what it had written kept whole."""
    args = ["sweep", "--strategy", "ddp", "--nodes", "2", "--no-plots", "--no-progress",
            "--out", "runs"]
    if phase == "start":
        (cli.cwd / "gated.py").write_text(GATED_MAKING)
        (cli.cwd / "gate").touch()
        proc = cli.popen(*args, "--steps", "3", "--workload", "gated:workload")
        wait_for(lambda: (cli.cwd / "making").exists(), "the workload's making")
    else:  # (about 70 ms a replay: the sweep is still replaying when the signal comes)
        proc = cli.popen(*args, "--steps", "100", "--workload", "mlp", "--bandwidth",
                         "10mbit..10gbit", "--points", "100")
        wait_for(lambda: any((cli.cwd / "runs").glob("*/runs/*/replays/*.json")),
                 "the first replay")
    proc.send_signal(signal.SIGTERM)
    finish(proc)
    assert proc.returncode == 130, proc.stderr_text
    assert proc.stderr_text.strip() == "interrupted by SIGTERM"  # (after click's blank line)
    assert cli.leftovers() == []
    for run in (cli.cwd / "runs").glob("*/runs/*"):  # trained whole before the replays
        assert strict_json(run / "summary.json")["status"] == "completed"
        for replay in (run / "replays").iterdir():
            strict_json(replay)

# Round 4 (issue 40): options and sweep points checked up front, resume checks

TWO_STEPS = ["--nodes", "2", "--steps", "2"]
SWEEP_TWO_STEPS = [*TWO_STEPS, "--no-plots"]
# (argv, files to write first, the names the one line must contain): each once trained, or
# made a run or sweep folder, before a rank refused it.
REFUSED_UP_FRONT = [
    (["sweep", "--strategy", "ddp,param-server,diloco", "-p", "param-server.servers=5",
      *SWEEP_TWO_STEPS], {}, ["param-server", "'servers' is 5", "2 nodes"]),
    (["run", "--strategy", "param-server", "-p", "servers=5", *TWO_STEPS], {},
     ["param-server", "'servers' is 5", "2 nodes"]),
    (["run", "--optimizer", "muon", "-o", "ns_dtype=float64", *TWO_STEPS], {},
     ["optimizer 'muon'", "ns_dtype", "float32 or bfloat16"]),
    (["sweep", "--optimizer", "muon", "-o", "ns_dtype=float64", *SWEEP_TWO_STEPS], {},
     ["optimizer 'muon'", "ns_dtype"]),
    (["run", "--optimizer", "muon", "-o", "adjust_lr=bad", *TWO_STEPS], {},
     ["optimizer 'muon'", "adjust_lr", "spectral_norm"]),
    (["run", "--optimizer", "muon", "-o", "muon_momentum=-1", *TWO_STEPS], {},
     ["optimizer 'muon'", "muon_momentum", "[0, 1)"]),
    (["run", "--optimizer", "muon", "-o", "nesterov=maybe", *TWO_STEPS], {},
     ["optimizer 'muon'", "nesterov"]),
    (["sweep", "--workload", "gpt", "-w", "data=missing.bin", *SWEEP_TWO_STEPS], {},
     ["data", "missing.bin"]),
    (["sweep", "--workload", "mlp", "-w", "hiden=3", *SWEEP_TWO_STEPS], {},
     ["workload 'mlp'", "hiden", "hidden"]),
    (["run", "--strategy", "streaming-diloco", "-p", "H=100000", "-p", "fragments=100000",
      *TWO_STEPS], {}, ["streaming-diloco", "'fragments' is 100000"]),
    (["run", "--nodes", "2", "--net", "ideal", "--steps", "100000000000000000000"], {},
     ["steps: 100000000000000000000", "at most"]),
    (["sweep", "--nodes", "2", "--net", "ideal", "--steps", "100000000000000000000",
      "--no-plots"], {}, ["steps: 100000000000000000000", "at most"]),
]


@pytest.mark.parametrize("argv, files, names", REFUSED_UP_FRONT)
def test_options_and_sweep_points_are_refused_before_any_folder(here, capsys, argv, files,
                                                                names):
    for name, content in files.items():
        (here / name).write_text(content)
    before = folders(here)
    code, out, err = run_main(argv, capsys)
    assert code == 2, (argv, err)
    assert_one_line(err, *names)
    assert [p for p in folders(here) if p not in before and "__pycache__" not in p] == []


def test_exponents_without_a_dot_are_floats(here):
    """YAML 1.1 reads 1e-12 as text ("must be float"); YAML 1.2 and users read a float."""
    from exoframe.config import parse_assignments, resolve_config
    from exoframe.engine.plan.resolve import resolve_names

    (here / "c.yaml").write_text("lr: 1e-3\nstrategy: sparta\nstrategy_params: {p: 1E-12}\n")
    config = resolve_config("c.yaml", {"strategy_params": parse_assignments(["p=2e-12"], "-p")})
    assert config.lr == 1e-3
    assert resolve_names(config).strategy_params.p == 2e-12


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory):
    """A run of 8 steps with its checkpoint at step 8."""
    out = tmp_path_factory.mktemp("runs")
    result = CliRunner().invoke(exoframe_cli, [
        "run", "--workload", "mlp", "--nodes", "2", "--compute", "fixed:10ms", "--steps", "8",
        "--checkpoint-every", "4", "--no-progress", "--out", str(out),
        "--hang-timeout", "20"])  # (bounds the hang a resume of too few rows once was)
    assert result.exit_code == 0, result.output
    return only_run(out)


def edit_checkpoint(run, change):
    path = run / "checkpoints" / "step-8" / "launcher.json"
    state = json.loads(path.read_text())
    change(state)
    path.write_text(json.dumps(state))


def _fewer_rows(run):
    edit_checkpoint(run, lambda state: state.update(rows=state["rows"][:5]))
    return "holds 5 rows that are not the rows of steps 1..8"


def _rows_again(run):
    edit_checkpoint(run, lambda state: state.update(rows=state["rows"] + state["rows"][:5]))
    return "holds 13 rows that are not the rows of steps 1..8"


def _no_config(run):
    """As the version before the config and model were recorded wrote it."""
    def drop(state):
        del state["run"]["config"], state["run"]["model"]
    edit_checkpoint(run, drop)


def _no_config_another_optimizer(run):
    _no_config(run)
    config = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(config.replace("optimizer: adamw", "optimizer: sgd"))
    return "records no config .* has betas=.* optimizer 'sgd' has no betas"


def _no_config_another_weight_decay(run):
    _no_config(run)
    config = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(config.replace("weight_decay: 0.0", "weight_decay: 0.1"))
    return "records no config .* has weight_decay=0.0, .* 'adamw' has weight_decay=0.1"


def _no_config_another_model(run):
    _no_config(run)
    config = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(config.replace("workload_params: {}",
                                                    "workload_params: {hidden: 64}"))
    return "records no config .* model's tensors are named or shaped otherwise"


@pytest.mark.parametrize("damage", [_fewer_rows, _rows_again, _no_config_another_optimizer,
                                    _no_config_another_weight_decay, _no_config_another_model])
def test_a_resume_checks_the_checkpoints_rows_and_the_state_it_holds(tmp_path, capsys,
                                                                    checkpointed, damage):
    run = tmp_path / "run"
    shutil.copytree(checkpointed, run)
    expected = damage(run)
    before = {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}
    code, out, err = run_main(["resume", run, "--steps", "12"], capsys)
    assert code == 2, err
    assert_one_line(err, f"checkpoint {run / 'checkpoints' / 'step-8'}")
    assert re.search(expected, err), err
    assert {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()} == before


def test_a_checkpoint_without_a_config_resumes_when_it_holds_this_runs_state(tmp_path,
                                                                              checkpointed):
    run = tmp_path / "run"
    shutil.copytree(checkpointed, run)
    _no_config(run)
    result = CliRunner().invoke(exoframe_cli, ["resume", str(run), "--steps", "10"])
    assert result.exit_code == 0, result.output
    assert [json.loads(line)["step"] for line in metric_lines(run)] == list(range(1, 11))

# Round 4 (issue 40): memory bounded by input, sockets on the given address

def test_a_token_file_that_shrinks_under_a_run_is_named(cli):
    import numpy as np
    tokens = cli.cwd / "ids.bin"
    (np.arange(200_000) % 50).astype(np.uint16).tofile(tokens)
    proc = cli.popen("run", "--workload", "gpt", "-w", "data=ids.bin", "-w", "block_size=16",
                     "--nodes", "2", *LONG, "--no-progress", "--out", "runs")
    try:
        wait_for_steps(cli)
        os.truncate(tokens, 64)
    finally:
        finish(proc)
    assert proc.returncode == 2, proc.stderr_text
    assert "Traceback" not in proc.stderr_text
    line = last_line(proc)
    assert "ids.bin" in line and "shrank" in line and "NaN" not in line, line
    assert cli.leftovers() == []


def test_ranks_started_by_hand_listen_on_loopback_and_publish_no_token(cli):
    """RANK/WORLD_SIZE/MASTER_ADDR=127.0.0.1 without torchrun: rank 0 serves the rendezvous
    store itself (torch's TCPStore would listen on every interface), and the run's token is
    not in it, where any local process could read it."""
    import datetime
    import torch.distributed as dist
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    ranks = [cli.popen("run", "--net", "real", "--nodes", "2", *LONG, *MLP,
                       env={**env, "RANK": str(rank)}) for rank in (0, 1)]
    try:
        wait_for_steps(cli)
        sockets = [s for pid in cli.leftovers() for s in listening(pid)]
        assert sockets and all(is_loopback(address) for address, _ in sockets), sockets
        store = dist.PrefixStore("exoframe/none/0/", dist.TCPStore(
            "127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=HANG_GUARD)))
        published = json.loads(store.get("service"))
        assert "token" not in published, published
    finally:
        ranks[0].send_signal(signal.SIGINT)
        for rank in ranks:
            finish(rank)
    assert ranks[0].returncode == 130, ranks[0].stderr_text
    assert cli.leftovers() == []


def capped_memory():
    """A safety net under the memory tests: a process past 2 GB of address space fails to
    allocate (before the estimates, these cases took all the machine's memory)."""
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


@pytest.mark.parametrize("source", ["uint32-file", "saved-dataset"])
def test_one_huge_token_id_is_refused_before_the_model_is_built(cli, source):
    """One id of 4e9 makes a vocabulary whose embedding alone is ~1 TB."""
    import numpy as np
    tokens = np.arange(4000) % 50
    tokens[7] = 4_000_000_000
    if source == "uint32-file":
        tokens.astype(np.uint32).tofile(cli.cwd / "ids.bin")
        data = ["-w", "data=ids.bin", "-w", "dtype=uint32"]
    else:
        datasets = pytest.importorskip("datasets")
        datasets.Dataset.from_dict({"input_ids": [tokens[:2000], tokens[2000:]]}).save_to_disk(
            str(cli.cwd / "ids"))
        data = ["-w", "data=ids"]
    proc = cli.popen("run", "--workload", "gpt", *data, "--steps", "2", "--no-progress",
                     "--out", "runs", preexec_fn=capped_memory)
    finish(proc)
    assert proc.returncode == 2, proc.stderr_text
    assert_one_line(proc.stderr_text, "data: the largest token id 4000000000 makes a "
                    "vocabulary of 4000000001", "GB free")
    assert not (cli.cwd / "runs").exists()


def test_nodes_times_the_model_beyond_free_memory_are_refused(cli):
    """1024 nodes of a 100 MB model, each with its gradients and AdamW's state: ~600 GB."""
    proc = cli.popen("run", "--nodes", "1024", "-w", "hidden=5000", "--steps", "2", *MLP,
                     preexec_fn=capped_memory)
    finish(proc)
    assert proc.returncode == 2, proc.stderr_text
    assert_one_line(proc.stderr_text, "workload 'mlp'", "1024 nodes with adamw's state",
                    "GB free", "--nodes")
    assert not (cli.cwd / "runs").exists()


@pytest.mark.parametrize("argv, names", [
    (["--workload", "mlp", "-w", "train_examples=10000000000"], ["train_examples", "examples"]),
    (["--workload", "image", "-w", "train_examples=1000000000"], ["train_examples", "images"]),
    (["--workload", "gpt", "-w", "train_tokens=100000000000"], ["train_tokens", "tokens"]),
    (["--workload", "gpt", "-w", "vocab_size=1000", "-w", "order=5"], ["1000^6 transitions"]),
], ids=["mlp-examples", "image-examples", "markov-tokens", "markov-table"])
def test_generated_data_beyond_free_memory_is_refused_before_it_is_made(cli, argv, names):
    proc = cli.popen("run", *argv, "--steps", "2", "--no-progress", "--out", "runs",
                     preexec_fn=capped_memory)
    finish(proc)
    assert proc.returncode == 2, proc.stderr_text
    assert_one_line(proc.stderr_text, *names, "GB free")
    assert not (cli.cwd / "runs").exists()


@pytest.mark.parametrize("kind", ["text", "saved-dataset"])
def test_data_read_whole_is_sized_before_it_is_read(here, capsys, monkeypatch, kind):
    """Text numbered by character and a saved dataset's ids are read whole: here against a
    machine with 1 kB free (the files are small; what they would take is not)."""
    if kind == "text":
        (here / "book.txt").write_text("to be or not to be\n" * 100)
        data = "book.txt"
    else:
        datasets = pytest.importorskip("datasets")
        datasets.Dataset.from_dict({"input_ids": [list(range(500))] * 4}).save_to_disk(
            str(here / "ids"))
        data = "ids"
    capsys.readouterr()  # (datasets' progress bar)
    monkeypatch.setattr("exoframe.host_memory.free_bytes", lambda: 1000)
    before = folders(here)
    code, _, err = run_main(["run", "--workload", "gpt", "-w", f"data={data}", "--steps", "2",
                             "--no-progress"], capsys)
    assert code == 2
    assert_one_line(err, "data: ", f"'{data}'", "this machine has 0 MB free")
    assert folders(here) == before
