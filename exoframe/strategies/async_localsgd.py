"""Asynchronous Local SGD: workers push their round's update to a server when they finish
it, with no barrier; the server applies what has arrived by its simulated now.

Rank 0 is the server (and also a worker). A worker runs H inner steps from the global
weights it last pulled, θ_base, then sends its pseudo-gradient Δ_r = θ_base − θ_r to the
server and posts a receive for the reply. It goes on training while the reply travels; when
the reply (the global weights after its push) arrives — checked right after the push and
once per step — the worker rebases: θ_r ← θ_global + (θ_r − θ_at_push), θ_base ← θ_global,
so the steps taken meanwhile are kept and counted in its next push. A worker whose next
round ends before the reply came waits for it.
The server, once per step of its own, applies in rank order every push that has completed
by its simulated now (one server update), with Delayed Nesterov: each push applies
θ_global ← θ_global − lr·Δ/N, and every N-th push also folds the buffered mean of the last N
pushes into the momentum, m ← μ·m + mean, and applies −lr·μ·m (N = `nesterov_period`, 0:
the number of ranks). Staleness of a push: the pushes applied in earlier server updates
since its worker pulled. On an ideal network without stragglers every push of a round
arrives in the same server update, with staleness 0, and the run equals DiLoCo (Nesterov,
N = n).
The server accepts push k of a worker once it has itself run k rounds (all ranks run the
same number of steps, so that push is sure to come); after its last step it serves the
pushes still owed before finishing.
Floating-point buffers (BatchNorm statistics) ride along: a push carries the worker's
buffers b_r, each server update moves the global buffers by Σ_arrived (b_r − b_global)/n (all
n pushes at once: their mean, as DiLoCo), a reply carries b_global and the worker rebases its
buffers as it rebases its weights.
Bytes per round: each worker other than rank 0 sends 4N (its push); rank 0 sends 4N to each
such worker (the replies): 4N per round for workers, 4N(n−1) per round for rank 0 (N counts
the float buffers too).
Source: Liu et al., "Asynchronous Local-SGD Training for Language Modeling" (2024).
"""
from dataclasses import dataclass

import torch

from ..comm import flatten, unflatten_into
from ..errors import ExoframeError
from .base import Strategy, check_fraction, check_positive
from .traits import Traits

SERVER = 0


class AsyncLocalSGD(Strategy):
    """Workers push updates to a server on rank 0 when their round ends; no barrier."""

    traits = Traits(
        timing_dependent=True,
        checkpointable=False,  # pushes and pulls stay in flight across steps
        held_model_from="rank0",
        held_model="server's global model")

    @dataclass
    class Params:
        H: int = 50
        outer_lr: float = 0.7
        outer_momentum: float = 0.9
        nesterov_period: int = 0

        def __post_init__(self):
            check_positive("async-localsgd", H=self.H, outer_lr=self.outer_lr)
            check_fraction("async-localsgd", outer_momentum=self.outer_momentum)
            if self.nesterov_period < 0:
                raise ExoframeError("async-localsgd: parameter 'nesterov_period' must be 0 "
                                    f"(the number of ranks) or positive, got "
                                    f"{self.nesterov_period}.")

    def setup(self):
        self.base = flatten(self.trainable_parameters())
        self.reply = None  # (handle, buffer, weights at push) while a pull is in flight
        self.push_out = None  # (handle, tensor): the last push, kept alive until sent
        if self.rank == SERVER:
            self.setup_server()

    # -- worker ----------------------------------------------------------------------------
    def step(self):
        self.optimizer.step()
        self.optimizer.zero_grad()
        if self.rank == SERVER:
            self.serve(own_push=self.step_num % self.params.H == 0)
            return
        round_ends = self.step_num % self.params.H == 0
        if self.reply is not None:
            self.rebase(wait=round_ends)  # the next push needs the reply to the last one
        if round_ends:
            self.push()

    def push(self):
        weights = flatten(self.trainable_parameters())
        delta = self.with_buffers(self.base - weights)  # [Δ_r; b_r]
        self.push_out = (self.comm.send(delta, SERVER, async_op=True), delta)
        buffer = torch.empty_like(delta)  # the reply: [θ_global; b_global]
        self.reply = (self.comm.recv(buffer, SERVER, async_op=True), buffer,
                      self.with_buffers(weights))
        self.rebase(wait=False)

    def rebase(self, wait: bool):
        handle, new_global, at_push = self.reply
        if not wait and not handle.is_completed():
            return
        handle.wait()
        params = self.trainable_parameters()
        rebased = new_global + (self.with_buffers(flatten(params)) - at_push)
        numel = self.base.numel()
        unflatten_into(self.take_buffers(rebased, numel), params)
        self.base = new_global[:numel]
        self.reply = None

    def held_weights(self):
        if self.rank != SERVER:
            return super().held_weights()
        return self.weights_with(self.global_params,
                                 self.global_buffers if self.global_buffers.numel() else None)

    # -- server ----------------------------------------------------------------------------
    def setup_server(self):
        n = self.world_size
        self.global_params = self.base.clone()
        buffers = self.float_buffers()
        self.global_buffers = flatten(buffers) if buffers else self.base.new_zeros(0)
        self.period = self.params.nesterov_period or n
        self.momentum = torch.zeros_like(self.global_params)
        self.buffer = torch.zeros_like(self.global_params)
        self.pushes = 0  # applied so far
        self.pulled_at = [0] * n  # per worker: pushes applied when it last pulled
        self.received = [0] * n  # pushes received per worker
        self.incoming = [None] * n  # per worker: (handle, buffer) of the awaited push
        self.replies = [None] * n  # per worker: (handle, tensor) of the last reply
        self.staleness = []

    def finish(self):
        # Serve the pushes still owed, or the workers waiting for their replies never finish.
        if self.rank == SERVER:
            self.serve_remaining()

    def serve(self, own_push: bool):
        arrived = []
        if own_push:
            arrived.append((SERVER, self.with_buffers(self.base - flatten(
                self.trainable_parameters()))))
        self.expect_pushes(self.step_num // self.params.H)
        for r, entry in enumerate(self.incoming):
            if entry is not None and entry[0].is_completed():
                arrived.append(self.take_push(r))
        self.apply(sorted(arrived, key=lambda a: a[0]))
        self.expect_pushes(self.step_num // self.params.H)

    def expect_pushes(self, rounds_done: int):
        """Post the receive of each worker's next push, if that push is sure to come."""
        for r in range(self.world_size):
            if r != SERVER and self.incoming[r] is None and self.received[r] < rounds_done:
                buffer = self.global_params.new_empty(
                    self.global_params.numel() + self.global_buffers.numel())
                self.incoming[r] = (self.comm.recv(buffer, r, async_op=True), buffer)

    def take_push(self, r: int):
        handle, buffer = self.incoming[r]
        handle.wait()
        self.incoming[r] = None
        self.received[r] += 1
        return r, buffer

    def apply(self, arrived):
        """One server update: every push in `arrived`, then a reply to each pusher."""
        if not arrived:
            return
        p = self.params
        numel = self.global_params.numel()
        for r, _ in arrived:
            self.staleness.append(self.pushes - self.pulled_at[r])
        self.global_buffers = self.global_buffers + sum(
            push[numel:] - self.global_buffers for _, push in arrived) / self.world_size
        for _, push in arrived:
            delta = push[:numel]
            self.pushes += 1
            self.buffer += delta
            self.global_params -= p.outer_lr / self.period * delta
            if self.pushes % self.period == 0:
                self.momentum = p.outer_momentum * self.momentum + self.buffer / self.period
                self.global_params -= p.outer_lr * p.outer_momentum * self.momentum
                self.buffer.zero_()
        for r, _ in arrived:
            self.pulled_at[r] = self.pushes
            if r == SERVER:
                self.base = self.global_params.clone()
                unflatten_into(self.base, self.trainable_parameters())
                self.take_buffers(torch.cat([self.base, self.global_buffers]), numel)
            else:
                reply = torch.cat([self.global_params, self.global_buffers])
                self.replies[r] = (self.comm.send(reply, r, async_op=True), reply)

    def serve_remaining(self):
        rounds = self.step_num // self.params.H
        for _ in range(rounds):
            self.expect_pushes(rounds)
            for r, entry in enumerate(self.incoming):
                if entry is not None:
                    self.apply([self.take_push(r)])

    def metrics(self):
        if self.rank != SERVER or not self.staleness:
            return {}
        return {"mean_staleness": sum(self.staleness) / len(self.staleness),
                "max_staleness": max(self.staleness)}
