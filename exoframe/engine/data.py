"""Batches from a rank's shard: reshuffled every epoch, reproducible from (seed, rank, epoch)."""
from __future__ import annotations

import torch
from torch.utils.data import Dataset, Subset, TensorDataset
from torch.utils.data._utils.collate import default_collate

from ..errors import ExoframeError


def fetch(dataset: Dataset, indices: torch.Tensor):
    """One batch for `indices`, gathering straight from tensors when the data allows it."""
    while isinstance(dataset, Subset):  # map indices down to the underlying dataset
        base = dataset.indices
        indices = (base.start + indices * base.step if isinstance(base, range)
                   else torch.as_tensor(base)[indices])
        dataset = dataset.dataset
    if isinstance(dataset, TensorDataset):
        return tuple(t[indices] for t in dataset.tensors)
    idx = indices.tolist()
    if hasattr(dataset, "__getitems__"):
        return default_collate(dataset.__getitems__(idx))
    return default_collate([dataset[i] for i in idx])


class Batches:
    """Endless batches over one rank's shard; each epoch is a new permutation."""

    def __init__(self, dataset: Dataset, batch_size: int, seed: int, rank: int):
        self.dataset = dataset
        self.size = len(dataset)
        if self.size == 0:
            raise ExoframeError(f"rank {rank} got an empty training shard: use fewer nodes or more data.")
        self.batch_size = min(batch_size, self.size)
        self.generator = torch.Generator().manual_seed(seed * 1_000_003 + rank)
        self.epoch = 0
        self._new_epoch()

    def _new_epoch(self):
        self.order = torch.randperm(self.size, generator=self.generator)
        self.position = 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.position + self.batch_size > self.size:
            self.epoch += 1
            self._new_epoch()
        indices = self.order[self.position:self.position + self.batch_size]
        self.position += self.batch_size
        return fetch(self.dataset, indices)


def eval_batches(dataset: Dataset, batch_size: int, max_batches: int):
    """The first `max_batches` batches of a validation shard, in order."""
    size = len(dataset)
    for start in range(0, min(size, batch_size * max_batches), batch_size):
        yield fetch(dataset, torch.arange(start, min(start + batch_size, size)))
