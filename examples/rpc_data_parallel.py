"""TorchOpt's data parallelism by remote calls, inside an exoframe strategy.

    python examples/rpc_data_parallel.py --nodes 4 --steps 20

Rank 0 holds the batch, as TorchOpt's master worker does. A function decorated with
`parallelize(partitioner=batch_partitioner, reducer=mean_reducer)` sends each rank a slice
of it; every rank returns the loss and gradient of its slice on its own copy of the model,
and rank 0 gets their mean, steps its optimizer and broadcasts the new weights. The other
ranks serve the calls while they wait in `barrier()`. The requests and results cross the
simulated network, so the run's simulated time and bytes include them. The script checks
the trained weights against the same training in one process.
"""
import argparse

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import exoframe
import exoframe.distributed as todist
from exoframe.strategies import Traits
from exoframe import testing
from exoframe.comm import flatten, unflatten_into

BATCH = 32
generator = torch.Generator().manual_seed(0)
X = torch.randn(1024, 6, generator=generator)
Y = torch.sin(X.sum(1))
MODEL = None  # each rank's model: set on that rank when its strategy starts


@todist.parallelize(partitioner=todist.batch_partitioner, reducer=todist.mean_reducer)
def loss_and_gradient(x, y):
    """Runs on the rank that gets this slice: its loss and gradient, in one flat tensor."""
    MODEL.zero_grad()
    loss = F.mse_loss(MODEL.net(x).squeeze(1), y)
    loss.backward()
    return torch.cat([loss.detach().reshape(1), flatten(p.grad for p in MODEL.parameters())])


def batch(step: int):
    start = (step - 1) * BATCH % len(X)
    return X[start:start + BATCH], Y[start:start + BATCH]


class RpcDataParallel(exoframe.Strategy):
    """Rank 0 splits its batch over the ranks by remote calls and steps on the mean."""

    traits = Traits(remote_calls=True)

    def setup(self):
        global MODEL
        MODEL = self.model

    def step(self):
        params = list(self.model.parameters())
        if self.rank == 0:
            mean = loss_and_gradient(*batch(self.step_num))  # [loss, gradient...]
            unflatten_into(mean[1:], [p.grad for p in params])
            self.optimizer.step()
        todist.barrier()  # the other ranks serve rank 0's calls while they wait here
        weights = flatten(p.detach() for p in params)
        self.comm.broadcast(weights, src=0)
        unflatten_into(weights, params)


def one_process(steps: int, lr: float) -> torch.nn.Module:
    model = testing.tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(1, steps + 1):
        optimizer.zero_grad()
        x, y = batch(step)
        F.mse_loss(model.net(x).squeeze(1), y).backward()
        optimizer.step()
    return model


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    lr = 0.05
    trainer = exoframe.Trainer(testing.tiny_model(), TensorDataset(X, Y), batch_size=8)
    result = trainer.fit(strategy=RpcDataParallel, num_nodes=args.nodes, steps=args.steps,
                         optimizer="sgd", lr=lr, net="wan-100mbps", compute="fixed:50ms")
    difference = testing.max_difference(result.model, one_process(args.steps, lr))
    traffic = result.summary["traffic_by_kind_rank0"]
    print(f"{args.nodes} ranks, {args.steps} steps: simulated {result.summary['simulated_seconds']:.3f} s; "
          f"rank 0 sent {traffic['remote']['bytes_sent']} B of tensors in remote calls "
          f"(+{traffic['remote_envelope']['bytes_sent']} B envelope); "
          f"max |weights - one process| = {difference:.2e}")
    if difference > 1e-5:
        raise SystemExit("the weights differ from the one-process training")
