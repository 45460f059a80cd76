"""HALoS: hierarchical asynchronous local SGD, with a parameter server per region (site) and
a global one.

The regions are the network's sites (its YAML's `sites:`; one region without them). The
lowest rank of each site is its local parameter server (LPS), and rank 0 is also the
global one (GPS); every rank trains as a worker. Through remote calls (exoframe.distributed):
- A worker runs H inner steps from the model it last got from its LPS, sends its
  pseudo-gradient Δ = θ_start − θ to the LPS and waits for the reply: the LPS's model once
  Δ is applied, from which it starts its next H steps.
- An LPS applies each push as it is served (in arrival order) with Delayed Nesterov
  (local_lr, local_beta, local_buffer) and counts it as a version. Once it has K versions
  beyond those the global model last merged into it, it sends the GPS its accumulated
  update u = θ_merged − θ_LPS, and goes on serving its workers meanwhile.
- The GPS applies each update with Delayed Nesterov (global_lr, global_beta,
  global_buffer) and answers with the global model θ_G. An LPS checks for that answer at
  each of its steps and merges it: θ_LPS ← (1 − α)·θ_LPS + α·θ_G, θ_merged ← θ_LPS.
Delayed Nesterov over N (buffer) pushes g: every push θ ← θ − lr·g/N; every N-th push also
m ← β·m + mean of the last N pushes and θ ← θ − lr·β·m (Liu et al., arXiv 2401.09135).
A rank serves the calls that reached it at its step ends (and while it waits), so a push
waits for its LPS's next step end. Buffers (BatchNorm statistics) stay local.
Bytes: per push, 4N to the LPS and 4N back (none for the LPS's own worker); per update,
4N to the GPS and 4N back (none for rank 0's own region).
Source: Kim et al., "HALoS: Hierarchical Asynchronous Local SGD over Slow Networks for
Geo-Distributed Large Language Model Training" (arXiv 2506.04531, ICML 2025); reference
code utnslab/halos. Defaults are its examples' (run_halos.sh, learning rates already
multiplied by their buffer sizes).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import distributed
from ..comm import flatten, unflatten_into
from .base import Strategy, check_fraction, check_positive
from .traits import Traits

GPS = 0
# rank -> its HALoS strategy, for the ranks that serve (one per process, or several where
# nodes share a process, engine/node/packing.py)
_SERVERS: dict = {}


def push_to_region(delta: torch.Tensor) -> torch.Tensor:
    """Served on an LPS: one worker's pseudo-gradient; answers the LPS's model."""
    return _SERVERS[distributed.get_rank()].take_push(delta)


def push_to_global(update: torch.Tensor) -> torch.Tensor:
    """Served on the GPS: one region's accumulated update; answers the global model."""
    return _SERVERS[distributed.get_rank()].take_region_update(update)


class DelayedNesterov:
    """Delayed Nesterov on a flat tensor (Liu et al., arXiv 2401.09135)."""

    def __init__(self, weights: torch.Tensor, lr: float, beta: float, buffer: int):
        self.lr, self.beta, self.buffer = lr, beta, buffer
        self.momentum = torch.zeros_like(weights)
        self.pending = torch.zeros_like(weights)
        self.steps = 0

    def step(self, weights: torch.Tensor, grad: torch.Tensor):
        self.pending += grad
        self.steps += 1
        weights -= self.lr / self.buffer * grad
        if self.steps % self.buffer == 0:
            self.momentum = self.beta * self.momentum + self.pending / self.buffer
            weights -= self.lr * self.beta * self.momentum
            self.pending.zero_()


class HALoS(Strategy):
    """Workers push to their region's parameter server, which pushes to a global one."""

    traits = Traits(
        remote_calls=True,
        timing_dependent=True,  # which model a worker gets depends on the order of arrivals
        checkpointable=False,
        held_model="replicas' average (the workers' copies of their regions' models)")

    @dataclass
    class Params:
        H: int = 8
        K: int = 32
        alpha: float = 0.25
        local_lr: float = 3.2
        local_beta: float = 0.9
        local_buffer: int = 16
        global_lr: float = 0.3
        global_beta: float = 0.5
        global_buffer: int = 2

        def __post_init__(self):
            check_positive("halos", H=self.H, K=self.K, local_lr=self.local_lr,
                           global_lr=self.global_lr, local_buffer=self.local_buffer,
                           global_buffer=self.global_buffer)
            check_fraction("halos", alpha=self.alpha, local_beta=self.local_beta,
                           global_beta=self.global_beta)

    def setup(self):
        p = self.params
        self.start = flatten(self.trainable_parameters()).detach().clone()
        site = next(group for group in self.comm.sites() if self.rank in group)
        self.lps = site[0]
        if self.rank == self.lps:
            self.region_model = self.start.clone()
            self.merged = self.start.clone()
            self.local_optimizer = DelayedNesterov(self.region_model, p.local_lr, p.local_beta,
                                                   p.local_buffer)
            self.version = self.merged_version = 0
            self.global_reply = None  # the future of the update in flight to the GPS
            _SERVERS[self.rank] = self
        if self.rank == GPS:
            self.global_model = self.start.clone()
            self.global_optimizer = DelayedNesterov(self.global_model, p.global_lr,
                                                    p.global_beta, p.global_buffer)

    def step(self):
        self.optimizer.step()
        self.optimizer.zero_grad()
        if self.rank == self.lps:
            self.merge_if_answered()
        if self.step_num % self.params.H == 0:
            self.push()

    # -- the worker ------------------------------------------------------------------------
    def push(self):
        params = self.trainable_parameters()
        delta = self.start - flatten(params)
        model, = distributed.remote_sync_call(push_to_region, args=(delta,),
                                              partitioner=self.lps)
        self.start = model.to(self.start.device)
        unflatten_into(self.start, params)

    # -- a region's parameter server -------------------------------------------------------------
    def take_push(self, delta: torch.Tensor) -> torch.Tensor:
        self.local_optimizer.step(self.region_model, delta.to(self.region_model.device))
        self.version += 1
        if self.global_reply is None and self.version == self.merged_version + self.params.K:
            self.global_reply = distributed.remote_async_call(
                push_to_global, args=(self.merged - self.region_model,), partitioner=GPS)
        return self.region_model.clone()

    def merge_if_answered(self):
        if self.global_reply is None or not self.global_reply.done():
            return
        global_model, = self.global_reply.wait()
        global_model = global_model.to(self.region_model.device)
        self.global_reply = None
        self.region_model.lerp_(global_model, self.params.alpha)
        self.merged = self.region_model.clone()
        self.merged_version = self.version
        self.note(region_version=float(self.version))

    # -- the global parameter server -----------------------------------------------------------
    def take_region_update(self, update: torch.Tensor) -> torch.Tensor:
        self.global_optimizer.step(self.global_model, update.to(self.global_model.device))
        return self.global_model.clone()

