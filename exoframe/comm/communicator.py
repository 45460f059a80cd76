"""The Communicator: the one way strategies exchange data.

Every operation passes through `_submit`, where its kind, payload size, participants and
rank are known: that is where traffic is counted (and where the network simulator will
time it). Tensors are exchanged for real through torch.distributed.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .traffic import TrafficStats, ring_bytes

_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
               "min": dist.ReduceOp.MIN}


class Handle:
    """An operation in flight. `wait()` blocks until it is done and returns its result."""

    def __init__(self, work, result=None, finish=None):
        self._work = work
        self._result = result
        self._finish = finish
        self._done = False

    def wait(self):
        if not self._done:
            if self._work is not None:
                self._work.wait()
            if self._finish is not None:
                self._finish()
            self._done = True
        return self._result

    def is_completed(self) -> bool:
        if self._done:
            return True
        return self._work is None or self._work.is_completed()


class Communicator:
    def __init__(self, rank: int, world_size: int, group=None):
        self.rank = rank
        self.world_size = world_size
        self.group = group
        self.traffic = TrafficStats()

    # -- collectives ---------------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", async_op: bool = False):
        """In place. op: sum, mean, max or min."""
        reduce_op = _reduce_op(op)
        finish = (lambda: tensor.div_(self.world_size)) if op == "mean" else None
        return self._submit("all_reduce", _nbytes(tensor), async_op, tensor, finish,
                            lambda: dist.all_reduce(tensor, reduce_op, self.group, async_op))

    def broadcast(self, tensor: torch.Tensor, src: int, async_op: bool = False):
        sent, received = ring_bytes("broadcast", _nbytes(tensor), self.world_size, self.rank, src)
        return self._submit("broadcast", _nbytes(tensor), async_op, tensor, None,
                            lambda: dist.broadcast(tensor, src, self.group, async_op),
                            counted=(sent, received))

    def all_gather(self, output: torch.Tensor, input: torch.Tensor, async_op: bool = False):
        """output (world_size * input.numel(), flat) receives every rank's input, in rank order."""
        _check_numel(output, input.numel() * self.world_size, "all_gather output")
        return self._submit("all_gather", _nbytes(output), async_op, output, None,
                            lambda: dist.all_gather_into_tensor(output, input, self.group, async_op))

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, op: str = "sum",
                       async_op: bool = False):
        """output receives this rank's 1/world_size chunk of the reduction of every input."""
        _check_numel(output, input.numel() // self.world_size, "reduce_scatter output")
        reduce_op = _reduce_op(op)
        finish = (lambda: output.div_(self.world_size)) if op == "mean" else None
        return self._submit(
            "reduce_scatter", _nbytes(input), async_op, output, finish,
            lambda: dist.reduce_scatter_tensor(output, input, reduce_op, self.group, async_op))

    # -- point to point ------------------------------------------------------------------
    def send(self, tensor: torch.Tensor, dst: int, async_op: bool = False):
        nbytes = _nbytes(tensor)
        run = (lambda: dist.isend(tensor, dst, self.group)) if async_op else \
            (lambda: dist.send(tensor, dst, self.group))
        return self._submit("send", nbytes, async_op, None, None, run, counted=(nbytes, 0))

    def recv(self, tensor: torch.Tensor, src: int, async_op: bool = False):
        nbytes = _nbytes(tensor)
        run = (lambda: dist.irecv(tensor, src, self.group)) if async_op else \
            (lambda: dist.recv(tensor, src, self.group))
        return self._submit("recv", nbytes, async_op, tensor, None, run, counted=(0, nbytes))

    # -- the choke point -----------------------------------------------------------------
    def _submit(self, kind, nbytes, async_op, result, finish, run, counted=None):
        sent, received = counted if counted is not None else \
            ring_bytes(kind, nbytes, self.world_size)
        self.traffic.add(kind, sent, received)
        if self.world_size == 1 and kind not in ("send", "recv"):
            work = None  # nothing to exchange; keep the same semantics without a process group
        else:
            work = run()
        if async_op:
            return Handle(work, result, finish)
        if finish is not None:
            finish()
        return result


def _reduce_op(op: str):
    try:
        return _REDUCE_OPS[op]
    except KeyError:
        raise ValueError(f"unknown reduce op '{op}'; use one of {', '.join(_REDUCE_OPS)}") from None


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _check_numel(tensor, expected, what):
    if tensor.numel() != expected:
        raise ValueError(f"{what} must have {expected} elements, got {tensor.numel()}")
