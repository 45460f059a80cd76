"""The model a method holds: validation, time to target and result.model use the model a
node would deploy (DiLoCo's global model as of its last outer step), and the replicas'
average is a second, named metric."""
import importlib.resources

import pytest
import torch
import yaml
from conftest import Regressor
from torch.utils.data import TensorDataset

import exoframe
from exoframe.config import RunConfig
from exoframe.engine.plan.resolve import job_from_config
from exoframe.engine.run import execute

# The issue's setting: the default gpt workload, 2 nodes, wan-100mbps, 50 ms per step.
ISSUE_RUN = dict(nodes=2, net="wan-100mbps", compute="fixed:50ms", steps=200)

# ddp's time to target in this setting, recorded by running the code before the held model
# existed (commit 876e2f3, `exoframe run --strategy ddp --nodes 2 --net wan-100mbps
# --compute fixed:50ms --target-loss T`): ddp's held model is its replicas' model, so the
# change must leave it exactly where it was.
DDP_BEFORE = {2.55: (12, 1.6301685668979), 2.35: (16, 2.1743947357526685)}
# The steps at the target since the validation set became a fixed number of examples spread
# over the whole validation set (issue 44): the losses moved, the simulated clock did not.
DDP_STEPS_NOW = {2.55: 11, 2.35: 16}


def run(**fields):
    return execute(job_from_config(RunConfig(**{**ISSUE_RUN, **fields})))


@pytest.mark.parametrize("target", [2.55, 2.45, 2.35])
def test_diloco_reaches_a_target_only_at_an_outer_step(target):
    result = run(strategy="diloco", strategy_params={"H": 10}, target_loss=target,
                 val_replicas="every")
    summary, rows = result.summary, result.metrics
    step = summary["steps_to_target"]
    assert step is not None and step % 10 == 0
    # That step's simulated end: when its last rank ended it.
    assert summary["time_to_target"] == rows[step - 1]["sim_time"]
    assert rows[step - 1]["step"] == step
    assert summary["validated_model"] == "global model as of the last outer step"
    # Between outer steps the held model does not change, so neither does its loss; the
    # replicas' average, a model no node holds, does (and is reported under its own name).
    losses = [row["val_loss"] for row in rows]
    for k in range(2, step + 1):
        if k % 10:
            assert losses[k - 1] == losses[k - 2], k
    averages = [row["val_loss_replicas_average"] for row in rows[:9]]
    assert len(set(averages)) > 1 and losses[0] not in averages


@pytest.mark.parametrize("target", sorted(DDP_BEFORE))
def test_ddp_time_to_target_is_unchanged(target, tmp_path):
    # wan-100mbps as it was then: the exact α-β model (the preset now models TCP).
    preset = yaml.safe_load((importlib.resources.files("exoframe.netmodels") /
                             "wan-100mbps.yaml").read_text())
    net = tmp_path / "wan-100mbps-alpha-beta.yaml"
    net.write_text(yaml.safe_dump({**preset, "protocol": "none"}))
    result = run(strategy="ddp", target_loss=target, net=str(net))
    summary, rows = result.summary, result.metrics
    steps, simulated_seconds = DDP_BEFORE[target]  # the simulated clock's, not a speed
    assert rows[steps - 1]["sim_time"] == pytest.approx(simulated_seconds, rel=1e-12, abs=0)
    now = DDP_STEPS_NOW[target]
    assert summary["steps_to_target"] == now
    assert summary["time_to_target"] == rows[now - 1]["sim_time"]
    assert rows[now - 1]["val_loss"] <= target < min(r["val_loss"] for r in rows[:now - 1])
    assert "final_val_loss_replicas_average" not in summary  # the held model is the average


def per_rank(rank, num_nodes, split):
    g = torch.Generator().manual_seed(1000 * rank + (split == "val"))
    x = torch.randn(12, 6, generator=g)
    return TensorDataset(x, torch.tanh(x @ torch.linspace(-1, 1, 6)))


def fit(strategy, steps, **params):
    torch.manual_seed(0)
    trainer = exoframe.Trainer(Regressor(), per_rank, batch_size=12)
    return trainer.fit(strategy=strategy, num_nodes=2, steps=steps, optimizer="sgd", lr=0.1,
                       compute="fixed:10ms", strategy_params=params)


@pytest.mark.parametrize("strategy", ["diloco", "localsgd"])
def test_the_final_model_is_the_one_of_the_last_sync(strategy):
    """Five steps past an outer step the run's model is still that step's: the model of the
    same run stopped right after it (when every node's weights are the global ones)."""
    at_sync = fit(strategy, 10, H=5).model.state_dict()
    after = fit(strategy, 13, H=5)
    for name, value in after.model.state_dict().items():
        assert torch.equal(value, at_sync[name]), name
    # and the replicas went on training: their average is another model, validated apart
    last = after.metrics[-1]
    assert last["val_loss_replicas_average"] != last["val_loss"]
