"""Batches from a rank's shard: reshuffled every epoch, reproducible from (seed, rank, epoch),
or read in order from a stream."""
from __future__ import annotations

import itertools

import torch
from torch.utils.data import Dataset, IterableDataset, Subset, TensorDataset
from torch.utils.data._utils.collate import default_collate

from ...errors import ExoframeError
from ...strategies.seeds import derive


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
    """Endless batches over one rank's shard: each epoch a new permutation (or the shard's
    order, without shuffle), the last short batch dropped or kept. A stream (an
    IterableDataset) is read in order, and running dry is an error naming the rank."""

    def __init__(self, dataset: Dataset, batch_size: int, seed: int, rank: int,
                 shuffle: bool = True, drop_last: bool = True):
        self.dataset, self.rank = dataset, rank
        self.shuffle, self.drop_last = shuffle, drop_last
        self.samples = 0  # examples given out (the summary's samples seen)
        self.read = 0  # batches made so far
        self._first = None  # a batch read ahead by first(): served next
        if isinstance(dataset, IterableDataset):
            self.stream, self.batch_size = iter(dataset), batch_size
            return
        self.stream = None
        self.size = len(dataset)
        if self.size == 0:
            raise ExoframeError(f"rank {rank} got an empty training shard: use fewer nodes or more data.")
        self.batch_size = min(batch_size, self.size)
        self.generator = torch.Generator().manual_seed(derive(seed, rank))
        self.epoch = 0
        # Drawn on first use, in the process that trains the rank: the launcher builds every
        # rank's Batches, and an order drawn there would be held by every forked worker.
        self.order, self.position = None, 0

    def _drawn(self):
        if self.order is None:
            self._new_epoch()

    def _new_epoch(self):
        self.order = (torch.randperm(self.size, generator=self.generator) if self.shuffle
                      else torch.arange(self.size))
        self.position = 0

    def first(self):
        """The first batch, without using it up (the launcher checks the model on it)."""
        if self._first is None:
            self._first = self._next()
        return self._first

    def __iter__(self):
        return self

    def __next__(self):
        if self._first is not None:
            batch, self._first = self._first, None
        else:
            batch = self._next()
        self.samples += examples_in(batch)
        return batch

    def state_dict(self) -> dict:
        """Where this rank is in its data (a checkpoint). A stream keeps no position: it is
        read again up to where it was (load_state_dict)."""
        state = {"samples": self.samples, "read": self.read}
        if self.stream is None:
            self._drawn()
            state.update(epoch=self.epoch, order=self.order, position=self.position,
                         generator=self.generator.get_state())
        return state

    def load_state_dict(self, state: dict):
        self._first = None
        if self.stream is None:
            self.epoch, self.order = state["epoch"], state["order"]
            self.position = state["position"]
            self.generator.set_state(state["generator"])
        else:
            self.stream = iter(self.dataset)
            self.read = 0
            for _ in range(state["read"]):
                self._next()
        self.samples, self.read = state["samples"], state["read"]

    def _next(self):
        if self.stream is not None:
            items = list(itertools.islice(self.stream, self.batch_size))
            if not items or (self.drop_last and len(items) < self.batch_size):
                raise ExoframeError(
                    f"rank {self.rank}: its training stream (an IterableDataset) ran dry after "
                    f"{self.read} batches of {self.batch_size}; give a longer stream or fewer "
                    "steps.")
            self.read += 1
            return default_collate(items)
        self.read += 1
        self._drawn()
        left = self.size - self.position
        if left <= 0 or (self.drop_last and left < self.batch_size):
            self.epoch += 1
            self._new_epoch()
        indices = self.order[self.position:self.position + self.batch_size]
        self.position += self.batch_size
        return fetch(self.dataset, indices)


def examples_in(batch) -> int:
    """How many examples a batch holds: the length of its first tensor."""
    while isinstance(batch, (tuple, list)):
        batch = batch[0]
    if isinstance(batch, dict):
        return examples_in(next(iter(batch.values())))
    return len(batch)
