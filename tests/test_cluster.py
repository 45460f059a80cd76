"""Runs across machines under torchrun (engine/launch/cluster.py) and the transports that carry a
rank's messages (sim/clocks/transport.py): real torchrun agents on loopback, compared with the
local fork run of the same config."""
from __future__ import annotations

import glob
import io
import json
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from conftest import one_line_error

from exoframe import testing
from exoframe.engine.ipc.messages import Hello, Rendezvous, StepDone
from exoframe.errors import ExoframeError
from exoframe.sim.clocks.protocol import (Listen, Mail, Op, Post, Probe, Probed, Quorum, Quorumed,
                                          StepEnd, Wait, Waited)
from exoframe.sim.clocks.transport import Listener, TransportError, connect, in_process
from exoframe.strategies.ddp import DDP
from exoframe.workloads.mlp import mlp

MESSAGES = [
    Op(0.25, 3, ("c", (0, 1, 2), 7), "all_reduce", 4096.0, (0, 1, 2), 0, True),
    Wait(1.5, 3), Probe(1.5, 4), Quorum(2.0, 1, None), Quorum(2.0, 2, 9.5),
    Post(3.0, 0, 2, 128.0), Listen(3.0), Listen(3.5, 4, False),
    Waited(2.0, 0.25, 0.5), Probed(True), Quorumed(2.5, (0, 2), (1,)),
    Mail(4.0, 0.5, 0.5, ((1, 0, 128.0),), (b"\x00payload",)),
    Hello(1, 4, "host-b", "0.1.0", {"steps": 5, "net": "wan-100mbps"}, "cpu"),
    Rendezvous(None, 360.0, "gloo", ("127.0.0.1", 29500, "exoframe/run/0/")),
    StepDone(2, 7, StepEnd(3.5, 7), {"loss": 1.25, "sim_time": 3.5}, None),
]


def tcp_pair(token: bytes = b"the run's token"):
    listener = Listener("127.0.0.1", token)
    accepted = []
    thread = threading.Thread(target=lambda: accepted.append(listener.accept()))
    thread.start()
    client = connect(*listener.address, token, timeout=30)
    thread.join()
    listener.close()
    return accepted[0], client


def pipe_pair():
    return mp.Pipe()


@pytest.mark.parametrize("make_pair", [in_process, pipe_pair, tcp_pair],
                         ids=["in-process", "pipe", "tcp"])
def test_typed_messages_round_trip_every_transport(make_pair):
    """Every message, queued before any is read: none lost, none reordered, each equal to
    what was sent and of its type; then echoed back the same way."""
    a, b = make_pair()
    assert not b.poll(0)
    for message in MESSAGES:
        a.send(message)
    got = []
    while b.poll(0.5 if len(got) < len(MESSAGES) else 0):
        got.append(b.recv())
    assert [type(m) for m in got] == [type(m) for m in MESSAGES] and got == MESSAGES
    for message in got:
        b.send(message)
    assert [a.recv() for _ in MESSAGES] == MESSAGES
    assert not a.poll(0) and not b.poll(0)


def test_a_listener_ignores_garbage_and_a_wrong_token_then_serves_the_right_one():
    listener = Listener("127.0.0.1", b"right token")
    log = io.StringIO()
    raw = socket.create_connection(listener.address)
    raw.sendall(os.urandom(200))
    assert listener.accept(log=log) is None
    raw.close()
    refused = []
    wrong = threading.Thread(target=lambda: refused.append(
        pytest.raises(TransportError, connect, *listener.address, b"wrong token", 30)))
    wrong.start()
    assert listener.accept(log=log) is None
    wrong.join()
    assert "refused the handshake" in str(refused[0].value)
    said = log.getvalue().splitlines()
    assert len(said) == 2 and all("did not present this run's token" in line for line in said)
    accepted = []
    right = threading.Thread(target=lambda: accepted.append(listener.accept(log=log)))
    right.start()
    client = connect(*listener.address, b"right token", 30)
    right.join()
    client.send(MESSAGES[0])
    assert accepted[0].recv() == MESSAGES[0]
    listener.close()


# -- torchrun -------------------------------------------------------------------------------
COMMON = ["--workload", "mlp", "--net", "wan-100mbps", "--compute", "fixed:50ms",
          "--eval-every", "2"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def exoframe_env() -> dict:
    env = dict(os.environ)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                 "EXOFRAME_TOKEN"):
        env.pop(name, None)
    return env


def start_agents(out: Path, args_per_agent: list[list[str]], cwd=None) -> list[subprocess.Popen]:
    """Two torchrun agents on this machine, 2 ranks each, rendezvous on loopback."""
    port = free_port()
    return [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node",
         "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
         "--rdzv-id", f"test{port}", "-m", "exoframe", "run", "--out", str(out), *args],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=exoframe_env()) for args in args_per_agent]


def finish(agents) -> list[tuple[int, str]]:
    try:
        return [(agent.wait(timeout=600), agent.stdout.read()) for agent in agents]
    finally:  # a hang guard, not a speed limit: no agent outlives the test
        for agent in agents:
            agent.kill()
            agent.wait()


def fork_run(out: Path, args: list[str]):
    done = subprocess.run([sys.executable, "-m", "exoframe", "run", "--nodes", "4", "--out",
                           str(out), *args], capture_output=True, text=True, timeout=600,
                          env=exoframe_env())
    assert done.returncode == 0, done.stderr


def rows(out: Path) -> list[dict]:
    [path] = glob.glob(str(out / "*" / "metrics.jsonl"))
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def summary(out: Path) -> dict:
    [path] = glob.glob(str(out / "*" / "summary.json"))
    return json.loads(Path(path).read_text())


def test_torchrun_diloco_equals_the_fork_run(tmp_path):
    args = [*COMMON, "--strategy", "diloco", "--steps", "6", "-p", "H=2"]
    results = finish(start_agents(tmp_path / "torchrun", [args, args]))
    assert all(code == 0 for code, _ in results), results
    fork_run(tmp_path / "fork", args)
    assert rows(tmp_path / "torchrun") == rows(tmp_path / "fork")
    torchrun, fork = summary(tmp_path / "torchrun"), summary(tmp_path / "fork")
    assert torchrun["num_nodes"] == 4
    assert simulated_clocks(torchrun) == simulated_clocks(fork)


def simulated_clocks(said: dict) -> list:
    """The run's simulated clock and each rank's: the network model's output (fixed compute),
    the same on any machine however fast; not a measured time."""
    return [said["simulated_seconds"], *(r["simulated_seconds"] for r in said["per_rank"])]


def descendants(pid: int) -> list[int]:
    found = [pid]
    for children in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            found += [d for child in Path(children).read_text().split()
                      for d in descendants(int(child))]
        except OSError:
            pass
    return found


def listening_ports(pids: list[int]) -> set[int]:
    """The TCP ports these processes listen on (from /proc: Linux only)."""
    inodes = set()
    for pid in pids:
        for fd in glob.glob(f"/proc/{pid}/fd/*"):
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def send_garbage(port: int):
    for junk in (os.urandom(4096), b"GET / HTTP/1.0\r\n\r\n", b"\x00" * 64):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(junk)
        except OSError:
            pass


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_torchrun_ddp_equals_the_fork_run_with_garbage_sent_to_every_port(tmp_path):
    """While the run goes, raw connections send garbage to every port its processes listen
    on (the rendezvous, torchrun's store, gloo's): the run goes on, unchanged."""
    args = [*COMMON, "--strategy", "ddp", "--steps", "400", "--eval-every", "100"]
    out = tmp_path / "torchrun"
    agents = start_agents(out, [args, args])
    # Until the first step's row: every rank has joined and trains. (A run that hangs ends
    # by its own guards, --connect-timeout and --hang-timeout: the agents then exit.)
    while not any(Path(p).stat().st_size for p in glob.glob(str(out / "*" / "metrics.jsonl"))):
        assert all(a.poll() is None for a in agents), finish(agents)
        time.sleep(0.1)
    ports = listening_ports([p for a in agents for p in descendants(a.pid)])
    for port in ports:
        send_garbage(port)
    results = finish(agents)
    assert all(code == 0 for code, _ in results), results
    assert len(ports) >= 3, ports  # the rendezvous, the agent's store, gloo's
    fork_run(tmp_path / "fork", args)
    assert rows(out) == rows(tmp_path / "fork")


def test_torchrun_refuses_ranks_started_with_different_steps(tmp_path):
    results = finish(start_agents(tmp_path, [[*COMMON, "--steps", "3"],
                                              [*COMMON, "--steps", "4"]]))
    assert all(code != 0 for code, _ in results)
    said = "".join(output for _, output in results)
    assert "was started with steps=4 where rank 0 has steps=3: start every rank with the " \
           "same command and config." in said, said


def test_real_network_under_torchrun_reports_measured_times(tmp_path):
    args = ["--workload", "mlp", "--strategy", "ddp", "--net", "real", "--steps", "5"]
    results = finish(start_agents(tmp_path, [args, args]))
    assert all(code == 0 for code, _ in results), results
    said = summary(tmp_path)
    assert said["real_network"] and len(said["per_rank"]) == 4
    # A ring all-reduce of the gradients per step: each of n ranks sends 2(n-1)/n of them.
    gradient_bytes = 4 * sum(p.numel() for p in mlp().build_model().parameters())
    # (How the measured times compare with the launch's: benchmarks/real_network.py.)
    for rank in said["per_rank"]:
        assert rank["compute_seconds"] > 0  # the timer counted the training
        assert rank["bytes_sent"] == 5 * round(2 * 3 / 4 * gradient_bytes)


def test_a_wrong_master_port_is_one_clear_line(tmp_path):
    port = free_port()  # nothing listens there
    env = {**exoframe_env(), "RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "TORCHELASTIC_USE_AGENT_STORE": "True"}
    done = subprocess.run([sys.executable, "-m", "exoframe", "run", "--workload", "mlp",
                           "--connect-timeout", "2", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"error: rank 1: could not reach the rendezvous store: could not connect to "
        f"127.0.0.1:{port} within 2 s (Connection refused) (--connect-timeout): check "
        "MASTER_ADDR and MASTER_PORT (torchrun's --rdzv-endpoint) and that rank 0's machine "
        "is up."]


# -- the divergence check -------------------------------------------------------------------
class DriftsOnRankOne(DDP):
    """DDP, but rank 1 nudges one weight after the synchronization of step 3."""

    def step(self):
        super().step()
        if self.rank == 1 and self.step_num == 3:
            with torch.no_grad():
                next(self.model.parameters()).view(-1)[0] += 1e-6


def test_ranks_that_drift_apart_after_a_synchronization_stop_the_run():
    with pytest.raises(ExoframeError) as stopped:
        testing.run(DriftsOnRankOne, nodes=3, steps=6)
    assert str(stopped.value) == (
        "divergence check: ranks diverged: after the synchronization of step 3, rank(s) 1 "
        "hold parameters that differ from rank 0's, where driftsonrankone leaves every rank "
        "equal (their checksums differ): a rank computed differently (a nondeterministic "
        "operation), or the strategy changes a rank's parameters after synchronizing.")
    assert stopped.value.rows and [r["step"] for r in stopped.value.rows] == [1, 2]


CRASHES_ON_RANK_3 = '''
import torch
from exoframe import distributed
from exoframe.workloads.mlp import mlp


class Crashes(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner, self.calls = inner, 0

    def forward(self, batch):
        self.calls += 1
        if distributed._comm is not None and distributed.get_rank() == 3 and self.calls == 3:
            raise RuntimeError("boom on rank 3")
        return self.inner(batch)


def make():
    workload = mlp()
    build = workload.build_model
    workload.build_model = lambda: Crashes(build())
    return workload
'''


def test_a_rank_that_dies_under_torchrun_is_named_with_its_host(tmp_path):
    (tmp_path / "crashy.py").write_text(CRASHES_ON_RANK_3)
    args = ["--workload", "crashy:make", "--steps", "20"]  # found in cwd
    results = finish(start_agents(tmp_path / "runs", [args, args], cwd=tmp_path))
    assert all(code != 0 for code, _ in results)
    said = "".join(output for _, output in results)
    assert f"error: rank 3 on {socket.gethostname()}: RuntimeError: boom on rank 3" in said, said
    summary_file, = glob.glob(str(tmp_path / "runs" / "*" / "summary.json"))
    assert json.loads(Path(summary_file).read_text())["status"] == "failed"


def test_a_run_across_machines_needs_a_shared_token(capsys, monkeypatch):
    """torchrun's store is open to whoever reaches it: across machines the token must come
    from EXOFRAME_TOKEN, set on every machine, not from the store."""
    for name, value in {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "192.0.2.1",
                        "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("EXOFRAME_TOKEN", raising=False)
    err = one_line_error(capsys, "run", "--workload", "mlp", "--steps", "2")
    assert err.startswith("error: EXOFRAME_TOKEN: a run across machines needs a shared secret")
