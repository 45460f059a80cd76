"""Parameter server: workers push gradients to the servers holding the parameters and pull
the updated weights, through remote calls (exoframe.distributed).

The flat parameters are split into `servers` contiguous shards; server s is rank s, which
also trains as a worker (co-located, as ps-lite and BytePS run), and holds shard s and the
run's optimizer over it. Each step, every worker pushes its gradient's shard s to server s;
a server adds the pushes of a step and, once all N are in, steps its optimizer on their
mean (updates are applied in step order). A worker keeps the weights it last pulled (its
cache) and trains on them while they lack at most `staleness` updates:
- staleness = 0 (synchronous): after step k a worker pulls the weights with update k in
  (a server holds the pull until the last push of k is in): all train on the same weights,
  and with the same optimizer the run equals ddp.
- staleness = s > 0 (bounded staleness, stale synchronous parallel): a worker pulls only
  when its cache lacks more than s updates, and then takes weights with at least update
  k−s in; faster workers run up to s steps ahead. The `staleness` metric is how many
  updates the weights trained on next lack. At the last step every worker pulls the final
  weights (with a stopping rule that ends the run early, the model reported is the
  averaged workers' copies at that step; they pull the final weights after it).
Bytes for a worker that is no server, per step: S sent and, per pull, S received, S the
parameters' bytes (plus a small envelope per call); a server's own shard stays local, and
it answers the N−1 other workers. Buffers (BatchNorm statistics) stay local, as with the
gradient compressors. A server steps its optimizer on its flat shard, so "synchronous equals
ddp" holds for optimizers that act per element (sgd, adam, adamw, ...), not for one that
needs the parameters' shapes. Source: Li et al., "Scaling Distributed Machine Learning with the
Parameter Server" (OSDI 2014); Ho et al., "More Effective Distributed ML via a Stale
Synchronous Parallel Parameter Server" (NIPS 2013).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import distributed
from ..comm import flatten, unflatten_into
from .base import Strategy
from .traits import Traits

# rank -> its ParameterServer, for the ranks that hold a shard (one in a rank's process;
# several where nodes share a process, engine/node/packing.py)
_SERVERS: dict = {}


def push(step: int, gradient: torch.Tensor, lr: float) -> None:
    """Served on a server: one worker's gradient shard for `step`, and that step's lr."""
    server = _SERVERS[distributed.get_rank()]
    server.take_push(step, gradient.to(server.shard.device), lr)


def pull(min_version: int) -> tuple[int, torch.Tensor]:
    """Served on a server: (the last step applied, its shard's weights), once that step is
    at least min_version."""
    server = _SERVERS[distributed.get_rank()]
    if server.version < min_version:
        raise distributed.NotYet
    return server.version, server.shard.detach().clone()


class ParameterServer(Strategy):
    """Push gradient shards to server ranks, pull updated weights (sync or bounded staleness)."""

    traits = Traits(
        remote_calls=True,
        timing_dependent=True,  # with staleness, which update a pull returns depends on timing
        held_model="replicas' average (the workers' copies of the servers' weights)")
    # The workers' copies of the servers' weights: equal to them with staleness 0.

    @dataclass
    class Params:
        servers: int = 1
        staleness: int = 0

        def __post_init__(self):
            if not (isinstance(self.servers, int) and self.servers >= 1):
                raise ValueError(f"servers must be an integer of at least 1, got "
                                 f"{self.servers!r}")
            if not (isinstance(self.staleness, int) and self.staleness >= 0):
                raise ValueError(f"staleness must be an integer of at least 0, got "
                                 f"{self.staleness!r}")

    @classmethod
    def params_problem(cls, params, nodes, model):
        if params.servers > nodes:
            return (f"parameter 'servers' is {params.servers} but the run has {nodes} nodes "
                    "(each server is a node); give at most that many")
        return None

    def setup(self):
        sizes = [p.numel() for p in self.trainable_parameters()]
        self.bounds = _shard_bounds(sum(sizes), self.params.servers)
        self.cached = 0  # the last update in the weights this worker trains on
        self.pushes = []  # pushes whose acknowledgements are still to be collected
        if self.rank < self.params.servers:
            start, end = self.bounds[self.rank]
            weights = flatten(p.detach() for p in self.trainable_parameters())[start:end]
            self.shard = torch.nn.Parameter(weights.clone())
            self.server_optimizer = self.optimizer_spec.build([self.shard])
            self.version = 0  # the last step whose update is applied
            self.sums = {}  # step -> (sum of the gradients pushed, how many)
            _SERVERS[self.rank] = self

    def step(self):
        params = self.trainable_parameters()
        gradient = flatten(p.grad if p.grad is not None else torch.zeros_like(p)
                           for p in params)
        self.pushes.append(distributed.remote_async_call(
            push, args=(self.step_num, gradient, self.lr),
            partitioner=lambda step, g, lr: [(s, (step, g[a:b], lr), {})
                                             for s, (a, b) in enumerate(self.bounds)]))
        self.optimizer.zero_grad()
        # The last step's weights are the final model: every update in.
        wanted = self.step_num - (0 if self.step_num == self.total_steps
                                  else self.params.staleness)
        if self.cached < wanted:
            self._pull(wanted)

    def finish(self):
        if self.cached < self.step_num:  # a stopping rule ended the run early
            self._pull(self.step_num)

    def metrics(self) -> dict:
        return {"staleness": self.step_num - self.cached}

    # -- the server's side ------------------------------------------------------------------
    def take_push(self, step: int, gradient: torch.Tensor, lr: float):
        total, count, _ = self.sums.get(step, (0, 0, lr))
        self.sums[step] = (gradient + total, count + 1, lr)
        while self.sums.get(self.version + 1, (0, 0, 0))[1] == self.world_size:
            total, _, lr = self.sums.pop(self.version + 1)
            for group in self.server_optimizer.param_groups:
                group["lr"] = lr
            self.shard.grad = total / self.world_size
            self.server_optimizer.step()
            self.version += 1

    # -- the worker's side ------------------------------------------------------------------
    def _pull(self, min_version: int):
        """Take weights with at least update min_version in, from every server."""
        for pushed in self.pushes:
            pushed.wait()
        self.pushes = []
        shards = distributed.remote_sync_call(
            pull, args=(min_version,),
            partitioner=lambda v: [(s, (v,), {}) for s in range(self.params.servers)])
        self.cached = min(version for version, _ in shards)
        params = self.trainable_parameters()
        unflatten_into(torch.cat([weights.to(params[0].device) for _, weights in shards]),
                       params)


def _shard_bounds(total: int, servers: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) pieces of `total` elements, the first ones one longer when
    it does not divide."""
    size, extra = divmod(total, servers)
    bounds, start = [], 0
    for s in range(servers):
        end = start + size + (s < extra)
        bounds.append((start, end))
        start = end
    return bounds
