"""Gossip: decentralized SGD. Each rank averages its parameters with its neighbours' on a
fixed graph, by point-to-point messages; there is no collective.

Update: θ_i ← opt(θ_i, g_i) every step; every H steps θ_i ← Σ_j W_ij θ_j over i and its
neighbours, with Metropolis–Hastings weights W_ij = 1 / (1 + max(d_i, d_j)) for a neighbour
j and W_ii = 1 − Σ_j W_ij (doubly stochastic on any graph; uniform, 1/(d+1), on a regular
one). Graphs: `ring` (i ± 1), `complete` (every rank: the average, i.e. localsgd), `random`
(Erdős–Rényi with edge probability `edge_prob`, drawn once from the run seed, redrawn until
connected, so every rank draws the same graph).
Floating-point buffers (BatchNorm statistics) are sent and mixed with the parameters.
Bytes per rank per exchange: d_i · 4N (one send of the fp32 parameters, and float buffers, to
each neighbour); ring with n ≥ 3: 8N; complete: 4N(n−1).
Source: Lian et al., "Can Decentralized Algorithms Outperform Centralized Algorithms? A Case
Study for Decentralized Parallel Stochastic Gradient Descent" (2017).
"""
from dataclasses import dataclass

import torch

from ..comm import flatten, unflatten_into
from ..errors import ExoframeError
from .base import Strategy, check_fraction, check_positive
from .seeds import derive
from .traits import Traits

GRAPHS = ("ring", "complete", "random")


def neighbour_sets(graph: str, n: int, edge_prob: float, seed: int) -> list[set[int]]:
    if graph == "ring":
        return [{(i - 1) % n, (i + 1) % n} - {i} for i in range(n)]
    if graph == "complete":
        return [set(range(n)) - {i} for i in range(n)]
    generator = torch.Generator().manual_seed(derive(seed, 29))
    while True:
        draws = torch.rand(n, n, generator=generator)
        neighbours = [{j for j in range(n) if j != i and draws[min(i, j), max(i, j)] < edge_prob}
                      for i in range(n)]
        if _connected(neighbours):
            return neighbours


def _connected(neighbours) -> bool:
    seen, frontier = {0}, [0]
    while frontier:
        for j in neighbours[frontier.pop()] - seen:
            seen.add(j)
            frontier.append(j)
    return len(seen) == len(neighbours)


def metropolis_weights(neighbours: list[set[int]], i: int) -> dict[int, float]:
    weights = {j: 1 / (1 + max(len(neighbours[i]), len(neighbours[j]))) for j in neighbours[i]}
    weights[i] = 1 - sum(weights.values())
    return weights


def exchange_with(comm, tensor: torch.Tensor, peers) -> dict[int, torch.Tensor]:
    """Send `tensor` to every peer and receive theirs. All sends and receives are posted
    before any is waited for, so no order of peers can deadlock."""
    received = {j: torch.empty_like(tensor) for j in peers}
    handles = []
    for j in peers:
        handles.append(comm.send(tensor, j, async_op=True))
        handles.append(comm.recv(received[j], j, async_op=True))
    for handle in handles:
        handle.wait()
    return received


class Gossip(Strategy):
    """Every H steps, average parameters with graph neighbours (send/recv, no collective)."""

    traits = Traits(held_model="replicas' average (a model no node holds)")

    @dataclass
    class Params:
        graph: str = "ring"
        H: int = 1
        edge_prob: float = 0.5

        def __post_init__(self):
            check_positive("gossip", H=self.H, edge_prob=self.edge_prob)
            check_fraction("gossip", edge_prob=self.edge_prob)
            if self.graph not in GRAPHS:
                raise ExoframeError(f"gossip: parameter 'graph' must be one of "
                                    f"{', '.join(GRAPHS)}, got '{self.graph}'.")

    def setup(self):
        p = self.params
        neighbours = neighbour_sets(p.graph, self.world_size, p.edge_prob, self.seed)
        self.neighbours = sorted(neighbours[self.rank])
        self.weights = metropolis_weights(neighbours, self.rank)

    def step(self):
        self.optimizer.step()
        self.optimizer.zero_grad()
        if self.step_num % self.params.H == 0 and self.neighbours:
            params = self.trainable_parameters()
            own = self.with_buffers(flatten(params))
            values = {self.rank: own, **exchange_with(self.comm, own, self.neighbours)}
            mixed = sum(self.weights[j] * values[j] for j in sorted(values))
            unflatten_into(self.take_buffers(mixed, sum(p.numel() for p in params)), params)
