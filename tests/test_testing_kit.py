"""exoframe.testing, as a plugin author uses it: a new strategy checked against a built-in in
a few lines, its step() unit-tested without processes, a collective timed on a network."""
import math
from dataclasses import dataclass

import pytest
import torch

from exoframe import ExoframeError, testing
from exoframe.strategies import LocalSGD


class FedProx(LocalSGD):
    """Local SGD whose local steps add the proximal term mu·(θ − θ_last_average)."""

    @dataclass
    class Params:
        H: int = 10
        mu: float = 0.01

    def setup(self):
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
