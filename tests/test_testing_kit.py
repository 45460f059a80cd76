"""exoframe.testing, as a plugin author uses it: a new strategy checked against a built-in in
a few lines, its step() unit-tested without processes, a collective timed on a network."""
import math
import os
import threading
from dataclasses import dataclass

import numpy
import pytest
import torch

import exoframe.distributed
from exoframe import ExoframeError, testing
from exoframe.builtins import STRATEGIES
from exoframe.strategies import LocalSGD


class FedProx(LocalSGD):
    """Local SGD whose local steps add the proximal term mu·(θ − θ_last_average)."""

    @dataclass
    class Params:
        H: int = 10
        mu: float = 0.01

    def setup(self):
        super().setup()
        self.anchor = [p.detach().clone() for p in self.trainable_parameters()]

    def step(self):
        for p, anchor in zip(self.trainable_parameters(), self.anchor):
            p.grad.add_(p.detach() - anchor, alpha=self.params.mu)
        super().step()
        if self.step_num % self.params.H == 0:
            self.anchor = [p.detach().clone() for p in self.trainable_parameters()]


def test_fedprox_with_mu_0_is_localsgd():
    fedprox = testing.run(FedProx, {"H": 3, "mu": 0.0}, nodes=3, steps=9)
    localsgd = testing.run("localsgd", {"H": 3}, nodes=3, steps=9)
    assert testing.max_difference(fedprox, localsgd) < 1e-6
    pulled = testing.run(FedProx, {"H": 3, "mu": 1.0}, nodes=3, steps=9)
    assert testing.max_difference(pulled, localsgd) > 1e-3  # the term does something


def test_a_strategys_step_unit_tested_without_processes():
    strategy = testing.solo(FedProx, {"H": 100, "mu": 0.5}, lr=0.1)
    weight = strategy.model.net[0].weight
    start = weight.detach().clone()
    with torch.no_grad():
        weight.add_(1.0)  # move away from the anchor, then take a step with no loss gradient
    for p in strategy.model.parameters():
        p.grad = torch.zeros_like(p)
    strategy.step_num = 1
    strategy.step()
    # SGD on the proximal term alone: θ ← θ − lr·mu·(θ − anchor)
    assert torch.allclose(weight, start + 1.0 - 0.1 * 0.5 * 1.0)


@pytest.mark.parametrize("nodes", [2, 4, 5])
def test_time_collective_is_the_closed_form(tmp_path, nodes):
    net = tmp_path / "net.yaml"
    net.write_text("bandwidth: 1gbit\nlatency: 2ms\nprotocol: none\n")
    size, bandwidth, latency = 4e7, 1.25e8, 0.002
    expected = 2 * (nodes - 1) * (latency + size / (nodes * bandwidth))
    assert testing.time_collective("all_reduce", nodes, size, str(net)) == pytest.approx(
        expected, rel=1e-9)
    # A binomial-tree broadcast: ranks finish round by round; the time is the last one's.
    rounds = math.ceil(math.log2(nodes))
    assert testing.time_collective("broadcast", nodes, size, str(net)) == pytest.approx(
        rounds * (latency + size / bandwidth), rel=1e-9)


class Contract(LocalSGD):
    """Records what the contract promises a strategy: total steps, lr and simulated time."""

    def metrics(self):
        return {"total": self.total_steps, "seen_lr": self.lr, "clock": self.sim_time}


def test_a_strategy_sees_total_steps_the_current_lr_and_its_simulated_time():
    result = testing.run(Contract, {"H": 2}, steps=4, compute="fixed:10ms", lr=0.2,
                         schedule="linear", min_lr_ratio=0.5)
    assert [row["total"] for row in result.metrics] == [4] * 4
    assert [row["seen_lr"] for row in result.metrics] == pytest.approx([0.2, 0.2 * 5 / 6,
                                                                        0.2 * 4 / 6, 0.1])
    assert [row["clock"] for row in result.metrics] == pytest.approx([0.01, 0.02, 0.03, 0.04])


def test_a_value_error_in_params_is_one_line_naming_the_strategy():
    class Picky(LocalSGD):
        @dataclass
        class Params:
            H: int = 1

            def __post_init__(self):
                if self.H > 3:
                    raise ValueError(f"H must be at most 3, got {self.H}")

    with pytest.raises(ExoframeError, match=r"^strategy 'Picky': H must be at most 3, got 5$"):
        Picky.parse_params({"H": 5})


# A few steps of every built-in strategy, with the parameters that make its steps differ.
WORLD_PARAMS = {"diloco": {"H": 2}, "localsgd": {"H": 2}, "streaming-diloco": {"H": 4},
                "sparta-diloco": {"H": 2}, "eager-diloco": {"H": 2}, "hier-diloco": {"H": 4},
                "sparseloco": {"H": 2}, "noloco": {"H": 2}, "param-server": {"servers": 2}}


def per_rank_clocks(result) -> list:
    return [result.summary["simulated_seconds"],
            *(r["simulated_seconds"] for r in result.summary["per_rank"])]


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_the_test_world_equals_forked_nodes_for_every_built_in_strategy(name):
    """testing.run's nodes, in this process, against the same nodes forked into a worker:
    the same rows, weights, simulated clocks and bytes, bit for bit."""
    run = dict(nodes=4, steps=6, net="wan-100mbps", compute="fixed:10ms", eval_every=3)
    here = testing.run(name, WORLD_PARAMS.get(name, {}), **run)
    forked = testing.run(name, WORLD_PARAMS.get(name, {}), nodes_per_process=4,
                         in_process=False, **run)
    assert here.metrics == forked.metrics
    assert testing.max_difference(here, forked) == 0
    assert per_rank_clocks(here) == per_rank_clocks(forked)
    assert here.summary["bytes_sent_per_node"] == forked.summary["bytes_sent_per_node"]
    assert [r["step"] for r in here.metrics] == list(range(1, 7))


class WhereAmI(LocalSGD):
    """Records the process and thread each node steps in; rank 1 fails at step `fail_at`."""
    seen: set = set()

    @dataclass
    class Params:
        H: int = 2
        fail_at: int = 0

    def step(self):
        WhereAmI.seen.add((os.getpid(), threading.current_thread().name))
        if self.rank == 1 and self.step_num == self.params.fail_at:
            raise RuntimeError("boom on rank one")
        super().step()


def test_the_test_world_runs_every_node_in_the_tests_process_and_names_a_failing_one():
    left = []  # the test's own process after a run: as a forked run leaves it
    for in_process in (False, True):
        WhereAmI.seen = set()
        torch.manual_seed(5)
        numpy.random.seed(5)
        torch.set_num_threads(2)
        testing.run(WhereAmI, {"H": 2}, nodes=3, steps=4, in_process=in_process)
        left.append((torch.get_rng_state(), numpy.random.get_state()[1].copy(),
                     torch.get_num_threads(), exoframe.distributed.current()))
    assert WhereAmI.seen == {(os.getpid(), "exoframe-0")}  # one worker thread, no fork
    (torch_a, numpy_a, *rest_a), (torch_b, numpy_b, *rest_b) = left
    assert torch.equal(torch_a, torch_b) and (numpy_a == numpy_b).all()
    assert rest_a == rest_b == [2, None]
    with pytest.raises(ExoframeError, match="rank 1: RuntimeError: boom on rank one"):
        testing.run(WhereAmI, {"H": 2, "fail_at": 3}, nodes=3, steps=4)
    assert [t.name for t in threading.enumerate() if t.name.startswith("exoframe-")] == []
    with pytest.raises(ExoframeError, match="in_process: every node runs in this process"):
        testing.run("ddp", nodes=3, steps=2, nodes_per_process=2, in_process=True)
    forked = testing.run("ddp", nodes=3, steps=2, nodes_per_process=2)  # (needs processes)
    assert [row["step"] for row in forked.metrics] == [1, 2]
