"""A packed node's state kept in host memory between its turns (--offload), so that more
nodes share a GPU than its memory holds at once: when a node gives way, the storages of its
state (weights, gradients, optimizer and strategy state: Rank.state_tensors) are copied to
pinned host buffers and shrunk to nothing on the GPU; before its next turn they grow back
and the bytes return.

A storage is shrunk, not replaced (as FSDP frees its shards): every tensor that views it,
found or not (a strategy's views of the weights, a flat buffer), sees the same bytes again.
A tensor that an exchange still holds (the worker's Pack reads it in another node's turn)
stays where it is until a later turn. The copies run on the worker's one stream, in order
with the nodes' kernels, so nothing waits for them on the host.
"""
from __future__ import annotations

from typing import Iterable

import torch


class OffloadedState:
    """One node's parked storages, and the host buffers it reuses turn after turn."""

    def __init__(self, device: torch.device):
        self.device = device
        self.pin = device.type == "cuda"
        self.parked: dict[int, tuple] = {}  # storage id -> (storage, host copy, bytes)
        self.spare: dict[int, list] = {}  # bytes -> host buffers not in use

    def park(self, tensors: Iterable[torch.Tensor], held: set[int]):
        """Move the storages of `tensors` on the node's device to host memory, except those
        in `held` (storage ids an exchange still reads)."""
        for tensor in tensors:
            if tensor is None or tensor.device != self.device:
                continue
            storage = tensor.untyped_storage()
            key, size = storage._cdata, storage.nbytes()
            if key in self.parked or size == 0 or key in held:
                continue
            spare = self.spare.get(size)
            host = spare.pop() if spare else torch.empty(
                size, dtype=torch.uint8, pin_memory=self.pin).untyped_storage()
            host.copy_(storage, non_blocking=self.pin)
            try:
                storage.resize_(0)
            except RuntimeError:  # memory torch did not allocate (not resizable): stays
                self.spare.setdefault(size, []).append(host)
                continue
            self.parked[key] = (storage, host, size)

    def unpark(self):
        """Every parked storage back on the device, with its bytes."""
        for storage, host, size in self.parked.values():
            storage.resize_(size)
            storage.copy_(host, non_blocking=self.pin)
            self.spare.setdefault(size, []).append(host)
        self.parked.clear()

    @property
    def parked_bytes(self) -> int:
        return sum(size for _, _, size in self.parked.values())


def storage_ids(tensors: Iterable) -> set[int]:
    """The storages of the tensors among `tensors`."""
    return {t.untyped_storage()._cdata for t in tensors if isinstance(t, torch.Tensor)}
