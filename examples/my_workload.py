"""Bring your own model and data to the CLI:

    exoframe run --workload examples.my_workload:make --strategy localsgd -p H=5
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import exoframe


class LinearRegression(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.linear = nn.Linear(dim, 1)

    def forward(self, batch):
        x, y = batch
        return F.mse_loss(self.linear(x).squeeze(1), y)


def make(dim: int = 16, examples: int = 4096, noise: float = 0.1) -> exoframe.Workload:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(dim, generator=g)
    x = torch.randn(examples, dim, generator=g)
    y = x @ w + noise * torch.randn(examples, generator=g)
    split = examples * 9 // 10
    return exoframe.Workload.from_datasets(
        lambda: LinearRegression(dim), TensorDataset(x[:split], y[:split]),
        TensorDataset(x[split:], y[split:]), batch_size=32, lr=0.05, best_loss=noise ** 2,
        name="linreg")
