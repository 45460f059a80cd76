"""A small MLP classifier on synthetic data labelled by a fixed random teacher network.

Labels are the teacher's argmax, replaced by another class with probability `label_noise`,
so the best achievable cross-entropy is known in closed form:
H = -(1-ε) log(1-ε) - ε log(ε/(K-1)).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from ..host_memory import check_fits
from .base import Workload, shard_factory


class MLP(nn.Module):
    def __init__(self, in_dim: int, hidden: int, classes: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                 nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, batch):
        x, y = batch
        return F.cross_entropy(self.net(x), y)


def accuracy(model: MLP, batch) -> dict:
    x, y = batch
    return {"accuracy": (model.net(x).argmax(1) == y).float().mean().item()}


def teacher_data(n: int, in_dim: int, classes: int, label_noise: float, seed: int):
    g = torch.Generator().manual_seed(seed)
    teacher = [torch.randn(in_dim, 64, generator=g), torch.randn(64, classes, generator=g)]
    x = torch.randn(n, in_dim, generator=g)
    y = (torch.tanh(x @ teacher[0]) @ teacher[1]).argmax(1)
    flip = torch.rand(n, generator=g) < label_noise
    other = (y + torch.randint(1, classes, (n,), generator=g)) % classes
    return TensorDataset(x, torch.where(flip, other, y))


def best_loss(classes: int, eps: float) -> float:
    if eps == 0:
        return 0.0
    return -(1 - eps) * math.log(1 - eps) - eps * math.log(eps / (classes - 1))


def mlp(in_dim: int = 32, hidden: int = 128, classes: int = 10, label_noise: float = 0.1,
        train_examples: int = 20_000, val_examples: int = 2_000, data_seed: int = 0) -> Workload:
    """MLP classifier on teacher-labelled Gaussian data; best achievable loss is known."""
    examples = train_examples + val_examples
    # float32 inputs, the teacher's hidden layer twice, its logits twice, labels and flips
    check_fits(f"train_examples, val_examples, in_dim: {examples:,} examples take",
               4 * examples * (in_dim + 2 * 64 + 2 * classes + 8), "give fewer or smaller ones")
    data = teacher_data(examples, in_dim, classes, label_noise, data_seed)
    x, y = data.tensors
    train = TensorDataset(x[:train_examples], y[:train_examples])
    val = TensorDataset(x[train_examples:], y[train_examples:])
    return Workload(build_model=lambda: MLP(in_dim, hidden, classes),
                    dataset=shard_factory(train, val), batch_size=64, lr=1e-3,
                    best_loss=best_loss(classes, label_noise), name="mlp", metrics=accuracy)
