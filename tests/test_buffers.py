"""Model buffers (BatchNorm running statistics and counters) travel with the weights: the
validated and the final model carry them, against references computed in one process."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import exoframe

NODES, SHARD, VAL_SHARD, STEPS, LR = 2, 16, 24, 6, 0.2


class BatchNormRegressor(nn.Module):
    def __init__(self):
        super().__init__()
        # momentum=None: a cumulative average, so the statistics matter after a few steps
        self.net = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8, momentum=None), nn.Tanh(),
                                 nn.Linear(8, 1))

    def forward(self, batch):
        x, y = batch
        return F.mse_loss(self.net(x).squeeze(1), y)


def data(split):
    """Features far from zero mean and unit variance, so the running statistics matter."""
    g = torch.Generator().manual_seed(7 if split == "train" else 8)
    n = NODES * (SHARD if split == "train" else VAL_SHARD)
    x = 10 + 5 * torch.randn(n, 6, generator=g)
    y = (x[:, 0] - 10) / 5 + 0.1 * torch.randn(n, generator=g)
    return x, y


def per_rank(rank, num_nodes, split):
    x, y = data(split)
    size = SHARD if split == "train" else VAL_SHARD
    part = slice(rank * size, (rank + 1) * size)
    return TensorDataset(x[part], y[part])


def fresh_model():
    torch.manual_seed(0)
    return BatchNormRegressor()


def fit(strategy, **params):
    # batch = whole shard, so every step sees it all; one eval batch covers a val shard
    trainer = exoframe.Trainer(fresh_model(), per_rank, batch_size=SHARD)
    return trainer.fit(strategy=strategy, num_nodes=NODES, steps=STEPS, optimizer="sgd", lr=LR,
                       strategy_params=params, eval_every=3,
                       compute="fixed:10ms")


@torch.no_grad()
def single_process_val_loss(model):
    model = copy.deepcopy(model).eval()
    return model(data("val")).item()


def bn(model):
    return model.net[1]


def reference(average_every, broadcast_buffers):
    """NODES model copies in one process, each on its shard; SGD; every step the gradients
    are averaged and rank 0's buffers copied (DDP), or every `average_every` steps the
    parameters and float buffers are averaged (DiLoCo with a plain outer step)."""
    models = [fresh_model() for _ in range(NODES)]
    optimizers = [torch.optim.SGD(m.parameters(), lr=LR) for m in models]
    for step in range(1, STEPS + 1):
        for rank, m in enumerate(models):
            m(per_rank(rank, NODES, "train").tensors).backward()
        if broadcast_buffers:
            for ps in zip(*(m.parameters() for m in models)):
                mean = torch.stack([p.grad for p in ps]).mean(0)
                for p in ps:
                    p.grad = mean.clone()
            for m in models[1:]:
                for b, b0 in zip(m.buffers(), models[0].buffers()):
                    b.copy_(b0)
        for opt in optimizers:
            opt.step()
            opt.zero_grad()
        if average_every and step % average_every == 0:
            with torch.no_grad():
                for ts in zip(*(list(m.parameters()) + [b for b in m.buffers()
                                                         if b.is_floating_point()]
                                for m in models)):
                    mean = torch.stack(list(ts)).mean(0)
                    for t in ts:
                        t.copy_(mean)
    return models[0]


def state_diff(a, b):
    tensors = lambda m: [*m.parameters(), *m.buffers()]  # noqa: E731
    return max((x.double() - y.double()).abs().max().item()
               for x, y in zip(tensors(a), tensors(b), strict=True))


@pytest.mark.parametrize("strategy,params,ref", [
    ("ddp", {}, dict(average_every=0, broadcast_buffers=True)),
    ("diloco", {"H": 3, "outer_lr": 1.0, "outer_momentum": 0.0},
     dict(average_every=3, broadcast_buffers=False)),
])
def test_validation_and_final_model_carry_the_averaged_buffers(strategy, params, ref):
    result = fit(strategy, **params)
    model = result.model
    # The reported validation loss is that of the final weights with their statistics.
    reported = result.metrics[-1]["val_loss"]
    assert reported == pytest.approx(single_process_val_loss(model), rel=0.01)
    # ... which is not what the same weights give with fresh statistics.
    fresh_stats = copy.deepcopy(model)
    bn(fresh_stats).reset_running_stats()
    assert single_process_val_loss(fresh_stats) > 2 * reported
    assert bn(model).running_mean.abs().max() > 0.5
    assert bn(model).running_var.sub(1).abs().max() > 0.5
    assert bn(model).num_batches_tracked.item() == STEPS
    # The whole state against the same training done in one process.
    assert state_diff(model, reference(**ref)) < 1e-4
    assert state_diff(model, fresh_model()) > 1e-2


@pytest.mark.parametrize("strategy,params,average_every", [
    ("localsgd", {"H": 3}, 3),
    ("streaming-diloco", {"H": 3, "fragments": 1, "tau": 0, "alpha": 0.0, "outer_lr": 1.0,
                          "outer_momentum": 0.0}, 3),
    ("async-localsgd", {"H": 3, "outer_lr": 1.0, "outer_momentum": 0.0}, 3),
    ("sparta", {"p": 1.0}, 1),
    ("gossip", {"graph": "complete"}, 1),
    ("noloco", {"H": 1, "outer_lr": 1.0, "outer_momentum": 0.0, "gamma": 0.0}, 1),
])
def test_strategies_that_average_weights_average_the_float_buffers_too(strategy, params,
                                                                       average_every):
    """Each configured to average the two ranks' weights every `average_every` steps."""
    result = fit(strategy, **params)
    assert state_diff(result.model, reference(average_every, broadcast_buffers=False)) < 1e-4
    assert result.metrics[-1]["val_loss"] == pytest.approx(
        single_process_val_loss(result.model), rel=0.01)


def test_ddp_broadcasts_the_buffers_every_step():
    result = fit("ddp")
    model = result.model
    params = 4 * sum(p.numel() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert buffers == 4 * (8 + 8) + 8  # running mean and var (fp32), num_batches_tracked (int64)
    # Two ranks: a ring all-reduce sends the gradient once per rank; the binomial-tree
    # broadcast sends the buffers from rank 0 to rank 1.
    assert result.summary["bytes_sent_per_rank"] == [STEPS * (params + buffers), STEPS * params]
    assert result.summary["traffic_by_kind_rank0"]["broadcast"] == {
        "calls": STEPS, "bytes_sent": STEPS * buffers, "bytes_received": 0}
    assert [row["bytes_sent_per_node"] for row in result.metrics] == [
        step * (params + buffers / NODES) for step in range(1, STEPS + 1)]
