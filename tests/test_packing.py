"""Many nodes per worker process (engine/node/packing.py): the packing changes nothing a run
computes, each node is charged its own compute, and a failing node stops the run."""
import json
import os
import random
import time
import dataclasses
from dataclasses import dataclass

import pytest
import torch
from conftest import helper_processes

import exoframe
from exoframe import testing
from exoframe.comm.memory import fold
from exoframe.config import RunConfig
from exoframe.engine import execute, job_from_config
from exoframe.engine.launch.launcher import RankFailed
from exoframe.engine.plan.placement import Machine, max_workers, nodes_per_process, packed, place
from exoframe.errors import ExoframeError, RunStopped


def run(strategy, params, packing, nodes=16, steps=6, eval_every=3, **fit):
    return testing.run(strategy, params, nodes=nodes, steps=steps, net="wan-100mbps",
                       compute="fixed:10ms", nodes_per_process=packing, eval_every=eval_every,
                       in_process=False, **fit)


def simulated_clocks(said: dict) -> list:
    """The run's simulated clock and each rank's (fixed compute: the network model's output)."""
    return [said["simulated_seconds"], *(r["simulated_seconds"] for r in said["per_rank"])]


@pytest.mark.parametrize("strategy,params,length", [
    ("ddp", {}, {}), ("diloco", {"H": 2}, {}), ("gossip", {}, {}),
    ("param-server", {"servers": 3}, {}),
    # 11 steps without a wait: packed nodes take turns of several steps (STEPS_PER_TURN)
    ("localsgd", {"H": 12}, {"steps": 25, "eval_every": 25})])
def test_a_run_is_the_same_whatever_the_packing(strategy, params, length):
    """1 node per process (16 workers), 16 per process (one), and uneven (5, 5, 5, 1): the
    same metrics, weights and simulated clocks, bit for bit; and the same, up to the order
    of floating-point sums, as a process per node exchanging through gloo."""
    runs = {packing: run(strategy, params, packing, **length) for packing in (1, 16, 5, None)}
    alone = runs[1]
    for packing in (16, 5):
        assert runs[packing].metrics == alone.metrics
        assert testing.max_difference(runs[packing], alone) == 0
        assert simulated_clocks(runs[packing].summary) == simulated_clocks(alone.summary)
        assert runs[packing].summary["bytes_sent_per_node"] == alone.summary["bytes_sent_per_node"]
    gloo = runs[None]
    assert simulated_clocks(gloo.summary) == simulated_clocks(alone.summary)
    assert [r["loss"] for r in gloo.metrics] == pytest.approx([r["loss"] for r in alone.metrics],
                                                             rel=1e-5)
    assert testing.max_difference(gloo, alone) < 1e-5


class Demanding(exoframe.Strategy):
    """Gives way inside no_grad, draws from torch's and Python's global generators, and
    changes a broadcast's source tensor as soon as its own wait returns."""

    @dataclass
    class Params:
        pass

    @torch.no_grad()
    def step(self):
        draw = torch.rand(1).item() + random.random()
        buffer = torch.full((3,), self.rank + draw)
        self.comm.broadcast(buffer, src=1)
        if self.rank == 1:
            buffer.add_(1000.0)
        self.comm.all_reduce(buffer)
        self.total = buffer.sum().item()
        self.optimizer.step()
        self.optimizer.zero_grad()

    def metrics(self):
        return {"total": self.total}


def test_what_a_node_keeps_of_the_process_is_its_own():
    runs = [testing.run(Demanding, {}, nodes=4, steps=3, compute="fixed:1ms",
                        nodes_per_process=packing, in_process=False) for packing in (1, 4, None)]
    assert runs[0].metrics == runs[1].metrics
    assert [r["total"] for r in runs[1].metrics] == \
        pytest.approx([r["total"] for r in runs[2].metrics], rel=1e-6)
    assert testing.max_difference(runs[1], runs[2]) < 1e-6


def test_reductions_add_in_rank_order():
    """A sum of float32 parts whose value depends on the order: rank order, as a loop does."""
    parts = [torch.tensor([1e8]), torch.tensor([1.0]), torch.tensor([-1e8]), torch.tensor([1.0])]
    expected = torch.tensor([0.0])
    for part in parts:
        expected += part
    assert expected.item() == 1.0  # (1e8 + 1 rounds to 1e8 in float32)
    assert fold(None, parts, "sum").item() == 1.0
    assert fold(fold(None, parts[:1], "sum"), parts[1:], "sum").item() == 1.0  # in a chain
    assert fold(None, parts[::-1], "sum").item() == 0.0  # another order, another sum
    weights = [torch.nn.Parameter(torch.tensor([float(r), -float(r)])) for r in range(3)]
    for op, expected in (("max", [2.0, 0.0]), ("min", [0.0, -2.0]), ("sum", [3.0, -3.0])):
        total = fold(None, weights, op)  # (parameters: as gloo's, no graph is recorded)
        assert total.tolist() == expected and not total.requires_grad


def test_a_lone_workers_reductions_stay_in_its_memory(monkeypatch):
    """One worker (here: --in-process) folds its nodes' parts and keeps the result where they
    are: no host copy (on a GPU, a DiLoCo sync of an 85M model spent 0.67 s in one)."""
    def no_copy(tensor):
        raise AssertionError("a lone worker's exchange left its device")
    monkeypatch.setattr("exoframe.comm.memory.to_bytes", no_copy)
    for strategy, params in (("ddp", {}), ("diloco", {"H": 2})):
        run = testing.run(strategy, params, nodes=3, steps=4, compute="fixed:1ms")
        assert len(run.metrics) == 4


class Unequal(exoframe.Strategy):
    """Rank r spends (r + 1) × 30 ms of its thread's CPU time in each step."""

    @dataclass
    class Params:
        pass

    def step(self):
        end = time.thread_time() + 0.03 * (self.rank + 1)
        while time.thread_time() < end:
            pass
        self.optimizer.step()
        self.optimizer.zero_grad()


def test_measured_compute_is_each_nodes_own_time():
    """Four nodes in one process, computing 30, 60, 90 and 120 ms a step: each is charged
    at least its own work and not the others' (CPU time: a busy machine changes nothing)."""
    result = testing.run(Unequal, {}, nodes=4, steps=3, compute="measured",
                         nodes_per_process=4, in_process=False)
    compute = [r["compute_seconds"] for r in result.summary["per_rank"]]
    for rank, seconds in enumerate(compute):
        assert seconds >= 3 * 0.03 * (rank + 1)
    assert compute[0] < 3 * 0.06  # less than rank 1's work alone: nobody else's counted
    assert compute[3] < sum(compute[:3])


class FailsOnRankTwo(exoframe.Strategy):
    @dataclass
    class Params:
        pass

    def step(self):
        if self.rank == 2 and self.step_num == 2:
            raise RuntimeError("rank two broke")
        self.comm.all_reduce(torch.zeros(3))
        self.optimizer.step()


def test_a_failing_node_stops_the_run_naming_its_rank():
    config = RunConfig(workload="mlp", nodes=6, steps=5, compute="fixed:1ms",
                       nodes_per_process=3).validate()
    job = dataclasses.replace(job_from_config(config), strategy_cls=FailsOnRankTwo,
                              strategy_params=FailsOnRankTwo.Params())
    with pytest.raises(RunStopped, match="rank 2: RuntimeError: rank two broke") as failed:
        execute(job)
    assert isinstance(failed.value.__cause__, RankFailed) and failed.value.status == "failed"
    assert "FailsOnRankTwo" in failed.value.details or "rank two broke" in failed.value.details
    assert not [p for p in os.listdir("/proc") if p.isdigit()
                and _parent(int(p)) == os.getpid() and _alive(int(p))
                and int(p) not in helper_processes()]


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def test_the_packing_is_chosen_from_the_node_count_and_the_cores():
    assert nodes_per_process(8, None, cores=2) == 1  # a process per node
    assert nodes_per_process(9, None, cores=2) == 5  # a worker per core
    assert nodes_per_process(1024, None, cores=2) == 512
    assert nodes_per_process(1024, None, cores=16) == 64
    assert nodes_per_process(48, None, cores=16) == 3  # (a process per node up to 32)
    if max_workers() == 64:  # (fewer where few files may be open)
        assert nodes_per_process(1024, None, cores=256) == 16
    assert nodes_per_process(4, 16, cores=2) == 4
    assert packed(10, 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_a_placement_is_each_nodes_process_device_and_backend():
    machine = Machine(cores=2)
    packed_nodes = place(10, 4, "cpu", real_network=False, machine=machine)
    assert packed_nodes.packed and packed_nodes.nodes_per_process == 4
    assert packed_nodes.groups == ((0, 1, 2, 3), (4, 5, 6, 7), (8, 9))
    assert [packed_nodes.device_of(r) for r in (0, 9)] == [torch.device("cpu")] * 2
    assert packed_nodes.backend == "gloo"
    one_each = place(3, None, "cpu", real_network=False, machine=machine)
    assert not one_each.packed and one_each.groups == ((0,), (1,), (2,))
    assert place(12, None, "cpu", real_network=True,
                 machine=machine).groups == tuple((r,) for r in range(12))


@pytest.mark.parametrize("fields,message", [
    ({"nodes_per_process": 0}, "nodes_per_process must be at least 1, got 0."),
    ({"nodes_per_process": 2, "net": "real"}, "nodes_per_process: packed nodes run in turn"),
    ({"in_process": True, "net": "real"}, "in_process: the nodes run in turn in one process"),
    ({"in_process": True, "nodes_per_process": 2}, "in_process: every node runs in this "
                                                   "process, as one worker; drop "
                                                   "nodes_per_process or give it 4"),
    ({"offload": True}, "offload: nodes' state moves between a CUDA GPU and host memory, and "
                        "these nodes train on"),
    ({"nodes_per_process": 1, "nodes": 1000}, "nodes_per_process: 1000 nodes at 1 per process "
                                              "make more than {workers} workers.*give at least "
                                              "{least},"),
])
def test_bad_packing_is_one_clear_line(fields, message):
    workers = max_workers()  # (64, or fewer where few files may be open)
    message = message.format(workers=workers, least=-(-1000 // workers))
    with pytest.raises(ExoframeError, match=message):
        job_from_config(RunConfig(workload="mlp", **{"nodes": 4, **fields}).validate())


def test_a_packed_runs_trace_replays_as_a_packed_rerun():
    """The trace of packed nodes replays through another network as a packed run on it."""
    from exoframe.experiments.run_replays import replay_trace
    from exoframe.plugins import get_plugin_manager
    from exoframe.sim import resolve_sim

    runs = {net: testing.run("diloco", {"H": 2}, nodes=8, steps=4, net=net,
                             compute="fixed:10ms", nodes_per_process=3, in_process=False)
            for net in ("wan-10mbps", "geo-2dc")}
    replayed = replay_trace(runs["wan-10mbps"].trace,
                            resolve_sim("geo-2dc", "measured", "", 8, get_plugin_manager()))
    rerun = runs["geo-2dc"]
    assert [r["simulated_seconds"] for r in replayed["per_rank"]] == \
        pytest.approx([r["simulated_seconds"] for r in rerun.summary["per_rank"]], rel=1e-9)
    assert rerun.summary["simulated_seconds"] != runs["wan-10mbps"].summary["simulated_seconds"]


def test_the_cli_takes_the_packing_and_records_it(tmp_path, capsys):
    from exoframe.cli import main

    main(["run", "--workload", "mlp", "--strategy", "diloco", "-p", "H=2", "--nodes", "6",
          "--steps", "4", "--compute", "fixed:10ms", "--nodes-per-process", "4",
          "--no-progress", "--out", str(tmp_path)])
    [folder] = tmp_path.glob("*")
    said = json.loads((folder / "summary.json").read_text())
    assert len(said["per_rank"]) == 6
    assert "nodes_per_process: 4" in (folder / "config.yaml").read_text()
