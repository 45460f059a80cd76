"""A custom strategy used from the Python API, on the built-in MLP workload.

    python examples/custom_strategy.py
"""
from dataclasses import dataclass

import torch

import exoframe
from exoframe.workloads import mlp


class AverageEveryH(exoframe.Strategy):
    """Average parameters every H steps (Local SGD in five lines)."""

    @dataclass
    class Params:
        H: int = 10

    def step(self):
        self.optimizer.step()
        self.optimizer.zero_grad()
        if self.step_num % self.params.H == 0:
            self.average_parameters()


if __name__ == "__main__":
    workload = mlp()
    torch.manual_seed(0)
    trainer = exoframe.Trainer(workload.build_model(), workload.dataset, batch_size=64,
                               best_loss=workload.best_loss)
    result = trainer.fit(strategy=AverageEveryH, num_nodes=4, steps=300,
                         strategy_params={"H": 20}, progress=True)
    print(exoframe.report.summary_table(result.summary))
