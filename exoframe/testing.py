"""Helpers for testing strategies: in exoframe's own tests, in plugins' and in yours.

    from exoframe import testing

    def test_my_strategy_with_mu_0_is_localsgd():
        mine = testing.run(MyStrategy, {"H": 2, "mu": 0.0})
        reference = testing.run("localsgd", {"H": 2})
        assert testing.max_difference(mine, reference) < 1e-6

`run` trains a strategy (a registered name or a Strategy subclass) with a tiny regression
model and per-rank data, SGD and validation at the last step, and returns the RunResult
(averaged model, per-step metrics, summary with each rank's simulated clock). Its nodes run
in this process (`in_process`: one worker of nodes in a thread, exchanging in memory, the
simulator and the evaluator beside them; a breakpoint in a strategy stops there), with the
same results as forked ranks packed in a worker, and the same up to the order of
floating-point sums as a process per node (tests/test_testing_kit.py); `in_process=False`
forks them. `solo` builds a strategy on one rank with no
process and no network, to unit-test its `step()` directly. `time_collective` says how long
one collective takes on a network, as the simulator computes it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from .comm import Communicator
from .engine.run import RunResult
from .engine.trainer import Trainer
from .plugins import get_plugin_manager
from .sim import Simulator, resolve_sim
from .sim.clocks.protocol import Op
from .strategies.base import Strategy
from .strategies.optimizers import OptimizerSpec


class TinyRegression(torch.nn.Module):
    """A 6 → 16 → 1 MLP whose forward(batch) returns the MSE loss."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(),
                                       torch.nn.Linear(16, 1))

    def forward(self, batch):
        x, y = batch
        return F.mse_loss(self.net(x).squeeze(1), y)


def tiny_model(seed: int = 0) -> TinyRegression:
    torch.manual_seed(seed)
    return TinyRegression()


def tiny_data(examples_per_rank: int = 16):
    """A dataset factory: each rank its own seeded examples of y = sin(Σx) + noise."""
    def factory(rank: int, num_nodes: int, split: str):
        g = torch.Generator().manual_seed(1000 * rank + (split == "val"))
        x = torch.randn(examples_per_rank, 6, generator=g)
        return TensorDataset(x, torch.sin(x.sum(1)) + 0.1 * torch.randn(len(x), generator=g))
    return factory


def run(strategy, params: dict | None = None, nodes: int = 2, steps: int = 8,
        model: torch.nn.Module | None = None, data=None, batch_size: int = 8,
        **fit) -> RunResult:
    """Train `strategy` on `nodes` nodes in this process; `fit` takes Trainer.fit's other
    arguments (optimizer and lr default to SGD at 0.1; validation runs only at the last step;
    in_process=False forks the nodes, as do nodes_per_process, net="real" and device="mps",
    which need processes)."""
    forks = "nodes_per_process" in fit or fit.get("net") == "real" or fit.get("device") == "mps"
    fit = {"optimizer": "sgd", "lr": 0.1, "eval_every": steps, "in_process": not forks, **fit}
    trainer = Trainer(model if model is not None else tiny_model(),
                      data if data is not None else tiny_data(), batch_size=batch_size)
    return trainer.fit(strategy=strategy, num_nodes=nodes, steps=steps,
                       strategy_params=params, **fit)


def max_difference(a, b) -> float:
    """The largest absolute difference between two models' parameters and buffers (models
    or RunResults)."""
    a, b = (x.model if isinstance(x, RunResult) else x for x in (a, b))
    pairs = zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    return max((x.double() - y.double()).abs().max().item() for x, y in pairs)


def solo(strategy: type[Strategy], params: dict | None = None,
         model: torch.nn.Module | None = None, optimizer: str = "sgd", lr: float = 0.1,
         seed: int = 0) -> Strategy:
    """`strategy` on one rank, with no process and no network: its exchanges are done at
    once (world size 1). Set `.step_num`, run a backward pass, call `.step()`."""
    model = model if model is not None else tiny_model(seed)
    return strategy(model, Communicator(0, 1), OptimizerSpec(optimizer, lr),
                    strategy.parse_params(params), seed=seed)


def time_collective(kind: str, nodes: int, nbytes: float, net: str = "ideal",
                    root: int = 0, pm=None) -> float:
    """Simulated seconds for one `kind` collective (all_reduce, broadcast, all_gather,
    reduce_scatter) of `nbytes` among `nodes` ranks that all start at 0, on `net` (a preset
    or a YAML file), with the collective algorithm the network chooses."""
    setup = resolve_sim(net, "fixed:1s", "", nodes, pm or get_plugin_manager())
    sim = Simulator(setup.topology, setup.algorithms)
    ranks = tuple(range(nodes))
    for rank in ranks:
        sim.receive(rank, Op(0.0, 0, ("c", ranks, 0), kind, nbytes, ranks, root, True))
    end = 0.0
    while replies := sim.advance():  # ranks finish at different times: wait for the last
        for rank, reply in replies:
            end = max(end, reply.end)
            sim.rank_done(rank)
    return end
