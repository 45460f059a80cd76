"""The real exchanges behind the Communicator's operations: through torch.distributed
(`TorchExchange`, a process per node) or in memory among nodes packed into worker processes
(`comm/memory.py`). Both are Exchanges: they start an operation and return its Work, whose
`wait()` gives the result in place; `op` is sum, max or min (the Communicator divides a
mean itself)."""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
import torch.distributed as dist

# torch renamed the flat-buffer collectives; older releases (>= 2.1) have only the old names.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


@runtime_checkable
class Work(Protocol):
    """A started exchange (torch.distributed's Work, comm.memory.MemoryWork)."""

    def wait(self): ...

    def is_completed(self) -> bool: ...


@runtime_checkable
class Exchange(Protocol):
    """What moves a rank's tensors for the Communicator: each operation is started at once
    and returns its Work."""

    def ranks(self, world_size: int) -> tuple: ...

    def exchanges_host_memory(self, world_size: int, p2p: bool = False) -> bool: ...

    def token_device(self) -> str:
        """Where a tensor of the exchange's own (a barrier's token) must be."""
        ...

    def all_reduce(self, tensor: torch.Tensor, op: str) -> Work: ...

    def broadcast(self, tensor: torch.Tensor, src: int) -> Work: ...

    def all_gather(self, output: torch.Tensor, input: torch.Tensor) -> Work: ...

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, op: str) -> Work: ...

    def send(self, tensor: torch.Tensor, dst: int) -> Work: ...

    def recv(self, tensor: torch.Tensor, src: int) -> Work: ...


class TorchExchange:
    """group: the collectives' process group (None: the default one); p2p_group: the one for
    send and recv (gloo beside NCCL, see engine/node/rank.py)."""

    def __init__(self, group=None, p2p_group=None):
        self.group, self.p2p_group = group, p2p_group if p2p_group is not None else group

    def ranks(self, world_size: int) -> tuple:
        return tuple(range(world_size)) if self.group is None else \
            tuple(dist.get_process_group_ranks(self.group))

    def exchanges_host_memory(self, world_size: int, p2p: bool = False) -> bool:
        """gloo exchanges host memory: a GPU tensor travels through a host copy."""
        group = self.p2p_group if p2p else self.group
        return world_size > 1 and dist.is_initialized() and dist.get_backend(group) == "gloo"

    def token_device(self) -> str:
        """NCCL exchanges GPU memory; gloo host memory."""
        nccl = dist.is_initialized() and dist.get_backend(self.group) == "nccl"
        return "cuda" if nccl else "cpu"

    def all_reduce(self, tensor: torch.Tensor, op: str):
        return dist.all_reduce(tensor, REDUCE_OPS[op], self.group, True)

    def broadcast(self, tensor: torch.Tensor, src: int):
        return dist.broadcast(tensor, src, self.group, True)

    def all_gather(self, output: torch.Tensor, input: torch.Tensor):
        return _all_gather_flat(output, input, self.group, True)

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, op: str):
        return _reduce_scatter_flat(output, input, REDUCE_OPS[op], self.group, True)

    def send(self, tensor: torch.Tensor, dst: int):
        return dist.isend(tensor, dst, self.p2p_group)

    def recv(self, tensor: torch.Tensor, src: int):
        return dist.irecv(tensor, src, self.p2p_group)
