"""Strategies against references computed another way, their nodes run in the test's process
(in_process: the test world, which equals forked runs: tests/test_testing_kit.py)."""
import copy

import pytest
import torch
from conftest import Regressor
from torch.utils.data import TensorDataset

import exoframe
import exoframe.errors
from exoframe.plugins import PluginManager

SHARD = 12  # examples per rank; the batch size equals it, so every step sees the whole shard


def all_data(num_nodes):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(num_nodes * SHARD, 6, generator=g)
    y = torch.sin(x.sum(1)) + 0.1 * torch.randn(num_nodes * SHARD, generator=g)
    return x, y


def per_rank(rank, num_nodes, split):
    x, y = all_data(num_nodes)
    part = slice(rank * SHARD, (rank + 1) * SHARD)
    return TensorDataset(x[part], y[part])


def fresh_model():
    torch.manual_seed(0)
    return Regressor()


def fit(strategy, nodes, steps=10, optimizer="sgd", lr=0.05, **params):
    trainer = exoframe.Trainer(fresh_model(), per_rank, batch_size=SHARD)
    return trainer.fit(strategy=strategy, num_nodes=nodes, steps=steps, optimizer=optimizer,
                       lr=lr, strategy_params=params, eval_every=1000, in_process=True)


def max_diff(a, b):
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("nodes", [2, 4])
def test_ddp_equals_single_process_training_on_the_union(nodes):
    result = fit("ddp", nodes)
    reference = fresh_model()
    opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    x, y = all_data(nodes)
    for _ in range(10):
        reference((x, y)).backward()
        opt.step()
        opt.zero_grad()
    assert max_diff(result.model, reference) < 1e-5
    assert max_diff(result.model, fresh_model()) > 1e-2  # it did train


def test_localsgd_h1_equals_ddp():
    assert max_diff(fit("localsgd", 4, H=1).model, fit("ddp", 4).model) < 1e-5


def test_diloco_with_plain_outer_sgd_equals_localsgd():
    diloco = fit("diloco", 4, steps=9, optimizer="adamw", lr=0.01, H=3, outer_lr=1.0,
                 outer_momentum=0.0)
    localsgd = fit("localsgd", 4, steps=9, optimizer="adamw", lr=0.01, H=3)
    assert max_diff(diloco.model, localsgd.model) < 1e-5
    assert max_diff(diloco.model, fresh_model()) > 1e-2


def test_sparta_p1_equals_localsgd_h1():
    assert max_diff(fit("sparta", 4, p=1.0).model, fit("localsgd", 4, H=1).model) < 1e-5


def test_diloco_outer_gradient_is_nonzero_at_every_sync():
    result = fit("diloco", 2, steps=12, optimizer="adamw", lr=0.01, H=4)
    syncs = {row["step"]: row["outer_grad_norm"] for row in result.metrics
             if "outer_grad_norm" in row}
    assert sorted(syncs) == [4, 8, 12]
    assert all(norm > 1e-4 for norm in syncs.values()), syncs


def test_strategies_differ_in_traffic_as_expected():
    n_params = sum(p.numel() for p in fresh_model().parameters())
    ddp = fit("ddp", 4).summary
    local = fit("localsgd", 4, H=5).summary
    ring = 2 * 3 * n_params * 4 // 4  # ring all-reduce of the fp32 vector, per rank per call
    assert ddp["bytes_sent_per_node"] == 10 * ring
    assert local["bytes_sent_per_node"] == 2 * ring


def test_state_dict_round_trip_restores_diloco_outer_state():
    from exoframe.comm import Communicator
    from exoframe.strategies import DiLoCo, OptimizerSpec

    model = fresh_model()
    a = DiLoCo(model, Communicator(0, 1), OptimizerSpec("sgd", 0.1), DiLoCo.Params(H=1))
    x, y = all_data(1)
    for step in (1, 2):
        model((x, y)).backward()
        a.step_num = step
        a.step()
    b = DiLoCo(copy.deepcopy(model), Communicator(0, 1), OptimizerSpec("sgd", 0.1),
               DiLoCo.Params(H=1))
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    assert torch.equal(a.global_params, b.global_params)
    assert torch.equal(a.outer_optimizer.state_dict()["state"][0]["momentum_buffer"],
                       b.outer_optimizer.state_dict()["state"][0]["momentum_buffer"])


def test_unknown_strategy_parameter_lists_valid_ones():
    with pytest.raises(exoframe.errors.ExoframeError) as e:
        exoframe.Trainer(fresh_model(), per_rank).fit("diloco", strategy_params={"outer_lrr": 1})
    message = str(e.value)
    assert "outer_lrr" in message and "Did you mean 'outer_lr'" in message
    assert "H, outer_lr, outer_momentum, nesterov" in message


def test_fresh_plugin_manager_registers_builtins_through_hooks():
    pm = PluginManager(load_entry_points=False)
    names = [e.name for e in pm.strategies]
    assert names == ["async-localsgd", "ddp", "desloc", "diloco", "eager-diloco", "gossip",
                     "halos", "hier-diloco", "localsgd", "noloco", "param-server", "powersgd",
                     "randomk-ef", "sparseloco", "sparta", "sparta-diloco", "streaming-diloco",
                     "topk-ef"]
    assert pm.strategies.get("fedavg").name == "localsgd"
    assert {e.source for e in pm.strategies} == {"exoframe"}
