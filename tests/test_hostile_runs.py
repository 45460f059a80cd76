"""Hostile input and hostile machines: foreign clients, stopped ranks, signals, diverging
losses and stray modules. Every run here is a real `exoframe run` with real ranks."""
import json
import os
import signal
import socket
import stat
import textwrap
import threading
import time
from pathlib import Path

import pytest
from conftest import REPO, write_plugin

MLP = ["--workload", "mlp", "--no-progress", "--out", "runs"]
LONG = ["--steps", "100000"]
HANG_GUARD = 120  # seconds; a guard against hangs, never a speed requirement


def strict_json(path: Path):
    def refuse(constant):
        raise ValueError(f"{path}: bare {constant} is not JSON")
    return json.loads(path.read_text(), parse_constant=refuse)


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
    proc = cli.popen("run", "--nodes", "3", *LONG, *MLP, env={"EXOFRAME_WATCHDOG_SECONDS": "3"})
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


def test_a_stuck_rank_is_named_by_the_watchdog(cli):
    write_plugin(cli.cwd, "stuck-plugin", "stuck", STUCK)
    proc = cli("run", "--strategy", "stuck", "--nodes", "3", "--steps", "10", *MLP,
               env={"EXOFRAME_WATCHDOG_SECONDS": "2"})
    assert proc.returncode == 1, proc.stderr_text
    assert "Traceback" not in proc.stderr_text
    line = last_line(proc)
    assert line.startswith("error: watchdog: no progress for 2 s: rank 2 made no progress; "
                           "rank 0 waits for "), line
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


CRASHY = textwrap.dedent('''
    import exoframe
    from exoframe.strategies import DDP

    class Crashy(DDP):
        """Fails on rank 1 at step 4."""
        def step(self):
            if self.rank == 1 and self.step_num == 4:
                raise RuntimeError("boom on rank one")
            super().step()

    @exoframe.hookimpl
    def exoframe_register_strategies(register):
        register("crashy", Crashy)
''')


def test_a_failed_run_writes_a_failed_summary_with_every_finished_row(cli):
    write_plugin(cli.cwd, "crashy-plugin", "crashy", CRASHY)
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
    assert "loss became NaN at step 3 on rank " in line and "EXOFRAME_ALLOW_NONFINITE=1" in line
    assert cli.leftovers() == []
    result = summary(cli)
    assert result["status"] == "failed"
    assert [r["step"] for r in result["rows"]] == [1, 2][:len(result["rows"])]


def test_a_nan_loss_may_be_allowed_and_the_files_stay_strict_json(cli):
    (cli.cwd / "diverging.py").write_text(DIVERGING)
    proc = cli("run", "--nodes", "2", "--steps", "6", "--workload", "diverging:make",
               "--no-progress", "--out", "runs", env={"EXOFRAME_ALLOW_NONFINITE": "1"})
    assert proc.returncode == 0, proc.stderr_text
    result = summary(cli)
    assert result["status"] == "completed" and result["final_loss"] is None
    strict_json(run_folder(cli) / "trace.json")
    assert cli.leftovers() == []


def test_a_bad_watchdog_setting_is_one_line(cli):
    proc = cli("run", "--nodes", "2", "--steps", "2", *MLP,
               env={"EXOFRAME_WATCHDOG_SECONDS": "soon"})
    assert proc.returncode == 2
    assert proc.stderr_text.strip() == ("error: EXOFRAME_WATCHDOG_SECONDS: expected a positive "
                                        "number of seconds like 120; got 'soon'. Fix or unset it.")
    assert cli.leftovers() == []


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
